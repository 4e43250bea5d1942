"""The memory model out of sample: its constants set from measurements refit without the cell or the
study predicted (`trainbench check-models memory`, its last section but the emulated cells').

The constants set from measurements (the others are data-sheet or library facts, or structure): the GPU
figure is allocation x ALLOCATOR_SLACK + CUDA_CONTEXT_MIB (+ NCCL_SCALE x the layout's NCCL figure with
more than one rank), the host figure ranks x (HOST_RANK_BASE_MIB + the framework's own + model states +
OFFLOAD_STAGING_BYTES per offloaded parameter). Both are linear in their constants, so a fit is a
least-squares solve on relative error; the out-of-sample figures refit them without the held-out cell
(leave-one-out) or study (leave-one-study-out) and predict it with the refit constants.
"""

from __future__ import annotations

import statistics

import numpy as np

from trainbench.checks.inputs import counted_params
from trainbench.predict import memory_model
from trainbench.predict.memory_model import (CUDA_CONTEXT_MIB, DEEPSPEED_IMPORT_MIB, HOST_RANK_BASE_MIB,
                                             OFFLOAD_STAGING_BYTES, allocated_mib, engine, model_states,
                                             nccl_buffers_mib, predict)
from trainbench.registry.frameworks import framework_of
from trainbench.registry.models import get_model


def error_pct(predicted, measured):
    return 100.0 * (predicted - measured) / measured


GPU_CONSTANTS = ("ALLOCATOR_SLACK", "CUDA_CONTEXT_MIB", "NCCL_SCALE")
HOST_CONSTANTS = ("HOST_RANK_BASE_MIB[cuda]", "OFFLOAD_STAGING_BYTES")
NOT_REFIT = (
    "not refit (no constant of them is fitted from data, or it is structure chosen after looking at a "
    "study, so their held-out study's error is not out of sample for them): the ZeRO/FSDP/DDP state "
    "formulas and activation counts (papers, tests against real blocks); FSDP1 accumulation's unsharded "
    "gradients (chosen on llama's 4 FSDP cells); tensor parallelism's whole norm outputs (chosen on "
    "megatron's searches); AutoTP's whole-model build (zero3_pipeline); what torch.compile saves and "
    "its logits without an fp32 copy at a vocabulary padded to 64 (baseline's cells, "
    "validation/scripts/mfu.py); the loss's fp32 logits, FSDP2's accumulated gradients and the moment "
    "ZeRO 0-2 peak at (allocator snapshots of baseline, scaling, megatron, holdout_4gpu and holdout_comm "
    "cells); DistilBERT's inputs cast by q, k and v, what it holds beyond its blocks at its peak, and "
    "ZeRO-1/2's two buckets under overlap_comm "
    "(snapshots of lightning and holdout cells); a one-GPU DeepSpeed engine's NCCL group of one (the "
    "median of every one-GPU ZeRO cell); the frameworks' host extras "
    "(Lightning's 900 MiB from the lightning study, the Hugging Face Trainer's taken from it); DeepSpeed's "
    "import (75 MiB) and the CPU ranks' base (smoke)")


def linear_terms(params_dict: dict) -> dict | None:
    """A measured cell's predictions (its parameters as its result holds them) as linear functions of
    the fitted constants: GPU = slack x alloc + context + nccl scale x the layout's NCCL figure; host =
    ranks x (base + rest + staging x offloaded) (MiB)."""
    params = counted_params(params_dict)
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
