"""Predict a cell's optimizer-step time on any hardware: the physical work of a step on its busiest GPU
(`work`, from the cell and the hardware table) in seconds by efficiency constants fitted on measured
cells (`parts`, `fit`). docs/time-model.md states the model; trainbench/calibration.yaml, its evidence."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainbench.registry.frameworks import (SHARDED_TP, registry)
from trainbench.contract.result import Result
from trainbench.study.cell_view import CellView, as_view
from trainbench.study.params import CellParams
from trainbench.registry.hardware import GpuType, peak_flops, peak_flops_of
from trainbench.predict.memory_model import (block_bytes_per_token, eager_score_bytes_per_token,
                                     shard_params, vocab_parallel)
from trainbench.registry.models import ModelSpec
from trainbench.predict.communication import (Interconnect, fsdp_gathers, interconnect_of, link_gb_s,
                                             step_collectives, tp_all_reduces)

DEFAULT_CPU_THREADS = 8  # a rank's CPU optimizer threads where a cell does not say
CPU_THREAD_EXPONENT = 0.75  # CPU optimizer work divides among threads as threads ** this
OPTIMIZER_BYTES = 32.0  # an Adam step's bytes per parameter: 16 read, 12 written, 4 of the half copy
SHARPNESS = 4.0  # how sharply the slower of host and device sets the pace: (h^p + d^p)^(1/p)

CONSTANTS_FILE = Path(__file__).with_name("time_model_constants.json")


@dataclass(frozen=True)
class Work:
    """What one step asks of a cell's busiest GPU: seconds at 100% of the hardware's figures, counts."""

    loop: str  # whose training loop pays a fixed cost per step ("": none)
    loop_repeats: float  # how often a step: once, or once a micro batch
    engine: str  # DeepSpeed's engine by ZeRO stage ("ZeRO-0", "ZeRO-1/2", "ZeRO-3"; "": none)
    matmul_s: float
    unaligned_head_s: float  # the LM head's FLOPs / peak where its vocabulary is not a multiple of 8
    elementwise_s: float  # bytes a block moves outside matmuls (one pass) / HBM bandwidth
    cast_s: float  # float8's scaling and casts of the linear layers' operands / HBM bandwidth
    layer_passes: float
    dtensor_passes: float
    deterministic_passes: float
    calls: float  # framework-level collective calls the host makes
    micro_link_s: float  # tensor- and pipeline-parallel collectives per step, not overlapped, on the link
    overlapped_link_s: float  # ZeRO-3 / FSDP / DDP collectives compute can hide, on the link
    overlapped_pcie_s: float  # FSDP's offloaded parameters' traffic, prefetched / PCIe bandwidth
    overlap_budget: float  # share of the compute time that can hide it
    sync_link_s: float  # gradient and weight synchronisation after backward, exposed, on the link
    optimizer_hbm_s: float  # DeepSpeed's ZeRO optimizer step on the GPU / HBM bandwidth
    torch_optimizer_hbm_s: float
    offload_pcie_s: float  # offload traffic on the critical path (gradients down, weights up) / PCIe
    # what each CPU optimizer steps (ZeRO-3 offload's fp16 checks too), over threads ** CPU_THREAD_EXPONENT
    cpu_adam_params: float
    cpu_torch_params: float
    cpu_unscale_params: float
    cpu_host_params: float  # parameters the host's CPU optimizers step at once, all its ranks together
    pipeline_factor: float  # (ga + pp - 1) / ga: the pipeline's bubble
    ranks: float = 1.0  # ranks whose steps meet in collectives (1: one GPU, or a rank run alone)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Constants:
    """The time model's efficiency constants for one GPU type (docs/time-model.md)."""

    eta_matmul: float = 0.6  # fraction of peak FLOP/s matmuls and attention reach
    eta_unaligned: float = 0.15  # the same for an LM head of unaligned vocabulary (align1 kernels)
    elementwise_passes: float = 3.0  # elementwise traffic in units of what a block saves for backward
    layer_pass_s: float = 1e-4  # launch and Python cost of one block's forward or backward
    dtensor_pass_s: float = 1e-3  # what DTensor's dispatch adds to a block's pass under torch's tp
    deterministic_pass_s: float = 5e-4  # what deterministic algorithms add to a block's pass
    call_s: float = 5e-4  # one framework-level collective call, on the host
    exposed_share: float = 0.1  # of overlappable collectives, exposed however much compute hides them
    # fractions of HBM bandwidth an optimizer step reaches: DeepSpeed's ZeRO one, a torch one
    eta_optimizer: float = 0.3
    eta_optimizer_torch: float = 0.3
    eta_pcie: float = 0.7  # fraction of PCIe bandwidth offload copies reach
    # per second: one thread's parameters (CPU Adam, torch's Adam, fp16 checks); the host memory's
    cpu_adam_per_thread: float = 1e8
    cpu_torch_per_thread: float = 2e7
    cpu_unscale_per_thread: float = 1e8
    cpu_host_rate: float = 4e9
    # fixed cost per step of each framework's loop (starting at TimeFacts) and ZeRO stage's engine
    step_s: dict[str, float] = field(default_factory=lambda: {
        **{f.name: f.time.loop_step_s for f in registry().values() if f.time.loop_step_s is not None},
        "ZeRO-0": 0.02, "ZeRO-1/2": 0.02, "ZeRO-3": 0.02})
    # by ranks: the host part's share spent waiting in collectives; moves time between parts, not fitted
    collective_wait_share: dict[str, float] = field(default_factory=dict)
    gpu: str = "h200"  # the GPU type they were fitted on
    fitted_on: str = ""

    SCALARS = ("eta_matmul", "eta_unaligned", "elementwise_passes", "layer_pass_s", "dtensor_pass_s",
               "deterministic_pass_s", "call_s", "exposed_share", "eta_optimizer", "eta_optimizer_torch",
               "eta_pcie", "cpu_adam_per_thread", "cpu_torch_per_thread", "cpu_unscale_per_thread",
               "cpu_host_rate")

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, k) for k in self.SCALARS] + list(self.step_s.values()))

    def from_vector(self, values) -> Constants:
        """These constants with new values, in vector()'s order."""
        values = [float(v) for v in values]
        return Constants(**dict(zip(self.SCALARS, values)),
                         step_s=dict(zip(self.step_s, values[len(self.SCALARS):])),
                         collective_wait_share=dict(self.collective_wait_share), gpu=self.gpu,
                         fitted_on=self.fitted_on)

    def names(self) -> list[str]:
        return [*self.SCALARS, *(f"step_s[{k}]" for k in self.step_s)]

    def as_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.SCALARS}, "step_s": dict(self.step_s),
                "collective_wait_share": dict(self.collective_wait_share), "gpu": self.gpu,
                "fitted_on": self.fitted_on}

    def fitted_studies(self) -> set[str]:
        """The studies whose cells the constants were fitted on, as `fitted_on` names them."""
        found = re.search(r"\(([^()]*)\)", self.fitted_on)
        return {name.strip() for name in found.group(1).split(",")} if found else set()


