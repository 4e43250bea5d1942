"""Filling a cell's metrics.json from the ranks' reports: its metrics section, its phases, its energy.
What the document holds, its schema, its atomic writing and its reading are the contract's
(contract.result).
"""

from __future__ import annotations

import math
from typing import Any

from trainbench.contract.figures import timed_metrics
from trainbench.contract.result import PHASES, empty_metrics
from trainbench.study.params import CellParams
from trainbench.study.timing import TimingSettings


def node_memory(entries: list[dict[str, Any] | None]) -> dict[str, list]:
    """Concatenate per-node sampler peaks (in rank order) into per-GPU lists."""
    used, total, names, host_used, host_percent = [], [], [], [], []
    for entry in entries:
        if not entry:
            continue
        used += entry["gpu_used_mib"]
        total += entry["gpu_total_mib"]
        names += entry["gpu_names"]
        host_used.append(entry["host_used_mib"])
        host_percent.append(entry["host_percent"])
    return {"used": used, "total": total, "names": names, "host_used": host_used,
            "host_percent": host_percent}


def _round(value, digits=3):
    return None if value is None else round(value, digits)


def phases(marks: dict[str, float]) -> dict[str, float]:
    """Seconds per phase (PHASES) from the marks; a phase whose mark is missing (no warm-up steps)
    takes none, and its time goes to the next."""
    out, previous = {}, marks["launched"]
    for name, mark, _ in PHASES:
        end = max(marks.get(mark, previous), previous)  # clocks of 10 ms: never a negative phase
        out[name] = round(end - previous, 3)
        previous = end
    return out


def summarize(params: CellParams, result: dict[str, Any], wall_time_s: float,
              timing: TimingSettings, launched: float, exited: float) -> dict[str, Any]:
    """The metrics of a successful run, from rank 0's result.json; `launched` and `exited`: when the
    launcher started and when it ended (wall clock)."""
    ranks = result["ranks"]
    memory = node_memory([r["node_memory"] for r in ranks])
    gpu_name = memory["names"][0] if memory["names"] else None
    timed = timed_metrics(params, result["step_times_s"], steps_per_window=result["steps_per_window"],
                          gpu_name=gpu_name, target_ci=timing.target_ci)
    projected = None
    if params.dataset_size and params.epochs:
        # Steady state only: optimizer steps of the whole run times the median step (no start-up,
        # evaluation or checkpoint time).
        steps = math.ceil(params.dataset_size / params.global_batch) * params.epochs
        projected = steps * timed["step_time_s"]
    rss_by_host: dict[str, float] = {}
    for r in ranks:
        rss_by_host[r["host"]] = rss_by_host.get(r["host"], 0.0) + r["host_rss_peak_mib"]
    metrics = empty_metrics()
    metrics.update(
        # warm-up goes on until fp16 loss scaling settles (worker.WARMUP_SETTLED_STEPS): the steps it ran
        warmup_steps=len(result.get("warmup_step_times_s") or []) or params.warmup_steps,
        **timed,
        wall_time_s=_round(wall_time_s, 2),
        projected_run_s=_round(projected, 1),
        gpu_mem_used_mib=[_round(v, 1) for v in memory["used"]] or None,
        gpu_mem_total_mib=[_round(v, 1) for v in memory["total"]] or None,
        torch_peak_allocated_mib=[_round(r["torch_peak_allocated_mib"], 1) for r in ranks]
        if ranks[0]["torch_peak_allocated_mib"] is not None else None,
        torch_peak_reserved_mib=[_round(r["torch_peak_reserved_mib"], 1) for r in ranks]
        if ranks[0]["torch_peak_reserved_mib"] is not None else None,
        # the busiest node's ranks together: what that node's host memory had to hold
        host_mem_peak_mib=_round(max(rss_by_host.values()), 1),
        test_accuracy=_round(result.get("test_accuracy"), 4),
        loss_first=_round(result["losses"][0], 5),
        loss_last=_round(result["losses"][-1], 5),
        params_total=result["params_total"],
        params_per_module_rank0=result["params_per_module_rank0"],
    )
    metrics.update(
        step_times_s=[_round(t, 6) for t in result["step_times_s"]],
        warmup_step_times_s=[_round(t, 6) for t in result["warmup_step_times_s"]],
        loss_curve=[_round(v, 5) for v in result["losses"]],
        optimizer_steps_skipped=result.get("optimizer_steps_skipped"),
        timing={"method": "windows", "stopped": result["timing_stopped"], **timing.as_dict(),
                **({"gc": result["gc"]} if result.get("gc") else {})},
        host_rss_peak_mib_per_rank=[_round(r["host_rss_peak_mib"], 1) for r in ranks],
        tensors_held_bytes_per_rank=[r.get("tensors_held_bytes") for r in ranks],
        params_held_per_rank=[sum((r.get("params_per_module") or {}).values()) for r in ranks],
        host_mem_used_peak_mib=_round(max(memory["host_used"]), 1) if memory["host_used"] else None,
        host_mem_percent_peak=_round(max(memory["host_percent"]), 1) if memory["host_percent"] else None,
    )
    spent = phases({**result["phase_marks"], "launched": launched, "exited": exited})
    metrics.update(phases_s=spent,
                   timed_share=_round(spent["timed"] / wall_time_s, 4) if wall_time_s else None)
    if ranks[0].get("memory_snapshot"):
        metrics["memory_snapshot"] = {"rank": ranks[0]["rank"], **ranks[0]["memory_snapshot"]}
    if ranks[0].get("breakdown"):  # the profiled steps' (profiling.py), on the rank that reports
        metrics["breakdown"] = ranks[0]["breakdown"]
        if len(ranks) > 1:
            metrics["breakdown_per_rank"] = [r.get("breakdown") for r in ranks]
    metrics.update(energy_metrics(params, ranks, timed["steps_timed"]))
    if "dataset" in result:  # where accuracy was measured: real data, or the synthetic stand-in
        metrics.update(dataset=result["dataset"], test_samples=result["test_samples"])
    return metrics


