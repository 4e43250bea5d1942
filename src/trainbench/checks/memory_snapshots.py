"""Kept allocator snapshots against the memory model (`trainbench check-models memory --snapshots`):
every cell whose run kept one (metrics.memory_snapshot, docs/profiles.md "Memory snapshots") has the
snapshot's peak by category set beside the model's parts summed into the same categories, and torch's
reserve over that peak beside the model's slack."""

from __future__ import annotations

import sys
from pathlib import Path

from trainbench.checks.inputs import counted_params
from trainbench.contract.result import read_result
from trainbench.predict.memory_model import ALLOCATOR_SLACK, allocated_mib, hardware_of_result, predict

# The model's parts as a snapshot sorts the allocator's blocks (trainbench.execute.profiling): by the
# runner's parameters, gradients and optimizer states; all else is activations and other.
SNAPSHOT_CATEGORY = {"weights": "parameters", "weights_at_init": "parameters",
                     "gradients": "gradients", "gradients_beyond_activations": "gradients",
                     "unsharded_gradients": "gradients", "optimizer": "optimizer_states"}


def print_snapshots(paths: list[Path]) -> int:
    """Each kept snapshot's peak by category (MiB) against the memory model's parts in the same categories."""
    found = 0
    for path in paths:
        result = read_result(path)
        snapshot = result.metrics.memory_snapshot if result.status in ("ok", "oom") else None
        if not snapshot:
            continue
        found += 1
        params = counted_params(result.params)
        parts = predict(params, hardware_of_result(result)).parts_mib
        model: dict[str, float] = {}
        for part, mib in parts.items():
            # what allocated_mib counts (not the allocator's reserve or gradient shards it holds
            # beyond the allocation, not the CUDA context), so the categories add up to its total
            if not part.startswith("allocator_") and part != "cuda_context":
                category = SNAPSHOT_CATEGORY.get(part, "activations_and_other")
                model[category] = model.get(category, 0.0) + mib
        measured = snapshot["peak_by_category_mib"]
        print(f"{result.study}/{result.cell_id} ({result.status}, rank {snapshot['rank']}; {path})")
        print(f"  {'category':<24} {'snapshot MiB':>13} {'model MiB':>10} {'model - snapshot':>17}")
        for category in ("parameters", "gradients", "optimizer_states", "activations_and_other"):
            got, want = measured.get(category, 0.0), model.get(category, 0.0)
            print(f"  {category:<24} {got:>13.0f} {want:>10.0f} {want - got:>+17.0f}")
        total = allocated_mib(parts)
        print(f"  {'peak allocated':<24} {snapshot['peak_allocated_mib']:>13.0f} {total:>10.0f} "
              f"{total - snapshot['peak_allocated_mib']:>+17.0f}")
        if snapshot.get("reserved_mib"):
            over = snapshot["reserved_mib"] / snapshot["peak_allocated_mib"]
            print(f"  reserved / peak allocated: {over:.3f} measured, "
                  f"{ALLOCATOR_SLACK:.3f} the model's slack")
        print("  model's parts (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()))
    if not found:
        print("no cell with an allocator snapshot (timing's memory_snapshot, `trainbench profile --memory`)",
              file=sys.stderr)
        return 1
    return 0
