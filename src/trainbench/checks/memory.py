"""How good is the memory model? Predicted versus measured peak memory over every measured cell
(`trainbench check-models memory [FOLDER ...] [--csv FILE] [--snapshots]`).

For every metrics.json under the folders (default: the published runs and max-batch searches, whose
probes straddle each cell's OOM boundary; inputs.published): cells that ran (ok) compare the predicted
per-GPU memory with the peak NVML 'used' of the busiest GPU, and the predicted host memory with the
busiest node's ranks' peak resident memory; cells that ran out of memory check the verdict. Prints one
line per cell and the error distribution: median and worst absolute error in percent, and how many
fit/OOM verdicts were right (a cell that ran fits; a cell that hit OOM does not).

Where the GPU figure is wrong, the next lines say which half is: the tensors (the predicted allocation
against torch's peak allocated) or the caching allocator's reserve over them (torch's peak reserved over
its peak allocated, against the ALLOCATOR_SLACK the model assumes), by engine. Then the model out of
sample (memory_out_of_sample).

Emulated cells (one rank of a world of 8 to 128 on one GPU, docs/emulation.md) are the model checked at
scale: they are listed and summarised apart (goal: median GPU error <= 10%, verdicts >= 95%), and take
no part in the figures above them nor in refitting the constants (their GPU figure carries the model's
own NCCL figure, and their host figure is derived from one rank's).
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from trainbench.checks.inputs import counted_params
from trainbench.checks.inputs import metrics_files, published
from trainbench.checks.memory_out_of_sample import error_pct, linear_terms, print_out_of_sample
from trainbench.checks.memory_snapshots import print_snapshots
from trainbench.contract.result import read_result
from trainbench.predict.memory_model import (ALLOCATOR_SLACK, allocated_mib, engine, gpu_mem_used_now_mib,
                                             hardware_of_result, predict)
from trainbench.reporting.compare import shorten


def engine_label(params) -> str:
    kind, stage = engine(params)
    offload = "+offload" if params.offload_optimizer or params.offload_param else ""
    return f"{kind}{'' if stage is None else f' {stage}'}{offload}"


def measured_rows(paths: list[Path]) -> list[dict]:
    """One row per cell that ran or ran out of memory: its predictions beside its measurements."""
    rows = []
    for path in paths:
        result = read_result(path)  # checked, in the current shape (optional parameters filled in)
        if result.status not in ("ok", "oom"):
            continue
        m = result.metrics
        params = counted_params(result.params)
        hardware = hardware_of_result(result)
        pred = predict(params, hardware)
        # an emulated rank's GPU memory as the model completes it now: what a real rank would show
        used = gpu_mem_used_now_mib(result)
        row = {"study": result.study, "cell": result.cell_id, "status": result.status,
               "gpu_pred_mib": pred.gpu_mem_mib, "gpu_meas_mib": max(used or [0]) or None,
               "host_pred_mib": pred.host_mem_mib, "host_meas_mib": m.host_mem_peak_mib, "fits": pred.fits,
               "engine": engine_label(params), "tensors_pred_mib": allocated_mib(pred.parts_mib),
               "torch_alloc_mib": max(m.torch_peak_allocated_mib or [0]) or None,
               "torch_reserved_mib": max(m.torch_peak_reserved_mib or [0]) or None,
               "terms": linear_terms(result.params), "hardware": hardware}
        for kind in ("gpu", "host"):
            p, x = row[f"{kind}_pred_mib"], row[f"{kind}_meas_mib"]
            row[f"{kind}_err_pct"] = error_pct(p, x) if p and x and result.ok else None
        row["emulated"] = result.emulated
        row["one_gpu"] = params.gpus == 1 and params.device == "cuda"
        row["allocated_err_pct"] = (error_pct(row["tensors_pred_mib"], row["torch_alloc_mib"])
                                    if result.ok and row["torch_alloc_mib"] else None)
        rows.append(row)
    return rows


def _f(v, fmt):
    return format(v, fmt) if v is not None else "-"


def print_cells(rows: list[dict]) -> None:
    print(f"{'study':<15} {'cell':<62} {'status':<6} {'GPU pred':>9} {'meas':>9} {'err%':>6} "
          f"{'host pred':>10} {'meas':>9} {'err%':>6}")
    for r in rows:
        print(f"{r['study']:<15} {shorten(r['cell'], 62):<62} {r['status']:<6} "
              f"{_f(r['gpu_pred_mib'], '9.0f')} {_f(r['gpu_meas_mib'], '9.0f')} "
              f"{_f(r['gpu_err_pct'], '+6.1f')} {_f(r['host_pred_mib'], '10.0f')} "
              f"{_f(r['host_meas_mib'], '9.0f')} {_f(r['host_err_pct'], '+6.1f')}")
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
    # what a GPU alone holds beyond torch's reservation (CUDA context, cuBLAS workspace), and what a
    # DeepSpeed engine adds there: its NCCL group of one (memory_model.NCCL_MIB_ONE_DEEPSPEED_RANK)
    beyond: dict[str, list[float]] = {"with a DeepSpeed engine": [], "without": []}
    for r in split:
        if r["one_gpu"] and r["torch_reserved_mib"]:
            group = "with a DeepSpeed engine" if r["engine"].startswith("zero") else "without"
            beyond[group].append(r["gpu_meas_mib"] - r["torch_reserved_mib"])
    if all(beyond.values()):
        print("one-GPU cells, NVML used over torch's peak reservation: "
              + ", ".join(f"{name} median {statistics.median(v):,.0f} MiB ({len(v)} cells, "
                          f"{min(v):,.0f}-{max(v):,.0f})" for name, v in beyond.items()))


def print_at_scale(rows: list[dict]) -> None:
    """The emulated cells: each rank's GPU memory and verdict on the GPU it was held to."""
    if not rows:
        return
    print()
    print("at scale: emulated ranks (one rank of its world on one GPU, held to the GPU its cell names); "
          "the GPU figure is NVML's 'used' with NCCL's buffers modelled, 'alloc' torch's peak allocation "
          "against the model's tensors")
    print(f"{'study':<15} {'cell':<62} {'status':<6} {'GPU pred':>9} {'meas':>9} {'err%':>6} {'alloc%':>7} "
          f"{'verdict':>8}")
    for r in rows:
        right = r["fits"] == (r["status"] == "ok")
        print(f"{r['study']:<15} {shorten(r['cell'], 62):<62} {r['status']:<6} "
              f"{_f(r['gpu_pred_mib'], '9.0f')} {_f(r['gpu_meas_mib'], '9.0f')} "
              f"{_f(r['gpu_err_pct'], '+6.1f')} {_f(r['allocated_err_pct'], '+7.1f')} "
              f"{'right' if right else 'WRONG':>8}")
    gpu = [abs(r["gpu_err_pct"]) for r in rows if r["gpu_err_pct"] is not None]
    allocated = [abs(r["allocated_err_pct"]) for r in rows if r["allocated_err_pct"] is not None]
    right = sum(r["fits"] == (r["status"] == "ok") for r in rows)
    print(f"emulated: {len(rows)} cells ({sum(r['status'] == 'ok' for r in rows)} trained, "
          f"{sum(r['status'] == 'oom' for r in rows)} ran out of memory); GPU memory median |error| "
          f"{statistics.median(gpu):.1f}%, worst {max(gpu):.1f}%, within 10%: {sum(e <= 10 for e in gpu)} of "
          f"{len(gpu)}; tensors (torch's peak allocated) median {statistics.median(allocated):.1f}%, worst "
          f"{max(allocated):.1f}%; verdicts {right} of {len(rows)} right "
          "(goal: median <= 10%, verdicts >= 95%)")
    for study in sorted({r["study"] for r in rows}):
        members = [r for r in rows if r["study"] == study]
        errors = [abs(r["gpu_err_pct"]) for r in members if r["gpu_err_pct"] is not None]
        print(f"  {study:<15} {len(members)} cells: GPU median {statistics.median(errors):.1f}%, worst "
              f"{max(errors):.1f}%; verdicts {sum(r['fits'] == (r['status'] == 'ok') for r in members)}/"
              f"{len(members)}")


def run(args) -> int:
    folders = args.folders or published("runs", "search")
    paths = metrics_files(folders)
    if args.snapshots:
        return print_snapshots(paths)
    rows = measured_rows(paths)
    emulated = [r for r in rows if r["emulated"]]
    rows = [r for r in rows if not r["emulated"]]
    if not rows:
        print(f"no measured cells under {', '.join(map(str, folders))}", file=sys.stderr)
        return 1
    print_cells(rows)
    print_out_of_sample(rows)
    print_at_scale(emulated)
    if args.csv:
        with args.csv.open("w", newline="") as f:
            fields = [k for k in rows[0] if k not in ("terms", "hardware")]
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows + emulated)
    return 0
