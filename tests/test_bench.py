"""The benchmarks in bench/ run end to end on CPU stand-ins (their figures come from GPU hosts)."""

from __future__ import annotations

import json
import subprocess
import sys

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


def test_the_advise_benchmark_times_searches_on_one_core(tmp_path):
    # a tiny search: the benchmark's code paths (its figures come from results/bench/advise)
    done = subprocess.run([sys.executable, "bench/advise.py", "--searches", "gpt2-tiny:1:4", "--repeats", "2",
                           "--host", "one core of a test", "--out", str(tmp_path), "--profile"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [result] = json.loads((tmp_path / "advise.json").read_text())["results"]
    assert result["search"] == "gpt2-tiny on 1 x 8 h100, micro batch 1-4"
    for mode in ("settled", "unsettled"):  # the same search, with and without settled_plugins
        assert result[mode]["setups"] > result[mode]["fit"] > 0 and len(result[mode]["cpu_s"]) == 2
    text = (tmp_path / "advise.txt").read_text()
    assert text.startswith("command: python3 bench/advise.py --searches gpt2-tiny:1:4")
    assert "one core of a test (" in text and "goal: 10,000 set-ups in under 60 s" in text
    assert "profile of one search of gpt2-tiny" in text
