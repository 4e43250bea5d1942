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

Every plan reads what each result says (is it a result? which parameters made it?), so each file is
read, and checked against the schema, once per version of it: the verdicts are kept in
.snakemake/trainbench/checked/<study>.json by the file's size and modification time, and a plan of a
measured grid costs a stat per result (a study of 10,000 results: 5 s of schema checks in every
Snakemake run before). A result changed in any way (rewritten, edited, checked out) is read again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from trainbench.study.grid import Cell, Study
from trainbench.paths import GRID_STAMP, MODELS_STAMP, RESULTS_CHECKED, RUNS, TABLE_MD, path
from trainbench.contract.result import (SCHEMA_VERSION, InvalidResult, Result, metrics_json_schema,
                                        read_result, result_problem, why_invalid)
from trainbench.contract.result import write_json_atomic, write_text_atomic

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


def refresh_models_stamp(digest: str, root: Path | str = ".") -> str:
    """Write the prediction models' digest (Workflow.prediction_models) if it changed. Tables, plots and
    the dataset take it as an input: a refit of the models changes no cell and no grid, and without
    Snakemake's metadata (a fresh clone) the digest in their params is not compared, so a newer stamp
    is what makes them again."""
    stamp = Path(root) / MODELS_STAMP
    try:
        if stamp.read_text().strip() == digest:
            return MODELS_STAMP
    except OSError:
        pass
    write_text_atomic(stamp, digest + "\n")
    return MODELS_STAMP


@dataclass(frozen=True)
class Checked:
    """What one result file was found to be: why it is not a result (None if it is one), and the
    parameters' hash it records."""
    problem: str | None
    params_hash: str | None
    # the result says the infrastructure failed it (a rank lost to a signal, a freeze: cellrun.lost_rank)
    retry: bool = False


# RETRY: a current result of a failure that was not the cell's, which the next run runs again
MISSING, INVALID, STALE, RETRY, CURRENT = "missing", "invalid", "stale", "retry", "current"


@dataclass(frozen=True)
class State:
    """A cell's result as result_state finds it: MISSING (no file), INVALID (a file that is not a
    result, `why`), STALE (a result made with other parameters) or CURRENT; `result` is the result
    of a stale or current one, where it was read."""
    kind: str
    why: str = ""
    result: Result | None = field(default=None, compare=False, repr=False)


def result_state(cell: Cell, target: Path | str, checked: Checked | None = None) -> State:
    """Is this cell's result current? The one place that decides, for `trainbench cells`, `trainbench
    progress` and the workflow's plan (prepare) alike. `target` is the cell's metrics.json; `checked`,
    what it was found to be if known (a plan's kept verdict), else the file is read. A file that does not
    follow the schema (unreadable, edited, of another schema version) is INVALID: the workflow sets it
    aside and runs the cell again. A result whose params_hash is not the cell's as config.yaml gives it
    now is STALE: the workflow runs it again. A result of the infrastructure's failure (a rank lost to a
    signal or frozen, after the cell's retries) is RETRY: it stands until the next run runs the cell
    again. Any other result is CURRENT, whatever its status."""
    result = None
    if checked is None:
        if not Path(target).exists():
            return State(MISSING)
        try:
            result = read_result(target)
        except InvalidResult as error:
            return State(INVALID, why_invalid(error))
        checked = Checked(None, result.params_hash, result.failure == "infrastructure")
    if checked.problem:
        return State(INVALID, checked.problem)
    if checked.params_hash != cell.params_hash:
        return State(STALE, result=result)
    return State(RETRY if checked.retry else CURRENT, result=result)


@cache
def checker_version() -> str:
    """Verdicts hold for the checks that made them: the schema version and the schema itself."""
    schema = json.dumps(metrics_json_schema(), sort_keys=True, default=str)
    return f"{SCHEMA_VERSION}-{hashlib.sha256(schema.encode()).hexdigest()[:16]}"


def check_result(target: Path) -> Checked:
    try:
        result = read_result(target)
    except InvalidResult as error:
        return Checked(why_invalid(error), None)
    return Checked(None, result.params_hash, result.failure == "infrastructure")


