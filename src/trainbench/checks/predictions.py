"""Predictions made before cells ran, held against what the cells measured
(`trainbench check-models predictions PREDICTIONS.csv [--runs FOLDER ...] [--json FILE]`).

    trainbench predict holdout --gpu h200 --gpus-per-node 1 --host-mem-gib 128 \
        > results/predictions/holdout-h200.csv                     (committed before the cells run)
    trainbench check-models predictions results/predictions/holdout-h200.csv

For every row of the predictions (`trainbench predict`'s CSV), the cell's metrics.json under the first
of the --runs folders that has it (default: the published runs, inputs.published): its fit/OOM verdict
against the outcome (a cell that ran `ok` fitted; `oom` did not), and for the cells that ran, the
predicted per-GPU memory (NVML 'used', what the memory model predicts) and step time against the
measured ones, as (predicted - measured) / measured. Cells with no result, or whose result is neither ok
nor oom, are listed and left out of the figures. Where the predictions have the step's parts (compute,
communication, optimizer, framework) and the cell was profiled, each part against the profile's
(reporting.predictions.MODEL_PARTS: the profile's shares of the timed median step), and the part that
missed most. An emulated rank's step (its compute alone) is set against the prediction less its
communication, and the real cells' figures are also given apart. --json writes every row and the
summary for machines.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from trainbench.checks.inputs import published
from trainbench.errors import UsageError
from trainbench.contract.result import InvalidResult, Result, read_result
from trainbench.predict.memory_model import gpu_mem_used_now_mib
from trainbench.registry.hardware import MIB
from trainbench.reporting.predictions import MODEL_PARTS, profiled_parts

GIB = 1024 * MIB


def _outcome(path: Path) -> tuple[str, Result | None]:
    if not path.exists():
        return "no result", None
    try:
        result = read_result(path)
    except InvalidResult as error:
        return f"unreadable ({error})", None
    return result.status, result


def result_of(row: dict, runs: Path | list[Path]) -> Path:
    """Where a prediction's cell has its result: under the first of `runs` that has it (none: the first's
    place for it)."""
    roots = [runs] if isinstance(runs, Path) else list(runs)
    places = [root / row["study"] / row["cell"] / "metrics.json" for root in roots]
    return next((p for p in places if p.exists()), places[0])


def compare_row(row: dict, runs: Path | list[Path]) -> dict:
    """One prediction against its cell's result."""
    status, result = _outcome(result_of(row, runs))
    predicted_fit = row["fits"] == "True"
    entry = {"study": row["study"], "cell": row["cell"], "status": status,
             "predicted_gpu_gib": float(row["gpu_mem_gib"]), "predicted_fits": predicted_fit,
             "predicted_step_s": float(row["step_time_s"]) if row.get("step_time_s") else None,
             "measured_gpu_gib": None, "measured_step_s": None, "verdict_right": None,
             "gpu_error": None, "step_error": None, "parts_ms": None, "emulated": False}
    if status not in ("ok", "oom"):
        return entry
    entry["verdict_right"] = predicted_fit == (status == "ok")
    if status == "ok":
        metrics = result.metrics
        entry["measured_gpu_gib"] = max(gpu_mem_used_now_mib(result)) * MIB / GIB
        entry["measured_step_s"] = metrics.step_time_s
        entry["gpu_error"] = entry["predicted_gpu_gib"] / entry["measured_gpu_gib"] - 1
        if result.emulated and entry["predicted_step_s"] and row.get("communication_s"):
            # an emulated rank's step is its compute alone: set against the prediction less its
            # communication (compute, optimizer and the loop's own costs remain)
            entry["predicted_step_s"] -= float(row["communication_s"])
            entry["emulated"] = True
        if entry["predicted_step_s"]:
            entry["step_error"] = entry["predicted_step_s"] / entry["measured_step_s"] - 1
        profiled = profiled_parts(metrics)
        if profiled and row.get("compute_s"):  # the pre-registered parts against the profile's
            entry["parts_ms"] = {part: (float(row[f"{part}_s"]) * 1e3, profiled[part] * 1e3)
                                 for part in MODEL_PARTS}
    return entry


