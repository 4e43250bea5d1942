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

With --snapshots, instead: every cell whose run kept an allocator snapshot (metrics.memory_snapshot,
docs/profiles.md "Memory snapshots") has the snapshot's peak by category set beside the model's parts
summed into the same categories, and torch's reserve over that peak beside the model's slack.

Emulated cells (one rank of a world of 8 to 128 on one GPU, docs/emulation.md) are the model
checked at scale: they are listed and summarised apart (goal: median GPU error <= 10%, verdicts >=
95%), and take no part in the figures above them nor in refitting the constants (their GPU figure
carries the model's own NCCL figure, and their host figure is derived from one rank's).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from trainbench.reporting.compare import shorten
from trainbench.predict.memory_model import (ALLOCATOR_SLACK, allocated_mib, engine, hardware_of_run,
                                             nccl_buffers_mib, predict)
from trainbench.execute.results import read_result
from trainbench.study.params import CellParams


def error_pct(predicted, measured):
    return 100.0 * (predicted - measured) / measured


def engine_label(params) -> str:
    kind, stage = engine(params)
    offload = "+offload" if params.offload_optimizer or params.offload_param else ""
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


# --- out of sample -------------------------------------------------------------------------------
# The memory model's constants set from measurements (the others are data-sheet or library facts, or
# structure): the GPU figure is allocation x ALLOCATOR_SLACK + CUDA_CONTEXT_MIB (+ NCCL_SCALE x the
# layout's NCCL figure with more than one rank), the host figure ranks x (HOST_RANK_BASE_MIB + the
# framework's own + model states + OFFLOAD_STAGING_BYTES per offloaded parameter). Both are linear in
# their constants, so a fit is a least-squares solve on relative error; the out-of-sample figures
# refit them without the held-out cell (leave-one-out) or study (leave-one-study-out) and predict it
# with the refit constants.
GPU_CONSTANTS = ("ALLOCATOR_SLACK", "CUDA_CONTEXT_MIB", "NCCL_SCALE")
HOST_CONSTANTS = ("HOST_RANK_BASE_MIB[cuda]", "OFFLOAD_STAGING_BYTES")
NOT_REFIT = (
    "not refit (no constant of them is fitted from data, or it is structure chosen after looking at a "
    "study, so their held-out study's error is not out of sample for them): the ZeRO/FSDP/DDP state "
    "formulas and activation counts (papers, tests against real blocks); FSDP1 accumulation's unsharded "
    "gradients (chosen on llama's 4 FSDP cells); tensor parallelism's whole norm outputs (chosen on "
    "megatron's searches); AutoTP's whole-model build (zero3_pipeline); what torch.compile saves and "
    "its logits without an fp32 copy at a vocabulary padded to 64 (baseline's cells, bench/mfu.py); "
    "the frameworks' host extras "
    "(Lightning's 900 MiB from the lightning study, the Hugging Face Trainer's taken from it); DeepSpeed's "
    "import (75 MiB) and the CPU ranks' base (smoke)")


def linear_terms(doc: dict) -> dict | None:
    """A measured cell's predictions as linear functions of the fitted constants: GPU = slack x alloc +
    context + nccl scale x the layout's NCCL figure; host = ranks x (base + rest + staging x offloaded)
    (MiB)."""
    from trainbench.registry.frameworks import framework_of
    from trainbench.predict.memory_model import (DEEPSPEED_IMPORT_MIB, HOST_RANK_BASE_MIB,
                                                 OFFLOAD_STAGING_BYTES,
                                         model_states)
    from trainbench.registry.models import get_model

    params = CellParams.from_dict(doc["params"])
    if params.device != "cuda":
        return None
    pred = predict(params)
    _, on_host = model_states(params, get_model(params.model))
    ranks = params.gpus_per_node
    staging = on_host.get("offload_staging", 0.0) / OFFLOAD_STAGING_BYTES / 2**20  # offloaded params (Mi)
    kind, _ = engine(params)
    rest = (framework_of(params).memory.host_extra_mib["cuda"]
            + (DEEPSPEED_IMPORT_MIB if kind == "zero" else 0)
            + (sum(on_host.values()) - on_host.get("offload_staging", 0.0)) / 2**20)
    assert abs(ranks * (HOST_RANK_BASE_MIB["cuda"] + rest + OFFLOAD_STAGING_BYTES * staging)
               - pred.host_mem_mib) < 1e-3 * pred.host_mem_mib
    # what the allocator holds beyond its slack (FSDP1's reserved gradient shards) is not scaled by it
    reserved = sum(v for k, v in pred.parts_mib.items()
                   if k.startswith("allocator_") and k != "allocator_slack")
    return {"alloc": allocated_mib(pred.parts_mib), "reserved": reserved, "nccl": nccl_buffers_mib(params),
            "ranks": ranks, "rest": rest, "staging": staging}


