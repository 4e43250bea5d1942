"""A cell's history, as the contract of its lines: every run of a cell is kept as one line of
`results/history/<study>/<cell>.jsonl` (execute.history appends them), shaped like a result (compare
reads either) and smaller: the run's key (commit, host, GPU model, when), the figures a comparison
reads, the cell's status and parameter hash. Here: what a line holds, where a cell's lines live, and
reading them back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainbench.contract.result import Result
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
