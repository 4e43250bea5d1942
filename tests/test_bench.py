"""The benchmarks in bench/ run end to end on CPU stand-ins (their figures come from GPU hosts)."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import FAST_TIMING, REPO


def test_the_overhead_benchmark_holds_the_pipelines_cell_against_a_bare_loop(tmp_path):
    # a baseline study of one tiny CPU cell: the benchmark's code paths, not its figures
    config = {"studies": {"baseline": {
        "description": "CPU stand-in", "timing": FAST_TIMING,
        "settings": {"model": "gpt2-tiny", "device": "cpu", "seq_len": 32, "micro_batch": 2, "grad_accum": 2,
                     "warmup_steps": 2, "timed_steps": 6},
        "include": [{"strategy": "single", "gpus": 1}]}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "bench/overhead.py", "--config", str(tmp_path / "config.yaml"),
                           "--rounds", "2", "--ablation", "--ablation-rounds", "2", "--ablation-steps", "2",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "overhead.json").read_text())
    [cell] = report["cells"]
    assert [r["order"] for r in cell["rounds"]] == [["bare", "cell"], ["cell", "bare"]]  # drift cancels
    for r in cell["rounds"]:
        assert r["ratio"] == r["cell"]["tokens_per_s_per_gpu"] / r["bare"]["tokens_per_s_per_gpu"]
        # the cell times at least its 6 windows; more where a loaded machine widened the interval
        assert r["bare"]["steps"] == 6 and r["cell"]["windows"] >= 6
    assert cell["ratio_half_width"] is not None
    assert set(report["ablation"]["strategy~single__gpus~1"]) == {
        "bare", "sync and read the loss every step", "sampler thread (50 ms)", "sampler process (50 ms)"}
    summary = (out / "overhead.txt").read_text()
    assert "cell/reference" in summary and "strategy~single__gpus~1" in summary and "command:" in summary
    assert summary.splitlines()[5].endswith("(bare)")  # the reference the cell's row was set against
    # each round's cell is a metrics.json that `trainbench compare` reads as a rerun of the others
    assert (out / "round-2" / "runs" / "baseline" / "strategy~single__gpus~1" / "metrics.json").exists()


@pytest.mark.slow
def test_the_scaling_benchmark_plans_runs_and_times_cells_against_bare_snakemake(tmp_path):
    # tiny sizes: the benchmark's code paths (its figures come from results/bench/plan_scaling). Its
    # sections run as three processes at once, each skipping the others' (--skip): planning; the
    # measured grid and the scheduler; execution. What is asserted here is what each section records,
    # not its times, which the processes beside it do not change.
    common = ["--sizes", "4", "--repeats", "1", "--ready", "6", "--window", "60", "--cells", "2",
              "--before", "HEAD"]
    parts = {"planning": ["--skip", "measured", "scheduler", "execution"],
             "measured": ["--skip", "planning", "execution"],
             "execution": ["--skip", "planning", "measured", "scheduler"]}
    runs = {}
    try:
        for part, skip in parts.items():
            with open(tmp_path / f"{part}.log", "w") as log:  # the pipes of three processes would fill
                runs[part] = subprocess.Popen([sys.executable, "bench/plan_scaling.py", *common, *skip,
                                               "--out", str(tmp_path / part)],
                                              cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        for part, run in runs.items():
            assert run.wait(timeout=900) == 0, (tmp_path / f"{part}.log").read_text()[-6000:]
    finally:
        for run in runs.values():
            if run.poll() is None:  # another part failed first
                run.kill()
                run.wait()
    report = {}
    for part in parts:
        figures = json.loads((tmp_path / part / "plan_scaling.json").read_text())
        # each process timed Snakemake's start and ran beside the workflow of --before HEAD
        assert figures["start"]["median"] > 0 and figures["before"] == "HEAD"
        report.update(figures)
    # each size planned by the workflow (alone, and beside this repository's studies), the bare
    # Snakefile and the bare one shaped like train_cell (its values from functions, and fixed), quiet
    # and not (the benchmark itself checks each dry run planned every cell)
    for size in ("4",):  # one size: each size runs the same code (the figures come from a GPU host's run)
        for mode in ("plan", "plan quiet"):
            figures = report["planning"][size][mode]
            assert all(len(figures[f"{kind}_wall_s"]["values"]) == 1
                       for kind in ("workflow", "bare", "shaped", "fixed", "beside"))
            assert figures["ratio_wall"]["median"] == (figures["workflow_wall_s"]["median"]
                                                       / figures["bare_wall_s"]["median"])
            assert figures["fixed_ratio_wall"]["median"] == (figures["fixed_wall_s"]["median"]
                                                             / figures["bare_wall_s"]["median"])
            assert len(figures["before_wall_s"]["values"]) == 1  # the workflow of --before REF, beside it
        # a grid whose every cell has a result: planned cold, warm, and a remote job's start, each kind
        measured = report["measured"][size]
        for kind in ("workflow", "before"):
            for what in ("cold", "warm", "remote"):
                assert measured[f"{kind} {what}_s"]["median"] > 0 and f"{kind}_{what}_ratio" in measured
    assert {s: r["done"] for s, r in report["scheduler"].items()} == {"greedy": 6, "ilp": 6}
    execution = report["execution"]
    # the unsupported cells really run through Snakemake, 1 and then 2 of them: a slope per cell
    assert execution["cells"] == [1, 2] and execution["before"]["workflow_unsupported_per_cell_s"]
    for ranks in ("1", "2"):  # a launched cell: its launcher's lifetime is inside run-cell's
        launched = execution["launched"][ranks]
        assert 0 < launched["launcher_s"]["median"] < launched["run_cell_s"]["median"]
    planning, measuring, executing = ((tmp_path / part / "plan_scaling.txt").read_text() for part in parts)
    assert all("command:" in text for text in (planning, measuring, executing))
    assert "workflow/bare" in planning and "goal <= 20 ms" in executing
    assert "fixed/bare (wall)" in planning and "beside/bare (wall)" in planning


def test_predictions_made_before_a_run_are_held_against_its_results(tmp_path):
    """bench/predicted_then_run.py: the verdict of each cell against its outcome (an OOM result is a
    right 'does not fit' only where that was predicted), and the errors of the cells that ran."""
    import shutil

    from trainbench.execute.results import partial_metrics

    predictions = tmp_path / "baseline-h200.csv"
    with open(predictions, "w") as out:
        subprocess.run(["trainbench", "predict", "baseline", "--gpu", "h200", "--gpus-per-node", "1",
                        "--host-mem-gib", "128"], stdout=out, check=True, cwd=REPO)
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
    report = tmp_path / "check.json"
    run = subprocess.run([sys.executable, "bench/predicted_then_run.py", str(predictions), "--runs",
                          str(tmp_path / "runs"), "--json", str(report)], cwd=REPO, capture_output=True,
                         text=True, check=True)
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


def test_an_emulated_ranks_step_is_held_against_the_prediction_less_its_communication():
    """An emulated rank's step is its compute alone: bench/predicted_then_run.py sets it against the
    predicted step less its communication, its real twin against the whole step, and gives the real
    cells' figures apart (the published emulation_check cells, predicted at the commit they ran at)."""
    import csv

    sys.path.insert(0, str(REPO / "bench"))
    import predicted_then_run as bench

    with open(REPO / "results/bench/emulation_check/predictions-b3c89f8.csv", newline="") as f:
        rows = {r["cell"]: r for r in csv.DictReader(f)}
    real_cell = "framework~deepspeed__strategy~zero2__model~gpt-2.5b__gpus~4__micro_batch~8__emulate~false"
    runs = REPO / "results/runs"
    real = bench.compare_row(rows[real_cell], runs)
    emulated = bench.compare_row(rows[real_cell.replace("emulate~false", "emulate~true")], runs)
    whole = float(rows[real_cell]["step_time_s"])
    communication = float(rows[real_cell]["communication_s"])
    assert communication > 0
    assert not real["emulated"] and real["predicted_step_s"] == whole
    assert emulated["emulated"] and emulated["predicted_step_s"] == pytest.approx(whole - communication)
    summary = bench.summarize([real, emulated])
    assert summary["step_real_cells"] == 1
    assert summary["step_real_median_abs_error"] == abs(real["step_error"])
    assert "of which real cells (1)" in bench.render([real, emulated], summary)


