"""`trainbench compare`: two result trees matched cell by cell, on published metrics.json files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainbench.cli import main
from trainbench.compare import compare

PUBLISHED = Path(__file__).resolve().parent.parent / "results" / "runs" / "megatron"
CELLS = ["strategy~zero1__model~gpt-345m__gpus~4__tp~1__offload_optimizer~false",
         "strategy~zero1__model~gpt-2.5b__gpus~4__tp~1__offload_optimizer~false",
         "strategy~zero3__model~gpt-2.5b__gpus~4__tp~1__offload_optimizer~false"]


def _tree(root: Path, cells: list[str]) -> Path:
    for cell in cells:
        (root / "megatron" / cell).mkdir(parents=True)
        shutil.copy(PUBLISHED / cell / "metrics.json", root / "megatron" / cell / "metrics.json")
    return root


def _edit(root: Path, cell: str, change) -> None:
    path = root / "megatron" / cell / "metrics.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.fixture
def trees(tmp_path):
    first = _tree(tmp_path / "a", CELLS)
    second = _tree(tmp_path / "b", CELLS[:2])

    def slower(doc):
        doc["metrics"]["step_time_s"] *= 1.25
        doc["metrics"]["gpu_mem_used_mib"] = [x + 1024 for x in doc["metrics"]["gpu_mem_used_mib"]]

    def other_params(doc):
        doc["params_hash"] = "0" * len(doc["params_hash"])

    _edit(second, CELLS[0], slower)
    _edit(second, CELLS[1], other_params)
    return first, second


def test_changes_are_relative_to_the_first_tree_and_only_repeats_count(trees):
    first, second = trees
    result = compare(first, second)
    by_cell = {c.cell_id: c for c in result.cells}
    assert set(by_cell) == set(CELLS[:2])
    slower = by_cell[CELLS[0]]
    assert slower.same_params
    assert slower.change_pct["step_time_s"] == pytest.approx(25.0)
    busiest = max(json.loads((first / "megatron" / CELLS[0] / "metrics.json").read_text())["metrics"]["gpu_mem_used_mib"])
    assert slower.change_pct["gpu_mem_used_mib"] == pytest.approx(100 * 1024 / busiest)
    assert slower.change_pct["host_mem_peak_mib"] == 0
    # a cell rerun with other parameters is not a repeat: it does not enter the spread
    assert not by_cell[CELLS[1]].same_params
    assert result.spread("step_time_s") == [pytest.approx(25.0)]
    assert result.only_in_first == [f"megatron/{CELLS[2]}"] and result.only_in_second == []


def test_cli_prints_each_cell_and_the_spread_and_fails_with_nothing_in_common(trees, tmp_path, capsys):
    first, second = trees
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "+25.0%" in out and "parameters differ: not a repeat" in out
    assert "step_time_s: 1 cells, median |change| 25.0%" in out
    assert "only in" in out

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(first), str(empty)]) == 1
    assert main(["compare", str(first), str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