def load_constants(path: Path = CONSTANTS_FILE) -> dict[str, Constants]:
    """The fitted constants by GPU type (`trainbench check-models time --write` writes them)."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {gpu: Constants(**values) for gpu, values in raw.items()}


def threads_of_run(doc: dict[str, Any]) -> int:
    """The threads a measured rank's CPU optimizer had, from a result document or a history line (see
    threads_of)."""
    return threads_of((doc.get("provenance") or {}).get("environment"), doc.get("params"),
                      f"{doc.get('study')}/{doc.get('cell_id')}")


def threads_of_result(result: Result) -> int:
    """The threads a measured rank's CPU optimizer had, from its result (see threads_of)."""
    return threads_of(result.provenance.get("environment"), result.params,
                      f"{result.study}/{result.cell_id}")


def threads_of(environment: dict[str, str] | None, params: dict[str, Any] | None, run: str) -> int:
    """The threads a measured rank's CPU optimizer had: OMP_NUM_THREADS as it ran; for runs that did not
    record it, the job's threads (one per GPU rank of the node); a history line cannot say."""
    if environment is None:
        if params is None:
            raise ValueError(f"{run}: the run records neither its environment nor its parameters (a "
                             "history line?): its threads are unknown")
        return int(params.get("gpus_per_node") or DEFAULT_CPU_THREADS)
    try:
        return int(environment.get("OMP_NUM_THREADS", DEFAULT_CPU_THREADS))
    except ValueError:
        return DEFAULT_CPU_THREADS