def test_the_time_models_held_out_cells_are_predicted_and_never_fitted():
    """bench/time_model.py --held-out: the thread curves (three offloaded cells, each at 1 to 16 CPU
    threads) are predicted by the fit on the other folders' cells, and not one of them enters that fit
    (one of the curves is a holdout cell itself, swept outside results/runs)."""
    run = subprocess.run([sys.executable, "bench/time_model.py", "results/runs/holdout", "--held-out",
                          "results/bench/threads"], cwd=REPO, capture_output=True, text=True, timeout=300)
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


def test_the_thread_exponent_is_read_on_each_curve_at_the_exponent_the_others_chose():
    """bench/time_model.py --thread-exponents: every held-out thread curve is predicted at each
    exponent, then read at the exponent chosen on the other curves alone; the model's own exponent is
    restored after (the choice writes nothing), and the mode refuses to run without the curves."""
    run = subprocess.run([sys.executable, "bench/time_model.py", "results/runs/holdout", "--held-out",
                          "results/bench/threads", "--thread-exponents", "0.6", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    table = out[:out.index("each curve at the exponent")]
    assert [line.split()[0] for line in table.splitlines()[2:] if line.strip()] == ["0.6", "1"]
    crossed = re.findall(r"^  (\S.*?)\s+exponent (0\.6|1): (.*)$", out, re.M)
    assert len(crossed) == 3  # one line per curve: three curves in results/bench/threads
    for _, _, points in crossed:
        assert sorted({int(t) for t in re.findall(r"(\d+) threads", points)}) == [1, 2, 4, 8, 16]
    assert re.search(r"chosen on all curves: (0\.6|1) \(time_model.CPU_THREAD_EXPONENT is", out)
    refused = subprocess.run([sys.executable, "bench/time_model.py", "--thread-exponents", "0.6"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--thread-exponents needs --held-out" in refused.stderr


def test_the_time_model_fit_leaves_out_float8_cells_it_does_not_describe():
    """Eager float8 (torchao's casts as separate kernels, 2.4x bf16's step) is outside the model, which
    assumes compiled casts: bench/time_model.py leaves it out of every fit, and says so; the compiled
    float8 cells are fitted."""
    run = subprocess.run([sys.executable, "bench/time_model.py", "results/runs/float8"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    eager = "float8/model~gpt-2.5b__micro_batch~8__float8~tensorwise"
    assert f"left out {eager}: float8 without torch.compile" in run.stderr
    # and its prediction says so wherever it is shown
    from trainbench.execute.results import read_result
    from trainbench.predict import time_model
    from trainbench.registry.hardware import GPUS
    from trainbench.study.params import CellParams

    eager_cell = CellParams.from_dict(read_result(REPO / "results/runs" / eager / "metrics.json")["params"])
    assert "float8 without torch.compile" in time_model.predict(eager_cell, GPUS["h200"]).note
    compiled_cell = eager_cell.replace(compile=True)
    assert time_model.predict(compiled_cell, GPUS["h200"]).note is None
    # every published real GPU cell that trained is fitted but the eager float8 one
    trained = [d for d in (read_result(p) for p in (REPO / "results/runs/float8").glob("*/metrics.json"))
               if d["status"] == "ok" and d["params"].get("device") == "cuda" and not d.get("emulation")]
    assert f"h200: {len(trained) - 1} cells, leave-one-out" in run.stdout


def test_a_kept_allocator_snapshot_is_set_beside_the_memory_models_parts():
    """bench/memory_model.py --snapshots on the float8 cell's snapshot from an H200: the model's
    parameters and optimizer states are what the allocator held; its float8 layers keep no autocast
    copy of their weights, so what is left (activations and other) is within 3% of the snapshot's."""
    run = subprocess.run([sys.executable, "bench/memory_model.py", "--snapshots",
                          "results/bench/float8/memory_snapshot"], cwd=REPO, capture_output=True, text=True,
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
    empty = subprocess.run([sys.executable, "bench/memory_model.py", "--snapshots", "results/runs/holdout"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 1 and "no cell with an allocator snapshot" in empty.stderr


def test_the_minimal_loop_is_gpt2_of_the_cells_shape_written_apart_from_trainbench():
    # bench/minimal_loop.py: the independent reference of bench/minimal_vs_cell.py (issue 34)
    import ast
    import importlib.util

    import torch

    from trainbench.training.gpt import GPT
    from trainbench.registry.models import get_model

    path = REPO / "bench" / "minimal_loop.py"
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert "trainbench" not in imported
    spec = importlib.util.spec_from_file_location("minimal_loop", path)
    minimal_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(minimal_loop)
    for size in ("124m", "350m"):
        with torch.device("meta"):
            minimal = minimal_loop.GPT(*minimal_loop.SIZES[size])
            cell = GPT(get_model(f"gpt2-{size}").with_vocab_multiple(64))
        assert minimal.wte.weight is minimal.lm_head.weight  # tied, as GPT-2 and the cells
        assert (sum(p.numel() for p in minimal.parameters())
                == sum(p.numel() for p in cell.parameters()))
        # MFU's numerator: the cells' count leaves out the final LayerNorm, nanoGPT's keeps it
        ours = get_model(f"gpt2-{size}").train_flops_per_token(1024)
        assert abs(minimal_loop.flops_per_token(minimal) - ours) / ours < 2e-5


def test_the_minimal_loop_can_train_on_the_cells_pool_of_batches(monkeypatch):
    """`batches=4` cycles four different batches, as the cells' data does: with the learning rate at
    0 the weights stay put, so a step's loss names its batch (one batch: every loss the same)."""
    sys.path.insert(0, str(REPO / "bench"))
    import minimal_loop

    monkeypatch.setitem(minimal_loop.SIZES, "tiny", (1, 32, 2))
    monkeypatch.setattr(minimal_loop, "BLOCK", 16)
    for batches, distinct in ((1, 1), (4, 4)):
        step, _ = minimal_loop.build("tiny", 2, accum=1, lr=0.0, device="cpu", batches=batches,
                                     compile=False)
        losses = [round(step().item(), 6) for _ in range(2 * batches)]
        assert len(set(losses)) == distinct
        assert losses[:batches] == losses[batches:]  # the pool comes round again


def test_data_matched_rounds_give_each_loop_a_ratio_to_the_minimal_loop_with_its_interval():
    """--round-loops: every loop of a round is set against that round's minimal window, the mean and
    95% t-interval taken over the rounds, with the clock and power NVML saw in its windows."""
    sys.path.insert(0, str(REPO / "bench"))
    from minimal_vs_cell import rounds_by_loop

    def w(loop, tokens, mhz, r):
        return {"loop": loop, "tag": f"round {r}", "tokens_per_s": tokens, "sm_clock_mhz": mhz,
                "power_w": 690.0, "energy_j_per_step": 170.0, "loss": 10.0 - r}
    item = {"rounds": [], "windows": []}
    for r, (minimal, cell, pool) in enumerate([(100.0, 99.0, 98.0), (102.0, 101.0, 100.0)], start=1):
        item["rounds"].append({"minimal": minimal, "cell": cell, "ratio": cell / minimal,
                               "others": {"minimal pool": pool}})
        item["windows"] += [w("minimal", minimal, 1900, r), w("cell", cell, 1880, r),
                            w("minimal pool", pool, 1870, r)]
    lines = rounds_by_loop(item)
    pool = next(line for line in lines if "minimal pool" in line).split()
    ratios = [98 / 100, 100 / 102]
    mean = sum(ratios) / 2
    half = 12.706 * abs(ratios[0] - ratios[1]) / 2 ** 0.5 / 2 ** 0.5
    assert pool[2:4] == ["99", f"{mean:.3f}"]
    assert f"[{mean - half:.3f}, {mean + half:.3f}]" in " ".join(pool)
    per_cycle = (98 / 1870 + 100 / 1870) / (100 / 1900 + 102 / 1900)  # tokens per MHz, / minimal's
    assert pool[-5:] == ["1870", "690", "170.0", f"{per_cycle:.3f}", "8.000"]  # the last round's loss
    assert next(line for line in lines if line.split()[0] == "minimal").split()[2] == "1.000"


def test_the_draws_set_each_loop_against_its_own_second_draw_and_the_cell_against_the_pool_loop():
    """--variants draws: each loop's second seed over its first, round by round, and the cell over the
    minimal loop on the pool with both draws of each summed; nothing without the four loops."""
    sys.path.insert(0, str(REPO / "bench"))
    from minimal_vs_cell import draws_lines

    figures = [(100.0, 99.0, 100.0, 98.0, 101.0), (102.0, 100.0, 101.0, 99.0, 102.0)]
    item = {"rounds": [{"minimal": m, "cell": c, "others": {"minimal pool": p, "minimal pool draw2": p2,
                                                            "cell draw2": c2}}
                       for m, c, p, p2, c2 in figures]}
    lines = draws_lines(item)
    assert len(lines) == 4
    by_label = {line.strip().split("  ")[0]: line.split()[-3] for line in lines[1:]}
    assert by_label["minimal pool, its second draw / its first"] == f"{(98 / 100 + 99 / 101) / 2:.3f}"
    assert by_label["cell, its second draw / its first"] == f"{(101 / 99 + 102 / 100) / 2:.3f}"
    assert by_label["cell / minimal pool, both draws summed"] == f"{(200 / 198 + 202 / 200) / 2:.3f}"
    del item["rounds"][0]["others"]["cell draw2"], item["rounds"][1]["others"]["cell draw2"]
    assert draws_lines(item) == []


def test_the_comparison_sorts_kernels_into_the_classes_its_attribution_names():
    sys.path.insert(0, str(REPO / "bench"))
    from minimal_vs_cell import classify, generic

    assert classify("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT") == "matmul"
    assert classify("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == "attention"
    assert classify("triton_red_fused__log_softmax__to_copy__unsafe_view_prepare_softmax_online") == "loss"
    assert classify("triton_poi_fused_gelu_gelu_backward_view") == "fused (compiler)"
    assert classify("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert classify("Memcpy HtoD (Pageable -> Device)") == "copies and fills"
    assert generic("triton_poi_fused_add_12") == "triton_poi_fused_add"


def test_pre_registered_parts_are_held_against_the_profiles(tmp_path):
    """A profiled round (holdout_frameworks): each cell's predicted parts beside its profile's, which
    add up to its timed step, and the part that missed most named."""
    report = tmp_path / "check.json"
    run = subprocess.run([sys.executable, "bench/predicted_then_run.py",
                          "results/predictions/holdout_frameworks-h200.csv", "--json", str(report)],
                         cwd=REPO, capture_output=True, text=True, check=True)
    assert "the part that missed most, by cells:" in run.stdout
    entries = json.loads(report.read_text())["entries"]
    assert entries and all(e["parts_ms"] for e in entries)
    for e in entries:
        assert set(e["parts_ms"]) == {"compute", "communication", "optimizer", "framework"}
        profiled = sum(measured for _, measured in e["parts_ms"].values())
        assert profiled == pytest.approx(e["measured_step_s"] * 1e3, rel=1e-3)


def test_emulated_vs_real_takes_communication_as_a_share_and_nccl_beyond_what_the_twin_measured(capsys):
    """bench/emulated_vs_real.py's arithmetic on rows a 2-GPU host would give: the exposed communication
    of the real rank of the emulated rank's number, as a share of its (slower) profiled step; NCCL's
    buffers as the real rank's device memory beyond what the emulated rank measured (its stored figure
    already adds the memory model's figure), by layout; a rank whose outcome differs, listed with both."""
    sys.path.insert(0, str(REPO / "bench"))
    import emulated_vs_real as bench

    real = {"breakdown_per_rank": [{"step_s": 1.0, "parts_s": {"exposed_communication": 0.5}},
                                   {"step_s": 2.0, "parts_s": {"exposed_communication": 0.5}}]}
    assert bench.exposed_share(real, 1) == 0.25 and bench.exposed_share(real, 0) == 0.5
    assert bench.exposed_share({"breakdown": {"step_s": 4.0, "parts_s": {}}}, 0) is None  # not profiled

    def row(rank, status_emulated="ok"):
        figures = {f"{label}_{side}": None for label, _ in bench.MEMORY for side in ("real", "emulated")}
        return {**figures, "cell": "s/c", "rank": rank, "world": 2, "status_real": "ok",
                "status_emulated": status_emulated, "device_real": 10_700.0, "device_emulated": 10_650.0,
                "device_emulated_measured": 10_100.0, "held_real": None, "held_emulated": None,
                "shard_real": 5, "shard_emulated": 5, "step_real_s": 0.5, "step_emulated_s": 0.3,
                "real_exposed_comm_share": 0.25, "layout": "data", "modelled_mib": 550.0}

    ok = row(1)
    assert bench.ratio(ok) == pytest.approx(0.6)
    assert bench.compute_ratio(ok) == pytest.approx(0.3 / (0.5 * 0.75))
    assert bench.compute_ratio({**ok, "real_exposed_comm_share": None}) is None
    bench.print_summary([ok, row(0, status_emulated="oom")])
    said = capsys.readouterr().out
    assert "outcomes: 1 of 2 ranks the same emulated and real; s/c rank 0: real ok, emulated oom" in said
    # 10,700 - 10,100, not - 10,650, beside what the model adds for the layout
    assert "NCCL's buffers, mostly), data: median 600 MiB over 1 ranks (600-600); the model adds 550" in said
    assert "device memory: 1 ranks, |emulated - real| median 0.5%" in said and "median 0.800 over 1" in said


def test_top_kernels_totals_a_traces_kernels_per_step_and_sets_cells_side_by_side(tmp_path):
    # two synthetic GPU traces of 2 profiled steps each: the second cell's extra cast kernels must show
    # in its "other" class and the side-by-side table
    def trace(path, casts):
        events = [{"ph": "X", "name": f"ProfilerStep#{i}", "cat": "user_annotation", "ts": i * 1000,
                   "dur": 1000, "tid": 1} for i in range(2)]
        for i in range(2):
            events.append({"ph": "X", "name": "nvjet_sm90_gemm", "cat": "kernel", "ts": i * 1000, "dur": 400})
            events.append({"ph": "X", "name": "ncclDevKernel_AllGather", "cat": "kernel",
                           "ts": i * 1000 + 400, "dur": 100})
            for k in range(casts):
                events.append({"ph": "X", "name": "triton_poi_fused_to_float8", "cat": "kernel",
                               "ts": i * 1000 + 500 + k * 10, "dur": 10})
                # launched from autograd's thread (tid 2), inside a host op of 40 us
                events.append({"ph": "X", "name": "cuLaunchKernel", "cat": "cuda_driver", "tid": 2,
                               "ts": i * 1000 + 100 + k * 50 + 10, "dur": 5})
                events.append({"ph": "X", "name": "fsdp::all_gather_copy_in", "cat": "cpu_op", "tid": 2,
                               "ts": i * 1000 + 100 + k * 50, "dur": 40})
        import gzip
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": events}, f)
    for name, casts in (("bf16", 0), ("fp8", 5)):
        (tmp_path / name / "profile").mkdir(parents=True)
        trace(tmp_path / name / "profile" / "rank0.json.gz", casts)
    done = subprocess.run([sys.executable, "bench/top_kernels.py",
                           str(tmp_path / "bf16/profile/rank0.json.gz"),
                           str(tmp_path / "fp8/profile/rank0.json.gz"), "--json", str(tmp_path / "k.json"),
                           "--host", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    bf16, fp8 = json.loads((tmp_path / "k.json").read_text())
    assert bf16["steps"] == 2 and bf16["step_ms"] == 1.0
    assert bf16["ms_per_step_by_class"] == {"matmul": 0.4, "collective": 0.1}
    assert fp8["ms_per_step_by_class"]["fused (compiler)"] == pytest.approx(0.05)
    [casts] = [k for k in fp8["kernels"] if k["kernel"] == "triton_poi_fused_to_float8"]
    assert casts["launches_per_step"] == 5
    assert "[1] bf16 | [2] fp8" in done.stdout and "fused (compiler)" in done.stdout
    # the host's side: the thread that launched the casts, its op's own time (less the launches in it)
    [thread] = [t for t in fp8["host"] if t["thread"] == "2"]
    assert thread["launches_per_step"] == 5
    [copy_in] = [op for op in thread["ops"] if op["op"] == "fsdp::all_gather_copy_in"]
    assert copy_in["calls_per_step"] == 5 and copy_in["ms_per_step"] == pytest.approx(5 * 35 / 1e3)
    assert not [t for t in bf16["host"] if t["thread"] == "2"]


def test_leave_one_study_out_predicts_a_study_from_the_others_alone():
    # a study's predictions must not move when its own measurements do, and must move with the others'
    import importlib.util

    spec = importlib.util.spec_from_file_location("time_model_bench", REPO / "bench/time_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from trainbench.predict import time_model

    cells = bench.measured_cells([REPO / "results/runs/holdout", REPO / "results/runs/holdout_mix",
                                  REPO / "results/runs/holdout_5b"])
    works = time_model.stack([c["work"] for c in cells])
    measured = np.array([c["measured_s"] for c in cells])
    studies = [c["doc"]["study"] for c in cells]
    mix = np.array(studies) == "holdout_mix"
    before = bench.leave_study_out(works, measured, studies)
    after = bench.leave_study_out(works, np.where(mix, 2 * measured, measured), studies)
    assert np.allclose(before[mix], after[mix])  # its own steps doubled: its predictions the same
    assert not np.allclose(before[~mix], after[~mix])  # the others' fits saw the doubled steps


def test_the_fsdp_loss_benchmark_times_the_eager_loss_beside_the_compiled_one_on_the_same_steps(tmp_path):
    """bench/fsdp_loss.py: the smoke study's FSDP2 cell as rank 0 of its 2 (fake process group), built
    twice, its loss eager and compiled, windows alternating: both variants train the same steps on the
    same data, so compiling the loss (GPT.compile_loss, as the runner does under torch.compile) must
    leave the loss as the eager function computes it."""
    from trainbench.study.params import CellParams

    cell = CellParams.resolve({"model": "gpt2-tiny", "device": "cpu", "gpus": 2, "seq_len": 64,
                               "micro_batch": 4, "strategy": "fsdp", "framework": "torch"})
    run = subprocess.run([sys.executable, "bench/fsdp_loss.py", "--params", cell.canonical, "--rounds", "2",
                          "--steps", "2", "--warmup", "1", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "fsdp_loss.json").read_text())
    windows = report["windows"]
    # every round runs each variant twice, in an order that alternates between rounds
    assert [w["variant"] for w in windows[:8]] == ["eager", "compiled", "compiled", "eager",
                                                   "compiled", "eager", "eager", "compiled"]
    # the cell compiles no block, so what the compiled variant compiled is its loss alone
    assert report["graphs_compiled"]["eager"] == 0 and report["graphs_compiled"]["compiled"] >= 1
    last = {v: [w["loss"] for w in windows if w["variant"] == v] for v in ("eager", "compiled")}
    assert last["eager"] == pytest.approx(last["compiled"], rel=1e-4)
    assert "step time, eager loss / compiled loss: median" in (tmp_path / "fsdp_loss.txt").read_text()


def test_results_timed_beside_another_cell_on_their_host_are_found_from_their_times(tmp_path, capsys):
    """bench/shared_host.py: two GPU results of one hostname whose runs overlap were timed side by
    side; a third on that host after them, one on another host at the same time, a CPU result and
    one refused before it ran are not. A run known only from the histories (its result replaced since)
    still counts as the company of the results it overlapped."""
    sys.path.insert(0, str(REPO / "bench"))
    import shared_host

    def times(start, end):
        return {"started": f"2026-11-21T15:0{start}:00+00:00", "ended": f"2026-11-21T15:0{end}:00+00:00"}

    def result(name, host, start, end, device="cuda", status="ok"):
        path = tmp_path / "runs" / "s" / name / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"study": "s", "cell_id": name, "params": {"device": device},
                                    "status": status, "provenance": {"hostname": host, **times(start, end)}}))

    def history(name, host, start, end, status="ok"):
        path = tmp_path / "history" / "s" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as lines:
            lines.write(json.dumps({"study": "s", "cell_id": name, "status": status, "provenance": {
                "hostname": host, "gpu_name": "NVIDIA H200", **times(start, end)}}) + "\n")

    result("a1", "a", 0, 3)
    result("a2", "a", 2, 4)
    result("a3", "a", 4, 6)
    result("b1", "b", 1, 5)
    result("cpu", "a", 1, 5, device="cpu")
    result("refused", "a", 2, 2, status="unsupported")
    assert shared_host.main([str(tmp_path / "runs"), "--history", ""]) == 0
    out = capsys.readouterr().out
    assert "s: 2 of 4 GPU results timed beside another cell" in out
    assert "s/a1 " in out and "beside 1: s/a2" in out and "s/a3 " not in out and "s/b1 " not in out

    # b1 ran again since, alone (8-9), and its result is replaced; its history keeps both runs, and
    # the first (1-5) was c1's company
    (tmp_path / "runs" / "s" / "b1" / "metrics.json").unlink()
    (tmp_path / "runs" / "s" / "b1").rmdir()
    result("b1", "b", 8, 9)
    history("b1", "b", 1, 5)
    history("b1", "b", 8, 9)  # the result's own run, in its history too, is not its company
    history("b2", "b", 3, 4, status="unsupported")
    result("c1", "b", 4, 6)
    assert shared_host.main([str(tmp_path / "runs"), "--history", str(tmp_path / "history")]) == 0
    out = capsys.readouterr().out
    assert "s: 3 of 5 GPU results timed beside another cell" in out
    assert ("s/c1 (2026-11-21 15:04:00-15:06:00): beside 1: s/b1 (its run of 2026-11-21, replaced since)"
            in out)
    assert "\n  s/b1 " not in out and "s/b2" not in out


def test_a_rerun_at_other_threads_is_set_against_its_first_run_the_models_ratio_and_the_plan(capsys):
    """bench/rerun_threads.py on published results: megatron's five four-GPU offloaded cells rerun with
    8 CPU threads a rank (results/bench/rerun/megatron-3d21d50) against their first runs with 4, which
    results/runs still holds; a result whose first run had its threads is not set against it."""
    sys.path.insert(0, str(REPO / "bench"))
    import rerun_threads

    runs_root = REPO / "results/runs"
    reruns = REPO / "results/bench/rerun/megatron-3d21d50/runs"
    assert rerun_threads.main(["--first", str(runs_root), str(reruns), str(runs_root / "llama")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("megatron/")]
    assert len(lines) == 5 and all(" 4 -> 8 " in line for line in lines)
    cell = "strategy~zero1__model~gpt-345m__gpus~4__tp~1__offload_optimizer~true"
    first = json.loads((runs_root / "megatron" / cell / "metrics.json").read_text())["metrics"]["step_time_s"]
    rerun = json.loads((reruns / "megatron" / cell / "metrics.json").read_text())["metrics"]["step_time_s"]
    row = next(line for line in lines if line.startswith(f"megatron/{cell[:40]}") and "tp~1__" in line)
    assert f" {rerun / first:.2f} " in row
    # an offloaded optimizer's step: the model expects it shorter at 8 threads than at 4
    assert 0.5 < float(row.split()[5]) < 1
    assert "offloaded, 4 GPUs: 5 cells" in out and "not offloaded" not in out