def publishes_energy(params: CellParams) -> bool:
    """Whether a run of these parameters, its ranks' GPU counters read, publishes energy per step and
    per token: only a whole world does. An emulated rank's energy is one GPU's, not its world's."""
    return not params.emulate


def energy_metrics(params: CellParams, ranks: list[dict[str, Any]], steps_timed: int) -> dict[str, Any]:
    """Energy over the timed windows from every rank's GPU counter (worker.py), where each rank read
    one: per rank, per step and token for the cell's GPUs together, and their mean power."""
    energy = [r.get("gpu_energy_j") for r in ranks]
    if not energy or any(e is None for e in energy) or not steps_timed:
        return {}
    out: dict[str, Any] = {"gpu_energy_j_per_rank": [_round(e, 2) for e in energy]}
    timed = [r.get("gpu_energy_timed_s") for r in ranks]
    if all(timed):
        out["gpu_power_w"] = _round(sum(e / t for e, t in zip(energy, timed)) / len(energy), 1)
    if publishes_energy(params):
        per_step = sum(energy) / steps_timed
        out["energy_j_per_step"] = _round(per_step, 3)
        out["energy_j_per_token"] = _round(per_step / (params.global_batch * params.seq_len), 8)
    return out


def partial_metrics(rank_records: list[dict[str, Any]], wall_time_s: float) -> dict[str, Any]:
    """What is known of a run that did not finish (from the ranks' failure records): wall time, and
    memory at the failure (an OOM's)."""
    metrics = empty_metrics()
    metrics["wall_time_s"] = _round(wall_time_s, 2)
    records = sorted(rank_records, key=lambda r: r["rank"])
    memory = node_memory([r.get("node_memory") for r in records])
    if memory["used"]:
        metrics["gpu_mem_used_mib"] = [_round(v, 1) for v in memory["used"]]
        metrics["gpu_mem_total_mib"] = [_round(v, 1) for v in memory["total"]]
    allocated = [r.get("torch_peak_allocated_mib") for r in records]
    if allocated and all(a is not None for a in allocated):
        metrics["torch_peak_allocated_mib"] = [_round(a, 1) for a in allocated]
    snapshots = {r["rank"]: r["memory_snapshot"] for r in records if r.get("memory_snapshot")}
    if snapshots:  # the GPU allocator at the OOM, on the first rank that ran out
        metrics["memory_snapshot"] = {"rank": min(snapshots), **snapshots[min(snapshots)]}
    return metrics