def _spans_nodes(group: int, stride: int, params: CellParams) -> bool:
    """Whether a process group of `group` ranks, `stride` apart, has ranks on more than one node."""
    return group > 1 and group * stride > params.gpus_per_node and params.nodes > 1


def _nodes_spanned(group: int, stride: int, params: CellParams) -> int:
    """The nodes a process group's ranks are on (1 where it does not span nodes)."""
    if not _spans_nodes(group, stride, params):
        return 1
    return min(params.nodes, group, math.ceil(group * stride / params.gpus_per_node))


def _compute(cell: CellParams | CellView, spec: ModelSpec, gpu: GpuType, layers: int) -> dict[str, float]:
    """The step's matmuls, elementwise traffic, FP8 casts and layer passes: Work's compute fields."""
    cell = as_view(cell)
    params = cell.params
    tp, ga, mb = params.tp, params.grad_accum, params.micro_batch
    seq = params.seq_len or spec.max_seq
    ac = bool(params.activation_checkpointing)
    peak = peak_flops(gpu, params.precision, params.tf32)
    if peak is None:
        raise ValueError(f"{gpu.key} has no {params.precision} peak")
    hbm = gpu.hbm_gb_s * 1e9
    d = spec.d_model
    block = spec.block_matmul_params()
    head = spec.matmul_params(params.head, params.num_classes) - spec.n_layer * block
    split_vocabulary = vocab_parallel(cell)
    if split_vocabulary or (spec.user_defined and spec.facts.tp_other_params):
        head /= tp
    # the blocks' matmuls, split over the tensor-parallel ranks; a user's model, the share its plan splits
    split = spec.facts.tp_block_params / spec.block_params() if spec.user_defined and tp > 1 else 1.0
    linear = 6 * block * layers * (1 - split + split / tp) * (1 + ac / 3)
    # attention's FLOPs per token and position: PaLM's 12 d a layer, or what a user's model was counted at
    per_position = spec.facts.attention_flops_per_position / spec.n_layer if spec.user_defined else 12 * d
    attention = per_position * (1 + ac / 3) * layers * seq / tp
    if params.precision == "fp32" and spec.attention_run(params.attention) in ("sdpa", "efficient"):
        # SDPA has no fp32 flash kernel: the memory-efficient one runs on CUDA cores, TF32 or not
        attention *= peak / peak_flops(gpu, "fp32", False)
    per_token = linear + attention
    tokens = mb * seq * ga
    # an eager 16-bit LM head of a vocabulary not a multiple of 8 falls back to unaligned kernels
    vocabulary = spec.with_vocab_multiple(params.vocab_multiple).vocab_size
    rows = -(-vocabulary // tp) if split_vocabulary else vocabulary
    unaligned = (params.head == "lm" and rows % 8 != 0 and not params.compile
                 and params.precision in ("bf16", "fp16"))
    if not unaligned:
        per_token += 6 * head
    cast = 0.0
    fp8_peak = peak_flops_of(gpu, "fp8") if params.float8 and spec.family == "gpt" else None
    if fp8_peak:
        # linear layers at the FP8 peak, plus their operands' scaling and casts (bf16's efficiencies)
        per_token -= linear * (1 - peak / fp8_peak)
        inputs = 2 * d + (d + spec.ffn) / tp
        output_grads = 2 * d + (3 * d + spec.ffn) / tp
        cast = tokens * layers * (2 * inputs + output_grads) * 5 / hbm
    passes = 3 + ac
    saved = block_bytes_per_token(cell, spec, traffic=True) + eager_score_bytes_per_token(cell, spec)
    return {"matmul_s": tokens * per_token / peak,
            "unaligned_head_s": tokens * 6 * head / peak if unaligned else 0.0,
            "elementwise_s": tokens * layers * saved * passes / hbm, "cast_s": cast,
            "layer_passes": ga * layers * passes}


def _communication(cell: CellParams | CellView, spec: ModelSpec, gpu: GpuType, layers: int,
                   links: Interconnect) -> dict[str, float]:
    """The step's collectives: on its critical path, overlapped with backward, or synchronous, and the
    calls that launch them (Work's link fields and calls)."""
    cell = as_view(cell)
    params = cell.params
    strategy = cell.strategy
    layout, stage = strategy.layout, strategy.zero_stage
    tp, pp, dp, ga = params.tp, params.pp, params.dp, params.grad_accum
    sent = step_collectives(cell)

    def link_s(group: str, ranks: int, nodes: int) -> float:
        return links.seconds([c for c in sent if c.group == group], link_gb_s(gpu, ranks, nodes), nodes > 1,
                             nodes)

    calls = micro_link = 0.0
    if tp > 1:
        calls += tp_all_reduces(cell, layers)
        micro_link += link_s("tp", tp, _nodes_spanned(tp, 1, params))
    if pp > 1:
        micro_link += link_s("pp", 2, 2 if _spans_nodes(pp, tp, params) else 1)
    traffic = link_s("dp", dp, _nodes_spanned(dp, tp * pp, params)) if dp > 1 else 0.0

    overlapped = sync = 0.0
    budget = 1.0
    if layout == "replicated" and dp > 1:  # DDP: one all-reduce of fp32 (autocast) gradients per step
        overlapped = traffic
        budget = 2 / 3 / ga  # the last micro batch's backward
    elif layout == "fsdp" and dp > 1:
        overlapped = traffic
        calls += (fsdp_gathers(cell) + 1) * spec.n_layer
    elif layout == "zero":
        if stage == 3:
            # a fetch is a call of bookkeeping, and of an all-gather where the weights are partitioned
            ac = bool(params.activation_checkpointing)
            fetches = ga * (2 + ac) * (spec.n_layer * spec.fetched_modules_per_block() + 1)
            calls += fetches * (1 + (dp > 1))
        if cell.overlaps_comm:
            overlapped = traffic
            budget = 1.0 if stage == 3 else 2 / 3 / ga
        else:
            sync = traffic
    return {"calls": calls, "micro_link_s": micro_link, "overlapped_link_s": overlapped,
            "overlap_budget": budget, "sync_link_s": sync}


def _optimizer(cell: CellParams | CellView, spec: ModelSpec, gpu: GpuType, cpu_threads: int,
               alone: bool) -> dict[str, float]:
    """The optimizer step, on the GPU or offloaded, and the copies offloading adds (Work's optimizer,
    PCIe and host fields)."""
    cell = as_view(cell)
    params = cell.params
    strategy = cell.strategy
    layout, stage = strategy.layout, strategy.zero_stage
    offload_optimizer, offload_param = cell.offloads
    ga, ac = params.grad_accum, bool(params.activation_checkpointing)
    hbm, pcie = gpu.hbm_gb_s * 1e9, gpu.pcie_gb_s * 1e9
    weight_bytes = 2 if params.precision != "fp32" else 4
    psi = shard_params(cell, spec)
    sharded = layout == "fsdp" or (layout == "zero" and stage >= 1)
    stepped = psi / params.dp if sharded else psi
    on_gpu = {"optimizer_hbm_s": 0.0, "torch_optimizer_hbm_s": 0.0, "offload_pcie_s": 0.0,
              "overlapped_pcie_s": 0.0}
    host = {"cpu_adam_params": 0.0, "cpu_torch_params": 0.0, "cpu_unscale_params": 0.0,
            "cpu_host_params": 0.0}
    per_thread = stepped / cpu_threads ** CPU_THREAD_EXPONENT
    # the node's ranks step their partitions at once, through one host's memory
    on_host = stepped * (1 if alone else params.gpus_per_node)
    if layout == "fsdp" and offload_param:
        # fp32 shards copied in for every gather, gradients out once a step, torch's Adam on the host
        on_gpu["overlapped_pcie_s"] = 2 * ga * 4 * stepped / pcie
        on_gpu["offload_pcie_s"] = 4 * stepped / pcie
        host.update(cpu_torch_params=per_thread, cpu_host_params=on_host)
    elif offload_optimizer:
        reductions = ga if stage in (2, 3) else 1
        on_gpu["offload_pcie_s"] = (reductions * weight_bytes + weight_bytes) * stepped / pcie
        host.update(cpu_adam_params=per_thread, cpu_host_params=on_host)
        if stage == 3 and params.precision == "fp16":
            # ZeRO-3 unscales and checks offloaded fp16 gradients on the host (stages 1-2: on the GPU)
            host["cpu_unscale_params"] = per_thread
    elif layout == "zero":  # DeepSpeed's engine steps flat fp32 partitions, with its casts and checks
        on_gpu["optimizer_hbm_s"] = OPTIMIZER_BYTES * stepped / hbm
    else:
        on_gpu["torch_optimizer_hbm_s"] = OPTIMIZER_BYTES * stepped / hbm
    if layout == "zero" and offload_param:
        # ZeRO-Infinity copies a module's partition in just before gathering it: on the critical path,
        # whether the optimizer is offloaded too or steps on the GPU
        on_gpu["offload_pcie_s"] += ga * (2 + ac) * weight_bytes * stepped / pcie
    return {**on_gpu, **host}


def work(cell: CellParams | CellView, gpu: GpuType, cpu_threads: int = DEFAULT_CPU_THREADS,
         alone: bool = False, links: Interconnect | None = None) -> Work:
    """The physical work of one step of a cell on the busiest of `gpu`s; `alone`: of that rank run by
    itself, as an emulated rank runs (no collective waits, no bubble, its host its own)."""
    cell = as_view(cell)
    params = cell.params
    spec: ModelSpec = cell.model
    framework, strategy = cell.framework, cell.strategy
    layout, stage = strategy.layout, strategy.zero_stage
    ga, pp = params.grad_accum, params.pp
    layers = math.ceil(spec.n_layer / pp)
    compute = _compute(cell, spec, gpu, layers)
    communication = _communication(cell, spec, gpu, layers,
                                   interconnect_of(gpu) if links is None else links)
    if alone:
        communication.update(micro_link_s=0.0, overlapped_link_s=0.0, sync_link_s=0.0)
    passes = compute["layer_passes"]
    return Work(
        loop="" if framework.time.loop_step_s is None else framework.name,
        loop_repeats=ga if framework.time.loop_per_micro_batch else 1,
        engine="" if layout != "zero" else f"ZeRO-{'1/2' if stage in (1, 2) else stage}",
        **compute, **communication, **_optimizer(cell, spec, gpu, cpu_threads, alone),
        dtensor_passes=passes if params.tp > 1 and strategy.tensor_parallel is SHARDED_TP else 0,
        deterministic_passes=passes if params.deterministic else 0,
        pipeline_factor=1.0 if alone else (ga + pp - 1) / ga,
        ranks=1.0 if alone else float(params.gpus))

FIELDS = [f for f in Work.__dataclass_fields__ if f not in ("loop", "engine")]


def stack(works: list[Work]) -> dict[str, np.ndarray]:
    """Works as arrays, one entry per cell (for fitting many cells at once)."""
    arrays = {f: np.array([getattr(w, f) for w in works], dtype=float) for f in FIELDS}
    arrays["loop"] = np.array([w.loop for w in works])
    arrays["engine"] = np.array([w.engine for w in works])
    return arrays


def _names(works: dict[str, np.ndarray], key: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct names of a stack's `key` (loop, engine) and each cell's index into them."""
    if f"{key}_names" in works:
        return works[f"{key}_names"], works[f"{key}_at"]
    return np.unique(works[key], return_inverse=True)


def indexed(works: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A stack with its loop and engine names indexed, for many evaluations (not to be sliced by cell)."""
    found = dict(works)
    for key in ("loop", "engine"):
        found[f"{key}_names"], found[f"{key}_at"] = np.unique(works[key], return_inverse=True)
    return found


def parts(w, c: Constants) -> dict[str, Any]:
    """Seconds by part of the step (arrays where `w` holds arrays): compute, communication not hidden,
    the optimizer, and the framework's (fixed costs and the GPU waiting on the host's launches)."""
    if isinstance(w, dict):
        loops, loop_at = _names(w, "loop")
        engines, engine_at = _names(w, "engine")
        step = (np.array([c.step_s.get(n, 0.0) for n in loops])[loop_at] * w["loop_repeats"]
                + np.array([c.step_s.get(n, 0.0) for n in engines])[engine_at])
    else:
        step = c.step_s.get(w.loop, 0.0) * w.loop_repeats + c.step_s.get(w.engine, 0.0)
    g = (lambda k: w[k]) if isinstance(w, dict) else (lambda k: getattr(w, k))
    device = (g("matmul_s") / c.eta_matmul + g("unaligned_head_s") / c.eta_unaligned
              + c.elementwise_passes * g("elementwise_s") + g("cast_s"))
    host = (c.layer_pass_s * g("layer_passes") + c.dtensor_pass_s * g("dtensor_passes")
            + c.deterministic_pass_s * g("deterministic_passes") + c.call_s * g("calls"))
    # the host queues work while the GPU computes: the slower of the two sets the pace
    busy = (host ** SHARPNESS + device ** SHARPNESS) ** (1 / SHARPNESS)
    micro = g("pipeline_factor") * (busy + g("micro_link_s"))
    hidden_traffic = g("overlapped_link_s") + g("overlapped_pcie_s") / c.eta_pcie
    exposed = np.maximum(c.exposed_share * hidden_traffic, hidden_traffic - g("overlap_budget") * device)
    optimizer = (g("optimizer_hbm_s") / c.eta_optimizer + g("torch_optimizer_hbm_s") / c.eta_optimizer_torch
                 + g("offload_pcie_s") / c.eta_pcie
                 + g("cpu_adam_params") / c.cpu_adam_per_thread
                 + g("cpu_torch_params") / c.cpu_torch_per_thread
                 + g("cpu_unscale_params") / c.cpu_unscale_per_thread
                 + g("cpu_host_params") / c.cpu_host_rate)
    # the rest of `busy` is the GPU waiting on the host; where ranks meet, partly in collectives
    waiting = g("pipeline_factor") * (busy - device)
    host = step + waiting
    in_collectives = collective_wait_share(c, g("ranks")) * host
    return {"compute": g("pipeline_factor") * device, "communication": micro - g("pipeline_factor") * busy
            + exposed + g("sync_link_s") + in_collectives, "optimizer": optimizer,
            "framework": host - in_collectives}


def collective_wait_share(c: Constants, ranks):
    """The share of the host's part `ranks` ranks spend waiting in collectives, by log2(ranks)."""
    known = sorted((int(n), share) for n, share in c.collective_wait_share.items())
    xs = [0.0] + [math.log2(n) for n, _ in known]
    ys = [0.0] + [share for _, share in known]
    return np.interp(np.log2(np.maximum(ranks, 1.0)), xs, ys)


def step_time(w, c: Constants):
    """Predicted seconds per optimizer step (an array where `w` holds arrays)."""
    return sum(parts(w, c).values())


@dataclass
class TimePrediction:
    """A cell's predicted step time on one GPU type, the rates that follow from it, and its parts."""

    step_time_s: float
    samples_per_s: float
    tokens_per_s: float
    mfu: float | None
    parts_s: dict[str, float]
    gpu: str  # the GPU type predicted for
    constants_gpu: str  # the GPU type whose fitted efficiencies were used
    note: str | None = None  # set where they are another type's, or the cell is outside the model
    # the host's whole part: `framework` and what parts() counts of it as communication
    host_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"step_time_s": round(self.step_time_s, 6), "samples_per_s": round(self.samples_per_s, 3),
                "tokens_per_s": round(self.tokens_per_s, 1),
                "mfu": None if self.mfu is None else round(self.mfu, 4),
                "parts_s": {k: round(float(v), 6) for k, v in self.parts_s.items()}, "gpu": self.gpu,
                "constants_gpu": self.constants_gpu, "note": self.note, "host_s": round(self.host_s, 6)}


def constants_for(gpu: GpuType, table: dict[str, Constants] | None = None) -> tuple[Constants, str | None]:
    """The fitted constants of a GPU type, or another type's with a note saying so."""
    table = load_constants() if table is None else table
    if gpu.key in table:
        return table[gpu.key], None
    if table:
        borrowed = next(iter(table.values()))
        return borrowed, (f"no {gpu.key} cells measured: efficiencies fitted on {borrowed.gpu}, "
                          f"with {gpu.key}'s peaks and bandwidths")
    return Constants(gpu=gpu.key), "no constants fitted: starting values"


def outside(cell: CellParams | CellView) -> str | None:
    """Why the model does not describe a cell's step (its fit leaves such cells out), or None."""
    cell = as_view(cell)
    params = cell.params
    if params.float8 and not params.compile:
        return ("float8 without torch.compile runs torchao's scaling and casts as separate kernels, which "
                "the model (its casts compiled) does not describe")
    return None


def predict(cell: CellParams | CellView, gpu: GpuType | None, constants: Constants | None = None,
            cpu_threads: int = DEFAULT_CPU_THREADS) -> TimePrediction | None:
    """A cell's step time, samples/s and MFU on GPUs of type `gpu`; None where it has nothing to say."""
    cell = as_view(cell)
    params = cell.params
    if gpu is None or params.device != "cuda":
        return None
    note = None
    if constants is None:
        constants, note = constants_for(gpu)
    try:
        w = work(cell, gpu, cpu_threads)
        spec = cell.model
    except (KeyError, ValueError):
        return None
    parts_s = parts(w, constants)
    step = float(sum(parts_s.values()))
    seq = params.seq_len or spec.max_seq
    samples = params.global_batch / step
    peak = peak_flops(gpu, params.precision, params.tf32)
    flops = spec.train_flops_per_token(seq, params.head, params.num_classes)
    mfu = samples * seq * flops / params.gpus / peak if peak else None
    note = "; ".join(n for n in (note, outside(cell)) if n) or None
    waiting = float(collective_wait_share(constants, w.ranks))
    return TimePrediction(step, samples, samples * seq, mfu, {k: float(v) for k, v in parts_s.items()},
                          gpu.key, constants.gpu, note, host_s=float(parts_s["framework"]) / (1 - waiting))


def waiting_s(cell: CellParams | CellView, gpu: GpuType, constants: Constants | None = None,
              cpu_threads: int = DEFAULT_CPU_THREADS, whole_s: float | None = None) -> float | None:
    """What a rank of the cell's world spends that the same rank run alone (emulated) does not: an
    emulated rank's step plus this is its world's whole step. `whole_s`: predict()'s step, if known."""
    cell = as_view(cell)
    if constants is None:
        constants, _ = constants_for(gpu)
    try:
        whole = step_time(work(cell, gpu, cpu_threads), constants) if whole_s is None else whole_s
        alone = step_time(work(cell, gpu, cpu_threads, alone=True), constants)
    except (KeyError, ValueError):
        return None
    return float(whole - alone)


# how far real steps came from their emulated rank's whole step (check-models emulation --write-bands)
WHOLE_STEP_BANDS_FILE = Path(__file__).with_name("whole_step_bands.json")


def wait_kind(cell: CellParams | CellView) -> str:
    """What a rank's world mostly adds to its compute, as the whole step's bands group ranks."""
    cell = as_view(cell)
    params = cell.params
    if params.tp > 1 or params.pp > 1:
        return "tensor or pipeline parallel"
    if params.offload_optimizer or params.offload_param:
        return "offloaded"
    if cell.strategy.zero_stage == 3:
        return "ZeRO-3"
    return "data parallel"


def whole_step_band(cell: CellParams | CellView, path: Path = WHOLE_STEP_BANDS_FILE) -> dict[str, Any] | None:
    """Real steps over their emulated rank's whole step, for ranks that wait as this one's world does."""
    cell = as_view(cell)
    if not path.exists():
        return None
    return json.loads(path.read_text())["bands"].get(wait_kind(cell))


def thread_ratio(cell: CellParams | CellView, gpu: GpuType | None, then: int, now: int) -> float | None:
    """The predicted step at `now` CPU threads a rank over the step at `then` (None: no prediction)."""
    cell = as_view(cell)
    at_then = predict(cell, gpu, cpu_threads=then)
    at_now = predict(cell, gpu, cpu_threads=now)
    if at_then is None or at_now is None:
        return None
    return at_now.step_time_s / at_then.step_time_s


# efficiencies are fitted within (0, 1]: no cell is explained by hardware faster than the table's
BOUNDED = ("eta_matmul", "eta_unaligned", "exposed_share", "eta_optimizer", "eta_optimizer_torch", "eta_pcie")


def _to_free(values: np.ndarray, names: list[str]) -> np.ndarray:
    """Constants to the unconstrained space the fit moves in: log, or logit of a bounded fraction."""
    bounded = np.array([n in BOUNDED for n in names])
    clipped = np.clip(values, 1e-9, 1 - 1e-9)
    return np.where(bounded, np.log(clipped / (1 - clipped)), np.log(values))


def _from_free(x: np.ndarray, names: list[str]) -> np.ndarray:
    bounded = np.array([n in BOUNDED for n in names])
    return np.where(bounded, 1 / (1 + np.exp(-x)), np.exp(x))


def fit(works: dict[str, np.ndarray], measured_s: np.ndarray, start: Constants | None = None,
        prior: float = 0.01, iterations: int = 200, initial: Constants | None = None) -> Constants:
    """The constants that best predict `measured_s` from `works` (Levenberg-Marquardt on log time): `prior`
    pulls each towards `start`, so one no cell informs stays; `initial` is where the search begins."""
    start = start or Constants()
    names = start.names()
    works = indexed(works)
    x0 = _to_free(start.vector(), names)
    target = np.log(measured_s)

    def residuals(x):
        c = start.from_vector(_from_free(x, names))
        return np.concatenate([np.log(step_time(works, c)) - target, prior * (x - x0)])

    x = _to_free(initial.vector(), names) if initial is not None else x0.copy()
    r = residuals(x)
    cost, damping = r @ r, 1e-2
    for _ in range(iterations):
        jacobian = np.empty((len(r), len(x)))
        for i in range(len(x)):
            dx = np.zeros_like(x)
            dx[i] = 1e-6
            jacobian[:, i] = (residuals(x + dx) - r) / 1e-6
        jtj, jtr = jacobian.T @ jacobian, jacobian.T @ r
        improved = converged = False
        while damping < 1e10:
            step = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-9), -jtr)
            candidate = residuals(x + step)
            if candidate @ candidate < cost:
                converged = cost - candidate @ candidate < 1e-10 * cost
                x, r, cost, improved = x + step, candidate, candidate @ candidate, True
                damping = max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved or converged:
            break
    return start.from_vector(_from_free(x, names))
