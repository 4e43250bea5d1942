"""Whether a cell's result is current is decided in one place (freshness.result_state): `trainbench cells`,
`trainbench progress` and the workflow's plan (freshness.prepare) read the same verdict for every cell."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainbench.cli import main
from trainbench.reporting import freshness
from trainbench.reporting.freshness import CURRENT, INVALID, MISSING, STALE, State
from trainbench.reporting.progress import DONE, FAILED, WAITING, survey
from trainbench.study.config import load_config

from conftest import PROJECT_CONFIG, REPO

STUDY = "megatron"
CONFIG = PROJECT_CONFIG
KINDS = ("missing", "invalid json", "other schema", "stale", "current ok", "current oom")
EXPECTED = {"missing": MISSING, "invalid json": INVALID, "other schema": INVALID, "stale": STALE,
            "current ok": CURRENT, "current oom": CURRENT}


@pytest.fixture
def tree(tmp_path):
    """One results tree with a cell of each kind, from the published megatron results (every other
    measured cell has no result: missing too)."""
    study = load_config(CONFIG).study(STUDY)
    cells = dict(zip(KINDS, (c for c in study.cells if c.measured)))
    for kind, cell in cells.items():
        if kind == "missing":
            continue
        target = tmp_path / cell.target
        target.parent.mkdir(parents=True)
        shutil.copy(REPO / cell.target, target)
    (tmp_path / cells["invalid json"].target).write_text('{"status": "ok", ')
    _edit(tmp_path / cells["other schema"].target, schema=2)
    _edit(tmp_path / cells["stale"].target, params_hash="0" * 12)
    _edit(tmp_path / cells["current oom"].target, status="oom", reason="CUDA out of memory on rank 0")
    return tmp_path, study, cells


def _edit(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def _verdicts(root: Path, study, capsys, monkeypatch) -> dict[str, dict[str, str]]:
    """Each measured cell's verdict as each of the three reads it: the cli's listing, progress's survey
    and the workflow's plan (which moves invalid results aside: it goes last)."""
    monkeypatch.setenv("TRAINBENCH_FAKE_GPUS", "8")
    capsys.readouterr()
    assert main(["cells", STUDY, "--tsv", "--config", str(CONFIG), "--root", str(root)]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()[1:]]
    measured = {c.cell_id for c in study.cells if c.measured}

    def from_cli(status: str) -> str:
        return (MISSING if status == "missing" else INVALID if status.startswith("unreadable (")
                else STALE if status.endswith(" (stale: parameters changed)") else CURRENT)

    cli = {cell_id: from_cli(status) for _, cell_id, status, *_ in rows if cell_id in measured}

    def from_progress(state: str, note: str) -> str:
        if state in (DONE, FAILED):
            return CURRENT
        assert state == WAITING, (state, note)
        return (STALE if note == "parameters changed since it ran"
                else INVALID if note.startswith("its result is not one (") else MISSING)

    progress = {c.cell_id: from_progress(c.state, c.note) for c in survey(study, root, gpus_here=8).cells}

    stale = freshness.prepare(study, root)

    def from_plan(cell) -> str:
        target = root / cell.target
        return (STALE if cell.cell_id in stale else CURRENT if target.exists()
                else INVALID if Path(f"{target}.invalid").exists() else MISSING)

    plan = {c.cell_id: from_plan(c) for c in study.cells if c.measured}
    return {"cells": cli, "progress": progress, "prepare": plan}


def test_cells_progress_and_the_plan_read_the_same_verdict_for_every_cell(tree, capsys, monkeypatch):
    root, study, cells = tree
    decided = {c.cell_id: freshness.result_state(c, root / c.target).kind for c in study.cells if c.measured}
    assert {kind: decided[cell.cell_id] for kind, cell in cells.items()} == EXPECTED
    for view, verdicts in _verdicts(root, study, capsys, monkeypatch).items():
        assert verdicts == decided, view
    # the invalid results were set aside by the plan: all three now see those cells missing
    assert not (root / cells["other schema"].target).exists()


def test_what_result_state_says_is_what_all_three_show(tree, capsys, monkeypatch):
    """None of the three decides on its own: a verdict changed in result_state changes all of them."""
    root, study, cells = tree
    real = freshness.result_state
    ok = cells["current ok"].cell_id

    def says_stale(cell, target, checked=None) -> State:
        state = real(cell, target, checked)
        return State(STALE, result=state.result) if cell.cell_id == ok else state

    monkeypatch.setattr(freshness, "result_state", says_stale)
    for view, verdicts in _verdicts(root, study, capsys, monkeypatch).items():
        assert verdicts[ok] == STALE, view
