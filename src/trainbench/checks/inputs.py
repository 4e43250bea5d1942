"""The published results the checks read by default, and the order they read them in.

The campaigns' results are under results/, the validation rounds' under validation/results/ (a
workspace of its own: `cd validation` has only results/). A check reads both, where present, as one
tree: its cells in the order of their paths below each results folder, so that a cell's place does not
depend on which of the two holds its study.
"""

from __future__ import annotations

from pathlib import Path

RESULT_ROOTS = (Path("results"), Path("validation/results"))


def published(*kinds: str) -> list[Path]:
    """results/<kind> and validation/results/<kind> for each kind (runs, search, ...), those that exist."""
    return [root / kind for kind in kinds for root in RESULT_ROOTS if (root / kind).is_dir()]


def first_present(*candidates: str | Path) -> list[Path]:
    """The first of `candidates` that exists, as a one-folder list (none: an empty list)."""
    return next(([Path(c)] for c in candidates if Path(c).exists()), [])


def metrics_files(folders: list[Path]) -> list[Path]:
    """Every metrics.json under `folders`, sorted by its path below the folder's parent (runs/<study>/...,
    search/<study>/...), so results/runs and validation/results/runs interleave as one runs/ would."""
    found = {p for folder in folders for p in Path(folder).glob("**/metrics.json")}
    return sorted(found, key=lambda p: (_below_parent(p, folders), str(p)))


def _below_parent(path: Path, folders: list[Path]) -> str:
    for folder in folders:
        folder = Path(folder)
        if path.is_relative_to(folder):
            return str(path.relative_to(folder.parent))
    return str(path)


def counted_params(mapping):
    """A result's cell parameters, its model counted first where it is one of a config's `models`
    (a check runs in no workflow: the model is registered from the definition the cell carries)."""
    from trainbench.reporting.predictions import counted
    from trainbench.study.params import CellParams

    return counted(CellParams.from_dict(mapping))