def summarize(entries: list[dict]) -> dict:
    judged = [e for e in entries if e["verdict_right"] is not None]
    gpu = [abs(e["gpu_error"]) for e in entries if e["gpu_error"] is not None]
    step = [abs(e["step_error"]) for e in entries if e["step_error"] is not None]
    real = [abs(e["step_error"]) for e in entries if e["step_error"] is not None and not e["emulated"]]
    return {"step_real_cells": len(real),
            "step_real_median_abs_error": statistics.median(real) if real else None,
            "step_real_worst_abs_error": max(real) if real else None,
            "cells": len(entries), "judged": len(judged),
            "verdicts_right": sum(e["verdict_right"] for e in judged),
            "gpu_median_abs_error": statistics.median(gpu) if gpu else None,
            "gpu_worst_abs_error": max(gpu) if gpu else None,
            "step_median_abs_error": statistics.median(step) if step else None,
            "step_worst_abs_error": max(step) if step else None,
            "not_judged": [f"{e['study']}/{e['cell']}: {e['status']}" for e in entries
                           if e["verdict_right"] is None]}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def render(entries: list[dict], summary: dict) -> str:
    width = max(len(e["cell"]) for e in entries)
    lines = [f"{'cell':<{width}}  {'outcome':<9} {'verdict':<18} {'GPU GiB pred/meas':>18} {'err':>6}"
             f"  {'step s pred/meas':>17} {'err':>6}"]
    for e in entries:
        verdict = ("-" if e["verdict_right"] is None else
                   f"{'fits' if e['predicted_fits'] else 'OOM'}: "
                   f"{'right' if e['verdict_right'] else 'WRONG'}")
        gpu = (f"{e['predicted_gpu_gib']:.1f} / {e['measured_gpu_gib']:.1f}" if e["measured_gpu_gib"]
               else f"{e['predicted_gpu_gib']:.1f} / -")
        step = (f"{e['predicted_step_s']:.3f} / {e['measured_step_s']:.3f}" if e["measured_step_s"]
                else "-")
        lines.append(f"{e['cell']:<{width}}  {e['status'][:9]:<9} {verdict:<18} {gpu:>18} "
                     f"{_pct(e['gpu_error']):>6}"
                     f"  {step:>17} {_pct(e['step_error']):>6}")
    s = summary
    lines += ["", f"fit/OOM verdicts right: {s['verdicts_right']} of {s['judged']} cells "
                  "that ran or ran out of memory",
              f"GPU memory (cells that ran): median |error| {_pct(s['gpu_median_abs_error']).lstrip('+')}, "
              f"worst {_pct(s['gpu_worst_abs_error']).lstrip('+')}",
              f"step time (cells that ran): median |error| {_pct(s['step_median_abs_error']).lstrip('+')}, "
              f"worst {_pct(s['step_worst_abs_error']).lstrip('+')}"]
    if s["step_real_cells"] < sum(e["step_error"] is not None for e in entries):  # emulated ranks too
        lines += [f"  of which real cells ({s['step_real_cells']}): median |error| "
                  f"{_pct(s['step_real_median_abs_error']).lstrip('+')}, "
                  f"worst {_pct(s['step_real_worst_abs_error']).lstrip('+')}; emulated ranks against the "
                  "prediction less its communication (their step is their compute alone)"]
    parted = [e for e in entries if e["parts_ms"]]
    if parted:
        lines += ["", "the step's parts, ms predicted / profiled (the profile's shares of the timed step), "
                      "and the part that missed most:"]
        worst_parts = []
        for e in parted:
            misses = {part: predicted - measured for part, (predicted, measured) in e["parts_ms"].items()}
            worst = max(misses, key=lambda part: abs(misses[part]))
            worst_parts.append(worst)
            lines.append(f"{e['cell']:<{width}}  " + "  ".join(
                f"{part} {p:.0f}/{m:.0f}" for part, (p, m) in e["parts_ms"].items())
                + f"  -> {worst} {misses[worst]:+.0f} ms")
        lines.append("the part that missed most, by cells: "
                     + ", ".join(f"{part} {worst_parts.count(part)}" for part in MODEL_PARTS))
    if s["not_judged"]:
        shown = s["not_judged"][:4]
        more = len(s["not_judged"]) - len(shown)
        lines.append(f"not judged ({len(s['not_judged'])}): " + "; ".join(shown)
                     + (f"; and {more} more" if more else ""))
    return "\n".join(lines)


NEEDED = {"study", "cell", "gpu_mem_gib", "fits", "step_time_s"}


def read_predictions(path: Path) -> list[dict]:
    """The rows of a `trainbench predict` CSV made with --gpu (it has step times)."""
    if not path.exists():
        raise UsageError(f"no predictions file {path}")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not NEEDED <= set(rows[0]):
        raise UsageError(f"{path}: not a `trainbench predict` CSV with --gpu "
                         f"(needs the columns {', '.join(sorted(NEEDED))})")
    return rows


def run(args) -> int:
    rows = read_predictions(args.predictions)
    runs = args.runs or published("runs")
    if not runs:
        raise UsageError("no results/runs here: run from the repository root or a workspace, or pass --runs")
    entries = [compare_row(row, runs) for row in rows]
    summary = summarize(entries)
    print(render(entries, summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)  # a new round's folder
        args.json.write_text(json.dumps({"predictions": str(args.predictions), "entries": entries,
                                         "summary": summary}, indent=1) + "\n")
    return 0
