"""Rerun decisions that hold without Snakemake's metadata (a fresh clone of published results).

Snakemake reruns a job when its params or its set of inputs changed only if it recorded them
(.snakemake/metadata, which a clone lacks). Without them it compares file times alone, and an
existing table newer than every cell file present counts as up to date even when cells are
missing: their jobs are pruned. So each study keeps a grid stamp, results/.grid/<study>.json,
mapping its cell ids to their parameter hashes:

- it is rewritten (at workflow parse time) only when that mapping changes, so reordering
  config.yaml or editing execution settings leaves it alone;
- the study's table and plots take it as an input: a changed grid makes them rerun, and with them
  every missing cell they read;
- every cell takes the stamp as an input: as it is when the cell's metrics.json records other
  parameters than config.yaml now gives (stale), so the cell reruns; marked ancient() otherwise, so
  its time never matters. The input set stays the same either way, which Snakemake's own
  "input changed" trigger needs to stay quiet.

Results cloned from git all get checkout times; decisions here read file contents, not times,
except that a stale cell's stamp is made newer than its result.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainbench.grid import Cell, Study
from trainbench.paths import GRID_STAMP, RUNS, path
from trainbench.results import result_problem, write_json_atomic

def stamp_path(study: str) -> str:
    return path(GRID_STAMP, study=study)


def refresh_stamp(study: Study, root: Path | str = ".") -> Path:
    """Write the study's grid stamp if the mapping of cell ids to parameter hashes changed."""
    path = Path(root) / stamp_path(study.name)
    grid = {cell.cell_id: cell.params_hash for cell in study.cells}
    try:
        if json.loads(path.read_text()) == grid:
            return path
    except (OSError, ValueError):
        pass
    write_json_atomic(path, grid)
    return path


def recorded_hash(cell: Cell, root: Path | str = ".") -> str | None:
    try:
        return json.loads((Path(root) / cell.target).read_text()).get("params_hash")
    except (OSError, ValueError, AttributeError):
        return None


def prepare(study: Study, root: Path | str = ".") -> set[str]:
    """Refresh the study's stamp, set invalid results aside (they run again); return the ids of its
    stale cells, after making sure the stamp is newer than each of their results."""
    stamp = refresh_stamp(study, root)
    results = existing_results(study, root)
    set_aside = [cell for cell in results if set_aside_invalid(Path(root) / cell.target)]
    stale = {cell.cell_id for cell in results if is_stale(cell, root)}
    newest = max((os.stat(Path(root) / study.cell(i).target).st_mtime for i in stale), default=None)
    if set_aside or (newest is not None and stamp.stat().st_mtime <= newest):
        os.utime(stamp)  # without Snakemake's metadata, a newer stamp is what reruns the table
    return stale


def existing_results(study: Study, root: Path | str = ".") -> list[Cell]:
    """The study's cells that have a result file, in grid order. The study's results folder is listed
    once, so a grid of many cells without results costs one listing, not a file check per cell."""
    try:
        folders = {entry.name for entry in os.scandir(Path(root) / path(RUNS, study=study.name))
                   if entry.is_dir()}
    except FileNotFoundError:
        return []
    # a cell's result lies in the folder named by its id (paths.RUN)
    return [cell for cell in study.cells if cell.cell_id in folders and (Path(root) / cell.target).exists()]


def is_stale(cell: Cell, root: Path | str = ".") -> bool:
    """The cell has a result, made with other parameters than the config now gives it."""
    if not (Path(root) / cell.target).exists():
        return False
    return recorded_hash(cell, root) != cell.params_hash


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def set_aside_invalid(path: Path | str, say=_to_stderr) -> bool:
    """A result file that is not a valid result (truncated, edited, of another shape) is moved aside
    to <name>.invalid, with a word: the job that makes it then runs again (Snakemake sees it missing),
    and what was there is kept for a look. True if it was moved."""
    path = Path(path)
    problem = result_problem(path) if path.exists() else None
    if problem:
        aside = path.with_name(path.name + ".invalid")
        os.replace(path, aside)
        say(f"trainbench: {path} is not a valid result ({problem}); moved to {aside.name}, "
            "it will be made again")
    return bool(problem)
