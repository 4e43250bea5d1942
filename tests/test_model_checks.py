"""`trainbench check-models memory|time|predictions|emulation` (trainbench.checks) on the published
results: what each check reads by default, what it keeps out of a fit, and its arithmetic."""

from __future__ import annotations

import collections
import csv
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

VALIDATION_RUNS = REPO / "validation/results/runs"


def check_models(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """The command as a user runs it, from the repository root."""
    return subprocess.run([sys.executable, "-m", "trainbench", "check-models", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# --- what the checks read ------------------------------------------------------------------------------

def test_the_campaigns_and_the_validation_rounds_are_read_as_one_results_tree(tmp_path, monkeypatch):
    """By default a check reads results/ and validation/results/, where present, and takes their cells in
    the order one results/ holding both would give (a fit's figures follow the order of its cells)."""
    from trainbench.checks.inputs import metrics_files, published

    for place in ("results/runs/b/c", "validation/results/runs/a/c", "results/search/a/c/mb~2",
                  "validation/results/runs/c/c"):
        (tmp_path / place).mkdir(parents=True)
        (tmp_path / place / "metrics.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    folders = published("runs", "search")
    assert [str(f) for f in folders] == ["results/runs", "validation/results/runs", "results/search"]
    assert [str(p.parent) for p in metrics_files(folders)] == [
        "validation/results/runs/a/c", "results/runs/b/c", "validation/results/runs/c/c",
        "results/search/a/c/mb~2"]
    shutil.rmtree(tmp_path / "validation")  # a workspace of its own (`cd validation`): results/ alone
    assert [str(f) for f in published("runs", "search")] == ["results/runs", "results/search"]


# --- the memory model --------------------------------------------------------------------------------------

def test_a_lone_deepspeed_engines_nccl_figure_is_what_the_published_one_gpu_cells_show():
    """The model's NCCL memory for a DeepSpeed engine alone on a GPU is the gap check-models memory
    prints between the one-GPU DeepSpeed and torch cells' NVML use over their reservation."""
    from trainbench.predict.memory_model import NCCL_MIB_ONE_DEEPSPEED_RANK

    run = check_models("memory")
    assert run.returncode == 0, run.stderr
    found = re.search(r"one-GPU cells, NVML used over torch's peak reservation: with a DeepSpeed engine "
                      r"median ([\d,]+) MiB \((\d+) cells.*without median ([\d,]+) MiB \((\d+) cells",
                      run.stdout)
    assert found, run.stdout[-2000:]
    with_engine, without = (float(found.group(i).replace(",", "")) for i in (1, 3))
    assert int(found.group(2)) >= 20 and int(found.group(4)) >= 20
    assert NCCL_MIB_ONE_DEEPSPEED_RANK == pytest.approx(with_engine - without, abs=1)


# --- the time model ----------------------------------------------------------------------------------------

def test_the_time_models_held_out_cells_are_predicted_and_never_fitted():
    """check-models time: the thread curves (three offloaded cells, each at 1 to 16 CPU threads, in
    validation/results/bench/threads, its --held-out by default) are predicted by the fit on the other
    folders' cells, and not one of them enters that fit (one of the curves is a holdout cell itself,
    swept outside the runs)."""
    run = check_models("time", "validation/results/runs/holdout")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "h200: 10 cells, leave-one-out" in out  # the holdout study's 10 cells that trained, alone
    held = out[out.index("held out (never fitted)"):].splitlines()
    rows = [m.groups() for line in held if (m := re.match(r"^(\S.*?)\s+(\d+)\s+[\d.]+ s\s+\[", line))]
    curves = collections.defaultdict(set)
    for label, threads in rows:
        curves[label].add(int(threads))
    assert len(curves) == 3 and all(sorted(t) == [1, 2, 4, 8, 16] for t in curves.values())
    assert f"held out: {len(rows)} cells" in out and len(rows) == 21
    assert all("validation/results/bench/threads/" in line for line in held[2:2 + len(rows)])


def test_the_thread_exponent_is_read_on_each_curve_at_the_exponent_the_others_chose():
    """check-models time --thread-exponents: every held-out thread curve is predicted at each exponent,
    then read at the exponent chosen on the other curves alone; the model's own exponent is restored
    after (the choice writes nothing), and the mode refuses to run without the curves."""
    run = check_models("time", "validation/results/runs/holdout", "--thread-exponents", "0.6", "1",
                       timeout=600)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    table = out[:out.index("each curve at the exponent")]
    assert [line.split()[0] for line in table.splitlines()[2:] if line.strip()] == ["0.6", "1"]
    crossed = re.findall(r"^  (\S.*?)\s+exponent (0\.6|1): (.*)$", out, re.M)
    assert len(crossed) == 3  # one line per curve: three curves in validation/results/bench/threads
    for _, _, points in crossed:
        assert sorted({int(t) for t in re.findall(r"(\d+) threads", points)}) == [1, 2, 4, 8, 16]
    assert re.search(r"chosen on all curves: (0\.6|1) \(time_model.CPU_THREAD_EXPONENT is", out)
    refused = check_models("time", "--held-out", "--thread-exponents", "0.6", timeout=60)
    assert refused.returncode == 2 and "--thread-exponents needs --held-out" in refused.stderr


def test_the_time_model_fit_leaves_out_float8_cells_it_does_not_describe():
    """Eager float8 (torchao's casts as separate kernels, 2.4x bf16's step) is outside the model, which
    assumes compiled casts: check-models time leaves it out of every fit, and says so; the compiled
    float8 cells are fitted."""
    run = check_models("time", "results/runs/float8", "--held-out")
    assert run.returncode == 0, run.stderr
    eager = "float8/model~gpt-2.5b__micro_batch~8__float8~tensorwise"
    assert f"left out {eager}: float8 without torch.compile" in run.stderr
    assert "held out (never fitted)" not in run.stdout  # --held-out alone: none
    # and its prediction says so wherever it is shown
    from trainbench.reporting.documents import read_reported
    from trainbench.predict import time_model
    from trainbench.registry.hardware import GPUS
    from trainbench.study.params import CellParams

    eager_cell = CellParams.from_dict(read_reported(REPO / "results/runs" / eager / "metrics.json")["params"])
    assert "float8 without torch.compile" in time_model.predict(eager_cell, GPUS["h200"]).note
    compiled_cell = eager_cell.replace(compile=True)
    assert time_model.predict(compiled_cell, GPUS["h200"]).note is None
    # every published real GPU cell that trained is fitted but the eager float8 one
    trained = [d for d in (read_reported(p) for p in (REPO / "results/runs/float8").glob("*/metrics.json"))
               if d["status"] == "ok" and d["params"].get("device") == "cuda" and not d.get("emulation")]
    assert f"h200: {len(trained) - 1} cells, leave-one-out" in run.stdout


def test_write_stores_the_all_cells_fit_where_the_model_reads_its_constants(tmp_path, monkeypatch, capsys):
    """check-models time --write: the constants fitted on all the cells, by GPU type, in the file
    time_model reads (here a copy of it), saying what they were fitted on and by what."""
    from trainbench.cli import main
    from trainbench.predict import time_model
    from trainbench.registry.hardware import GPUS
    from trainbench.study.params import CellParams

    written = tmp_path / "time_model_constants.json"
    monkeypatch.setattr(time_model, "CONSTANTS_FILE", written)
    assert main(["check-models", "time", str(REPO / "results/runs/float8"), "--held-out", "--write"]) == 0
    assert f"wrote {written}" in capsys.readouterr().out
    [(gpu, constants)] = time_model.load_constants(written).items()  # as `trainbench predict` reads them
    assert gpu == constants.gpu == "h200"
    assert re.fullmatch(r"\d+ cells \(float8\), by trainbench check-models time", constants.fitted_on)
    cell = time_model.predict(CellParams.resolve({"framework": "torch", "strategy": "single",
                                                  "model": "gpt2-124m", "device": "cuda"}), GPUS["h200"],
                              constants)
    assert cell.step_time_s > 0 and cell.constants_gpu == "h200"


def test_leave_one_study_out_predicts_a_study_from_the_others_alone():
    # a study's predictions must not move when its own measurements do, and must move with the others'
    from trainbench.checks.step_time import leave_study_out, measured_cells
    from trainbench.predict import time_model

    cells = measured_cells([VALIDATION_RUNS / "holdout", VALIDATION_RUNS / "holdout_mix",
                            VALIDATION_RUNS / "holdout_5b"])
    works = time_model.stack([c["work"] for c in cells])
    measured = np.array([c["measured_s"] for c in cells])
    studies = [c["result"].study for c in cells]
    mix = np.array(studies) == "holdout_mix"
    before = leave_study_out(works, measured, studies)
    after = leave_study_out(works, np.where(mix, 2 * measured, measured), studies)
    assert np.allclose(before[mix], after[mix])  # its own steps doubled: its predictions the same
    assert not np.allclose(before[~mix], after[~mix])  # the others' fits saw the doubled steps


# --- the memory model --------------------------------------------------------------------------------------

def test_a_kept_allocator_snapshot_is_set_beside_the_memory_models_parts():
    """check-models memory --snapshots on the float8 cell's snapshot from an H200: the model's
    parameters and optimizer states are what the allocator held; its float8 layers keep no autocast
    copy of their weights, so what is left (activations and other) is within 3% of the snapshot's."""
    run = check_models("memory", "--snapshots", "validation/results/bench/float8/memory_snapshot",
                       timeout=120)
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: [float(x) for x in line.split()[1:4]] for line in run.stdout.splitlines()
            if line.strip().split(" ")[0] in ("parameters", "optimizer_states", "activations_and_other")}
    for category in ("parameters", "optimizer_states"):
        snapshot, model, _ = rows[category]
        assert model == pytest.approx(snapshot, rel=0.01), category
    snapshot, model, _ = rows["activations_and_other"]
    assert model == pytest.approx(snapshot, rel=0.03)
    assert "reserved / peak allocated: 1.016 measured" in run.stdout
    empty = check_models("memory", "--snapshots", "validation/results/runs/holdout", timeout=120)
    assert empty.returncode == 1 and "no cell with an allocator snapshot" in empty.stderr


# --- predictions made before the cells ran -----------------------------------------------------------------

def test_predictions_made_before_a_run_are_held_against_its_results(tmp_path):
    """check-models predictions: the verdict of each cell against its outcome (an OOM result is a right
    'does not fit' only where that was predicted), and the errors of the cells that ran."""
    from trainbench.execute.results import partial_metrics

    predictions = tmp_path / "baseline-h200.csv"
    with open(predictions, "w") as out:
        subprocess.run([sys.executable, "-m", "trainbench", "predict", "baseline", "--gpu", "h200",
                        "--gpus-per-node", "1", "--host-mem-gib", "128"], stdout=out, check=True, cwd=REPO)
    rows = predictions.read_text().splitlines()
    small, medium = (next(r for r in rows if f"single__model~{m}" in r) for m in ("gpt2-124m", "gpt2-350m"))
    runs = tmp_path / "runs" / "baseline"
    for row in (small, medium):
        cell = row.split(",")[1]
        shutil.copytree(REPO / "results" / "runs" / "baseline" / cell, runs / cell)
    # the 350M cell as if it had run out of memory: predicted to fit, so a wrong verdict
    oom_file = runs / medium.split(",")[1] / "metrics.json"
    doc = json.loads(oom_file.read_text())
    doc.update(status="oom", reason="OOM at step 1 (warm-up) on rank 0", metrics=partial_metrics([], 12.0))
    oom_file.write_text(json.dumps(doc))
    report = tmp_path / "bench" / "a_new_round" / "check.json"  # its folder made, as for a new round
    run = check_models("predictions", str(predictions), "--runs", str(tmp_path / "runs"),
                       "--json", str(report))
    assert run.returncode == 0, run.stderr
    assert "fit/OOM verdicts right: 1 of 2" in run.stdout and "and 8 more" in run.stdout
    result = json.loads(report.read_text())
    entries = {e["cell"]: e for e in result["entries"]}
    ran = entries[small.split(",")[1]]
    measured = json.loads((runs / ran["cell"] / "metrics.json").read_text())["metrics"]
    assert ran["verdict_right"] and ran["measured_step_s"] == measured["step_time_s"]
    assert ran["gpu_error"] == pytest.approx(ran["predicted_gpu_gib"] * 1024
                                             / max(measured["gpu_mem_used_mib"]) - 1)
    assert entries[medium.split(",")[1]]["verdict_right"] is False
    assert result["summary"]["judged"] == 2 and len(result["summary"]["not_judged"]) == 12
    refused = check_models("predictions", str(tmp_path / "none.csv"), timeout=60)
    assert refused.returncode == 2 and "no predictions file" in refused.stderr


def test_a_prediction_finds_its_cell_in_the_first_results_tree_that_has_it(tmp_path):
    """The published runs are two trees (the campaigns', the validation rounds'): a row's cell is read
    from the one that has it, whichever that is; with neither, it has no result."""
    from trainbench.checks.predictions import result_of

    for tree, study in (("a", "s"), ("b", "t")):
        (tmp_path / tree / study / "c").mkdir(parents=True)
        (tmp_path / tree / study / "c" / "metrics.json").write_text("{}")
    roots = [tmp_path / "a", tmp_path / "b"]
    assert result_of({"study": "t", "cell": "c"}, roots) == tmp_path / "b/t/c/metrics.json"
    assert result_of({"study": "s", "cell": "c"}, roots) == tmp_path / "a/s/c/metrics.json"
    assert not result_of({"study": "u", "cell": "c"}, roots).exists()


def test_an_emulated_ranks_step_is_held_against_the_prediction_less_its_communication():
    """An emulated rank's step is its compute alone: the predictions check sets it against the predicted
    step less its communication, its real twin against the whole step, and gives the real cells' figures
    apart (the published emulation_check cells, predicted at the commit they ran at)."""
    from trainbench.checks.predictions import compare_row, render, summarize

    with open(REPO / "validation/results/bench/emulation_check/predictions-b3c89f8.csv", newline="") as f:
        rows = {r["cell"]: r for r in csv.DictReader(f)}
    real_cell = "framework~deepspeed__strategy~zero2__model~gpt-2.5b__gpus~4__micro_batch~8__emulate~false"
    real = compare_row(rows[real_cell], VALIDATION_RUNS)
    emulated = compare_row(rows[real_cell.replace("emulate~false", "emulate~true")], VALIDATION_RUNS)
    whole = float(rows[real_cell]["step_time_s"])
    communication = float(rows[real_cell]["communication_s"])
    assert communication > 0 and real["status"] == emulated["status"] == "ok"
    assert not real["emulated"] and real["predicted_step_s"] == whole
    assert emulated["emulated"] and emulated["predicted_step_s"] == pytest.approx(whole - communication)
    summary = summarize([real, emulated])
    assert summary["step_real_cells"] == 1
    assert summary["step_real_median_abs_error"] == abs(real["step_error"])
    assert "of which real cells (1)" in render([real, emulated], summary)


def test_pre_registered_parts_are_held_against_the_profiles(tmp_path):
    """A profiled round (holdout_frameworks): each cell's predicted parts beside its profile's, which
    add up to its timed step, and the part that missed most named; its cells found in the validation
    rounds' runs by default."""
    report = tmp_path / "check.json"
    run = check_models("predictions", "validation/results/predictions/holdout_frameworks-h200.csv",
                       "--json", str(report))
    assert run.returncode == 0, run.stderr
    assert "the part that missed most, by cells:" in run.stdout
    entries = json.loads(report.read_text())["entries"]
    assert entries and all(e["parts_ms"] for e in entries)
    for e in entries:
        assert set(e["parts_ms"]) == {"compute", "communication", "optimizer", "framework"}
        profiled = sum(measured for _, measured in e["parts_ms"].values())
        assert profiled == pytest.approx(e["measured_step_s"] * 1e3, rel=1e-3)


# --- emulated ranks against real ones ----------------------------------------------------------------------

def test_emulated_vs_real_takes_communication_as_a_share_and_nccl_beyond_what_the_twin_measured(capsys):
    """The emulation check's arithmetic on rows a 2-GPU host would give: the exposed communication of
    the real rank of the emulated rank's number, as a share of its (slower) profiled step; NCCL's buffers
    as the real rank's device memory beyond what the emulated rank measured (its stored figure already
    adds the memory model's figure), by layout; a rank whose outcome differs, listed with both."""
    from trainbench.checks import emulation

    real = {"breakdown_per_rank": [{"step_s": 1.0, "parts_s": {"exposed_communication": 0.5}},
                                   {"step_s": 2.0, "parts_s": {"exposed_communication": 0.5}}]}
    assert emulation.exposed_share(real, 1) == 0.25 and emulation.exposed_share(real, 0) == 0.5
    assert emulation.exposed_share({"breakdown": {"step_s": 4.0, "parts_s": {}}}, 0) is None  # not profiled

    def row(rank, status_emulated="ok"):
        figures = {f"{label}_{side}": None for label, _ in emulation.MEMORY for side in ("real", "emulated")}
        return {**figures, "cell": "s/c", "rank": rank, "world": 2, "status_real": "ok",
                "status_emulated": status_emulated, "device_real": 10_700.0, "device_emulated": 10_650.0,
                "device_emulated_measured": 10_100.0, "held_real": None, "held_emulated": None,
                "shard_real": 5, "shard_emulated": 5, "step_real_s": 0.5, "step_emulated_s": 0.3,
                "real_exposed_comm_share": 0.25, "layout": "data", "modelled_mib": 550.0}

    ok = row(1)
    assert emulation.ratio(ok) == pytest.approx(0.6)
    assert emulation.compute_ratio(ok) == pytest.approx(0.3 / (0.5 * 0.75))
    assert emulation.compute_ratio({**ok, "real_exposed_comm_share": None}) is None
    emulation.print_summary([ok, row(0, status_emulated="oom")])
    said = capsys.readouterr().out
    assert "outcomes: 1 of 2 ranks the same emulated and real; s/c rank 0: real ok, emulated oom" in said
    # 10,700 - 10,100, not - 10,650, beside what the model adds for the layout
    assert "NCCL's buffers, mostly), data: median 600 MiB over 1 ranks (600-600); the model adds 550" in said
    assert "device memory: 1 ranks, |emulated - real| median 0.5%" in said and "median 0.800 over 1" in said


def test_the_emulation_check_reads_the_published_emulation_check_study_by_default():
    """With no folder, check-models emulation pairs the emulation_check study's emulated ranks (in the
    validation rounds' runs) with their real twins, every rank of them."""
    run = check_models("emulation", timeout=120)
    assert run.returncode == 0, run.stderr
    emulated = [p for p in (VALIDATION_RUNS / "emulation_check").glob("*emulate~true*/metrics.json")]
    assert emulated and "ranks the same emulated and real" in run.stdout
    assert re.search(rf"outcomes: \d+ of {len(emulated)} ranks", run.stdout)
    # the whole step, emulated + the model's wait out of sample, is nearer the real step than the
    # emulated step alone
    whole = re.search(r"whole step .* median ([\d.]+)%, worst ([\d.]+)% over \d+ ranks \(the emulated step "
                      r"alone: median ([\d.]+)%, worst ([\d.]+)%", run.stdout)
    assert whole, run.stdout[-2000:]
    median, worst, alone_median, alone_worst = map(float, whole.groups())
    assert median < alone_median and worst < alone_worst


def test_the_whole_step_bands_are_what_the_published_emulated_and_real_ranks_give(tmp_path):
    """src/trainbench/predict/whole_step_bands.json, which `trainbench fit` reads: made again from the
    published pairs by the command it names (the waits fitted without each real cell's study)."""
    from trainbench.checks.emulation import add_whole_steps, pairs, whole_step_bands
    from trainbench.checks.inputs import metrics_files
    from trainbench.predict.time_model import WHOLE_STEP_BANDS_FILE

    committed = json.loads(WHOLE_STEP_BANDS_FILE.read_text())
    folders = [REPO / f for f in committed["made_by"].split()[3:-1]]
    assert len(folders) >= 3 and all(f.is_dir() for f in folders)
    rows, _ = pairs(metrics_files(folders))
    add_whole_steps(rows)
    assert whole_step_bands(rows) == committed["bands"]
    assert set(committed["bands"]) == {"data parallel", "ZeRO-3", "offloaded", "tensor or pipeline parallel"}


def test_the_emulation_check_takes_the_waits_committed_before_the_run(tmp_path):
    """--predictions: each emulated rank's whole step is its measured step plus the wait a predictions
    file gave it; with each wait exactly what its real twin took beyond it, every whole step is exact."""
    import csv

    from trainbench.checks.emulation import pairs
    from trainbench.checks.inputs import metrics_files

    rows, _ = pairs(metrics_files([VALIDATION_RUNS / "emulation_check"]))
    path = tmp_path / "predictions.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["study", "cell", "emulated_wait_s"])
        for row in rows:
            if row["step_real_s"] and row["step_emulated_s"]:
                study, cell = row["emulated_cell"].split("/")
                writer.writerow([study, cell, row["step_real_s"] - row["step_emulated_s"]])
    run = check_models("emulation", "--predictions", str(path), timeout=120)
    assert run.returncode == 0, run.stderr
    assert re.search(r"whole step \(emulated \+ the time model's wait, committed before the run\) against "
                     r"the real step: \|error\| median 0\.0%, worst 0\.0% over 19 ranks", run.stdout), (
        run.stdout[-800:])
