"""Predict a cell's optimizer-step time on any hardware, beside the memory model's memory.

A step is what one GPU (the busiest: the last pipeline stage, which holds the LM head) must do, in
physical quantities computed from the cell and the hardware table alone (`work`), turned into seconds
by a handful of efficiency constants fitted on the measured cells (`step_time`, `fit`):

    T = r x t_loop[framework] + t_engine[ZeRO stage]      fixed costs (r: 1, or ga for a loop per micro batch)
      + (ga + pp - 1) / ga x (busy + C_tp,pp)                                micro batches, the bubble
      + max(s_exp x C_hide, C_hide + prefetch_bytes / (e_pcie x B_pcie) - budget x D)   hidden, or not
      + C_sync                                                      gradient and weight synchronisation
      + opt_bytes / (e_opt x B_hbm)                                               optimizer on the GPU
      + offload_bytes / (e_pcie x B_pcie) + params / (threads^a x r_cpu)  or offloaded to the CPU (a 0.75)
      + node_params / R_host                         the node's CPU optimizers share its host memory

    busy = (H^4 + D^4)^(1/4)      the host queues work while the GPU runs it: the slower sets the pace
    D = F / (e_mm x peak) + F_head / (e_unaligned x peak)
        + k_elem x elem_bytes / B_hbm (+ cast_bytes / B_hbm)                  the device's compute
    H = t_layer x layer_passes + t_dt x dtensor_passes + t_det x det_passes
        + t_call x calls                                                       the host's launches

- F, the matmul and attention FLOPs of the step on the GPU: per token 6 x the block parameters of the
  GPU's shard (tensor parallelism divides them, pipeline stages split the layers) plus 12 L d S / tp
  for attention (PaLM's count), plus 6 x the head (AutoTP leaves it whole on every tensor-parallel
  rank; vocabulary-parallel tensor parallelism divides it by tp), and with activation checkpointing
  the blocks' forward again (2N + 4 L d S per token); times micro batch x sequence x accumulation.
  peak: the GPU's dense peak at the cell's compute type; SDPA's fp32 attention at the fp32 peak even
  with TF32 (no fp32 flash kernel: the memory-efficient one runs on CUDA cores).
- F_head, an eager 16-bit LM head's FLOPs where its vocabulary is not a multiple of 8 (GPT-2's 50,257
  unpadded): cuBLAS has no aligned tensor-core kernel for it, and cutlass's align1 fallback reaches a
  fraction of the peak (e_unaligned, fitted: 0.15; profiled: 0.11). Otherwise the head is in F.
- float8 cells (torchao): the blocks' linear FLOPs at the FP8 peak, and cast_bytes, the scaling and
  casting of each linear's input (twice: forward and backward) and output gradient (5 bytes per
  element); unfitted.
- elem_bytes: what the blocks read and write outside matmuls (norms, activations, residual adds), in
  proportion to the tensors a block saves for backward (the memory model's count, per family and
  dtype) once forward, twice backward, once more when recomputed. This is the term that makes small
  widths slow: per token it grows like d where the matmuls grow like d^2, so a GPU's efficiency
  falls with d / tp, at a rate set by its peak over its memory bandwidth.
- layer_passes: each block's forward and backward per micro batch (3, 4 with recomputation): the
  kernel launches and Python of a block; dtensor_passes, the same under torch's tensor parallelism,
  whose layers are DTensors, each operation dispatched through their sharding on the host (t_dt);
  det_passes, the same under deterministic algorithms (t_det): torch then fills every tensor it
  allocates uninitialised (torch.utils.deterministic.fill_uninitialized_memory: 535 fill kernels a step
  of Lightning's DistilBERT, 1.9 of the GPU's 15.6 ms, 8 ms of the host's profiled 84) and attention
  runs eagerly, in a dozen operations where SDPA takes one.
  calls: framework-level collective calls the host makes: the tensor-parallel all-reduces (2 forward
  and 2 backward per block and micro batch, 2 more when recomputing, and 2 per micro batch for a
  vocabulary-parallel embedding and LM head), ZeRO-3's parameter fetches (one per linear layer for
  forward, backward and recomputation; two calls where the weights are partitioned over several
  ranks: the bookkeeping and the all-gather) and FSDP's unit gathers. The host's time bounds the
  small cells (a ZeRO-3 step of GPT-2.5B takes as long at micro batch 4 as at 16); where the GPU's
  work is longer it hides it.
- C: the step's collectives (communication.step_collectives: what each strategy sends, operation by
  operation and bucket by bucket) timed on the GPU type's links as measured (communication.Interconnect):
  a group of ranks on one host by the commbench table of its number of ranks, interpolated at each
  operation's size, so small messages cost their issue time; a group no table has (more ranks, or
  across nodes) by its bus bytes (ring algorithms over n ranks: all-reduce 2(n-1)/n x size,
  reduce-scatter and all-gather (n-1)/n x size) at the share of the link's bandwidth the tables' large
  messages reached, over NVLink within a node (or PCIe where a GPU has none) and over the network once
  a group spans nodes. No constant of the fit scales them. Overlappable traffic (C_hide) is hidden
  behind the strategy's compute budget, but a share s_exp of it (fitted) is exposed however much
  compute there is: the first gathers before compute starts, the last reductions after it ends, kernels
  slowed by the compute beside them. DDP all-reduces the gradients once per step (accumulation skips
  it), overlapped with the last micro batch's backward; DeepSpeed ZeRO-0 all-reduces them, ZeRO-1/2
  too in buckets (ZeRO-2 every micro batch), then all-gather the updated weights after the step, not
  overlapped (DeepSpeed's overlap_comm is off below stage 3; Lightning turns it on);
  ZeRO-3 and FSDP all-gather the weights for forward and backward (and recomputation, ZeRO-3) of every
  micro batch and reduce-scatter the gradients, prefetched behind compute.
- optimizer: 32 bytes of device memory per parameter a GPU steps (fp32 Adam: weights, gradients and
  two moments read, three written, the half copy); offloaded (DeepSpeed's CPU Adam, or torch's Adam
  on the host for FSDP's offload), the partition's gradients cross PCIe down and its half-precision
  weights up, and the CPU steps the partition with the rank's threads (under fp16, ZeRO-3 also
  unscales and checks the gradients there). More threads help less than in proportion: the work
  divides among them as threads ** CPU_THREAD_EXPONENT (0.75), and Adam on the host streams ~30 bytes
  per parameter through memory that all the node's ranks share, so the step is the threads' share
  plus the node's parameters at the rate the host's memory sustains, the one term threads do not
  shorten (offloaded cells at 1, 2, 4, 8 and 16 threads: validation/results/bench/threads).
  Offloaded parameters cross PCIe at every fetch: FSDP's prefetched behind compute like its gathers,
  ZeRO-Infinity's on the critical path.

The constants (`Constants`) are efficiencies, not properties of a cell: the fraction of peak matmuls
reach, the passes of elementwise traffic, a block's launch cost, a collective call's cost, the share
of overlappable collectives exposed, the fraction of PCIe and memory bandwidth copies and the
optimizer reach, the CPU optimizer's parameters per second per thread and per host, and the fixed
cost per step of each training loop and of DeepSpeed's engine at each ZeRO stage. They are fitted by
least squares on log step time over the measured cells of one GPU type (`fit`; `trainbench
check-models time` reports the error leave-one-out). A GPU type without measurements is predicted
with the constants of the measured one (H200): peaks and bandwidths come from the hardware table,
efficiencies are assumed to carry over, and the output says so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainbench.registry.frameworks import (SHARDED_TP, framework_of, offloads, registry, strategy_of,
                                           zero_overlaps_comm)
from trainbench.study.params import CellParams
from trainbench.registry.hardware import GpuType, peak_flops, peak_flops_of
from trainbench.predict.memory_model import (block_bytes_per_token, eager_score_bytes_per_token,
                                     shard_params, vocab_parallel)
from trainbench.registry.models import ModelSpec, get_model
from trainbench.predict.communication import (Interconnect, fsdp_gathers, interconnect_of, link_gb_s,
                                             step_collectives, tp_all_reduces)

# DeepSpeed's CPU Adam and torch's optimizer threads per rank where a cell does not say (the
# studies' execution.cpus_per_rank)
DEFAULT_CPU_THREADS = 8
# A rank's CPU optimizer work divides among its threads as threads ** this, not in proportion: profiled
# at 1, 4 and 16 threads (GPT-345M, ZeRO-3 fp16 offloaded,
# results/provenance/gpu-runs/threads-profile-1.log), the
# host's Adam, overflow checks and copies ran 2.5x faster at 4 threads and 6.4x at 16 (an exponent of
# 0.66). The fitted cells, all at 4 to 16 threads, cannot tell exponents apart (leave-one-out 7.6-7.9%
# from 0.5 to 1), so it is chosen on the thread curves no fit sees, each curve predicted with the
# exponent the others chose: check-models time --thread-exponents (validation/results/bench/time_model/).
CPU_THREAD_EXPONENT = 0.75
# bytes of device memory an Adam step moves per parameter: fp32 weights, gradients and two moments
# read (16), weights and moments written (12), the half-precision copy written and its gradient read (4)
OPTIMIZER_BYTES = 32.0

# how sharply the slower of host and device sets a micro batch's pace: (h^p + d^p)^(1/p)
SHARPNESS = 4.0

CONSTANTS_FILE = Path(__file__).with_name("time_model_constants.json")


@dataclass(frozen=True)
class Work:
    """What one optimizer step asks of the busiest GPU of a cell, in physical units (seconds at 100% of
    the hardware's figure, counts): nothing here is fitted."""

    loop: str  # whose training loop drives the step (a fixed cost per step; "" for one without: TimeFacts)
    loop_repeats: float  # how often its fixed cost is paid a step: once, or once a micro batch (TimeFacts)
    engine: str  # DeepSpeed's engine, by ZeRO stage ("ZeRO-0", "ZeRO-1/2", "ZeRO-3"; "" without it)
    matmul_s: float  # FLOPs / peak
    unaligned_head_s: float  # the LM head's FLOPs / peak where its vocabulary is not a multiple of 8
    elementwise_s: float  # bytes a block moves outside matmuls (one pass) / HBM bandwidth
    cast_s: float  # float8's scaling and casts of the linear layers' operands / HBM bandwidth
    layer_passes: float  # block forward/backward passes
    dtensor_passes: float  # those of them whose layers are DTensors (torch's tensor parallelism)
    deterministic_passes: float  # those of them under deterministic algorithms (params.deterministic)
    calls: float  # framework-level collective calls the host makes
    micro_link_s: float  # tensor- and pipeline-parallel collectives per step, not overlapped, on the link
    overlapped_link_s: float  # ZeRO-3 / FSDP / DDP collectives compute can hide, on the link
    overlapped_pcie_s: float  # FSDP's offloaded parameters' traffic, prefetched / PCIe bandwidth
    overlap_budget: float  # share of the compute time that can hide it
    sync_link_s: float  # gradient and weight synchronisation after backward, exposed, on the link
    optimizer_hbm_s: float  # DeepSpeed's ZeRO optimizer step on the GPU / HBM bandwidth
    torch_optimizer_hbm_s: float  # or a torch optimizer's (fused AdamW over the module's tensors)
    offload_pcie_s: float  # offload traffic on the critical path (gradients down, weights up) / PCIe
    cpu_adam_params: float  # parameters DeepSpeed's CPU Adam steps, over threads ** CPU_THREAD_EXPONENT
    cpu_torch_params: float  # parameters torch's optimizer steps on the host, the same
    cpu_unscale_params: float  # fp16 gradients ZeRO-3's offload unscales and checks on the host, the same
    cpu_host_params: float  # parameters the host's CPU optimizers step at once, all its ranks together
    pipeline_factor: float  # (ga + pp - 1) / ga: the pipeline's bubble
    ranks: float = 1.0  # ranks whose steps meet in collectives (1: one GPU, or a rank run alone)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Constants:
    """The time model's efficiency constants for one GPU type (see the module's formulas)."""

    eta_matmul: float = 0.6  # fraction of peak FLOP/s matmuls and attention reach
    eta_unaligned: float = 0.15  # the same for an LM head of unaligned vocabulary (align1 kernels)
    elementwise_passes: float = 3.0  # elementwise traffic in units of what a block saves for backward
    layer_pass_s: float = 1e-4  # launch and Python cost of one block's forward or backward
    dtensor_pass_s: float = 1e-3  # what DTensor's dispatch adds to a block's pass under torch's tp
    # what deterministic algorithms add to a block's pass: a fill of every tensor allocated, eager attention
    deterministic_pass_s: float = 5e-4
    call_s: float = 5e-4  # one framework-level collective call, on the host
    # the share of overlappable collectives a step exposes however much compute there is to hide them
    # behind: the first gathers before compute starts, the last reductions after it ends, a kernel
    # slowed by the compute beside it
    exposed_share: float = 0.1
    eta_optimizer: float = 0.3  # fraction of HBM bandwidth DeepSpeed's ZeRO optimizer step reaches
    eta_optimizer_torch: float = 0.3  # the same for a torch optimizer stepping the module's parameters
    eta_pcie: float = 0.7  # fraction of PCIe bandwidth offload copies reach
    # the CPU rates are one thread's; n threads step n ** CPU_THREAD_EXPONENT times as many
    cpu_adam_per_thread: float = 1e8  # parameters per second a thread, DeepSpeed's CPU Adam
    cpu_torch_per_thread: float = 2e7  # parameters per second a thread, torch's Adam on the host
    cpu_unscale_per_thread: float = 1e8  # gradient elements per second a thread, ZeRO-3 offload's checks
    cpu_host_rate: float = 4e9  # parameters per second the host's memory lets its CPU optimizers step
    # fixed cost per step of each framework's training loop (keyed by its name; the starting values are
    # the registry's, frameworks.TimeFacts) and of DeepSpeed's engine at each ZeRO stage
    step_s: dict[str, float] = field(default_factory=lambda: {
        **{f.name: f.time.loop_step_s for f in registry().values() if f.time.loop_step_s is not None},
        "ZeRO-0": 0.02, "ZeRO-1/2": 0.02, "ZeRO-3": 0.02})
    # by number of ranks: the share of the host's part (`framework`) that a world's ranks spend in
    # collectives waiting for the slowest rank's host, which a profile counts as exposed communication.
    # Not fitted with the step (it moves time between parts, not the total): calibrated on the profiles
    # of real multi-GPU cells (checks.step_time.collective_wait_shares)
    collective_wait_share: dict[str, float] = field(default_factory=dict)
    gpu: str = "h200"  # the GPU type they were fitted on
    fitted_on: str = ""  # what they were fitted on (cells, command)

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
        """The studies whose cells the constants were fitted on, as `fitted_on` names them
        ("243 cells (baseline, emulation_check, ...), by ...": checks.step_time writes it)."""
        found = re.search(r"\(([^()]*)\)", self.fitted_on)
        return {name.strip() for name in found.group(1).split(",")} if found else set()


def load_constants(path: Path = CONSTANTS_FILE) -> dict[str, Constants]:
    """The fitted constants by GPU type (`trainbench check-models time --write` writes them)."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {gpu: Constants(**values) for gpu, values in raw.items()}


def threads_of_run(doc: dict[str, Any]) -> int:
    """The threads a measured rank's CPU optimizer had: OMP_NUM_THREADS as the ranks ran (provenance).
    Runs that did not record their environment are older than the fix of b222dfd, and their ranks had
    the job's threads, which Snakemake exports as OMP_NUM_THREADS and the launcher kept: one per GPU
    rank on the node (Cell.resources' "threads"). Holdout cells made then recorded exactly that.
    A history line (results/history) keeps neither, so it cannot say: ValueError, not a guess."""
    environment = (doc.get("provenance") or {}).get("environment")
    if environment is None:
        if "params" not in doc:
            raise ValueError(f"{doc.get('study')}/{doc.get('cell_id')}: the run records neither its "
                             "environment nor its parameters (a history line?): its threads are unknown")
        return int(doc["params"].get("gpus_per_node") or DEFAULT_CPU_THREADS)
    try:
        return int(environment.get("OMP_NUM_THREADS", DEFAULT_CPU_THREADS))
    except ValueError:
        return DEFAULT_CPU_THREADS


def _spans_nodes(group: int, stride: int, params: CellParams) -> bool:
    """Whether a process group of `group` ranks, `stride` apart, has ranks on more than one node
    (tensor-parallel ranks are adjacent, data-parallel ranks tp x pp apart)."""
    return group > 1 and group * stride > params.gpus_per_node and params.nodes > 1


def _nodes_spanned(group: int, stride: int, params: CellParams) -> int:
    """The nodes a process group's ranks are on (1 where it does not span nodes)."""
    if not _spans_nodes(group, stride, params):
        return 1
    # a group of fewer ranks than the nodes its stride reaches is on as many nodes as it has ranks
    return min(params.nodes, group, math.ceil(group * stride / params.gpus_per_node))


def work(params: CellParams, gpu: GpuType, cpu_threads: int = DEFAULT_CPU_THREADS,
         alone: bool = False, links: Interconnect | None = None) -> Work:
    """The physical work of one optimizer step of a cell on the busiest GPU of `gpu`s; `alone`: of that
    rank run by itself, as an emulated rank runs (training.emulation): its collectives complete at once,
    a pipeline stage waits for no other (no bubble), and its host is its own, not shared with the node's
    other ranks. The host still issues every call. `links`: the GPU type's interconnect (default: as
    its commbench tables measured it, communication.interconnect_of)."""
    spec: ModelSpec = get_model(params.model)
    framework, strategy = framework_of(params), strategy_of(params)
    layout, stage = strategy.layout, strategy.zero_stage
    offload_optimizer, offload_param = offloads(params)
    tp, pp, dp, ga, mb = params.tp, params.pp, params.dp, params.grad_accum, params.micro_batch
    seq = params.seq_len or spec.max_seq
    ac = bool(params.activation_checkpointing)
    mixed = params.precision != "fp32"
    peak = peak_flops(gpu, params.precision, params.tf32)
    if peak is None:
        raise ValueError(f"{gpu.key} has no {params.precision} peak")
    hbm, pcie = gpu.hbm_gb_s * 1e9, gpu.pcie_gb_s * 1e9

    # --- compute, on the busiest GPU (the last stage: its blocks and the head) ---
    layers = math.ceil(spec.n_layer / pp)
    d = spec.d_model
    block = spec.block_matmul_params()
    head = spec.matmul_params(params.head, params.num_classes) - spec.n_layer * block
    split_vocabulary = vocab_parallel(params)
    if split_vocabulary or (spec.user_defined and spec.facts.tp_other_params):
        head /= tp  # the LM head's columns split over the tensor-parallel ranks
    # the blocks' matmuls, split over the tensor-parallel ranks; a user's model, the share its plan splits
    split = spec.facts.tp_block_params / spec.block_params() if spec.user_defined and tp > 1 else 1.0
    linear = 6 * block * layers * (1 - split + split / tp) * (1 + ac / 3)
    # attention's FLOPs per token, per position it attends to and layer: PaLM's 12 d, or, for a model of
    # the user's, what torch's FLOP counter found (trainbench.training.user_models)
    per_position = spec.facts.attention_flops_per_position / spec.n_layer if spec.user_defined else 12 * d
    attention = per_position * (1 + ac / 3) * layers * seq / tp
    if params.precision == "fp32" and spec.attention_run(params.attention) in ("sdpa", "efficient"):
        # SDPA has no fp32 flash or cuDNN kernel: fp32 runs the memory-efficient one on CUDA cores, TF32
        # or not (holdout_pace's GPT-345M: 221 ms of a 590 ms profiled step, 45 TFLOP/s): the fp32 peak
        attention *= peak / peak_flops(gpu, "fp32", False)
    per_token = linear + attention
    tokens = mb * seq * ga
    # a 16-bit LM head whose vocabulary is not a multiple of 8 (GPT-2's 50,257, unpadded) has no aligned
    # tensor-core kernel: cuBLAS falls back to cutlass's align1 ones (holdout_pace's GPT-2 124M under
    # FSDP2: 140 of its 241 ms of kernels, 11% of the bf16 peak). torch.compile pads such matmuls
    # (inductor's shape padding); the head of a classifier is negligible; fp32 (TF32 or not) was not
    # measured to pay it and is not charged. Split over tensor-parallel ranks, a rank's rows decide.
    vocabulary = spec.with_vocab_multiple(params.vocab_multiple).vocab_size
    rows = -(-vocabulary // tp) if split_vocabulary else vocabulary  # this rank's share of the head
    unaligned = (params.head == "lm" and rows % 8 != 0 and not params.compile
                 and params.precision in ("bf16", "fp16"))
    if not unaligned:
        per_token += 6 * head
    cast = 0.0
    fp8_peak = peak_flops_of(gpu, "fp8") if params.float8 and spec.family == "gpt" else None
    if fp8_peak:
        # float8 (torchao, trainbench's GPT): the blocks' linear layers at the FP8 peak, attention and
        # the LM head at the precision's; each linear's input scaled (amax: 2 bytes read) and cast (2
        # read, 1 written) in forward and again in backward (torchao keeps it in bf16), and its output
        # gradient once, at HBM bandwidth. Per token, at tp 1: inputs 3d + ffn elements (qkv and fc
        # read d, the projections d and ffn), output gradients 5d + ffn. Tensor parallelism splits
        # what is sharded on this rank (the projections' inputs, the qkv's and fc's outputs) and
        # leaves the replicated ones whole. Not yet fitted on float8 cells: the bf16 efficiencies carry
        # over; tensorwise TP's amax all-reduces of sharded tensors are not counted (not measured).
        per_token -= linear * (1 - peak / fp8_peak)
        inputs = 2 * d + (d + spec.ffn) / tp
        output_grads = 2 * d + (3 * d + spec.ffn) / tp
        cast = tokens * layers * (2 * inputs + output_grads) * 5 / hbm
    passes = 3 + ac
    # eager attention's score matrices are elementwise work too (scale, mask, softmax, casts)
    saved = block_bytes_per_token(params, spec, traffic=True) + eager_score_bytes_per_token(params, spec)
    elementwise = tokens * layers * saved * passes

    # --- collectives: what the strategy sends (communication.step_collectives), group by group, timed
    # on the GPU type's links as measured (a commbench table of the group's ranks, or the tables' share
    # of the link's bandwidth) ---
    links = interconnect_of(gpu) if links is None else links
    weight_bytes = 2 if mixed else 4
    psi = shard_params(params, spec)  # parameters of one GPU's model-parallel shard
    sent = step_collectives(params)

    def link_s(group: str, ranks: int, nodes: int) -> float:
        return links.seconds([c for c in sent if c.group == group], link_gb_s(gpu, ranks, nodes), nodes > 1,
                             nodes)

    calls = 0.0
    micro_link = 0.0
    if tp > 1:
        calls += tp_all_reduces(params, layers)
        micro_link += link_s("tp", tp, _nodes_spanned(tp, 1, params))
    if pp > 1:  # activations forward and their gradients backward, at the stage boundary: one GPU's pair,
        # across nodes where the stages (tp ranks apart) do not fit on one
        micro_link += link_s("pp", 2, 2 if _spans_nodes(pp, tp, params) else 1)
    traffic = link_s("dp", dp, _nodes_spanned(dp, tp * pp, params)) if dp > 1 else 0.0

    overlapped = sync = 0.0
    budget = 1.0
    if layout == "replicated" and dp > 1:  # DDP: one all-reduce of fp32 (autocast) gradients per step
        overlapped = traffic
        budget = 2 / 3 / ga  # the last micro batch's backward
    elif layout == "fsdp" and dp > 1:
        # weights gathered for forward and backward of every micro batch (fsdp_reshard: fewer), gradients
        # reduce-scattered once (accumulation without synchronisation), prefetched behind compute
        overlapped = traffic
        calls += (fsdp_gathers(params) + 1) * spec.n_layer
    elif layout == "zero":
        hides = zero_overlaps_comm(params)
        if stage == 3:
            # each fetch is DeepSpeed's bookkeeping of a module's partitioned weights, and where they
            # are partitioned over more than one rank an all-gather: a second call
            fetches = ga * (2 + ac) * (spec.n_layer * spec.fetched_modules_per_block() + 1)
            calls += fetches * (1 + (dp > 1))
        if hides:
            overlapped = traffic
            budget = 1.0 if stage == 3 else 2 / 3 / ga
        else:
            sync = traffic
    if alone:
        micro_link = overlapped = sync = 0.0

    # --- optimizer: on the GPU, or offloaded ---
    sharded = layout == "fsdp" or (layout == "zero" and stage >= 1)
    stepped = psi / dp if sharded else psi
    optimizer_hbm = torch_optimizer_hbm = offload_pcie = overlapped_pcie = 0.0
    cpu_adam = cpu_torch = cpu_unscale = cpu_host = 0.0
    # the node's ranks step their partitions at the same time, through the same host memory
    on_host = stepped * (1 if alone else params.gpus_per_node)
    if layout == "fsdp" and offload_param:
        # FSDP's CPU offload: fp32 shards on the host, copied in for every gather, gradients copied
        # out once per step, torch's optimizer on the host
        overlapped_pcie = 2 * ga * 4 * stepped / pcie
        offload_pcie = 4 * stepped / pcie
        cpu_torch = stepped / cpu_threads ** CPU_THREAD_EXPONENT
        cpu_host = on_host
    elif offload_optimizer:
        reductions = ga if stage in (2, 3) else 1
        offload_pcie = (reductions * weight_bytes + weight_bytes) * stepped / pcie
        cpu_adam = stepped / cpu_threads ** CPU_THREAD_EXPONENT
        cpu_host = on_host
        if stage == 3 and params.precision == "fp16":
            # ZeRO-3 unscales the offloaded fp16 gradients and checks them for overflow on the host
            # (stages 1 and 2 check them on the GPU; bf16 and fp32 have no loss scale)
            cpu_unscale = stepped / cpu_threads ** CPU_THREAD_EXPONENT
    elif layout == "zero":  # DeepSpeed's engine steps flat fp32 partitions, with its casts and checks
        optimizer_hbm = OPTIMIZER_BYTES * stepped / hbm
    else:
        torch_optimizer_hbm = OPTIMIZER_BYTES * stepped / hbm
    if layout == "zero" and offload_param:
        # ZeRO-Infinity copies a module's partition in just before gathering it: on the critical path,
        # whether the optimizer is offloaded too or steps on the GPU
        offload_pcie += ga * (2 + ac) * weight_bytes * stepped / pcie

    return Work(
        loop="" if framework.time.loop_step_s is None else framework.name,
        loop_repeats=ga if framework.time.loop_per_micro_batch else 1,
        engine="" if layout != "zero" else f"ZeRO-{'1/2' if stage in (1, 2) else stage}",
        matmul_s=tokens * per_token / peak, unaligned_head_s=tokens * 6 * head / peak if unaligned else 0.0,
        elementwise_s=elementwise / hbm, cast_s=cast,
        layer_passes=ga * layers * passes, calls=calls,
        # torch's tensor parallelism runs each block's layers as DTensors, dispatched on the host
        dtensor_passes=ga * layers * passes if tp > 1 and strategy.tensor_parallel is SHARDED_TP else 0,
        deterministic_passes=ga * layers * passes if params.deterministic else 0,
        micro_link_s=micro_link,
        overlapped_link_s=overlapped, overlapped_pcie_s=overlapped_pcie, overlap_budget=budget,
        sync_link_s=sync, optimizer_hbm_s=optimizer_hbm, torch_optimizer_hbm_s=torch_optimizer_hbm,
        offload_pcie_s=offload_pcie,
        cpu_adam_params=cpu_adam, cpu_torch_params=cpu_torch, cpu_unscale_params=cpu_unscale,
        cpu_host_params=cpu_host, pipeline_factor=1.0 if alone else (ga + pp - 1) / ga,
        ranks=1.0 if alone else float(params.gpus))


FIELDS = [f for f in Work.__dataclass_fields__ if f not in ("loop", "engine")]


def stack(works: list[Work]) -> dict[str, np.ndarray]:
    """Works as arrays, one entry per cell (for fitting many cells at once)."""
    arrays = {f: np.array([getattr(w, f) for w in works], dtype=float) for f in FIELDS}
    arrays["loop"] = np.array([w.loop for w in works])
    arrays["engine"] = np.array([w.engine for w in works])
    return arrays


def _names(works: dict[str, np.ndarray], key: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct names of a stack's `key` (loop, engine) and each cell's index into them: computed
    once by `fit` (`indexed`) for the many evaluations of one stack, else here."""
    if f"{key}_names" in works:
        return works[f"{key}_names"], works[f"{key}_at"]
    return np.unique(works[key], return_inverse=True)


def indexed(works: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A stack with its loop and engine names indexed, for evaluating it many times (not to be sliced by
    cell: the names are not per cell)."""
    found = dict(works)
    for key in ("loop", "engine"):
        found[f"{key}_names"], found[f"{key}_at"] = np.unique(works[key], return_inverse=True)
    return found


def parts(w, c: Constants) -> dict[str, Any]:
    """Seconds by part of the step (each an array where `w` holds arrays): the device's compute,
    communication that is not hidden, the optimizer, and the framework's part: the loop's and the
    engine's fixed costs with the time the GPU waits on the host's launches (a profile's idle)."""
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
    # compute is the device's own work; the rest of `busy`, where the host's launches are the slower,
    # is time the GPU waits on the host: a profile's idle, with the loop's fixed costs (`framework`).
    # Where ranks meet in collectives, a share of it is spent there, waiting for the slowest rank's host
    waiting = g("pipeline_factor") * (busy - device)
    host = step + waiting
    in_collectives = collective_wait_share(c, g("ranks")) * host
    return {"compute": g("pipeline_factor") * device, "communication": micro - g("pipeline_factor") * busy
            + exposed + g("sync_link_s") + in_collectives, "optimizer": optimizer,
            "framework": host - in_collectives}


def collective_wait_share(c: Constants, ranks):
    """The share of the host's part that `ranks` ranks spend waiting in collectives for the slowest
    rank's host (Constants.collective_wait_share): none for one rank; between calibrated numbers of
    ranks, interpolated in log2(ranks); beyond the largest, held at its share."""
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
    # the host's whole part: `framework`, and what of it parts() counts as communication (ranks waiting
    # in collectives for the slowest host)
    host_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"step_time_s": round(self.step_time_s, 6), "samples_per_s": round(self.samples_per_s, 3),
                "tokens_per_s": round(self.tokens_per_s, 1),
                "mfu": None if self.mfu is None else round(self.mfu, 4),
                "parts_s": {k: round(float(v), 6) for k, v in self.parts_s.items()}, "gpu": self.gpu,
                "constants_gpu": self.constants_gpu, "note": self.note, "host_s": round(self.host_s, 6)}


def constants_for(gpu: GpuType, table: dict[str, Constants] | None = None) -> tuple[Constants, str | None]:
    """The fitted constants of a GPU type, or, for a type without measurements, those of the first type
    that has them (H200), with a note saying so; (Constants(), note) if nothing was ever fitted."""
    table = load_constants() if table is None else table
    if gpu.key in table:
        return table[gpu.key], None
    if table:
        borrowed = next(iter(table.values()))
        return borrowed, (f"no {gpu.key} cells measured: efficiencies fitted on {borrowed.gpu}, "
                          f"with {gpu.key}'s peaks and bandwidths")
    return Constants(gpu=gpu.key), "no constants fitted: starting values"


def outside(params: CellParams) -> str | None:
    """Why the model does not describe a cell's step, or None. It still predicts one, with this note,
    and its fit leaves such cells out (`trainbench check-models time`)."""
    if params.float8 and not params.compile:
        # measured: GPT-2.5B tensorwise 2.4 times bf16's step eager, 0.88 times compiled (docs/float8.md)
        return ("float8 without torch.compile runs torchao's scaling and casts as separate kernels, which "
                "the model (its casts compiled) does not describe")
    return None


def predict(params: CellParams, gpu: GpuType | None, constants: Constants | None = None,
            cpu_threads: int = DEFAULT_CPU_THREADS) -> TimePrediction | None:
    """A cell's step time, samples/s and MFU on GPUs of type `gpu`; None where the model has nothing to
    say (CPU ranks, no GPU type, a precision the GPU lacks, a model or strategy it does not know)."""
    if gpu is None or params.device != "cuda":
        return None
    note = None
    if constants is None:
        constants, note = constants_for(gpu)
    try:
        w = work(params, gpu, cpu_threads)
        spec = get_model(params.model)
    except (KeyError, ValueError):
        return None
    parts_s = parts(w, constants)
    step = float(sum(parts_s.values()))
    seq = params.seq_len or spec.max_seq
    samples = params.global_batch / step
    peak = peak_flops(gpu, params.precision, params.tf32)
    flops = spec.train_flops_per_token(seq, params.head, params.num_classes)
    mfu = samples * seq * flops / params.gpus / peak if peak else None
    note = "; ".join(n for n in (note, outside(params)) if n) or None
    waiting = float(collective_wait_share(constants, w.ranks))
    return TimePrediction(step, samples, samples * seq, mfu, {k: float(v) for k, v in parts_s.items()},
                          gpu.key, constants.gpu, note, host_s=float(parts_s["framework"]) / (1 - waiting))


def waiting_s(params: CellParams, gpu: GpuType, constants: Constants | None = None,
              cpu_threads: int = DEFAULT_CPU_THREADS, whole_s: float | None = None) -> float | None:
    """What a rank of the cell's world spends that the same rank run alone (emulated) does not, as the
    model has it: its collectives' exposed time and the host it shares with its node's other ranks. An
    emulated rank's measured step plus this is the whole step of its world, compute measured and
    communication modelled (trainbench check-models emulation holds it against real cells). `whole_s`:
    the cell's step as predict() gave it with these constants, where the caller has it. None where the
    model predicts nothing."""
    if constants is None:
        constants, _ = constants_for(gpu)
    try:
        whole = step_time(work(params, gpu, cpu_threads), constants) if whole_s is None else whole_s
        alone = step_time(work(params, gpu, cpu_threads, alone=True), constants)
    except (KeyError, ValueError):
        return None
    return float(whole - alone)


# How far real steps came from their emulated rank's whole step, by what the world waits on
# (`trainbench check-models emulation --write-bands` writes it from the published emulated/real pairs)
WHOLE_STEP_BANDS_FILE = Path(__file__).with_name("whole_step_bands.json")


def wait_kind(params: CellParams) -> str:
    """What a rank's world mostly adds to its compute, as the whole step's bands group real ranks:
    tensor or pipeline parallelism's traffic inside the step, offloaded optimizer steps sharing one
    host, ZeRO-3's per-module gathers, or data parallelism's gradient traffic."""
    if params.tp > 1 or params.pp > 1:
        return "tensor or pipeline parallel"
    if params.offload_optimizer or params.offload_param:
        return "offloaded"
    if strategy_of(params).zero_stage == 3:
        return "ZeRO-3"
    return "data parallel"


def whole_step_band(params: CellParams, path: Path = WHOLE_STEP_BANDS_FILE) -> dict[str, Any] | None:
    """Real steps over the whole step of their emulated rank, for ranks whose world waits as this one's
    does: {"ranks", "low", "median", "high"}; None where no such rank was measured."""
    if not path.exists():
        return None
    return json.loads(path.read_text())["bands"].get(wait_kind(params))


def thread_ratio(params: CellParams, gpu: GpuType | None, then: int, now: int) -> float | None:
    """The step at `now` CPU threads a rank over the step at `then`, as the model predicts both (1 for a
    cell without a CPU optimizer; None where it predicts nothing): what a rerun at other threads
    should take, from what the run at `then` took."""
    at_then = predict(params, gpu, cpu_threads=then)
    at_now = predict(params, gpu, cpu_threads=now)
    if at_then is None or at_now is None:
        return None
    return at_now.step_time_s / at_then.step_time_s


# Efficiencies are fractions of a hardware figure: fitted within (0, 1], so that a fit cannot explain a
# cell by a link faster than the hardware table's
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
    """The constants that best predict `measured_s` (seconds per step) from `works` (stack()): least
    squares on log step time by Levenberg-Marquardt with a numerical Jacobian, every constant positive
    (fitted as its logarithm) and every efficiency at most 1 (as a logit). `prior` pulls each constant
    towards `start` with that weight, so that a constant no cell informs (a framework without cells, a
    CPU optimizer without offload cells) keeps its starting value instead of wandering. `initial`: where
    the search begins (default `start`); the objective, prior included, does not depend on it, so a fit
    of almost the same cells (leave-one-out) begins at the fit of all of them and takes a few steps."""
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
