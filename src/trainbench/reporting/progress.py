"""Where a study's grid stands while it runs (`trainbench progress <study>`): its measured cells done,
running, failed and waiting, read from results/ as the workflow leaves it, and the time left; and what
its results cost in device time (`trainbench cost`).

A cell is running while its runner's scratch folder (`results/runs/<study>/<cell>/.work/`) exists and it
has no current result; done when its metrics.json holds a result (ok, oom, unsupported, infeasible);
failed when that result is `failed` or `timeout`; waiting otherwise (no result, one made with other
parameters, or one that is not a result: the workflow runs those again). A cell that needs more GPUs
than this machine has and has no result is `elsewhere`: a local run leaves it out (under SLURM,
`--cluster`, it waits like any other).

The time left: each cell not yet run is expected to take the median wall time of the study's cells
measured so far (their metrics.json's `wall_time_s`), or its time limit (`runtime_min`) while none is;
a running cell the rest of that. Cells run side by side as many at a time as run now.

What a study's results cost (`trainbench cost`): device time, and how much of it went to the timed
steps. A cell's wall time is everything from its launcher's start to its exit: start-up, imports, model
build, compilation, warm-up, the timed windows and teardown. Only the timed windows measure
anything, so their share of the device time is what the rest of each cell costs. Results made
since phases were recorded (`metrics.phases_s`) say where every second went; older ones give
their wall time and their timed steps (the timed windows' steps times their step times), and the
rest is unattributed. Runs that did not finish (OOM, failed, timeout) cost device time too and
count here; a max-batch search's probes are runs of their own.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainbench.paths import probe_glob
from trainbench.study.grid import Cell, Study
from trainbench.contract.result import PHASES, InvalidResult, Result, read_result
from trainbench.study.grid import short_of_gpus
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
            state = FAILED if result.status in FAILED_STATUSES else DONE
            text = result.status + (f": {result.reason}" if result.reason else "")
            if verdict.kind == freshness.RETRY:
                text += " (the infrastructure's failure: the next run runs it again)"
            progress = CellProgress(cell.cell_id, state, text, wall_s=result.metrics.wall_time_s)
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


# --- what the results cost -------------------------------------------------------------------------

def devices_of(params: dict[str, Any]) -> tuple[int, str]:
    """The devices a run held and their kind: its GPUs, or its CPU ranks."""
    return params["gpus"], "GPU" if params["device"] == "cuda" else "CPU rank"


def timed_seconds(metrics: dict[str, Any]) -> float | None:
    """The timed windows' wall time: recorded as a phase, or their steps times their step times."""
    if metrics.get("phases_s"):
        return metrics["phases_s"]["timed"]
    times = metrics.get("step_times_s")
    if not times:
        return None
    return sum(times) * (metrics.get("steps_per_window") or 1)


@dataclass
class Cost:
    """Device seconds (wall time x devices) of a set of runs, split into phases where they were
    recorded."""

    runs: int = 0
    device_s: float = 0.0
    timed_device_s: float = 0.0
    phase_device_s: dict[str, float] = field(default_factory=dict)
    with_phases: int = 0
    cell_shares: list[float] = field(default_factory=list)  # each finished run's timed share

    def add(self, result: Result) -> None:
        metrics = result.metrics
        wall = metrics.wall_time_s
        if not wall:
            return  # never ran (unsupported, infeasible): it cost nothing
        devices, _ = devices_of(result.params)
        self.runs += 1
        self.device_s += wall * devices
        timed = timed_seconds(metrics) if result.ok else 0.0
        if timed is not None:
            self.timed_device_s += timed * devices
            if result.ok:
                self.cell_shares.append(timed / wall)
        if metrics.phases_s:
            self.with_phases += 1
            for name, seconds in metrics.phases_s.items():
                self.phase_device_s[name] = self.phase_device_s.get(name, 0.0) + seconds * devices

    def __add__(self, other: Cost) -> Cost:
        phases = {name: self.phase_device_s.get(name, 0.0) + other.phase_device_s.get(name, 0.0)
                  for name in {**self.phase_device_s, **other.phase_device_s}}
        return Cost(self.runs + other.runs, self.device_s + other.device_s,
                    self.timed_device_s + other.timed_device_s, phases, self.with_phases + other.with_phases,
                    self.cell_shares + other.cell_shares)

    @property
    def timed_share(self) -> float | None:
        return self.timed_device_s / self.device_s if self.device_s else None

    @property
    def timed_share_ops_built(self) -> float | None:
        """The timed share with the `builds` phase left out: an upper bound on what the runs cost again in
        an environment that has compiled its DeepSpeed ops (each cell still loads them from the cache,
        3 s for CPU Adam on an H100 host: validation/results/bench/op_builds)."""
        rest = self.device_s - self.phase_device_s.get("builds", 0.0)
        return self.timed_device_s / rest if rest > 0 else None

    @property
    def median_cell_share(self) -> float | None:
        return statistics.median(self.cell_shares) if self.cell_shares else None


@dataclass
class StudyCost:
    study: str
    device_kind: str
    cells: Cost
    probes: Cost
    unreadable: list[str]

    @property
    def total(self) -> Cost:
        return self.cells + self.probes


