"""Running one cell for real on CPU ranks: outcomes, retries, limits, and what a killed run leaves."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainbench.execute.cellrun import CellRun, classify, run_cell
from trainbench.study.grid import Cell
from trainbench.study.params import CellParams
from trainbench.registry.models import get_model
from trainbench.contract.result import PHASES, read_json, schema_problems
from trainbench.execute.worker import FAIL_AT_STEP_ENV

from conftest import TINY, make_cell


def test_provenance_reads_each_packages_name_and_version_as_importlib_metadata_does():
    # every cell's provenance lists every installed package; reading only the metadata's header lines
    # (ten times faster) must find what importlib.metadata's full parse finds, for each one here
    import importlib.metadata

    from trainbench.execute.provenance import installed_packages, name_and_version, package_versions

    distributions = list(importlib.metadata.distributions())
    assert len(distributions) > 20
    for dist in distributions:
        assert name_and_version(dist) == (dist.metadata["Name"], dist.version), dist
    assert installed_packages()["torch"] == package_versions()["torch"] == importlib.metadata.version("torch")



def test_the_gpu_topology_is_kept_as_text_without_terminal_styling(tmp_path, monkeypatch):
    # nvidia-smi underlines `topo -m`'s header with escapes even into a pipe (the H200 hosts' 580 driver)
    from trainbench.execute.provenance import gpu_topology

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '\\033[4mGPU0\\tCPU Affinity\\033[0m\\nGPU0\\t X \\t0-15\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpu_topology() == "GPU0\tCPU Affinity\nGPU0\t X \t0-15"


def test_host_memory_is_what_psutil_says_without_importing_it():
    from trainbench.registry.hardware import host_memory_mib

    assert host_memory_mib() == psutil.virtual_memory().total / 2**20


def test_the_host_cpu_model_is_read_from_cpuinfo(tmp_path):
    from trainbench.execute.provenance import cpu_model

    cpuinfo = tmp_path / "cpuinfo"
    name = "AMD EPYC 9654 96-Core Processor"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: {name}\nflags\t\t: fpu\n\n"
                       f"processor\t: 1\nmodel name\t: {name}\n")
    assert cpu_model(cpuinfo) == name
    if Path("/proc/cpuinfo").exists():  # this host's, as every run's provenance has it
        assert cpu_model() and cpu_model() in Path("/proc/cpuinfo").read_text()


def test_the_hosts_pace_is_the_time_of_a_fixed_piece_of_work_and_grows_with_it(monkeypatch, tmp_path):
    from trainbench.execute.provenance import host_pace_ms

    # ten times the work takes longer, whatever else the machine runs (each the fastest of 3 tries)
    assert host_pace_ms(repeats=3, calls=40_000) > host_pace_ms(repeats=3, calls=4_000) > 0
    # no timing taken (the child prints inf) and a child that cannot start: no figure, never a made-up one
    assert host_pace_ms(repeats=0) is None
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    assert host_pace_ms(repeats=1, calls=10) is None


def test_host_facts_come_from_their_own_thread_and_its_errors_are_not_lost():
    import threading

    from trainbench.execute.provenance import HostFacts

    facts = HostFacts(lambda: {"read_on": threading.current_thread().name})
    facts.start()
    assert facts.get() == {"read_on": "host-facts"} and facts.get() is facts.get()
    assert HostFacts(lambda: {"x": 1}).get() == {"x": 1}  # taken without a start: read then

    def broken():
        raise OSError("no metadata")

    with pytest.raises(OSError, match="no metadata"):
        HostFacts(broken).get()

def run(cell: Cell, tmp_path: Path, *, retries: int = 0, runtime_min: float = 5,
        search_probe: bool = False) -> dict:
    output = tmp_path / "results/runs/t/c/metrics.json"
    assert run_cell(cell, output, runtime_min=runtime_min, retries=retries, search_probe=search_probe) == 0
    doc = read_json(output)
    assert schema_problems(doc) == []
    assert not (output.parent / ".work").exists()
    return doc


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_a_result_is_kept_when_its_history_cannot_be_written(tmp_path, capsys):
    (tmp_path / "results/history").mkdir(parents=True)
    (tmp_path / "results/history/t").write_text("")  # a file where the study's history folder goes
    doc = run(make_cell(strategy="single", timed_steps=2), tmp_path)
    assert doc["status"] == "ok"
    assert "could not add the result to its history" in capsys.readouterr().out


def test_single_rank_cell_measures_and_records_everything(tmp_path):
    cell = make_cell(strategy="single", timed_steps=4)
    doc = run(cell, tmp_path)
    m = doc["metrics"]
    assert doc["status"] == "ok" and doc["reason"] is None
    assert doc["params"] == cell.params.as_dict() and doc["params_hash"] == cell.params_hash
    # six timed windows (the fewest that give a 95% interval of the median), their mean step times kept
    assert m["windows"] == len(m["step_times_s"]) == 6
    assert m["steps_timed"] == 6 * m["steps_per_window"] >= 4
    assert m["step_time_s"] == pytest.approx(statistics.median(m["step_times_s"]), rel=1e-3)
    assert m["step_time_s_ci"] == pytest.approx([min(m["step_times_s"]), max(m["step_times_s"])], rel=1e-3)
    assert m["samples_per_s"] == pytest.approx(2 / m["step_time_s"], rel=1e-3)
    assert m["samples_per_s_ci"] == pytest.approx([2 / max(m["step_times_s"]), 2 / min(m["step_times_s"])],
                                                  rel=1e-3)
    assert m["ci_half_width"] == pytest.approx((max(m["step_times_s"]) - min(m["step_times_s"])) / 2
                                               / m["step_time_s"], rel=1e-2)
    # FAST_TIMING stops at the sixth window, asking for ±100%: noisy only where the windows spread wider
    assert m["noisy"] is (m["ci_half_width"] > 1.0) and "after 6 windows" in m["timing"]["stopped"]
    # provenance enough to set the run up again: every package, the variables that steer the stack,
    # and the framework's own settings beside metrics.json
    prov = doc["provenance"]
    assert prov["packages"]["torch"] == prov["versions"]["torch"] and "jsonschema" in prov["packages"]
    assert (prov["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            and prov["environment"]["OMP_NUM_THREADS"] == "1")
    torch_config = json.loads((tmp_path / "results/runs/t/c/torch_config.json").read_text())
    assert torch_config["wrapper"] is None and torch_config["optimizer"]["type"] == "AdamW"
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 16, rel=1e-3)
    assert m["params_total"] == get_model("gpt2-tiny").param_count()
    assert sum(m["params_per_module_rank0"].values()) == m["params_total"]
    assert math.isfinite(m["loss_first"]) and math.isfinite(m["loss_last"])
    assert m["mfu"] is None and m["gpu_mem_used_mib"] is None  # a CPU: no peak FLOPS, no GPU
    assert "energy_j_per_step" not in m and "gpu_energy_j_per_rank" not in m  # nor a GPU's energy counter
    assert m["host_mem_peak_mib"] > 50
    prov = doc["provenance"]
    assert prov["versions"]["torch"] and prov["hostname"] and prov["started"] <= prov["ended"]
    assert prov["host_pace_ms"] > 0  # the host's pace, beside its CPU model (host-bound cells move with it)
    assert "trainbench.execute.worker" in prov["command"]
    # where the wall time went: phases in order that add up to it, the timed windows among them
    phases = m["phases_s"]
    assert list(phases) == [name for name, _, _ in PHASES] and min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(m["wall_time_s"], abs=0.05)
    assert phases["timed"] >= m["step_time_s"] * m["steps_timed"] * 0.9
    assert phases["imports"] > 0.1 and phases["launch"] < 1  # torch's import; plain python starts the rank
    assert phases["builds"] < 0.1  # a CPU cell compiles and loads no DeepSpeed op
    assert m["timed_share"] == pytest.approx(phases["timed"] / m["wall_time_s"], abs=1e-3)



def test_the_host_facts_are_read_while_the_ranks_start(tmp_path):
    # reading every package's metadata and asking git is 35-50 ms of each cell: done while the launcher
    # starts, not before it nor after it exits
    from trainbench.execute.provenance import HostFacts, host_facts

    cell = make_cell(strategy="single")
    run_ = CellRun(cell, tmp_path / "results/runs/t/c/metrics.json", runtime_min=5, retries=0)
    seen = {}

    def read() -> dict:
        seen["launchers_running"] = [child.poll() is None for child in run_._children]
        return {**host_facts(), "hostname": "read-while-launching"}

    run_.host_facts = HostFacts(read)
    doc = run_.run()
    assert doc["status"] == "ok" and seen["launchers_running"] == [True]
    assert (doc["provenance"]["hostname"] == "read-while-launching"
            and "torch" in doc["provenance"]["packages"])

def test_ddp_on_two_ranks_reports_every_rank(tmp_path):
    doc = run(make_cell(strategy="ddp", gpus=2), tmp_path)
    assert doc["status"] == "ok"
    phases = doc["metrics"]["phases_s"]  # torchrun starts first, then the ranks: a phase of its own
    assert (phases["launch"] > 0
            and sum(phases.values()) == pytest.approx(doc["metrics"]["wall_time_s"], abs=0.05))
    assert len(doc["metrics"]["host_rss_peak_mib_per_rank"]) == 2
    assert "torch.distributed.run --standalone --nproc-per-node=2" in doc["provenance"]["command"]
    # the memory model's prediction is recorded, and on CPU ranks it is within a quarter of what they held
    predicted = doc["predicted"]
    assert predicted["fits"] is True and predicted["gpu_mem_mib"] is None
    assert predicted["host_mem_mib"] == pytest.approx(doc["metrics"]["host_mem_peak_mib"], rel=0.25)


def test_a_cell_predicted_not_to_fit_is_recorded_infeasible_without_running(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_MEMORY_LIMITS", "host=0.2")  # plan as if the host had 205 MiB
    doc = run(make_cell(strategy="ddp", gpus=2), tmp_path)
    assert doc["status"] == "infeasible"
    assert doc["reason"].startswith("predicted ") and "host memory per node > 0.2 GiB" in doc["reason"]
    assert "TRAINBENCH_FORCE_INFEASIBLE=1" in doc["reason"]
    assert doc["predicted"]["fits"] is False and doc["provenance"]["command"] == ""
    assert doc["metrics"]["step_time_s"] is None


@pytest.mark.parametrize("how", ["environment", "search probe"])
def test_a_forced_infeasible_cell_runs_and_says_it_was_forced(tmp_path, monkeypatch, how):
    # A max-batch probe always runs: the search measures the boundary the model only predicts.
    monkeypatch.setenv("TRAINBENCH_MEMORY_LIMITS", "host=0.2")
    if how == "environment":
        monkeypatch.setenv("TRAINBENCH_FORCE_INFEASIBLE", "1")
    doc = run(make_cell(strategy="single"), tmp_path, search_probe=how == "search probe")
    assert doc["status"] == "ok"
    assert doc["predicted"]["fits"] is False and doc["predicted"]["forced"] is True


def test_a_malformed_memory_limit_is_an_error_naming_the_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINBENCH_MEMORY_LIMITS", "host=lots")
    output = tmp_path / "metrics.json"
    assert run_cell(make_cell(strategy="single"), output, runtime_min=5, retries=0) == 2
    assert "TRAINBENCH_MEMORY_LIMITS='host=lots'" in capsys.readouterr().err and not output.exists()


def test_an_oom_at_a_step_is_a_result_with_its_step(tmp_path):
    # A real allocation too large for any machine fails in the allocator on rank 0 and rank 1 of a
    # DDP run, at step 2: the same handler a GPU's OutOfMemoryError goes through.
    doc = run(make_cell(strategy="ddp", gpus=2, inject_oom_at_step=2), tmp_path, retries=2)
    assert doc["status"] == "oom"
    assert doc["reason"].startswith("OOM at step 2 (timed) on rank")
    assert "can't allocate memory" in doc["reason"]
    assert doc["attempts"] == 1  # an OOM is deterministic: never retried
    assert doc["metrics"]["step_time_s"] is None and doc["metrics"]["wall_time_s"] > 0


def test_an_oom_while_building_the_model_is_an_oom_at_init(tmp_path):
    doc = run(make_cell(strategy="single", inject_oom_at_step=0), tmp_path)
    assert doc["status"] == "oom"
    assert doc["reason"].startswith("OOM at init (cannot even initialize the model)")


def test_an_unexpected_failure_is_retried_then_recorded_with_its_error(tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_AT_STEP_ENV, "1")
    doc = run(make_cell(strategy="single"), tmp_path, retries=1)
    assert doc["status"] == "failed"
    assert doc["attempts"] == 2
    assert "RuntimeError: injected failure at step 1" in doc["reason"]


def test_a_run_past_its_time_limit_is_stopped_and_recorded_as_timeout(tmp_path):
    started = time.monotonic()
    doc = run(make_cell(strategy="ddp", gpus=2, timed_steps=10**6), tmp_path, runtime_min=0.15, retries=3)
    assert doc["status"] == "timeout" and doc["attempts"] == 1
    assert "time limit of 8 s" in doc["reason"]
    assert time.monotonic() - started < 60


def test_the_deepspeed_launcher_starts_a_zero_run(tmp_path):
    doc = run(make_cell(framework="deepspeed", strategy="zero3", gpus=2, launcher="deepspeed"), tmp_path)
    assert doc["status"] == "ok", doc["reason"]
    assert "deepspeed.launcher.runner --num_gpus 2" in doc["provenance"]["command"]
    config = read_json(tmp_path / "results/runs/t/c/deepspeed_config.json")
    assert config["zero_optimization"]["stage"] == 3 and config["train_batch_size"] == 4
    # ZeRO-3: rank 0 holds half of every partitioned parameter
    held = sum(doc["metrics"]["params_per_module_rank0"].values())
    assert held == pytest.approx(doc["metrics"]["params_total"] / 2, rel=0.01)


def test_an_unsupported_cell_is_recorded_without_launching(tmp_path):
    doc = run(make_cell(framework="deepspeed", strategy="zero1", ort=True), tmp_path)
    assert doc["status"] == "unsupported" and "onnxruntime-training" in doc["reason"]
    assert doc["provenance"]["command"] == ""


def test_deepspeed_fp16_on_a_cpu_that_does_not_compute_fp16_is_unsupported_not_failed(tmp_path, monkeypatch):
    """DeepSpeed's CPU accelerator refuses fp16 where oneDNN has none (AMD EPYC, older Intel): the cell
    says so without launching, as any cell the stack cannot run here does."""
    from trainbench.execute import cellrun

    monkeypatch.setattr(cellrun, "cpu_computes_fp16", lambda: False)
    doc = run(make_cell(framework="deepspeed", strategy="zero1", gpus=2, precision="fp16"), tmp_path)
    assert doc["status"] == "unsupported" and "AVX512-FP16" in doc["reason"], doc["reason"]
    assert doc["provenance"]["command"] == ""
    for allowed in ({"framework": "deepspeed", "strategy": "zero1", "precision": "bf16"},
                    {"framework": "torch", "strategy": "single", "precision": "fp16"},
                    {"framework": "deepspeed", "strategy": "zero1", "precision": "fp16", "device": "cuda"}):
        assert cellrun.no_fp16_here(CellParams.resolve({**TINY, **allowed})) is None, allowed
    monkeypatch.setattr(cellrun, "cpu_computes_fp16", lambda: True)
    assert cellrun.no_fp16_here(CellParams.resolve({**TINY, "framework": "deepspeed", "strategy": "zero1",
                                                    "precision": "fp16"})) is None


@pytest.mark.parametrize("params, message", [
    ({"framework": "deepspeed", "strategy": "zero1", "pp": 2, "tp": 2, "gpus": 4},
     "pipeline and tensor parallelism together have no runner"),
    ({"framework": "lightning", "strategy": "ddp", "gpus": 2}, "lightning cannot build model family 'gpt'"),
    ({"strategy": "single", "device": "cuda"}, "needs 1 GPUs; this machine has 0"),
])
def test_a_cell_that_cannot_run_here_writes_nothing(tmp_path, monkeypatch, capsys, params, message):
    monkeypatch.setenv("TRAINBENCH_FAKE_GPUS", "0")
    output = tmp_path / "metrics.json"
    assert run_cell(make_cell(**params), output, runtime_min=5, retries=0) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_killed_run_leaves_no_metrics_and_no_ranks(tmp_path):
    cell = make_cell(strategy="ddp", gpus=2, timed_steps=10**6)
    output = tmp_path / "results/runs/t/killed/metrics.json"
    log = tmp_path / "log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainbench", "run-cell", "--study", "t", "--cell", "killed",
             "--params", cell.canonical, "--output", str(output), "--cpus-per-rank", "1"],
            stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "step 1/" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert not output.exists() and not (output.parent / ".work").exists()
        time.sleep(1)
        assert _processes_mentioning(str(output.parent)) == []
    finally:  # never leave a million-step run behind, whatever failed above
        for leftover in [psutil.Process(proc.pid)] if proc.poll() is None else []:
            leftover.kill()
        for leftover in _processes_mentioning(str(output.parent)):
            leftover.kill()


# --- classification of what the ranks left behind (no launch) -----------------------------

def _rank(work, rank, **record):
    (work / f"rank{rank}.json").write_text(json.dumps({"rank": rank, **record}))


def test_classify_takes_the_earliest_oom_step_over_ranks(tmp_path):
    _rank(tmp_path, 1, event="oom", phase="step", step=7, message="CUDA out of memory")
    _rank(tmp_path, 0, event="oom", phase="step", step=5, message="CUDA out of memory")
    outcome = classify(tmp_path, 1, False, 100, warmup_steps=3)
    assert outcome.status == "oom" and outcome.reason.startswith("OOM at step 5 (timed) on rank 0, 1: "
                                                                 "CUDA out of memory")


def test_classify_prefers_an_oom_over_a_peer_killed_by_the_launcher(tmp_path):
    _rank(tmp_path, 0, event="error", phase="step", step=3, message="RuntimeError: NCCL communicator aborted")
    _rank(tmp_path, 1, event="oom", phase="step", step=3, message="CUDA out of memory")
    assert classify(tmp_path, 1, False, 100, warmup_steps=1).status == "oom"


def test_classify_reports_a_signal_when_no_rank_said_anything(tmp_path):
    outcome = classify(tmp_path, -9, False, 100, warmup_steps=1)
    assert outcome.status == "failed" and "signal 9 (SIGKILL)" in outcome.reason


def test_stop_time_leaves_room_to_write_the_result():
    from trainbench.execute.cellrun import stop_time_s

    assert stop_time_s(30) == 30 * 60 - 60
    assert stop_time_s(1) == pytest.approx(54)
    assert CellRun(make_cell(strategy="single"), Path("x"), runtime_min=10, retries=0).timeout_s == 540


# --- multi-node launch: two "nodes" on this host joining one c10d rendezvous ---------------------

@pytest.mark.parametrize("framework, strategy", [("torch", "ddp"), ("deepspeed", "zero3")])
def test_two_nodes_on_one_host_join_one_rendezvous(tmp_path, monkeypatch, framework, strategy):
    monkeypatch.setenv("TRAINBENCH_SIMULATE_NODES", "1")
    doc = run(make_cell(framework=framework, strategy=strategy, nodes=2, gpus=2), tmp_path)
    assert doc["status"] == "ok", doc["reason"]
    command = doc["provenance"]["command"]
    # the same torchrun started once per node, meeting at one c10d endpoint
    assert command.count("--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:") == 2
    assert len(doc["metrics"]["host_rss_peak_mib_per_rank"]) == 2
    assert doc["params"]["dp"] == 2 and doc["metrics"]["samples_per_s"] > 0


def test_a_multi_node_cell_outside_slurm_says_where_it_can_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRAINBENCH_SIMULATE_NODES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert run_cell(make_cell(strategy="ddp", nodes=2, gpus=2), tmp_path / "m.json", runtime_min=5,
                    retries=0) == 2
    assert "a 2-node cell runs inside a SLURM allocation" in capsys.readouterr().err