def fit_constants(rows: list[dict]) -> dict[str, float]:
    """The constants from `rows` (cells that ran): the CUDA context as what NVML shows over torch's peak
    reservation on one GPU, NCCL's scale as that over the context with more, over the layout's figure
    (medians: what they are by definition); the allocator slack, the host base per rank and the offload
    staging by least squares on the relative error of the GPU and host figures."""
    import numpy as np

    from trainbench.predict.memory_model import CUDA_CONTEXT_MIB, OFFLOAD_STAGING_BYTES

    beyond = [(r["gpu_meas_mib"] - r["torch_reserved_mib"], r["terms"]["nccl"]) for r in rows
              if r["gpu_meas_mib"] and r["torch_reserved_mib"]]
    one = [b for b, nccl in beyond if not nccl]
    context = statistics.median(one) if one else CUDA_CONTEXT_MIB
    # NCCL's figures are the layouts' (memory_model.NCCL_MIB_BY_LAYOUT): refit as one scale on them all
    many = [(b - context) / nccl for b, nccl in beyond if nccl]
    nccl_scale = statistics.median(many) if many else 1.0
    gpu = [r for r in rows if r["gpu_meas_mib"]]
    measured = np.array([r["gpu_meas_mib"] for r in gpu])
    alloc = np.array([r["terms"]["alloc"] for r in gpu]) / measured
    fixed = np.array([context + nccl_scale * r["terms"]["nccl"] + r["terms"]["reserved"]
                      for r in gpu]) / measured
    slack = float(alloc @ (1 - fixed) / (alloc @ alloc))
    host = [r for r in rows if r["host_meas_mib"]]
    t = [r["terms"] for r in host]
    measured = np.array([r["host_meas_mib"] for r in host])
    a = np.array([[x["ranks"], x["ranks"] * x["staging"]] for x in t]) / measured[:, None]
    b = 1 - np.array([x["ranks"] * x["rest"] for x in t]) / measured
    if any(x["staging"] for x in t):
        base, staging = np.linalg.lstsq(a, b, rcond=None)[0]
    else:  # no offloaded cell to fit the staging on: keep the model's
        staging = OFFLOAD_STAGING_BYTES
        base = float(a[:, 0] @ (b - a[:, 1] * staging) / (a[:, 0] @ a[:, 0]))
    return {"ALLOCATOR_SLACK": slack, "CUDA_CONTEXT_MIB": context, "NCCL_SCALE": nccl_scale,
            "HOST_RANK_BASE_MIB[cuda]": float(base), "OFFLOAD_STAGING_BYTES": float(staging)}


def predict_with(row: dict, constants: dict[str, float]) -> tuple[float, float]:
    t = row["terms"]
    gpu = (constants["ALLOCATOR_SLACK"] * t["alloc"] + t["reserved"] + constants["CUDA_CONTEXT_MIB"]
           + constants["NCCL_SCALE"] * t["nccl"])
    host = t["ranks"] * (constants["HOST_RANK_BASE_MIB[cuda]"] + t["rest"]
                         + constants["OFFLOAD_STAGING_BYTES"] * t["staging"])
    return gpu, host


def shipped_constants() -> dict[str, float]:
    from trainbench.predict import memory_model

    return {"ALLOCATOR_SLACK": memory_model.ALLOCATOR_SLACK,
            "CUDA_CONTEXT_MIB": memory_model.CUDA_CONTEXT_MIB,
            "NCCL_SCALE": 1.0,  # on NCCL_MIB_BY_LAYOUT
            "HOST_RANK_BASE_MIB[cuda]": memory_model.HOST_RANK_BASE_MIB["cuda"],
            "OFFLOAD_STAGING_BYTES": memory_model.OFFLOAD_STAGING_BYTES}


