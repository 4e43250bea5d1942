"""Result documents the way the reporting stage's modules that read documents rather than `Result`
take them (and the checks, fit and the command line): a `Result` (contract.result) with what the
reporting shows beside what a file holds put into its metrics: the intervals a result from before
timing windows derives from its per-step times, and an emulated rank's GPU memory completed as the
memory model completes it now. A module moved to `Result` reads those as the fields they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainbench.contract.result import InvalidResult, Result, migrate, read_result
from trainbench.predict.memory_model import completed_gpu_mem_used_mib


def reported(result: Result) -> dict[str, Any]:
    """A result as a document the way the stages that read documents rather than `Result` take it: the
    intervals of a result from before timing windows (Result.per_step_figures) in its metrics, and an
    emulated result's GPU 'used' completed as the memory model completes it now (see
    memory_model.completed_gpu_mem_used_mib)."""
    doc = result.as_document()
    metrics = {**result.metrics, **(result.per_step_figures or {})}
    completed = completed_gpu_mem_used_mib(result)
    if completed is not None:
        metrics["gpu_mem_used_mib"], added = completed
        doc.update(emulation={**result.emulation.as_dict(),
                              "modelled": {**result.emulation.modelled, "nccl_buffers_mib": added}})
    return {**doc, "metrics": metrics}


def current(doc: dict[str, Any]) -> dict[str, Any]:
    """A metrics.json document (checked) as `reported` gives it."""
    doc, migrated = migrate(doc)
    return reported(Result.from_document(doc, migrated))


def read_reported(path: str | Path) -> dict[str, Any]:
    """One metrics.json, checked, as `reported` gives it; InvalidResult says why it is not one."""
    result = read_result(path)
    try:
        return reported(result)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:  # figures that make no sense
        raise InvalidResult(f"{path}: {type(error).__name__}: {error}") from None


def read_cells(paths) -> list[dict[str, Any]]:
    """metrics.json documents in the order given; a missing or malformed file is an error, not a gap."""
    return [read_reported(path) for path in paths]
