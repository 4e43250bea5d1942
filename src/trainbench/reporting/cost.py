"""What a study's results cost in device time, and how much of it went to the timed steps.

A cell's wall time is everything from its launcher's start to its exit: start-up, imports, model
build, compilation, warm-up, the timed windows and teardown. Only the timed windows measure
anything, so their share of the device time is what the rest of each cell costs. Results made
since phases were recorded (`metrics.phases_s`) say where every second went; older ones give
their wall time and their timed steps (the timed windows' steps times their step times), and the
rest is unattributed. Runs that did not finish (OOM, failed, timeout) cost device time too and
count here; a max-batch search's probes are runs of their own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainbench.paths import probe_glob
from trainbench.execute.results import PHASES, InvalidResult, read_result


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

    def add(self, doc: dict[str, Any]) -> None:
        metrics = doc["metrics"]
        wall = metrics.get("wall_time_s")
        if not wall:
            return  # never ran (unsupported, infeasible): it cost nothing
        devices, _ = devices_of(doc["params"])
        self.runs += 1
        self.device_s += wall * devices
        timed = timed_seconds(metrics) if doc["status"] == "ok" else 0.0
        if timed is not None:
            self.timed_device_s += timed * devices
            if doc["status"] == "ok":
                self.cell_shares.append(timed / wall)
        if metrics.get("phases_s"):
            self.with_phases += 1
            for name, seconds in metrics["phases_s"].items():
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
                doc = read_result(path)
            except InvalidResult as error:
                unreadable.append(str(error))
                continue
            kinds.add(devices_of(doc["params"])[1])
            cost.add(doc)
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
                prov = read_result(result).get("provenance") or {}
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