def checked_results(study: Study, root: Path | str = ".") -> dict[str, Checked]:
    """Each of the study's cells that has a result file, by id, in grid order: what its file is. A file
    is read only if it changed since the last plan read it (size or modification time); the verdicts
    are kept for the next plan."""
    verdicts_path = Path(root) / path(RESULTS_CHECKED, study=study.name)
    try:
        kept = json.loads(verdicts_path.read_text())
        verdicts = kept["verdicts"] if kept.get("checker") == checker_version() else {}
    except (OSError, ValueError, AttributeError, KeyError):
        verdicts = {}
    found, now = {}, {}
    for cell in cells_with_a_folder(study, root):
        target = Path(root) / cell.target
        try:
            stat = target.stat()
        except FileNotFoundError:  # a folder without a result (a cell that never finished)
            continue
        version = [stat.st_mtime_ns, stat.st_size]
        seen = verdicts.get(cell.cell_id)
        if seen and seen[:2] == version and len(seen) == 5:
            found[cell.cell_id] = Checked(*seen[2:])
        else:
            found[cell.cell_id] = check_result(target)
        verdict = found[cell.cell_id]
        now[cell.cell_id] = [*version, verdict.problem, verdict.params_hash, verdict.retry]
    if now != verdicts:
        try:
            write_json_atomic(verdicts_path, {"checker": checker_version(), "verdicts": now})
        except OSError:
            pass  # a read-only checkout plans as before, reading every result each time
    return found


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def prepare(study: Study, root: Path | str = ".", runs_here: Callable[[Cell], bool] | None = None,
            say=_to_stderr) -> set[str]:
    """Refresh the study's stamp, set invalid results aside (they run again); return the ids of its
    stale cells, after making sure the stamp is newer than each of their results.

    `runs_here`, where given, says which cells this Snakemake can run (a machine's GPUs, or a cluster):
    a measured cell of it without a result, under a table made without it (a cell that needed more
    GPUs than the machine that made the table had, or a run that died), makes the stamp newer than
    the table, so that the table runs again and the cell with it. Snakemake itself would find the
    table up to date and prune the missing cell's job."""
    stamp = refresh_stamp(study, root)
    checked = checked_results(study, root)
    states = {cell_id: result_state(study.cell(cell_id), Path(root) / study.cell(cell_id).target, verdict)
              for cell_id, verdict in checked.items()}
    invalid = {cell_id: state.why for cell_id, state in states.items() if state.kind == INVALID}
    for cell_id, problem in invalid.items():
        set_aside(Path(root) / study.cell(cell_id).target, problem)
    # a failure of the infrastructure is run again: its result is set aside (its history keeps it), so
    # the cell has none, as after a run that died
    retried = [cell_id for cell_id, state in states.items() if state.kind == RETRY]
    for cell_id in retried:
        target = Path(root) / study.cell(cell_id).target
        reason = read_result(target).reason
        os.replace(target, target.with_name(target.name + ".retried"))
        say(f"trainbench: {study.name}/{cell_id} failed for a reason not its own ({reason}); it runs again "
            f"(the result is kept as {target.name}.retried and in its history)")
    invalid.update((cell_id, "retried") for cell_id in retried)
    stale = {cell_id for cell_id, state in states.items() if state.kind == STALE}
    newest = max((os.stat(Path(root) / study.cell(i).target).st_mtime for i in stale), default=None)
    table = Path(root) / path(TABLE_MD, study=study.name)
    missing = [] if runs_here is None or not table.exists() else [
        cell.cell_id for cell in study.cells
        if cell.measured and cell.cell_id not in checked and runs_here(cell)]
    if missing and stamp.stat().st_mtime <= table.stat().st_mtime:
        say(f"trainbench: {study.name}: {len(missing)} cell(s) without a result can run here "
            f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); "
            f"its table is made again with them")
        newest = max(newest or 0.0, table.stat().st_mtime)
    if invalid or (newest is not None and stamp.stat().st_mtime <= newest):
        os.utime(stamp)  # without Snakemake's metadata, a newer stamp is what reruns the table
    return stale


def cells_with_a_folder(study: Study, root: Path | str = ".") -> list[Cell]:
    """The study's cells that have a folder under its results, in grid order: those that may have a
    result. The folder is listed once, so a grid of many cells without results costs one listing,
    not a file check per cell."""
    try:
        folders = {entry.name for entry in os.scandir(Path(root) / path(RUNS, study=study.name))
                   if entry.is_dir()}
    except FileNotFoundError:
        return []
    # a cell's result lies in the folder named by its id (paths.RUN)
    return [cell for cell in study.cells if cell.cell_id in folders]


def set_aside_invalid(path: Path | str, say=_to_stderr) -> bool:
    """A result file that is not a valid result (truncated, edited, of another shape) is moved aside
    to <name>.invalid, with a word: the job that makes it then runs again (Snakemake sees it missing),
    and what was there is kept for a look. True if it was moved."""
    path = Path(path)
    problem = result_problem(path) if path.exists() else None
    if problem:
        set_aside(path, problem, say)
    return bool(problem)


def set_aside(path: Path, problem: str, say=_to_stderr) -> None:
    """Move a result found invalid (`problem`, why) aside to <name>.invalid."""
    aside = path.with_name(path.name + ".invalid")
    os.replace(path, aside)
    say(f"trainbench: {path} is not a valid result ({problem}); moved to {aside.name}, it will be made again")