def study_cost(study, root: Path | str = ".") -> StudyCost:
    """The device time of every result of a study on disk: its cells', and its searches' probes'."""
    root = Path(root)
    cells, probes, unreadable = Cost(), Cost(), []
    kinds = set()
    for cell in study.cells:
        paths = [(cells, root / cell.target)]
        paths += [(probes, p) for p in sorted(root.glob(probe_glob(study.name, cell.cell_id)))]
        for cost, path in paths:
            if not path.exists():
                continue
            try:
                result = read_result(path)
            except InvalidResult as error:
                unreadable.append(str(error))
                continue
            kinds.add(devices_of(result.params)[1])
            cost.add(result)
    kind = "GPU" if "GPU" in kinds else "CPU rank" if kinds else "-"
    return StudyCost(study.name, kind, cells, probes, unreadable)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(costs: list[StudyCost]) -> str:
    """A table of device hours and timed shares per study, then where the time went in the runs that
    recorded their phases."""
    header = ("study", "runs", "device-hours", "device", "timed share", "median cell", "runs with phases")
    rows = []
    for c in costs:
        total = c.total
        probes = f" ({c.probes.runs} probes)" if c.probes.runs else ""
        rows.append((c.study, f"{total.runs}{probes}", f"{total.device_s / 3600:.3f}", c.device_kind,
                     _share(total.timed_share), _share(total.median_cell_share), str(total.with_phases)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines += ["", "timed share: the timed windows' share of all device time (runs that did not finish "
                  "count as untimed); median cell: the median over finished runs of their own share"]
    phased = [c for c in costs if c.total.with_phases]
    if phased:
        lines += ["", "where the device time went, in the runs that recorded their phases (share of it):"]
        for c in phased:
            spent = c.total.phase_device_s
            whole = sum(spent.values())
            # the phases its runs recorded: those made before a phase existed (builds) lack it
            lines.append(f"  {c.study}: " + ", ".join(f"{name} {spent[name] / whole:.0%}"
                                                       for name, _, _ in PHASES if name in spent))
            if spent.get("builds", 0.0) >= 1:
                lines.append("    of which DeepSpeed's op builds (compiled once per environment, then "
                             f"loaded from its cache by each cell): {spent['builds'] / 3600:.3f} "
                             "device-hours; the timed share without them "
                             f"{_share(c.total.timed_share_ops_built)}")
    for c in costs:
        for problem in c.unreadable:
            lines.append(f"not counted: {problem}")
    return "\n".join(lines)


# Where profiles/slurm has Snakemake's SLURM plugin write its efficiency report after every run
# (--slurm-efficiency-report: one CSV per run, from sacct)
EFFICIENCY_DIR = Path(".snakemake/slurm_efficiency")
LOW_CPU_EFFICIENCY_PCT = 50.0  # below this, a job's CPUs mostly waited: a request worth shrinking


def newest_efficiency_report(root: Path | str = ".") -> Path | None:
    found = sorted((Path(root) / EFFICIENCY_DIR).glob("efficiency_report_*.csv"),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _jobs_of_report(path: Path) -> dict[str, dict[str, float]]:
    """The plugin's report, one entry per SLURM job: its longest step's CPU efficiency (CPU time over
    elapsed time x CPUs) and peak memory against the request, in percent."""
    import csv

    jobs: dict[str, dict[str, float]] = {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = ("JobID", "Elapsed_sec", "CPU Efficiency (%)", "Memory Usage (%)")
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a SLURM efficiency report (no {', '.join(missing)})")
        for row in reader:
            try:
                step = {"elapsed_s": float(row["Elapsed_sec"]), "cpu_pct": float(row["CPU Efficiency (%)"]),
                        "mem_pct": float(row["Memory Usage (%)"])}
            except ValueError:  # a step sacct knew little of (cancelled before it started): not counted
                continue
            job = row["JobID"].split(".")[0]  # a job's steps are <job>.<step>; an array task's <array>_<task>
            if job not in jobs or step["elapsed_s"] > jobs[job]["elapsed_s"]:
                jobs[job] = step
    return jobs


def efficiency_report(path: Path, studies, root: Path | str = ".") -> str:
    """What the SLURM efficiency report at `path` says of each study's cells whose results its jobs
    wrote (matched by provenance.slurm_job_id): CPU efficiency and memory used of the request."""
    jobs = _jobs_of_report(path)
    lines = [f"SLURM efficiency ({path}, {len(jobs)} jobs): each cell's job, its longest step"]
    matched = 0
    for study in studies:
        cells = []
        for cell in study.cells:
            result = Path(root) / cell.target
            if not result.exists():
                continue
            try:
                prov = read_result(result).provenance
            except InvalidResult:
                continue
            job = (f"{prov['slurm_array_job_id']}_{prov.get('slurm_array_task_id')}"
                   if prov.get("slurm_array_job_id") else prov.get("slurm_job_id"))
            if job in jobs:
                cells.append(jobs[job])
        if not cells:
            continue
        matched += len(cells)
        cpu = [c["cpu_pct"] for c in cells]
        mem = [c["mem_pct"] for c in cells]
        low = sum(v < LOW_CPU_EFFICIENCY_PCT for v in cpu)
        lines.append(f"  {study.name}: {len(cells)} cells; CPU efficiency median "
                     f"{statistics.median(cpu):.0f}% (lowest {min(cpu):.0f}%, {low} under "
                     f"{LOW_CPU_EFFICIENCY_PCT:.0f}%); memory used median {statistics.median(mem):.0f}% "
                     f"of the request (highest {max(mem):.0f}%)")
    if not matched:
        lines.append("  none of its jobs wrote a current result of these studies")
    return "\n".join(lines)
