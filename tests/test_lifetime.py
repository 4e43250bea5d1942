"""A cell never outlives its driver: real Snakemake, real launchers, real signals, on CPU ranks.

Each test starts a two-rank DDP cell that would time for a minute, waits until its ranks are timing,
then kills one process of the tree and checks that every process of the cell (the job's shell, the
cell runner, torchrun, both ranks, the memory sampler) is gone within 10 s and no result was written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import tiny_study

TARGET = "results/runs/t/default/metrics.json"


def long_cell_config() -> dict:
    study = tiny_study(strategy="ddp", gpus=2)
    study["include"] = [{}]
    # a cell that keeps timing for a minute: an interval it can never reach, a cap of 60 s
    study["timing"] = {"target_ci": 1e-6, "max_timed_s": 60, "min_window_s": 0}
    return {"studies": {"t": study}}


def start(workflow) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """Snakemake running the long cell; returns it and the cell's processes once its ranks time."""
    workflow.write_config(long_cell_config())
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", TARGET], cwd=workflow.root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = workflow.path("results/runs/t/default/log")
    deadline = time.monotonic() + 180
    while not (log.exists() and "window 1 " in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "the cell never started timing"
        time.sleep(0.5)
    tree = psutil.Process(proc.pid).children(recursive=True)
    commands = " ".join(" ".join(p.cmdline()) for p in tree)
    for part in ("trainbench run-cell", "torch.distributed.run", "trainbench.execute.worker",
                 "trainbench.execute.memory_sampler"):
        assert part in commands, part
    return proc, tree


def assert_gone_within(processes: list[psutil.Process], seconds: float) -> None:
    _, alive = psutil.wait_procs(processes, timeout=seconds)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"still running after {seconds} s: {[' '.join(p.cmdline())[:100] for p in alive]}"


def kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_cell_stops_with_the_snakemake_that_started_it(workflow, signum):
    proc, tree = start(workflow)
    try:
        proc.send_signal(signum)
        assert_gone_within([psutil.Process(proc.pid), *tree], 10)
        assert not workflow.path(TARGET).exists()  # not a result: it runs again next time
        if signum == signal.SIGKILL:  # Snakemake could not clean up: the next run says how to go on
            result = workflow.snakemake("-n", TARGET, check=False)
            assert ("was stopped without cleaning up" in result.stderr
                    and "snakemake --unlock" in result.stderr)
            workflow.snakemake("--unlock")
        assert "train_cell" in workflow.planned(TARGET)
    finally:
        kill_tree(proc)


def test_ranks_stop_when_their_cell_runner_is_killed(workflow):
    proc, tree = start(workflow)
    try:
        runner = next(p for p in tree if "trainbench run-cell" in " ".join(p.cmdline()))
        below = runner.children(recursive=True)
        runner.kill()
        assert_gone_within(below, 10)
        proc.wait(timeout=60)  # Snakemake sees its job fail
        assert not workflow.path(TARGET).exists()
    finally:
        kill_tree(proc)


def test_a_rank_killed_mid_step_stops_its_peers_and_the_cell_is_failed(workflow):
    proc, tree = start(workflow)
    try:
        ranks = [p for p in tree if "-m trainbench.execute.worker" in " ".join(p.cmdline())
                 and "torch.distributed.run" not in " ".join(p.cmdline())]
        assert len(ranks) == 2
        ranks[1].kill()
        assert_gone_within(ranks, 30)  # torchrun stops the peer that waits in a collective
        proc.wait(timeout=120)
        doc = json.loads(workflow.path(TARGET).read_text())
        assert doc["status"] == "failed"
    finally:
        kill_tree(proc)


def test_the_cell_runner_notices_its_launchers_exit_when_it_happens():
    # the runner waits on its launchers in steps (to check its deadline): a step must end at the exit,
    # not run its length out, or every cell pays half a step after its launcher is done
    from trainbench.execute.watch import wait_for_an_exit

    launcher = subprocess.Popen(["sleep", "0.2"])
    started = time.monotonic()
    wait_for_an_exit([launcher.pid], timeout=60)
    assert time.monotonic() - started < 30, "waited for the step's end, not for the exit"
    assert launcher.poll() == 0


def test_the_driver_is_the_nearest_snakemake_above_the_cell_runner(tmp_path):
    # read from /proc (psutil's import is 10 ms of every cell): the parent of a process whose name holds
    # spaces and parentheses, and the command line of a process that calls itself snakemake
    middle = ("import ctypes, subprocess, sys\n"
              "ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0)  # PR_SET_NAME: this process's comm\n"
              "sys.exit(subprocess.call([sys.executable, '-c', "
              "'from trainbench.execute.watch import driver_pid; print(driver_pid())']))\n")
    script = tmp_path / "middle.py"
    script.write_text(middle)
    top = subprocess.Popen([sys.executable, "-c",
                            "import subprocess, sys; sys.exit(subprocess.call(sys.argv[2:]))",
                            "--snakemake-lookalike", sys.executable, str(script)],
                           stdout=subprocess.PIPE, text=True)
    out, _ = top.communicate(timeout=60)
    assert top.returncode == 0 and int(out) == top.pid
