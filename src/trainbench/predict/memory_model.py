"""Predict a cell's peak memory per GPU and per host before it runs, and whether it fits.

The prediction adds up what a rank holds at its peak, which for these training loops is the end of the
forward pass of a steady-state step: every activation saved for backward is alive, the optimizer
states exist (they are created at the first step), gradients of the previous step too where the loop
zeroes them late, or of the previous micro batches where it accumulates. Where a replicated model's
loop frees its gradients after each step and does not accumulate, backward makes them as it frees
the activations: the larger of the two counts, not their sum.

Model states, per parameter, by who holds them (Rajbhandari et al., "ZeRO", 2020, section 3; N = the
data-parallel size, Psi = parameters of the rank's model-parallel shard):

- replicated (single, DDP) with autocast mixed precision: fp32 weights 4 + fp32 gradients 4 +
  Adam moments 8 = 16 bytes, all on each GPU. DDP keeps a second copy of the gradients in its
  reduction buckets (4 bytes).
- DeepSpeed engine: in fp16/bf16 the weights and gradients are half precision (2 + 2) and the
  optimizer holds an fp32 master copy and the moments (K = 12); in fp32 the master copy is still a
  separate fp32 partition (stages 1-3). Stage 0 holds everything, plus fp32 gradients for the master
  copy in mixed precision; stages 1 and 2 partition the optimizer and gradients (DeepSpeed's stage 1
  reduces into gradient partitions like stage 2, and measures the same); stage 3 partitions the
  weights too and gathers them layer by layer. Gradient reduction goes through a contiguous buffer
  of `reduce_bucket_size` elements whatever the model's size.
- FSDP (torch's fully_shard, Lightning, the Hugging Face Trainer): fp32 weights, gradients and
  moments sharded (16 / N), plus the unsharded weights and gradients of the units in flight
  (the current block and the prefetched one) in the compute dtype. With offload, the shards live on
  the host and only the units in flight are on the GPU.
- Offload (ZeRO-Offload/Infinity): the fp32 master copy, moments and fp32 gradient partition go to
  host memory (16 bytes per parameter of the partition, and 6 more for the staging copies of the
  CPU step, measured); offloaded parameters add their half copy.
- Tensor parallelism (Megatron's layout; `shard_params`): Psi is one tensor-parallel rank's share.
  AutoTP splits the blocks and leaves the embeddings and the tied LM head whole, after building the
  whole fp32 model on every GPU (a peak of its own). The sharded implementation (DTensor under FSDP2,
  trainbench.training.tensor_parallel) splits every matrix, the column-parallel biases and the vocabulary
  (embedding, LM head and its logits) by tp, leaves the norms, row-parallel biases and positions
  whole, and never holds more at initialisation than its shards and one parameter drawn whole.
  Inside attention and the MLP activations are split; the residual stream and norms' outputs not.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022), counted tensor by tensor for each block layout (trainbench's GPT-2, Hugging Face's
LLaMA and DistilBERT): the tensors a block saves for backward, in the dtype they are saved in. Under
autocast the residual stream, LayerNorm inputs and softmax outputs stay fp32; in DeepSpeed's half
precision engine everything is half. Fused attention (SDPA) saves no seq x seq matrix; eager
attention saves the softmax output (and dropout mask and output where there is dropout). With
activation checkpointing each block keeps only its input, and one block's activations exist again
during its recomputation.

What a GPU reports as used (NVML) is more than the tensors: the caching allocator's slack over the
peak allocation, and the CUDA context, cuBLAS workspace and NCCL buffers. Those constants, and each
rank's host-side footprint, were set from the published gpt2_zero and lightning runs on H200 (see
`trainbench check-models memory` for how well the whole model does on every measured cell).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainbench.study.params import CellParams
from trainbench.registry.frameworks import framework_of, offloads, strategy_of, zero_overlaps_comm
from trainbench.registry.hardware import GPUS, GpuType, gpu_type, gpu_type_named_in, gpu_type_of
from trainbench.registry.hardware import MIB
from trainbench.registry.models import ActivationTrace, ModelSpec, get_model


# DeepSpeed's default (deepspeed/runtime/zero/config.py); frameworks' reduction buckets are theirs
# (frameworks.MemoryFacts).
DS_MAX_LIVE_PARAMETERS = 1e9

# Measured on H200 (published runs): NVML 'used' minus torch's peak reservation on a one-GPU run
# (CUDA context with lazy loading, cuBLAS workspace).
CUDA_CONTEXT_MIB = 1850.0
# NCCL's buffers and communicators on a GPU rank of a world of several, by the communicators its layout
# opens: what NVML shows over torch's peak reservation on a real rank, less a one-GPU rank's context
# (the median of the published one-GPU torch cells, 1,940 MiB on the same driver). From 4 x H200 over
# NVLink (results/provenance/gpu-runs/emulated-vs-real-2.log), where real ranks showed over their
# reservation 1,464 MiB (an emulated rank's context, below) plus, alike at 2 and 4 GPUs and across
# frameworks of one layout: torch FSDP2 774, the HF Trainer's FSDP 772; DeepSpeed ZeRO-3 974, the HF
# Trainer's ZeRO-3 973; ZeRO-1/2 1,264 with or without offload (its own data-parallel group beside the
# world's); FSDP2 over tensor parallelism of 2, 1,748 (two mesh groups); ZeRO-1 over a pipeline of 2,
# 3,748 (data-parallel, pipeline, point-to-point and tied-weight groups). DDP and ZeRO-0 were not
# measured: DDP opens one communicator as FSDP does, ZeRO-0 DeepSpeed's groups as ZeRO-1 does.
# Those ZeRO-1/2 and pipeline figures held 288 MiB that was the harness's own: a broadcast on the world's
# group (the ranks agreeing on window sizes) opened a communicator DeepSpeed's ZeRO 0-2 and pipeline
# engine do not. The ranks agree through the store now (execute/worker.py agree_through_store), and the
# figures are without it: "zero" as measured since, megatron's two-GPU ZeRO 0-2 cells rerun windowed at
# fbc3ff2 (results/provenance/gpu-runs/energy-rerun-10.log) showing 2,426-2,428 MiB over their reservation
# at tp 1,
# each GPU to the MiB as in their first run, less the one-GPU context: 488, with ZeRO-3's 498 one
# data-parallel communicator each; "pipeline" 3,272 less the 288, which zero3_pipeline's pipeline cells
# showed below their windowed reruns of c7c5ed6
# (validation/results/bench/rerun/history-zero3_pipeline-energy.txt).
NCCL_MIB_BY_LAYOUT = {"data": 298.0, "zero3": 498.0, "zero": 488.0, "tensor": 1272.0, "pipeline": 2984.0}
# A DeepSpeed engine alone on one GPU still runs its collectives (the initial broadcast, the overflow
# and norm all-reduces) on an NCCL group of one, whose buffers a one-GPU torch rank never opens: NVML
# over the peak reservation, median of the 47 one-GPU ZeRO cells published (every framework, offloaded
# or not, 2,248-2,424 MiB), 2,344 MiB, less the 75 torch cells' 1,940 (check-models memory prints both)
NCCL_MIB_ONE_DEEPSPEED_RANK = 404.0
# What an emulated rank shows over its reservation is 476 MiB less than a real one-GPU rank's context:
# 1,452-1,464 MiB on every emulated GPU rank published (H200, driver 580), 1,924-1,954 on the one-GPU
# torch cells of the same days. Its figure completed to a real rank's adds this and NCCL's buffers.
EMULATED_CONTEXT_SHORTFALL_MIB = 476.0
# The caching allocator reserves more than the peak it hands out (measured 1.04-1.24x).
ALLOCATOR_SLACK = 1.10
# Host memory each rank process holds before its share of model states: torch (CPU ranks), plus the
# CUDA libraries (GPU ranks); a framework adds its own (frameworks.MemoryFacts.host_extra_mib), and
# DeepSpeed's import DEEPSPEED_IMPORT_MIB wherever a ZeRO layout runs.
# Measured: smoke (CPU) and gpt2_zero/lightning (H200) runs.
HOST_RANK_BASE_MIB = {"cpu": 320.0, "cuda": 1800.0}
DEEPSPEED_IMPORT_MIB = 75.0
# Host bytes per offloaded parameter of a rank's partition beyond the 16 the CPU optimizer keeps
# (fp32 weights, gradients, Adam's two moments): DeepSpeed's pinned half-precision gradient
# partition and the transient fp32 copies of the step. Measured: peak RSS of the ZeRO-1/2/3
# offload cells of GPT-345M, GPT-2.5B and Llama-7B on H200 (6-9 bytes; 6 for ZeRO-3).
OFFLOAD_STAGING_BYTES = 6.0

@dataclass(frozen=True)
class Hardware:
    """What a cell would run on: memory per GPU and per host, GPUs per host, and the GPU type where known
    (hardware.GPUS: its peaks and bandwidths, for the time model)."""
    gpu_mem_mib: float | None  # None: no GPUs (CPU ranks)
    host_mem_mib: float
    gpus_per_node: int
    name: str = ""
    gpu: GpuType | None = None

    def describe(self) -> str:
        gpu = f"{self.gpu_mem_mib / 1024:.1f} GiB per GPU, " if self.gpu_mem_mib else ""
        return f"{self.name + ': ' if self.name else ''}{gpu}{self.host_mem_mib / 1024:.1f} GiB host"


@dataclass
class Prediction:
    gpu_mem_mib: float | None  # per GPU, as NVML reports 'used'; None for CPU ranks
    host_mem_mib: float  # per node: every rank's process and what is offloaded to it
    fits: bool | None  # None when no hardware was given
    why_not: str | None = None
    parts_mib: dict[str, float] = field(default_factory=dict)  # the GPU figure (or a CPU rank's), by part
    # what the hardware lacks: "GPUs", "GPU memory", "host memory"
    short_of: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"gpu_mem_mib": _r(self.gpu_mem_mib), "host_mem_mib": _r(self.host_mem_mib), "fits": self.fits,
                "why_not": self.why_not, "short_of": self.short_of,
                "parts_mib": {k: _r(v) for k, v in self.parts_mib.items()}}


def nccl_layout(params: CellParams) -> str:
    """Which of NCCL_MIB_BY_LAYOUT's layouts a cell's ranks communicate in."""
    if params.pp > 1:
        return "pipeline"
    if params.tp > 1:
        return "tensor"
    strategy = strategy_of(params)
    if strategy.layout == "zero":
        return "zero3" if strategy.zero_stage == 3 else "zero"
    return "data"


def nccl_buffers_mib(params: CellParams) -> float:
    """NCCL's device memory on one GPU rank of the cell, over a one-GPU torch rank's context: none on a
    CPU rank, nor on a GPU alone unless a DeepSpeed engine runs there."""
    if params.device != "cuda":
        return 0.0
    if params.gpus <= 1:
        return NCCL_MIB_ONE_DEEPSPEED_RANK if engine(params)[0] == "zero" else 0.0
    return NCCL_MIB_BY_LAYOUT[nccl_layout(params)]


def emulated_rank_shortfall_mib(params: CellParams) -> float:
    """What a real GPU rank of the cell's world shows beyond its emulated twin: NCCL's buffers for its
    layout, and the context an emulated rank does not load (both measured against real ranks)."""
    nccl = nccl_buffers_mib(params)
    return nccl + EMULATED_CONTEXT_SHORTFALL_MIB if nccl else 0.0


def _r(value):
    return None if value is None else round(value, 1)


def engine(params: CellParams) -> tuple[str, int | None]:
    """Which memory layout a cell's strategy has: ('replicated'|'fsdp'|'zero', ZeRO stage or None)."""
    strategy = strategy_of(params)
    return strategy.layout, strategy.zero_stage


