"""How good is the memory model? Predicted versus measured peak memory over every measured cell.

    python bench/memory_model.py [FOLDER ...] [--csv FILE]

For every metrics.json under the folders (default: results/runs, and results/search, whose max-batch
probes straddle each cell's OOM boundary): cells that ran (ok) compare the predicted per-GPU
memory with the peak NVML 'used' of the busiest GPU, and the predicted host memory with the busiest
node's ranks' peak resident memory; cells that ran out of memory check the verdict. Prints one line
per cell and the error distribution: median and worst absolute error in percent, and how many
fit/OOM verdicts were right (a cell that ran fits; a cell that hit OOM does not).

Where the GPU figure is wrong, the last lines say which half is: the tensors (the predicted
allocation against torch's peak allocated) or the caching allocator's reserve over them (torch's
peak reserved over its peak allocated, against the ALLOCATOR_SLACK the model assumes), by engine.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from trainbench.compare import shorten
from trainbench.memory_model import ALLOCATOR_SLACK, allocated_mib, engine, hardware_of_run, predict
from trainbench.results import read_json


def error_pct(predicted, measured):
    return 100.0 * (predicted - measured) / measured


def engine_label(params: dict) -> str:
    kind, stage = engine(params)
    offload = "+offload" if params.get("offload_optimizer") or params.get("offload_param") else ""
    return f"{kind}{'' if stage is None else f' {stage}'}{offload}"


def print_gpu_split(rows: list[dict]) -> None:
    """Tensor error and allocator reserve, by engine, for the cells whose torch peaks were recorded."""
    split = [r for r in rows if r["gpu_err_pct"] is not None and r["torch_alloc_mib"]]
    if not split:
        return
    errors = [abs(error_pct(r["tensors_pred_mib"], r["torch_alloc_mib"])) for r in split]
    print(f"tensors (predicted allocation vs torch's peak allocated): {len(split)} cells, median |error| "
          f"{statistics.median(errors):.1f}%, worst {max(errors):.1f}%")
    print(f"allocator reserve (torch's peak reserved / peak allocated; the model assumes "
          f"{ALLOCATOR_SLACK:.2f}):")
    for label in sorted({r["engine"] for r in split}):
        group = [r for r in split if r["engine"] == label]
        ratios = [r["torch_reserved_mib"] / r["torch_alloc_mib"] for r in group]
        tensor_err = [error_pct(r["tensors_pred_mib"], r["torch_alloc_mib"]) for r in group]
        print(f"  {label:<22} {len(group):>3} cells: reserve median {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}), tensors median error "
              f"{statistics.median(tensor_err):+.1f}%")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path,
                        default=[Path("results/runs"), Path("results/search")])
    parser.add_argument("--csv", type=Path, help="also write the per-cell comparison here")
    args = parser.parse_args(argv)
    rows = []
    for path in sorted(p for folder in args.folders for p in folder.glob("**/metrics.json")):
        doc = read_json(path)
        if doc["status"] not in ("ok", "oom"):
            continue
        m = doc["metrics"]
        pred = predict(doc["params"], hardware_of_run(doc))
        row = {"study": doc["study"], "cell": doc["cell_id"], "status": doc["status"],
               "gpu_pred_mib": pred.gpu_mem_mib, "gpu_meas_mib": max(m["gpu_mem_used_mib"] or [0]) or None,
               "host_pred_mib": pred.host_mem_mib, "host_meas_mib": m["host_mem_peak_mib"], "fits": pred.fits,
               "engine": engine_label(doc["params"]), "tensors_pred_mib": allocated_mib(pred.parts_mib),
               "torch_alloc_mib": max(m.get("torch_peak_allocated_mib") or [0]) or None,
               "torch_reserved_mib": max(m.get("torch_peak_reserved_mib") or [0]) or None}
        for kind in ("gpu", "host"):
            p, x = row[f"{kind}_pred_mib"], row[f"{kind}_meas_mib"]
            row[f"{kind}_err_pct"] = error_pct(p, x) if p and x and doc["status"] == "ok" else None
        rows.append(row)
    if not rows:
        print(f"no measured cells under {', '.join(map(str, args.folders))}", file=sys.stderr)
        return 1
    print(f"{'study':<15} {'cell':<62} {'status':<6} {'GPU pred':>9} {'meas':>9} {'err%':>6} "
          f"{'host pred':>10} {'meas':>9} {'err%':>6}")
    for r in rows:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        print(f"{r['study']:<15} {shorten(r['cell'], 62):<62} {r['status']:<6} "
              f"{f(r['gpu_pred_mib'], '9.0f')} {f(r['gpu_meas_mib'], '9.0f')} {f(r['gpu_err_pct'], '+6.1f')} "
              f"{f(r['host_pred_mib'], '10.0f')} "
              f"{f(r['host_meas_mib'], '9.0f')} {f(r['host_err_pct'], '+6.1f')}")
    print()
    for kind, label in (("gpu", "GPU memory per GPU (NVML used)"),
                        ("host", "host memory per node (ranks' RSS)")):
        errors = [abs(r[f"{kind}_err_pct"]) for r in rows if r[f"{kind}_err_pct"] is not None]
        if errors:
            print(f"{label}: {len(errors)} cells, median |error| {statistics.median(errors):.1f}%, "
                  f"worst {max(errors):.1f}%, within 10%: {sum(e <= 10 for e in errors)}, "
                  f"within 25%: {sum(e <= 25 for e in errors)}")
    print_gpu_split(rows)
    judged = [r for r in rows if r["fits"] is not None]
    right = sum((r["fits"] and r["status"] == "ok") or (not r["fits"] and r["status"] == "oom")
                for r in judged)
    print(f"fit/OOM verdicts: {right} of {len(judged)} right (cells with a known machine: "
          f"{sum(r['status'] == 'ok' for r in judged)} ran, "
          f"{sum(r['status'] == 'oom' for r in judged)} hit OOM)")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
