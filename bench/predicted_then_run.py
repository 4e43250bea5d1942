"""Predictions made before cells ran, held against what the cells measured.

    trainbench predict holdout --gpu h200 --gpus-per-node 1 --host-mem-gib 128 \
        > results/predictions/holdout-h200.csv                     (committed before the cells run)
    python bench/predicted_then_run.py results/predictions/holdout-h200.csv [--runs results/runs]

For every row of the predictions (`trainbench predict`'s CSV), the cell's metrics.json under
--runs: its fit/OOM verdict against the outcome (a cell that ran `ok` fitted; `oom` did not), and
for the cells that ran, the predicted per-GPU memory (NVML 'used', what the memory model predicts)
and step time against the measured ones, as (predicted - measured) / measured. Cells with no
result, or whose result is neither ok nor oom, are listed and left out of the figures. Where the
predictions have the step's parts (compute, communication, optimizer, framework) and the cell was
profiled, each part against the profile's (reporting.predictions.MODEL_PARTS: the profile's shares
of the timed median step), and the part that missed most. An emulated rank's step (its compute alone)
is set against the prediction less its communication, and the real cells' figures are also given
apart. --json writes every row and the summary for machines.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from trainbench.registry.hardware import MIB  # noqa: E402
from trainbench.execute.results import InvalidResult, read_result  # noqa: E402
from trainbench.reporting.predictions import MODEL_PARTS, profiled_parts  # noqa: E402

GIB = 1024 * MIB


def _outcome(path: Path) -> tuple[str, dict | None]:
    if not path.exists():
        return "no result", None
    try:
        doc = read_result(path)
    except InvalidResult as error:
        return f"unreadable ({error})", None
    return doc["status"], doc


def compare_row(row: dict, runs: Path) -> dict:
    """One prediction against its cell's result."""
    status, doc = _outcome(runs / row["study"] / row["cell"] / "metrics.json")
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
        metrics = doc["metrics"]
        entry["measured_gpu_gib"] = max(metrics["gpu_mem_used_mib"]) * MIB / GIB
        entry["measured_step_s"] = metrics["step_time_s"]
        entry["gpu_error"] = entry["predicted_gpu_gib"] / entry["measured_gpu_gib"] - 1
        if doc.get("emulation") and entry["predicted_step_s"] and row.get("communication_s"):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("predictions", type=Path, help="a CSV written by `trainbench predict`")
    parser.add_argument("--runs", type=Path, default=REPO / "results" / "runs", help="the results' root")
    parser.add_argument("--json", type=Path, help="also write every row and the summary here")
    args = parser.parse_args(argv)
    if not args.predictions.exists():
        parser.error(f"no predictions file {args.predictions}")
    with open(args.predictions, newline="") as f:
        rows = list(csv.DictReader(f))
    needed = {"study", "cell", "gpu_mem_gib", "fits", "step_time_s"}
    if not rows or not needed <= set(rows[0]):
        parser.error(f"{args.predictions}: not a `trainbench predict` CSV with --gpu "
                     f"(needs the columns {', '.join(sorted(needed))})")
    entries = [compare_row(row, args.runs) for row in rows]
    summary = summarize(entries)
    print(render(entries, summary))
    if args.json:
        args.json.write_text(json.dumps({"predictions": str(args.predictions), "entries": entries,
                                         "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
