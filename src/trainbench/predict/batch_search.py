"""The largest micro batch a cell trains without running out of memory: double, then bisect.

Each probe is the cell with another micro batch, trained for a fixed number of steps (enough to catch
OOMs that come late), and is a cached result of its own (results/search/<study>/<cell>/mb~<k>/), so an
interrupted search resumes where it stopped. The memory model seeds the first probe (the largest
power of two it predicts to fit) and bounds the search (never more than twice its largest fitting
batch, nor the study's `max_micro_batch`). The model only chooses where to look: a probe runs even
where the model predicts it will not fit, so the answer is measured, never the model's.

A probe fits when it ran its steps (status ok); OOM, a timeout or a failure all end the doubling, and
the search bisects below the smallest such batch, until the gap between the largest batch that trained
and the smallest that did not is 1, or within the study's `tolerance` (a fraction of the former: each
probe near the boundary is a full run, so a coarser answer costs fewer GPU minutes). Which failure it
was ("cannot even initialize", "OOM at step k (timed)") stays in the probe's metrics.json and the summary.

The probe at the largest batch is a complete run of the cell at that batch (the cell's warm-up and
the search's timed steps), so its metrics are the cell's throughput at its largest batch: the study
table reports them next to the fixed-batch run, and nothing runs twice.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from trainbench.study.params import CellParams
from trainbench.paths import cell_of_probe
from trainbench.registry.hardware import host_memory_mib
from trainbench.predict.memory_model import Hardware, hardware_of_run, held_gpu_mib, predict


def next_probe(outcomes: dict[int, str], start: int, upper: int, tolerance: float = 0.0) -> int | None:
    """The next micro batch to try given the statuses so far, or None when the answer is known: the
    boundary is bracketed to within max(1, tolerance x the largest batch that trained)."""
    if not outcomes:
        return min(start, upper)
    fitted = [b for b, status in outcomes.items() if status == "ok"]
    failed = [b for b, status in outcomes.items() if status != "ok"]
    low = max(fitted, default=0)
    high = min((b for b in failed if b > low), default=None)
    if high is None:  # nothing too big yet: keep doubling up to the bound
        return None if low >= upper else min(2 * low, upper)
    return None if high - low <= max(1, int(tolerance * low)) else (low + high) // 2


def largest_fitting(outcomes: dict[int, str]) -> int | None:
    """The search's answer: the largest micro batch that trained, below every failed one."""
    failed = [b for b, status in outcomes.items() if status != "ok"]
    limit = min(failed, default=None)
    fitted = [b for b, status in outcomes.items() if status == "ok" and (limit is None or b < limit)]
    return max(fitted, default=None)


def largest_predicted(params: CellParams, hardware: Hardware, limit: int = 1 << 16) -> int:
    """The largest micro batch (at most `limit`) the memory model predicts to fit; 0 if not even one."""
    def fits(batch: int) -> bool:
        return predict(params.replace(micro_batch=batch), hardware).fits

    low, batch = 0, 1
    while batch <= limit and fits(batch):
        low, batch = batch, batch * 2
    if low == 0:
        return 0
    high = min(2 * low, limit + 1)  # the model's memory grows with the batch: bisect between the two
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def model_bounds(params: CellParams, hardware: Hardware | None, max_micro_batch: int) -> tuple[int, int]:
    """(first probe, upper bound) from the memory model: the largest power of two predicted to fit,
    and at most twice the largest batch predicted to fit."""
    if hardware is None:
        return 1, max_micro_batch
    largest = largest_predicted(params, hardware, max_micro_batch)
    if largest == 0:
        return 1, min(max_micro_batch, 2)  # even one sample is predicted not to fit: check 1 (and 2)
    return 1 << (largest.bit_length() - 1), min(max_micro_batch, 2 * largest)