def vocab_parallel(params: CellParams) -> bool:
    """Whether the cell's tensor parallelism splits the token embedding and the tied LM head."""
    split = strategy_of(params).tensor_parallel
    # (a user's model splits by its plan: ModelFacts.tp_other_params says what it splits outside its blocks)
    return (params.tp > 1 and split is not None and split.vocab_parallel
            and not get_model(params.model).user_defined)


def block_shard_params(params: CellParams, spec: ModelSpec) -> float:
    """Parameters of one block on one tensor-parallel rank."""
    if spec.user_defined:  # what its plan splits (ModelFacts.tp_block_params), the rest whole
        return spec.block_params() - spec.facts.tp_block_params * (1 - 1 / params.tp)
    if vocab_parallel(params):  # sharded: the norms and row-parallel biases stay whole
        whole = spec.block_whole_params()
        return (spec.block_params() - whole) / params.tp + whole
    return spec.block_params() / params.tp  # AutoTP, counted as splitting the whole block


def shard_params(params: CellParams, spec: ModelSpec) -> float:
    """Psi: parameters of the model-parallel shard one rank holds before data-parallel sharding
    (rank 0's, which holds the larger part of an uneven vocabulary split).

    Tensor parallelism splits the blocks in Megatron's layout: sharded (DTensor) splits every
    matrix and the column-parallel biases, leaves the norms and row-parallel biases whole, and splits
    the token embedding (and the tied LM head) over the vocabulary; AutoTP splits the blocks and
    leaves the embeddings whole. Pipeline stages split the layers.
    """
    total = spec.param_count(params.head, params.num_classes)
    blocks = spec.n_layer * spec.block_params()
    psi = total - blocks + spec.n_layer * block_shard_params(params, spec)
    if vocab_parallel(params):
        psi -= (spec.vocab_size - -(-spec.vocab_size // params.tp)) * spec.d_model
    if spec.user_defined:  # the layers its plan splits outside the blocks (an untied LM head)
        psi -= spec.facts.tp_other_params * (1 - 1 / params.tp)
    return psi / params.pp


def float8_linear_params(params: CellParams, spec: ModelSpec) -> float:
    """Weights of the linear layers a float8 cell trains in float8 (torchao): the blocks' of trainbench's
    GPT (qkv, attention output, the MLP's two), without their biases; 0 for other cells."""
    if not params.float8 or spec.family != "gpt":
        return 0.0
    d, f = spec.d_model, spec.ffn
    return spec.n_layer * (4 * d * d + 2 * d * f) / params.tp


def model_states(params: CellParams, spec: ModelSpec) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes of weights, gradients, optimizer states and buffers: (on the device, on the host) per rank."""
    psi = shard_params(params, spec)
    n = params.dp
    mixed = params.precision != "fp32"
    kind, stage = engine(params)
    offload_optimizer, offload_param = offloads(params)
    memory = framework_of(params).memory
    device: dict[str, float] = {}
    host: dict[str, float] = {}
    if kind == "replicated":
        device["weights"] = 4 * psi
        device["gradients"] = 4 * psi
        device["optimizer"] = 8 * psi
        if params.gpus > 1 and not params.ddp_bucket_view:
            device["buffers"] = 4 * psi  # DDP's gradient buckets (with ddp_bucket_view, the gradients)
        if mixed:
            # autocast's cached half weights, but for float8's linear layers: torchao casts their
            # weights to float8 at each use and keeps no copy (the float8 study's compiled GPT-2.5B
            # tensorwise cell, allocator snapshot at its peak: parameters, optimizer states and
            # activations, nothing else; results/provenance/gpu-runs/gpu-session-6.log)
            cached = psi - float8_linear_params(params, spec)
            device["buffers"] = device.get("buffers", 0) + 2 * cached
    elif kind == "fsdp":
        block = block_shard_params(params, spec)
        compute = 2 if mixed else 4
        if memory.fsdp_reduce_bytes and mixed:
            # the current and the prefetched unit's weights; the current unit's gradient, and its copy in
            # the dtype of the reduction (fp32: bert-180b's 1.8B-parameter blocks as rank 0 of 64 at tp 1,
            # 23.2 GiB allocated, 19.3 predicted without the copy; the emulated rank's reduce-scatter
            # completes at once, where a real one may keep the previous unit's copy while it runs)
            gathered = block * compute
            if params.float8_all_gather:  # the float8 layers' weights gathered in float8, 1 byte each
                gathered -= (compute - 1) * float8_linear_params(params, spec) / spec.n_layer
            in_flight = 2 * gathered + block * (compute + memory.fsdp_reduce_bytes)
        else:
            in_flight = 2 * block * (compute + compute)  # current and prefetched unit, weights and gradients
        states = {"weights": 4 * psi / n, "gradients": 4 * psi / n, "optimizer": 8 * psi / n}
        (host if offload_param else device).update(states)
        device["buffers"] = in_flight
        if params.fsdp_reshard in ("after_backward", "after_step"):
            # every block's gathered weights kept from its forward to its backward (or the whole step):
            # at the end of forward all are unsharded, two of them counted in flight above
            device["unsharded_weights"] = max(0, spec.n_layer - 2) * block * compute
        if params.grad_accum > 1 and memory.fsdp_accumulates_unsharded:
            # Accumulating without synchronising keeps every unit's unsharded gradient until the last
            # micro batch: FSDP1's no_sync in the compute dtype, FSDP2's in the dtype it reduces in
            # (to_accumulated_grad_if_needed: fp32 under bf16), bytes x psi on every rank whatever N.
            # The sharded gradients appear only after that peak, from reduce-scatter. Measured on
            # llama-7b under FSDP1 (H200, 2 and 4 GPUs): peak allocated 12 psi/N + 2 psi +
            # activations, and 2 psi + activations with offload, the reservation 4 psi/N above that;
            # under FSDP2, GPT-2 350M's 4 psi at the peak (results/provenance/gpu-runs/memory-peaks-1.log).
            device.pop("gradients", None)
            device["unsharded_gradients"] = ((memory.fsdp_reduce_bytes if mixed else 0) or compute) * psi
            if not memory.fsdp_reduce_bytes:
                device["allocator_gradient_shards"] = 4 * psi / n
    else:
        weight = 2 if mixed else 4
        master = 4  # the optimizer's fp32 copy (a separate partition even in fp32 for stages 1-3)
        bucket_elements = params.reduce_bucket_size or memory.reduce_bucket_elements(spec)
        if params.device == "cpu":
            # host pages of an untouched torch.empty are not resident: only what reduction writes counts
            bucket_elements = min(bucket_elements, psi)
        # with overlap_comm, stages 1 and 2 reduce through two buckets, one filling while the other is
        # reduced (stage_1_and_2.py's setup_buckets, with contiguous_gradients; DeepSpeed 0.19:
        # 2 x 381 MiB for Lightning's 2e8-element buckets, memory-peaks-4.log)
        overlaps = zero_overlaps_comm(params) and params.contiguous_gradients is not False
        buffers = 2 if stage in (1, 2) and overlaps else 1
        bucket = buffers * bucket_elements * weight
        if stage == 0:
            device["weights"] = weight * psi
            device["gradients"] = weight * psi + (4 * psi if mixed else 0)
            device["optimizer"] = (master * psi if mixed else 0) + 8 * psi
        else:
            shard = 1 if stage < 3 else n
            weights = weight * psi / shard
            optimizer = (master + 8) * psi / n
            gradients = weight * psi / n
            if offload_param and stage == 3:
                host["weights"] = weights
            else:
                device["weights"] = weights
            if offload_optimizer:
                host["optimizer"] = optimizer
                host["gradients"] = 4 * psi / n  # the fp32 gradient partition the CPU optimizer steps on
                host["offload_staging"] = OFFLOAD_STAGING_BYTES * psi / n
                if stage < 3:
                    device["gradients"] = gradients
            else:
                device["optimizer"] = optimizer
                device["gradients"] = gradients
            device["buffers"] = bucket
            if stage == 3:
                # gathered weights of the layers in use, capped by stage3_max_live_parameters
                device["buffers"] += min(DS_MAX_LIVE_PARAMETERS, psi) * weight
    return device, host


def _compiled(params: CellParams, spec: ModelSpec) -> bool:
    """Whether torch.compile (inductor) builds the backward of trainbench's GPT in this cell."""
    return bool(params.compile) and spec.family in framework_of(params).compiles


def _compiled_whole(params: CellParams, spec: ModelSpec) -> bool:
    """Whether the model is compiled whole (one process, DDP's wrapper), its LM head and loss in one
    graph, rather than block by block with the loss compiled alone (FSDP2; DDP with ddp_compile:
    blocks)."""
    if not _compiled(params, spec) or engine(params)[0] == "fsdp":
        return False
    return not (params.gpus > 1 and params.ddp_compile == "blocks")


def _recomputes_in_backward(params: CellParams, spec: ModelSpec) -> bool:
    """Whether inductor's partitioner recomputes a block's norm and GELU outputs in its backward rather
    than saving them: in blocks trained in float8 (the float8 study's ranks, within 2% of the
    recomputing count; why is not established). In bf16 a compiled block saves what an uncompiled one
    does, compiled whole or block by block: allocator snapshots at the peak of GPT-2 124M and 350M
    compiled whole on one H200 (results/provenance/gpu-runs/memory-peaks-2.log: the compiled graphs'
    and SDPA's tensors, 13,868 and 16,165 MiB, less one tensor of logits, 3,144 and 1,572, and the
    weights' bf16 casts, 237 and 677) hold 36.4 and 36.2 bytes per token and hidden unit a layer, where
    the uncompiled list gives 36; FSDP2's compiled ranks of both, accumulating, within 1.4% of torch's
    peak with the list and FSDP2's accumulated gradients counted."""
    return _compiled(params, spec) and bool(params.float8)


def _block_tensors(spec: ModelSpec, compiled: bool = False) -> list[tuple[float, str]]:
    """What one block saves for backward, per token: (width in elements, which dtype class).

    'res' tensors are in the residual-stream dtype (fp32 under autocast), 'c' in the compute dtype,
    'rep' too but whole on every tensor-parallel rank (a norm's output: the input of a column-parallel
    linear layer, which each rank multiplies by its slice), 'mask' are dropout masks (one byte per
    element).
    """
    h, f = spec.d_model, spec.ffn
    if spec.family == "llama":
        # Hugging Face's LlamaDecoderLayer (counted with saved-tensor hooks, tests/test_memory_model.py):
        # RMSNorm (computed in fp32) input and normalised input, its output (q/k/v input); q and k
        # after RoPE, v; the attention output and its reshaped copy (o_proj input); the same RMSNorm
        # tensors before the MLP; gate, up, SiLU(gate) and their product (down_proj input)
        return [(2 * h, "res"), (h, "rep"), (3 * h, "c"), (2 * h, "c"), (2 * h, "res"), (h, "rep"),
                (4 * f, "c")]
    if spec.family == "distilbert":
        # post-LN: block input as q, k and v take it, q, k, v, context (out_lin input), LayerNorm
        # input, FFN input, lin1 output, GELU output (lin2 input); the FFN's dropout mask (1 byte; the
        # attention's dropout is SDPA's, or eager_score_bytes_per_token's). Allocator snapshots of
        # Lightning's cells at their peak (memory-peaks-4.log): 22 bytes per token and hidden unit
        # saved by the linear layers under bf16 autocast, 6 of them three casts of one fp32 input
        return [(h, "qkv_in"), (3 * h, "c"), (h, "c"), (h, "res"), (h, "c"), (2 * f, "c"), (h, "res"),
                (h, "mask")]
    # trainbench's GPT-2: LayerNorm input and output (qkv input), q, k, v, attention output
    # (proj input); LayerNorm input and output (fc input), fc output (GELU input), GELU output.
    # float8 (torchao) changes none of it: its linear layers keep their bf16 inputs for backward and
    # cast them again there (matmul_with_hp_or_float8_args saves input_hp)
    # In fp16 under tensor parallelism t that is 8 + 24/t bytes per token and hidden unit: Megatron's
    # 10 + 24/t less its two dropout masks (no dropout here) and the attention scores (fused attention
    # keeps none)
    if compiled:
        # inductor's partitioner recomputing the LayerNorm outputs and the GELU from what they are made
        # of in the backward: 24 bytes per token and hidden unit under bf16 autocast instead of 36
        # (float8's blocks, _recomputes_in_backward; the time model's measure of a compiled block's
        # elementwise traffic)
        return [(h, "res"), (3 * h, "c"), (h, "c"), (h, "res"), (f, "c")]
    return [(h, "res"), (h, "rep"), (3 * h, "c"), (h, "c"), (h, "res"), (h, "rep"), (2 * f, "c")]


def _dtype_bytes(params: CellParams) -> tuple[int, int]:
    """(compute dtype, residual-stream dtype) bytes of a cell's activations."""
    mixed = params.precision != "fp32"
    kind, _ = engine(params)
    # DeepSpeed runs the model itself in half precision; so does FSDP where its mixed precision casts
    # the parameters (torch's FSDP2)
    half_engine = mixed and (kind == "zero" or (kind == "fsdp"
                                                and framework_of(params).memory.fsdp_casts_parameters))
    return (2 if mixed else 4), (2 if half_engine else 4)


def traced(params: CellParams, spec: ModelSpec) -> ActivationTrace:
    """What a model of the user's saves for backward per sample, traced at the cell's precision mode
    (the dtypes _dtype_bytes gives), attention kernel and length, on one rank of its tensor-parallel
    split (trainbench.training.user_models; a model without a plan splits nothing)."""
    compute, residual = _dtype_bytes(params)
    mode = "fp32" if compute == 4 else ("half-16" if residual == 2 else "autocast-16")
    tp = params.tp if spec.facts.tp_collectives_per_block or spec.facts.tp_other_params else 1
    kernel = "eager" if spec.attention_run(params.attention) == "eager" else "sdpa"
    return spec.facts.activations(spec, mode, kernel, params.seq_len or spec.max_seq, tp)


def block_bytes_per_token(params: CellParams, spec: ModelSpec, *, traffic: bool = False) -> float:
    """Bytes one block saves for backward per token on one rank. `traffic`: the time model's measure of
    a block's elementwise memory traffic instead, where a compiled block counts as compiled whether or
    not its backward keeps more: FSDP2's blocks, compiled one by one, keep the uncompiled list but take
    the time of the model compiled whole (GPT-2 124M and 350M on 2 H200s, weights kept across the step:
    254.9 and 341.2 ms a step against one GPU's 254.4 and 335.2)."""
    if spec.user_defined:  # traced, not listed: the architecture is the user's
        return traced(params, spec).block_bytes / (params.seq_len or spec.max_seq)
    compute, residual = _dtype_bytes(params)
    # a block input that three linear layers read (DistilBERT's q, k, v): under autocast each casts the
    # fp32 input to the compute dtype and saves its own copy; where the dtypes agree one tensor is saved
    qkv_in = compute if compute == residual else 3 * compute
    sizes = {"c": compute, "rep": compute, "res": residual, "mask": 1, "qkv_in": qkv_in}
    recomputes = _compiled(params, spec) if traffic else _recomputes_in_backward(params, spec)
    # tensor parallelism splits what is inside attention and the MLP, not the residual stream nor
    # the norms' outputs that enter them (measured: 2.5B's largest micro batch at tp 2 and 4)
    return sum(width * sizes[dtype] / (params.tp if dtype == "c" else 1)
               for width, dtype in _block_tensors(spec, recomputes))


def _logit_bytes(params: CellParams, spec: ModelSpec, compute: int) -> int:
    """Bytes per logit at the loss's peak. Eager, three fp32 tensors of the logits' size: the
    log-softmax's output, saved for backward, and in its backward the gradients of its output and of
    its input; the logits in the compute dtype and their fp32 cast are saved by nothing and freed by
    then (allocator snapshots at the peak of GPT-2 350M under FSDP2 and DDP, eager: 3 x 3,141 MiB at
    16 x 1,024 tokens; results/provenance/gpu-runs/memory-peaks-1.log). Compiled, inductor keeps no
    fp32 copy where the vocabulary is a multiple of 64 (`vocab_multiple`; measured: 6.1 GiB less at
    GPT-2 124M's 32 x 1024 tokens, 2.9 GiB at 350M's 16 x 1024, bench/mfu.py on an H200), and the
    logits in the compute dtype: one tensor of them at the peak where the model is compiled whole
    (memory-peaks-2.log), the logits and their gradient where the loss is compiled alone."""
    if not _compiled(params, spec) or (engine(params)[0] == "fsdp" and params.tp > 1):
        return 4 + 4 + 4  # FSDP2 under tensor parallelism runs its loss eager, on vocabulary shards
    fp32_copy = 0 if spec.vocab_size % 64 == 0 else 4
    if _compiled_whole(params, spec):
        return compute + fp32_copy
    return compute + compute + fp32_copy


def eager_score_bytes_per_token(params: CellParams, spec: ModelSpec) -> float:
    """Bytes eager attention saves for backward per token and block on one rank: its score matrices
    (seq x seq per head); 0 with a fused kernel (SDPA), which saves none. The time model counts them as
    elementwise traffic too."""
    eager = params.attention == "eager" or (
        framework_of(params).memory.eager_attention_when_deterministic and params.deterministic)
    if not eager or spec.user_defined:  # a traced block's bytes hold its scores already
        return 0.0
    compute, residual = _dtype_bytes(params)
    # Saved per score element: the softmax's output (fp32 where the model asks for it or autocast runs
    # it), the probabilities in the compute dtype that multiply V (the softmax's own output where the
    # dtypes agree and no dropout comes between), and the dropout's mask. 6 bytes at bf16 without
    # dropout: measured 5.9 on GPT-5.8B (holdout_5b: eager at micro batches 1 and 2, less SDPA's bytes
    # per sample).
    softmax_bytes = 4 if spec.softmax_fp32 else residual
    dropout = spec.attention_dropout > 0
    cast = compute if (dropout or compute != softmax_bytes) else 0
    scores_per_token = spec.n_head / params.tp * (params.seq_len or spec.max_seq)
    return scores_per_token * (softmax_bytes + cast + dropout)


def activations(params: CellParams, spec: ModelSpec) -> float:
    """Bytes of activations saved for backward at the end of the forward pass, per rank (a pipeline's
    first stage: the micro batches in flight; heaviest_rank says when the last stage holds more)."""
    in_flight = min(params.pp, params.grad_accum) if params.pp > 1 else 1
    return _block_activations(params, spec, in_flight) + _logits(params, spec) + _outside_blocks(params, spec)


def _outside_blocks(params: CellParams, spec: ModelSpec) -> float:
    """What DistilBERT holds beyond its blocks as its forward ends, where a classifier peaks: the
    embeddings' sum, which their LayerNorm saves, and their dropout's mask; and three residual-stream
    tensors of the last block still live (its input and its attention's normed output among them).
    Allocator snapshots of Lightning's cells at the peak (memory-peaks-4.log: 48 MiB for the sum and
    146 MiB of LayerNorm outputs at 32 x 512 tokens in fp32)."""
    if spec.family != "distilbert":
        return 0.0
    _, residual = _dtype_bytes(params)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    return tokens * spec.d_model * (residual + 1 + 3 * residual)


def _block_activations(params: CellParams, spec: ModelSpec, in_flight: int) -> float:
    """What the rank's blocks save for backward on the device, for `in_flight` micro batches."""
    _, residual = _dtype_bytes(params)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    block = tokens * block_bytes_per_token(params, spec)
    block += tokens * eager_score_bytes_per_token(params, spec)
    layers = spec.n_layer / params.pp
    # what a checkpointed block keeps: its input, the residual stream (traced for a user's model)
    kept = (traced(params, spec).block_input_bytes / (params.seq_len or spec.max_seq) if spec.user_defined
            else spec.d_model * residual)
    if params.activation_checkpointing and params.checkpoint_in_cpu:
        # the checkpointed inputs wait in host memory (checkpoints_in_host); on the device, the one
        # gathered back for the block being recomputed, and that block's activations
        return tokens * kept + block
    if params.activation_checkpointing:
        return layers * tokens * kept * in_flight + block
    return layers * block * in_flight


def checkpoints_in_host(params: CellParams, spec: ModelSpec) -> float:
    """Bytes of checkpointed block inputs one rank keeps in host memory (checkpoint_in_cpu): its 1/tp
    of every block's input, the residual stream."""
    if not (params.activation_checkpointing and params.checkpoint_in_cpu):
        return 0.0
    _, residual = _dtype_bytes(params)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    return spec.n_layer / params.pp * tokens * spec.d_model * residual / params.tp


def _logits(params: CellParams, spec: ModelSpec) -> float:
    """What the loss holds of the logits at its peak (_logit_bytes): whole on every tensor-parallel rank
    where AutoTP leaves the tied LM head unsplit, a vocabulary shard each where tensor parallelism is
    vocabulary-parallel (none for a classification head)."""
    if params.head != "lm":
        return 0.0
    compute, _ = _dtype_bytes(params)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    if spec.user_defined:
        # traced: what the embeddings, final norm, head and loss save; and the loss's fp32 gradient of
        # the logits, which backward makes first
        return traced(params, spec).outside_bytes * params.micro_batch + tokens * spec.vocab_size * 4
    vocab = -(-spec.vocab_size // params.tp) if vocab_parallel(params) else spec.vocab_size
    return tokens * vocab * _logit_bytes(params, spec, compute)


def allocated_mib(parts_mib: dict[str, float]) -> float:
    """What torch allocates at the peak (its max_memory_allocated): every part of a prediction but
    the caching allocator's reserve and the CUDA context."""
    return sum(v for k, v in parts_mib.items() if not k.startswith("allocator_") and k != "cuda_context")


def predict(params: CellParams, hardware: Hardware | None = None) -> Prediction:
    """Peak memory of one rank's GPU, the busiest node's host memory, and whether both fit."""
    spec = get_model(params.model).with_vocab_multiple(params.vocab_multiple)  # as built
    on_device, on_host = model_states(params, spec)
    acts = activations(params, spec)
    if params.checkpoint_in_cpu:
        on_host["checkpointed_activations"] = checkpoints_in_host(params, spec)
    ranks_per_node = params.gpus_per_node
    kind, stage = engine(params)
    memory = framework_of(params).memory
    base = (HOST_RANK_BASE_MIB[params.device] + memory.host_extra_mib[params.device]
            + (DEEPSPEED_IMPORT_MIB if kind == "zero" else 0.0))
    parts = {k: v / MIB for k, v in on_device.items()}
    parts["activations"] = acts / MIB
    if kind == "replicated" and params.grad_accum == 1 and memory.replicated_gradients_freed:
        # No gradient outlives its step, and nothing accumulates: backward makes each layer's
        # gradients as it frees that layer's activations, so the peak is the larger of the two, not
        # their sum (the holdout study's torch cells: measured peaks are weights, optimizer states
        # and activations; the 9.4 GiB of GPT-2.5B's gradients were not on top)
        beyond = parts.pop("gradients") - parts["activations"]
        if beyond > 0:
            parts["gradients_beyond_activations"] = beyond
    elif kind == "zero" and stage < 3 and params.grad_accum == 1:
        # DeepSpeed's ZeRO 0-2 make their gradients and reduction bucket in backward, after the loss's
        # peak (megatron's GPT-345M ZeRO-0 and ZeRO-1 ranks, snapshots at the peak: weights, optimizer
        # states and activations, no gradient and no bucket live), and free them after the step, where
        # stages 1 and 2 in mixed precision flatten the gradient partition into an fp32 copy for the
        # optimizer. Without accumulation the peak is the largest of three moments: the loss's
        # backward (every activation and the logits), the blocks' backward (their activations, the
        # bucket and the gradients), the step (gradients, bucket and the copy).
        grads = parts.pop("gradients") + parts.pop("buffers", 0.0)
        logits = _logits(params, spec)
        if spec.user_defined:  # what its embeddings and head save stays to their backward
            logits -= traced(params, spec).outside_bytes * params.micro_batch
        blocks = parts["activations"] - logits / MIB
        copy = 0.0
        if stage > 0 and params.precision != "fp32" and not offloads(params)[0]:
            copy = 4 * shard_params(params, spec) / params.dp / MIB
        beyond = max(blocks + grads, grads + copy) - parts["activations"]
        if beyond > 0:
            parts["gradients_beyond_activations"] = beyond
    allocated = allocated_mib(parts)
    if params.device == "cuda":
        parts["allocator_slack"] = allocated * (ALLOCATOR_SLACK - 1)
        parts["cuda_context"] = CUDA_CONTEXT_MIB + nccl_buffers_mib(params)
        gpu = sum(parts.values())
        split = strategy_of(params).tensor_parallel if params.tp > 1 else None
        if split is not None and split.builds_whole_model:
            # AutoTP splits a model built whole: each GPU first holds every fp32 weight (measured:
            # bert-180b-l4 at tp 4 peaks at its 29 GiB of fp32 weights, whatever ZeRO does after)
            whole = 4 * spec.param_count(params.head, params.num_classes) / MIB
            if whole * ALLOCATOR_SLACK + parts["cuda_context"] > gpu:
                parts = {"whole_model_before_autotp": whole, "allocator_slack": whole * (ALLOCATOR_SLACK - 1),
                         "cuda_context": parts["cuda_context"]}
                gpu = sum(parts.values())
        elif split is not None:
            # built sharded: at initialisation a rank holds its fp32 shards (on the host when
            # offloaded) and one parameter drawn whole (trainbench.training.tensor_parallel.materialise)
            at_init = {"weights_at_init": on_device.get("weights", 0.0) / MIB,
                       "whole_parameter_at_init": 4 * spec.largest_param() / MIB}
            init_allocated = sum(at_init.values())
            if init_allocated * ALLOCATOR_SLACK + parts["cuda_context"] > gpu:
                parts = {**at_init, "allocator_slack": init_allocated * (ALLOCATOR_SLACK - 1),
                         "cuda_context": parts["cuda_context"]}
                gpu = sum(parts.values())
        host = ranks_per_node * (base + sum(on_host.values()) / MIB)
    else:  # CPU ranks: everything a "GPU" would hold is in each rank's process
        gpu = None
        parts["process"] = base
        host = ranks_per_node * (allocated + base + sum(on_host.values()) / MIB)
    prediction = Prediction(gpu, host, None, None, parts)
    if hardware is not None:
        problems = {}
        if gpu is not None and ranks_per_node > hardware.gpus_per_node:
            problems["GPUs"] = f"needs {ranks_per_node} GPUs per node > {hardware.gpus_per_node}"
        if gpu is not None and hardware.gpu_mem_mib is not None and gpu > hardware.gpu_mem_mib:
            problems["GPU memory"] = (f"predicted {gpu / 1024:.1f} GiB per GPU > "
                                      f"{hardware.gpu_mem_mib / 1024:.1f} GiB")
        if host > hardware.host_mem_mib:
            problems["host memory"] = (f"predicted {host / 1024:.1f} GiB host memory per node > "
                                       f"{hardware.host_mem_mib / 1024:.1f} GiB")
        prediction.fits = not problems
        prediction.short_of = list(problems)
        prediction.why_not = " and ".join(problems.values()) or None
    return prediction


def hardware_of_run(doc: dict[str, Any]) -> Hardware | None:
    """The machine a cell ran on, as far as its metrics.json says (older runs did not record the host)."""
    provenance = doc.get("provenance") or {}
    totals = (doc.get("metrics") or {}).get("gpu_mem_total_mib")
    if not totals and provenance.get("gpu_memory_mib") and provenance.get("gpu_count"):
        # a run that died before NVML sampled (an OOM in the first step): the GPUs it was given
        totals = [provenance["gpu_memory_mib"]] * provenance["gpu_count"]
    host = provenance.get("host_mem_total_mib") or float("inf")
    if not totals and host == float("inf"):
        return None
    kind = gpu_type_of(provenance.get("gpu_name"))
    try:
        params = CellParams.from_dict(doc.get("params") or {})
    except (TypeError, ValueError):  # not a whole cell's parameters (a hand-made document): as recorded
        return Hardware(min(totals) if totals else None, host, len(totals or []), gpu=kind)
    gpu_mib = held_gpu_mib(min(totals) if totals else None, params)
    if doc.get("emulation") or params.emulate:
        return emulated_node(gpu_mib, host, params, gpu=kind)
    return Hardware(gpu_mib, host, len(totals or []), gpu=kind)


def held_gpu_mib(gpu_mib: float | None, params: CellParams) -> float | None:
    """A GPU's memory as a cell's rank sees it: at most the cell's gpu_mem_limit_gib (None: no GPU
    known, unless the limit says)."""
    limit = params.gpu_mem_limit_gib
    if not limit:
        return gpu_mib
    return min(gpu_mib, limit * 1024) if gpu_mib is not None else limit * 1024


def emulated_node(gpu_mib: float | None, host_mib: float, params: CellParams, name: str = "",
                  gpu: GpuType | None = None) -> Hardware:
    """The node an emulated rank stands for, seen from the host it runs on: the world's ranks per node,
    each with that host's memory (so the one rank that runs must fit there)."""
    per_node = params.gpus_per_node
    return Hardware(gpu_mib, host_mib * per_node, per_node, name, gpu)


def hardware_from_args(gpu: str | None, gpu_mem_gib: float | None, host_mem_gib: float,
                       gpus_per_node: int) -> Hardware:
    """A hardware description from command-line words: a GPU type (hardware.GPUS) or its memory, host
    memory. A name that is no GPU type only names the hardware (a study's `plan_for: {name: 8 x H200}`)
    when the memory is given; the GPU type is then the one the name mentions, if any."""
    kind = None
    if gpu is not None:
        try:
            kind = gpu_type(gpu)
        except ValueError:
            if gpu_mem_gib is None:
                raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)} (or give --gpu-mem-gib)")
            kind = gpu_type_named_in(gpu)
    if gpu_mem_gib is not None:
        gpu_mib = gpu_mem_gib * 1024
    else:
        gpu_mib = kind.memory_mib if kind else None
    return Hardware(gpu_mib, host_mem_gib * 1024, gpus_per_node, gpu or "", kind)


def heaviest_rank(params: CellParams) -> int:
    """The rank whose GPU holds the most: the one an emulated cell runs by default (emulation.py).
    Ranks hold alike, or rank 0 holds the larger part of an uneven split (a vocabulary over tensor-
    parallel ranks, FSDP's and ZeRO's padded shards), except under pipeline parallelism, where the
    stages differ: the first holds the activations of every micro batch in flight (1F1B keeps up to
    pp of them), the last one micro batch's and the logits. DeepSpeed numbers a pipeline's ranks stage
    by stage (rank = stage x data-parallel size + data-parallel rank): the last stage's first rank is
    (pp - 1) x dp."""
    if params.pp == 1:
        return 0
    spec = get_model(params.model).with_vocab_multiple(params.vocab_multiple)
    # Both ends hold the token embedding (tied to the LM head on the last); the first also holds the
    # positions, the last the final norm and a classifier head: their model states, at the bytes per
    # parameter the rank's layout keeps on the device.
    states, _ = model_states(params, spec)
    per_parameter = sum(states.values()) / shard_params(params, spec)
    positions = spec.embedding_params() - spec.vocab_size * spec.d_model
    tail = (spec.param_count(params.head, params.num_classes) - spec.embedding_params()
            - spec.n_layer * spec.block_params())
    first = (_block_activations(params, spec, min(params.pp, params.grad_accum))
             + positions * per_parameter)
    last = _block_activations(params, spec, 1) + _logits(params, spec) + tail * per_parameter
    return 0 if first >= last else (params.pp - 1) * params.dp
