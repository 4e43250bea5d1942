"""Every run of a cell, kept: a result replaced by a rerun is not lost, it is history.

Each time a cell's result is written (cellrun), one line is appended to
`results/history/<study>/<cell>.jsonl` (config.yaml holds cell ids to lengths where that fits a file
name): the run's key (commit, host, GPU model, when) and the figures a comparison reads (step time and
samples/s with their intervals, peak memory), with the cell's status and parameter hash. `trainbench
compare RUNS --history` sets each cell of a results tree against its last earlier run on the same GPU
model with the same parameters, with the significance `compare` has; `trainbench history STUDY` lists
a study's runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from trainbench.contract.result import Result, read_result
from trainbench.paths import HISTORY_SUFFIX

HISTORY = "history"  # beside runs/ under results/
# a run's key: what ran it, where and when, and the host's pace (what moves a host-bound cell between hosts)
PROVENANCE = ("git_commit", "hostname", "gpu_name", "started", "ended", "host_pace_ms")
# and, where a SLURM job ran it, which job and how often SLURM had requeued it (preemption)
SLURM = ("slurm_job_id", "slurm_restart_count")
# the metrics a record keeps: what reporting.compare reads, and the energy a rerun that is not published
# (its table kept) would otherwise lose
KEPT = ("step_time_s", "step_time_s_ci", "samples_per_s", "samples_per_s_ci", "gpu_mem_used_mib",
        "torch_peak_allocated_mib", "host_mem_peak_mib", "mfu", "energy_j_per_step", "energy_j_per_token")


def record(result: Result) -> dict[str, Any]:
    """A result as its history keeps it: shaped like a result (compare reads either), smaller; its
    figures as its file holds them."""
    prov = result.provenance
    return {"study": result.study, "cell_id": result.cell_id, "status": result.status,
            "params_hash": result.params_hash, "emulation": result.emulated,
            "provenance": {**{k: prov.get(k) for k in PROVENANCE},
                           **{k: prov[k] for k in SLURM if prov.get(k) is not None}},
            "metrics": {k: result.metrics.get(k) for k in KEPT}}


def history_file(result: Path) -> Path | None:
    """Where the history of the cell whose result is `result` (…/runs/<study>/<cell>/metrics.json)
    lives; None for other results (a max-batch search's probes)."""
    cell, study, runs = result.parent, result.parent.parent, result.parent.parent.parent
    if runs.name != "runs":
        return None
    return runs.parent / HISTORY / study.name / f"{cell.name}{HISTORY_SUFFIX}"


def append(written: Result, result: Path) -> None:
    """Add a written result to its cell's history (one line, appended in one write)."""
    path = history_file(result)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record(written), sort_keys=True) + "\n").encode()
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def runs(path: Path) -> list[dict[str, Any]]:
    """A cell's runs, oldest first (lines a crash cut short are skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def last_comparable(params_hash: str | None, gpu_name: str | None, started: str | None,
                    result: Path) -> dict[str, Any] | None:
    """The last run of the cell whose result is `result` before `started`, with the same parameters
    (`params_hash`), on the same GPU model."""
    path = history_file(result)
    if path is None:
        return None
    earlier = [r for r in runs(path) if r.get("params_hash") == params_hash
               and r["provenance"].get("gpu_name") == gpu_name
               and (r["provenance"].get("started") or "") < (started or "")]
    return earlier[-1] if earlier else None


def seed(results: Iterable[Path]) -> int:
    """Add results not yet in their cells' history (a tree made before histories were kept); how many."""
    added = 0
    for result in results:
        path = history_file(result)
        if path is None:
            continue
        written = read_result(result)
        if any(r["provenance"].get("started") == written.provenance.started for r in runs(path)):
            continue
        append(written, result)
        added += 1
    return added