def bounds_for(search: dict[str, Any], params: CellParams) -> tuple[int, int]:
    """A study's search settings and a cell: the memory model's seed and bound on the machine the
    study describes (its `gpu_mem_gib`), or on this host for CPU cells."""
    if params.device == "cpu":
        hardware = Hardware(None, host_memory_mib(), params.gpus_per_node)
    elif search.get("gpu_mem_gib") or params.gpu_mem_limit_gib:
        # a cell held to a smaller GPU is searched on that GPU
        gpu = held_gpu_mib(search["gpu_mem_gib"] * 1024 if search.get("gpu_mem_gib") else None, params)
        hardware = Hardware(gpu, float("inf"), params.gpus_per_node)
    else:
        hardware = None
    return model_bounds(params, hardware, search["max_micro_batch"])


def walk(status_of: Callable[[int], str], start: int, upper: int, tolerance: float = 0.0,
         known: Iterable[int] = ()) -> list[int]:
    """The probes of a search, in order; `status_of(batch)` runs (or reads) one probe. `known`: batches
    already probed, read first, so that a search whose probes bracket the answer runs none, wherever
    the memory model would start it now (a model that changed moves the seed, not the answer)."""
    outcomes: dict[int, str] = {batch: status_of(batch) for batch in sorted(known)}
    while (batch := next_probe(outcomes, start, upper, tolerance)) is not None:
        outcomes[batch] = status_of(batch)
    return list(outcomes)


def summary(outcomes: dict[int, dict[str, Any]], tolerance: float, max_micro_batch: int) -> dict[str, Any]:
    """The search's result from its probes' metrics.json documents (by micro batch)."""
    statuses = {batch: doc["status"] for batch, doc in outcomes.items()}
    best = largest_fitting(statuses)
    failures = sorted((b, doc) for b, doc in outcomes.items() if doc["status"] != "ok")
    first = failures[0] if failures else None
    best_doc = outcomes.get(best) if best is not None else None
    any_doc = next(iter(outcomes.values()))
    # the machine the probes ran on, so the memory model's answer for it can be set beside the search's
    hardware = hardware_of_run(best_doc or any_doc)
    return {
        "study": any_doc["study"],
        "cell_id": cell_of_probe(any_doc["cell_id"]),
        "max_micro_batch": best,
        "max_global_batch": best_doc["params"]["global_batch"] if best_doc else None,
        "tolerance": tolerance,
        "bound": max_micro_batch,  # the study's max_micro_batch: no probe went above it
        "hardware": {"gpu_mem_mib": hardware.gpu_mem_mib, "gpus_per_node": hardware.gpus_per_node,
                     "host_mem_mib": hardware.host_mem_mib if hardware.host_mem_mib != float("inf") else None}
        if hardware else None,
        "first_failure": {"micro_batch": first[0], "status": first[1]["status"], "reason": first[1]["reason"]}
        if first else None,
        "probes": [{"micro_batch": b, "status": doc["status"], "reason": doc["reason"],
                    "step_time_s": doc["metrics"].get("step_time_s"),
                    "samples_per_s": doc["metrics"].get("samples_per_s"),
                    "gpu_mem_used_mib": doc["metrics"].get("gpu_mem_used_mib")}
                   for b, doc in sorted(outcomes.items())],
        # the largest batch's own run: the cell's throughput at its largest batch
        "metrics_at_max": best_doc["metrics"] if best_doc else None,
    }


def model_largest(params: CellParams, found: dict[str, Any]) -> int | None:
    """The memory model's largest micro batch (up to the search's bound) for a cell on the machine its
    search ran on; None where that machine or the model's knowledge of the cell is missing."""
    machine = found.get("hardware")
    if not machine:
        return None
    hardware = Hardware(machine["gpu_mem_mib"], machine["host_mem_mib"] or float("inf"),
                        machine["gpus_per_node"])
    try:
        return largest_predicted(params, hardware, found["bound"])
    except (KeyError, ValueError):  # a model or strategy the memory model does not know
        return None
