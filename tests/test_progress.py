"""`trainbench progress`: a study's grid while it runs, read from real result trees (the published
megatron cells copied, some of them put back to running, failed, waiting), through the CLI as a user
runs it."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainbench.study.config import load_config
from trainbench.reporting.progress import DONE, ELSEWHERE, FAILED, RUNNING, WAITING, duration, survey

from conftest import PROJECT_CONFIG, REPO

STUDY = "megatron"
CONFIG = PROJECT_CONFIG


@pytest.fixture
def grid(tmp_path):
    """The published megatron results in a tree of their own, with one cell running (its scratch
    folder 30 s old, no result), one failed, one missing (waiting), one made with other parameters
    (waiting) and one that is not a result (waiting)."""
    study = load_config(CONFIG).study(STUDY)
    measured = [c for c in study.cells if c.measured]
    for cell in measured:
        (tmp_path / cell.target).parent.mkdir(parents=True)
        shutil.copy(REPO / cell.target, tmp_path / cell.target)
    running, failed, missing, stale, broken = (tmp_path / c.target for c in measured[:5])
    running.unlink()
    (running.parent / ".work").mkdir()
    (running.parent / ".work" / "cell.json").write_text("{}")
    os.utime(running.parent / ".work" / "cell.json", (time.time() - 30, time.time() - 30))
    _edit(failed, status="failed", reason="RuntimeError: NCCL error on rank 1")
    missing.unlink()
    _edit(stale, params_hash="0" * 12)
    broken.write_text('{"status": "ok"}')
    return tmp_path, study, measured


def _edit(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def test_cells_are_counted_as_their_files_show_them_and_the_time_left_comes_from_measured_cells(grid):
    root, study, measured = grid
    progress = survey(study, root, gpus_here=8)
    states = {c.cell_id: c for c in progress.cells}
    ids = [c.cell_id for c in measured]
    assert [states[i].state for i in ids[:5]] == [RUNNING, FAILED, WAITING, WAITING, WAITING]
    assert {states[i].state for i in ids[5:]} == {DONE}
    assert states[ids[1]].note == "failed: RuntimeError: NCCL error on rank 1"
    assert states[ids[3]].note == "parameters changed since it ran"
    assert states[ids[4]].note.startswith("its result is not one (")
    assert progress.planned == len(study.cells) - len(measured) > 0  # planned cells: not the table's
    # every cell that ran (done or failed) has its wall time; the median is what the others take
    walls = [json.loads((root / c.target).read_text())["metrics"]["wall_time_s"] for c in measured[5:]]
    walls.append(json.loads((REPO / measured[1].target).read_text())["metrics"]["wall_time_s"])
    median = statistics.median(walls)
    assert states[ids[2]].expected_s == median and states[ids[0]].expected_s == median
    assert 29 <= states[ids[0]].elapsed_s < 60
    # one cell runs now: the three waiting ones and the running one's rest, one at a time
    assert progress.left_s == pytest.approx(3 * median + max(0.0, median - states[ids[0]].elapsed_s))
    assert not progress.finished
    # on a machine without GPUs the cells nobody runs yet cannot run here; the running one still runs
    here = survey(study, root, gpus_here=0)
    assert [c.state for c in here.cells if c.cell_id in ids[:5]] == [RUNNING, FAILED, ELSEWHERE, ELSEWHERE,
                                                                       ELSEWHERE]
    assert here.cells[2].note == f"needs {measured[2].params.gpus} GPUs (this machine has 0)"
    # ... through SLURM they wait for the cluster
    assert [c.state for c in survey(study, root, gpus_here=0, cluster=True).cells][:5] == [
        RUNNING, FAILED, WAITING, WAITING, WAITING]


def test_before_any_cell_ran_a_cell_is_expected_to_take_its_time_limit(tmp_path):
    study = load_config(CONFIG).study(STUDY)
    progress = survey(study, tmp_path, gpus_here=8)
    assert {c.state for c in progress.cells} == {WAITING}
    limits = [c.resources()["runtime"] * 60 for c in study.cells if c.measured]
    assert progress.left_s == sum(limits)
    assert "time limit" in progress.expected_from


def _progress(root: Path, *args: str, **popen) -> subprocess.Popen:
    # as on a machine of 8 GPUs, on a terminal 200 columns wide (rich reads COLUMNS)
    env = {**os.environ, "TRAINBENCH_FAKE_GPUS": "8", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "trainbench", "progress", STUDY, "--root", str(root),
                             "--config", str(CONFIG), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **popen)


def test_the_view_shows_counts_time_left_and_the_cells_that_need_a_look(grid):
    root, study, measured = grid
    out, err = _progress(root).communicate(timeout=60)
    assert not err, err
    ended = len(measured) - 4
    assert f"{ended} of {len(measured)} cells ended" in out
    assert f"done {len(measured) - 5}   running 1   failed 1   waiting 3" in out
    assert "about " in out and " left (3 waiting, 1 running, 1 at a time" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("strategy~")}
    # a grid this large lists only its running and failed cells
    assert set(lines) == {measured[0].cell_id, measured[1].cell_id}
    assert "running" in lines[measured[0].cell_id] and " of ~" in lines[measured[0].cell_id]
    assert "failed: RuntimeError: NCCL error on rank 1" in lines[measured[1].cell_id]
    every = _progress(root, "--all").communicate(timeout=60)[0]
    assert sum(line.startswith("strategy~") for line in every.splitlines()) == len(measured)


def test_watch_refreshes_until_no_cell_runs_or_waits(grid):
    root, study, measured = grid
    watch = _progress(root, "--watch", "--interval", "0.2")
    time.sleep(3)
    assert watch.poll() is None, watch.communicate()  # cells run and wait: it keeps watching
    # the running cell and the waiting ones finish (their results written as the cell runner does)
    for cell in measured[:5]:
        target = root / cell.target
        shutil.rmtree(target.parent / ".work", ignore_errors=True)
        shutil.copy(REPO / cell.target, target)
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0 and not err, err
    assert "nothing left to run" in out and f"{len(measured)} of {len(measured)} cells ended" in out


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (None, 4.4, 59.6, 61, 3599, 3660, 90061)] == [
        "?", "4 s", "1 min 00 s", "1 min 01 s", "59 min 59 s", "1 h 01 min", "25 h 01 min"]
