"""A rank that dies, freezes or hangs: the cell ends within seconds (not at its time limit), its result
says which rank and how, nothing of it outlives it, and a failure of the infrastructure (a signal, a
freeze) is run again by the next run while a failure of the cell's own (a hang) stands. On CPU ranks
(gloo) through Snakemake, as a GPU cell runs; test_slurm.py does the same through SLURM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainbench.execute import watch
from trainbench.reporting.freshness import CURRENT, RETRY, result_state
from trainbench.study.config import load_config

from conftest import Workflow, tiny_study

# long enough to be caught training: timed until the cap, which the interval never ends before
LONG_TIMING = {"target_ci": 0.0001, "max_timed_s": 300, "min_window_s": 0.05}


def long_cell(workflow: Workflow, **timing) -> tuple:
    study = tiny_study(strategy="ddp", gpus=2, timed_steps=100_000)
    study["include"] = [{}]
    study["timing"] = {**LONG_TIMING, **timing}
    workflow.write_config({"studies": {"r": study}})
    return load_config(workflow.path("config.yaml")).study("r").cells[0]


def start(workflow: Workflow, cell, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", cell.target],
                            cwd=workflow.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})


def rank_at_step(workflow: Workflow, cell, rank: int, step: int, proc: subprocess.Popen) -> watch.Progress:
    """Rank `rank`'s progress once it has reached `step`."""
    progress = workflow.path(cell.target).parent / ".work" / watch.PROGRESS_DIR / f"rank{rank}"
    deadline = time.monotonic() + 240
    while True:
        seen = watch.Progress.read(progress)
        if seen is not None and seen.step >= step:
            return seen
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)


def no_process_left(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig, words", [
    (signal.SIGKILL, "rank 1 on {host} ended by SIGKILL (signal 9)"),
    (signal.SIGSTOP, "rank 1 on {host} (pid {pid}) was stopped (SIGSTOP) at step"),
])
def test_a_rank_killed_or_stopped_ends_its_cell_in_seconds_and_the_next_run_runs_it_again(workflow, sig,
                                                                                          words):
    cell = long_cell(workflow)
    proc = start(workflow, cell)
    try:
        rank = rank_at_step(workflow, cell, 1, 5, proc)
        os.kill(rank.pid, sig)
        signalled = time.monotonic()
        output = proc.communicate(timeout=120)[0]
        ended_s = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(workflow.path(cell.target).read_text())
    assert doc["status"] == "failed" and doc.get("failure") == "infrastructure", doc["reason"]
    assert words.format(host=rank.host, pid=rank.pid) in doc["reason"], doc["reason"]
    assert ended_s < 30, f"the cell ended {ended_s:.0f} s after the signal:\n{output[-2000:]}"
    deadline = time.monotonic() + 15  # nothing of the cell outlives it: the stopped rank neither
    while not no_process_left(rank.pid):
        assert time.monotonic() < deadline, f"rank 1 (pid {rank.pid}) outlived its cell"
        time.sleep(0.2)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(workflow.root) in " ".join(
        p.info["cmdline"] or []) and "trainbench.execute.worker" in " ".join(p.info["cmdline"] or [])]
    assert result_state(cell, workflow.path(cell.target)).kind == RETRY
    dry = workflow.snakemake("-n", cell.target)
    assert "rule train_cell:" in dry.stdout, dry.stdout[-3000:] + dry.stderr[-3000:]  # it runs again


def test_a_rank_that_hangs_ends_its_cell_at_the_stall_limit_as_the_cells_own_failure(workflow):
    cell = long_cell(workflow, stall_s=8)
    proc = start(workflow, cell, env={"TRAINBENCH_HANG_AT_STEP": "1:6"})
    try:
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(workflow.path(cell.target).read_text())
    assert doc["status"] == "failed" and "failure" not in doc, (doc["status"], doc.get("reason"),
                                                                output[-2000:])
    assert "rank 1 made no progress for" in doc["reason"], doc["reason"]
    assert "(the limit: 8 s), last at step 5; the others at step 6" in doc["reason"], doc["reason"]
    assert doc["metrics"]["wall_time_s"] < 200  # long before the cell's time limit (300 s of timing alone)
    assert result_state(cell, workflow.path(cell.target)).kind == CURRENT  # a result: it stands