def errors_of(rows: list[dict], predictions: list[tuple[float, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"gpu": [], "host": []}
    for r, (gpu, host) in zip(rows, predictions):
        if r["status"] != "ok":
            continue
        if r["gpu_meas_mib"]:
            out["gpu"].append(abs(error_pct(gpu, r["gpu_meas_mib"])))
        if r["host_meas_mib"]:
            out["host"].append(abs(error_pct(host, r["host_meas_mib"])))
    return out


def verdicts_of(rows: list[dict], predictions: list[tuple[float, float]]) -> tuple[int, int]:
    right = judged = 0
    for r, (gpu, host) in zip(rows, predictions):
        if r["hardware"] is None or r["status"] not in ("ok", "oom"):
            continue
        hw = r["hardware"]
        fits = (hw.gpu_mem_mib is None or gpu <= hw.gpu_mem_mib) and host <= hw.host_mem_mib
        judged += 1
        right += fits == (r["status"] == "ok")
    return right, judged


def summary_text(errors: dict[str, list[float]]) -> str:
    parts = []
    for kind, label in (("gpu", "GPU"), ("host", "host")):
        e = errors[kind]
        parts.append(f"{label} median {statistics.median(e):.1f}% worst {max(e):.1f}% ({len(e)})" if e
                     else f"{label} -")
    return ", ".join(parts)


def print_out_of_sample(rows: list[dict]) -> None:
    rows = [r for r in rows if r["terms"]]
    fitted_rows = [r for r in rows if r["status"] == "ok"]  # OOM cells have no peak to fit
    shipped = shipped_constants()
    everything = fit_constants(fitted_rows)
    print()
    print("out of sample (GPU cells; the constants set from measurements refit without what is predicted):")
    print(f"  {'constant':<26} {'the model':>10} {'fitted on all':>14}")
    for name in (*GPU_CONSTANTS, *HOST_CONSTANTS):
        print(f"  {name:<26} {shipped[name]:>10.2f} {everything[name]:>14.2f}")
    in_sample = [predict_with(r, shipped) for r in rows]
    refit_all = [predict_with(r, everything) for r in rows]
    loo = []
    for r in rows:
        constants = fit_constants([x for x in fitted_rows if x is not r])
        loo.append(predict_with(r, constants))
    print(f"  the model's constants, in sample:     {summary_text(errors_of(rows, in_sample))}; "
          f"verdicts {'/'.join(map(str, verdicts_of(rows, in_sample)))}")
    print(f"  fitted on all cells, in sample:       {summary_text(errors_of(rows, refit_all))}; "
          f"verdicts {'/'.join(map(str, verdicts_of(rows, refit_all)))}")
    print(f"  leave-one-out (refit without the cell): {summary_text(errors_of(rows, loo))}; "
          f"verdicts {'/'.join(map(str, verdicts_of(rows, loo)))}")
    print("  leave-one-study-out (refit without the study; its cells predicted; in sample with the model's "
          "constants beside):")
    held_out = []
    for study in sorted({r["study"] for r in rows}):
        members = [r for r in rows if r["study"] == study]
        constants = fit_constants([x for x in fitted_rows if x["study"] != study])
        predictions = [predict_with(r, constants) for r in members]
        held_out += list(zip(members, predictions))
        right, judged = verdicts_of(members, predictions)
        print(f"    {study:<15} {summary_text(errors_of(members, predictions))}; verdicts {right}/{judged}; "
              f"in sample {summary_text(errors_of(members, [predict_with(r, shipped) for r in members]))}; "
              f"refit slack {constants['ALLOCATOR_SLACK']:.2f}, context {constants['CUDA_CONTEXT_MIB']:.0f}, "
              f"NCCL x{constants['NCCL_SCALE']:.2f}, host base {constants['HOST_RANK_BASE_MIB[cuda]']:.0f}, "
              f"staging {constants['OFFLOAD_STAGING_BYTES']:.1f}")
    members, predictions = zip(*held_out)
    print("    every cell predicted with its study held out: "
          f"{summary_text(errors_of(members, predictions))}; "
          f"verdicts {'/'.join(map(str, verdicts_of(members, predictions)))}")
    print(f"  {NOT_REFIT}.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path,
                        default=[Path("results/runs"), Path("results/search")])
    parser.add_argument("--csv", type=Path, help="also write the per-cell comparison here")
    parser.add_argument("--snapshots", action="store_true",
                        help="the cells' allocator snapshots beside the model's parts, by category")
    args = parser.parse_args(argv)
    if args.snapshots:
        found = sorted(p for folder in args.folders for p in folder.glob("**/metrics.json"))
        return print_snapshots(found)
    rows = []
    for path in sorted(p for folder in args.folders for p in folder.glob("**/metrics.json")):
        doc = read_result(path)  # checked, in the current shape (optional parameters filled in)
        if doc["status"] not in ("ok", "oom"):
            continue
        m = doc["metrics"]
        params = CellParams.from_dict(doc["params"])
        pred = predict(params, hardware_of_run(doc))
        row = {"study": doc["study"], "cell": doc["cell_id"], "status": doc["status"],
               "gpu_pred_mib": pred.gpu_mem_mib, "gpu_meas_mib": max(m["gpu_mem_used_mib"] or [0]) or None,
               "host_pred_mib": pred.host_mem_mib, "host_meas_mib": m["host_mem_peak_mib"], "fits": pred.fits,
               "engine": engine_label(params), "tensors_pred_mib": allocated_mib(pred.parts_mib),
               "torch_alloc_mib": max(m.get("torch_peak_allocated_mib") or [0]) or None,
               "torch_reserved_mib": max(m.get("torch_peak_reserved_mib") or [0]) or None,
               "terms": linear_terms(doc), "hardware": hardware_of_run(doc)}
        for kind in ("gpu", "host"):
            p, x = row[f"{kind}_pred_mib"], row[f"{kind}_meas_mib"]
            row[f"{kind}_err_pct"] = error_pct(p, x) if p and x and doc["status"] == "ok" else None
        row["emulated"] = bool(doc.get("emulation"))
        row["allocated_err_pct"] = (error_pct(row["tensors_pred_mib"], row["torch_alloc_mib"])
                                    if doc["status"] == "ok" and row["torch_alloc_mib"] else None)
        rows.append(row)
    emulated = [r for r in rows if r["emulated"]]
    rows = [r for r in rows if not r["emulated"]]
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
    print_out_of_sample(rows)
    print_at_scale(emulated)
    if args.csv:
        with args.csv.open("w", newline="") as f:
            fields = [k for k in rows[0] if k not in ("terms", "hardware")]
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows + emulated)
    return 0


# The model's parts as a snapshot sorts the allocator's blocks (trainbench.execute.profiling): by the
# runner's parameters, gradients and optimizer states; all else is activations and other.
SNAPSHOT_CATEGORY = {"weights": "parameters", "weights_at_init": "parameters",
                     "gradients": "gradients", "gradients_beyond_activations": "gradients",
                     "unsharded_gradients": "gradients", "optimizer": "optimizer_states"}


def print_snapshots(paths: list[Path]) -> int:
    """Each kept snapshot's peak by category (MiB) against the memory model's parts in the same categories."""
    found = 0
    for path in paths:
        doc = read_result(path)
        snapshot = doc["metrics"].get("memory_snapshot") if doc["status"] in ("ok", "oom") else None
        if not snapshot:
            continue
        found += 1
        params = CellParams.from_dict(doc["params"])
        parts = predict(params, hardware_of_run(doc)).parts_mib
        model: dict[str, float] = {}
        for part, mib in parts.items():
            # what allocated_mib counts (not the allocator's reserve or gradient shards it holds
            # beyond the allocation, not the CUDA context), so the categories add up to its total
            if not part.startswith("allocator_") and part != "cuda_context":
                category = SNAPSHOT_CATEGORY.get(part, "activations_and_other")
                model[category] = model.get(category, 0.0) + mib
        measured = snapshot["peak_by_category_mib"]
        print(f"{doc['study']}/{doc['cell_id']} ({doc['status']}, rank {snapshot['rank']}; {path})")
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
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        right = r["fits"] == (r["status"] == "ok")
        print(f"{r['study']:<15} {shorten(r['cell'], 62):<62} {r['status']:<6} "
              f"{f(r['gpu_pred_mib'], '9.0f')} {f(r['gpu_meas_mib'], '9.0f')} "
              f"{f(r['gpu_err_pct'], '+6.1f')} {f(r['allocated_err_pct'], '+7.1f')} "
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


if __name__ == "__main__":
    sys.exit(main())
