"""Where a study's grid stands while it runs (`trainbench progress <study>`): its measured cells done,
running, failed and waiting, read from results/ as the workflow leaves it, and the time left.

A cell is running while its runner's scratch folder (`results/runs/<study>/<cell>/.work/`) exists and it
has no current result; done when its metrics.json holds a result (ok, oom, unsupported, infeasible);
failed when that result is `failed` or `timeout`; waiting otherwise (no result, one made with other
parameters, or one that is not a result: the workflow runs those again). A cell that needs more GPUs
than this machine has and has no result is `elsewhere`: a local run leaves it out (under SLURM,
`--cluster`, it waits like any other).

The time left: each cell not yet run is expected to take the median wall time of the study's cells
measured so far (their metrics.json's `wall_time_s`), or its time limit (`runtime_min`) while none is;
a running cell the rest of that. Cells run side by side as many at a time as run now.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from trainbench.study.grid import Cell, Study
from trainbench.execute.gpus import short_of_gpus
from trainbench.reporting import freshness

DONE, RUNNING, FAILED, WAITING, ELSEWHERE = "done", "running", "failed", "waiting", "elsewhere"
FAILED_STATUSES = ("failed", "timeout")
WORK_DIR = ".work"  # the cell runner's scratch folder, there exactly while a cell runs (cellrun.py)


@dataclass(frozen=True)
class CellProgress:
    cell_id: str
    state: str
    note: str = ""  # the result's status and reason, why it waits, or why it cannot run here
    wall_s: float | None = None  # a finished cell's measured wall time
    elapsed_s: float | None = None  # a running cell's time since its attempt started
    expected_s: float | None = None  # a running or waiting cell's expected wall time


@dataclass(frozen=True)
class StudyProgress:
    study: str
    cells: list[CellProgress]
    planned: int  # cells outside the study's `measure` selection: its table runs none of them
    expected_from: str  # what the expected wall times come from

    def count(self, state: str) -> int:
        return sum(1 for c in self.cells if c.state == state)

    @property
    def finished(self) -> bool:
        """Nothing runs and nothing waits: the grid is as far as this machine (or cluster) takes it."""
        return not any(c.state in (RUNNING, WAITING) for c in self.cells)

    @property
    def at_a_time(self) -> int:
        return max(1, self.count(RUNNING))

    @property
    def left_s(self) -> float | None:
        """The work left (running cells' rest, waiting cells' expected time) over the cells running now."""
        work = 0.0
        for cell in self.cells:
            if cell.state == RUNNING:
                work += max(0.0, (cell.expected_s or 0) - (cell.elapsed_s or 0))
            elif cell.state == WAITING:
                if cell.expected_s is None:
                    return None
                work += cell.expected_s
        return work / self.at_a_time


def _started(work_dir: Path) -> float:
    """When the running attempt started: the cell file the runner writes first (else its folder)."""
    cell_file = work_dir / "cell.json"
    return (cell_file if cell_file.exists() else work_dir).stat().st_mtime


def survey(study: Study, root: Path, *, gpus_here: int, cluster: bool = False,
           now: float | None = None) -> StudyProgress:
    """Every measured cell of the study as results/ under `root` shows it now."""
    now = time.time() if now is None else now
    found: list[tuple[Cell, CellProgress]] = []
    for cell in study.cells:
        if not cell.measured:
            continue
        target = root / cell.target
        work_dir = target.parent / WORK_DIR
        verdict = freshness.result_state(cell, target)  # whether its result is current: decided there
        result = verdict.result
        if verdict.kind in (freshness.CURRENT, freshness.RETRY):
            state = FAILED if result["status"] in FAILED_STATUSES else DONE
            text = result["status"] + (f": {result['reason']}" if result.get("reason") else "")
            if verdict.kind == freshness.RETRY:
                text += " (the infrastructure's failure: the next run runs it again)"
            progress = CellProgress(cell.cell_id, state, text,
                                    wall_s=(result.get("metrics") or {}).get("wall_time_s"))
        elif work_dir.is_dir():
            progress = CellProgress(cell.cell_id, RUNNING, elapsed_s=max(0.0, now - _started(work_dir)))
        elif not cluster and not cell.unsupported and (short := short_of_gpus(cell.params, gpus_here)):
            progress = CellProgress(cell.cell_id, ELSEWHERE, f"{short} (this machine has {gpus_here})")
        else:
            why = ("parameters changed since it ran" if verdict.kind == freshness.STALE
                   else f"its result is not one ({verdict.why[:80]})" if verdict.kind == freshness.INVALID
                   else "")
            progress = CellProgress(cell.cell_id, WAITING, why)
        found.append((cell, progress))
    walls = [p.wall_s for _, p in found if p.state in (DONE, FAILED) and p.wall_s]
    median = statistics.median(walls) if walls else None
    expected_from = (f"the median wall time of {len(walls)} cell(s) that ran, {duration(median)}" if median
                     else "each cell's time limit (runtime_min): none has run yet")
    cells = [replace(p, expected_s=median if median is not None else cell.resources()["runtime"] * 60)
             if p.state in (RUNNING, WAITING) else p for cell, p in found]
    return StudyProgress(study.name, cells, sum(1 for c in study.cells if not c.measured), expected_from)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


STYLES = {DONE: "green", RUNNING: "bold cyan", FAILED: "bold red", WAITING: "yellow", ELSEWHERE: "dim"}
LISTED_ALL_UP_TO = 30  # cells; a larger grid lists its running and failed cells only (--all: every one)


def render(progress: StudyProgress, *, every_cell: bool = False):
    """The view: a bar, the counts, the time left, and the cells (rich renderables)."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    total = len(progress.cells)
    ended = progress.count(DONE) + progress.count(FAILED)
    head = Table.grid(padding=(0, 2))
    head.add_row(Text(progress.study, style="bold"),
                 ProgressBar(total=max(total, 1), completed=ended, width=40),
                 Text(f"{ended} of {total} cells ended"))
    counts = Text()
    for state in (DONE, RUNNING, FAILED, WAITING, ELSEWHERE):
        if state != ELSEWHERE or progress.count(ELSEWHERE):
            counts.append(f"{state} {progress.count(state)}", style=STYLES[state]).append("   ")
    if progress.planned:
        counts.append(f"(and {progress.planned} planned cells, which the table does not run)", style="dim")
    if progress.finished:
        left = Text("nothing left to run" + (": the cells elsewhere need a bigger machine or SLURM"
                                             if progress.count(ELSEWHERE) else ""))
    else:
        left = Text(f"about {duration(progress.left_s)} left", style="bold")
        left.append(f" ({progress.count(WAITING)} waiting, {progress.count(RUNNING)} running, "
                    f"{progress.at_a_time} at a time; a cell takes {progress.expected_from})")
    listed = [c for c in progress.cells
              if every_cell or total <= LISTED_ALL_UP_TO or c.state in (RUNNING, FAILED)]
    cells = Table(box=None, pad_edge=False, show_edge=False)
    cells.add_column("cell", no_wrap=True)  # an id is what one types next: never broken
    cells.add_column("state", no_wrap=True)
    cells.add_column("time", no_wrap=True)
    cells.add_column("note", overflow="fold")
    for cell in listed:
        if cell.state == RUNNING:
            timing = f"{duration(cell.elapsed_s)} of ~{duration(cell.expected_s)}"
        elif cell.state == WAITING:
            timing = f"~{duration(cell.expected_s)}"
        else:
            timing = duration(cell.wall_s) if cell.wall_s else ""
        cells.add_row(cell.cell_id, Text(cell.state, style=STYLES[cell.state]), timing, cell.note[:160])
    parts = [head, counts, left, *([cells] if listed else [])]
    if len(listed) < total:
        parts.append(Text(f"{total - len(listed)} done or waiting cells not listed (--all lists every cell)",
                          style="dim"))
    return Group(*parts)