def test_the_launchers_root_cause_names_the_rank_and_its_signal():
    report = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 15381)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_17:37:11
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 15382)  (SIGKILL)
"""
    assert watch.root_cause(report) == (1, -9)
    assert watch.describe_exit(-9) == "SIGKILL (signal 9)" and watch.describe_exit(3) == "exit status 3"
    assert watch.root_cause("no report") is None


def test_a_rank_killed_is_named_when_a_peer_that_failed_for_its_loss_ties_for_the_root_cause(tmp_path):
    """torchrun's own report, made by torch: rank 1 killed and rank 0 failing for its loss in the same
    second. torchrun names rank 0 the root cause (the lower rank of a tie); the cell names rank 1."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from trainbench.execute.cellrun import classify

    missing = str(tmp_path / "no-error-file.json")
    peer, killed = ProcessFailure(0, 101, 1, missing), ProcessFailure(1, 102, -9, missing)
    killed.timestamp = peer.timestamp
    report = ChildFailedError("worker", {0: peer, 1: killed}).format_msg()
    assert watch.root_cause(report) == (0, 1) and watch.failures(report) == [(0, 1), (1, -9)]
    (tmp_path / "rank0.json").write_text(json.dumps({
        "rank": 0, "event": "error", "phase": "step", "step": 6,
        "message": "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"}))
    outcome = classify(tmp_path, 1, False, 100, 2, None, report)
    assert outcome.status == "failed" and outcome.infrastructure, outcome.reason
    assert outcome.reason.startswith("rank 1 ended by SIGKILL (signal 9)"), outcome.reason


def test_the_stall_limit_follows_the_slowest_step_with_a_floor(tmp_path):
    ranks = watch.RankWatch(tmp_path)
    folder = tmp_path / watch.PROGRESS_DIR
    folder.mkdir()
    now = time.time()
    for rank, pid in ((0, os.getpid()), (1, os.getpid())):
        host = watch.socket.gethostname()
        (folder / f"rank{rank}").write_text(f"{rank} {pid} {host} 4 step {now - 10:.3f}\n")
    assert ranks.check(now) is None and ranks.stall_limit() == watch.STALL_FLOOR_S
    (folder / "rank0").write_text(f"0 {os.getpid()} {watch.socket.gethostname()} 5 step {now + 10:.3f}\n")
    ranks.check(now + 10)
    assert ranks.slowest_step == pytest.approx(20.0) and ranks.stall_limit() == 400  # 20 steps of 20 s
    verdict = ranks.check(now + 500)
    assert verdict.kind == "stalled" and verdict.rank == 1 and "the others at step 5" in verdict.reason
    assert not verdict.infrastructure
    (tmp_path / "result.json").write_text("{}")  # the cell ended: ranks leaving are no failure
    assert ranks.check(now + 500) is None


def test_sweep_kills_a_stopped_process_in_a_session_of_its_own(tmp_path):
    token = f"test-{time.time_ns()}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True, env={**os.environ, watch.CELL_TOKEN_ENV: token})
    try:
        deadline = time.monotonic() + 10  # its environment readable once the interpreter is up
        while not watch.processes_of(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGSTOP)
        assert [p.pid for p in watch.processes_of(token)] == [child.pid]
        assert watch.sweep(token) == [child.pid]
        assert no_process_left(child.pid)  # (sweep reaped it: it was this test's child)
    finally:
        if child.poll() is None:
            child.kill()
    assert watch.processes_of(token) == []


def test_a_rank_that_failed_and_said_why_is_not_taken_for_a_lost_one(tmp_path):
    from trainbench.execute.cellrun import classify

    (tmp_path / "rank1.json").write_text(json.dumps({"rank": 1, "event": "error", "phase": "step",
                                                     "step": 3, "message": "RuntimeError: boom"}))
    report = "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n" \
             "  exitcode  : 1 (pid: 99)\n"
    outcome = classify(tmp_path, 1, False, 100, 2, None, report)
    assert outcome.status == "failed" and outcome.reason == "rank 1: RuntimeError: boom"
    assert not outcome.infrastructure
    assert Path(tmp_path).exists()
