"""Predict a cell's peak memory per GPU and per host before it runs, and whether it fits: model states by
strategy (ZeRO's accounting), activations tensor by tensor (Korthikanti et al. 2022), what NVML shows
beyond torch. docs/memory-model.md states the model; trainbench/calibration.yaml holds its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from trainbench.study.cell_view import CellView, as_view, params_of, strategy_of_cell
from trainbench.study.params import CellParams
from trainbench.registry.hardware import GPUS, GpuType, gpu_type, gpu_type_named_in, gpu_type_of
from trainbench.registry.hardware import MIB
from trainbench.registry.models import ActivationTrace, ModelSpec
from trainbench.contract.result import Result


# DeepSpeed's default stage3_max_live_parameters; reduction buckets are each framework's (MemoryFacts).
DS_MAX_LIVE_PARAMETERS = 1e9

# NVML beyond torch's reservation (MiB): a lone rank's context; NCCL's buffers by a layout's groups
CUDA_CONTEXT_MIB = 1850.0
NCCL_MIB_BY_LAYOUT = {"data": 298.0, "zero3": 498.0, "zero": 488.0, "tensor": 1272.0, "pipeline": 2984.0}
# a DeepSpeed engine alone on its GPU still opens a group of one for its collectives
NCCL_MIB_ONE_DEEPSPEED_RANK = 404.0
# an emulated rank loads less context than a real one
EMULATED_CONTEXT_SHORTFALL_MIB = 476.0
# the caching allocator reserves more than the peak it hands out
ALLOCATOR_SLACK = 1.10
# a rank process's host memory before its model states; frameworks add theirs (MemoryFacts), ZeRO its import
HOST_RANK_BASE_MIB = {"cpu": 320.0, "cuda": 1800.0}
DEEPSPEED_IMPORT_MIB = 75.0
# host bytes per offloaded parameter beyond the CPU optimizer's 16 (pinned gradients, transient copies)
OFFLOAD_STAGING_BYTES = 6.0

@dataclass(frozen=True)
class Hardware:
    """What a cell would run on: memory per GPU and per host, GPUs per host, the GPU type where known."""
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
    short_of: list[str] = field(default_factory=list)  # "GPUs", "GPU memory", "host memory"

    def as_dict(self) -> dict[str, Any]:
        return {"gpu_mem_mib": _r(self.gpu_mem_mib), "host_mem_mib": _r(self.host_mem_mib), "fits": self.fits,
                "why_not": self.why_not, "short_of": self.short_of,
                "parts_mib": {k: _r(v) for k, v in self.parts_mib.items()}}


def nccl_layout(cell: CellParams | CellView) -> str:
    """Which of NCCL_MIB_BY_LAYOUT's layouts a cell's ranks communicate in (its model plays no part)."""
    params = params_of(cell)
    if params.pp > 1:
        return "pipeline"
    if params.tp > 1:
        return "tensor"
    strategy = strategy_of_cell(cell)
    if strategy.layout == "zero":
        return "zero3" if strategy.zero_stage == 3 else "zero"
    return "data"


def nccl_buffers_mib(cell: CellParams | CellView) -> float:
    """NCCL's device memory on one GPU rank of the cell, over a one-GPU torch rank's context (its model
    plays no part)."""
    params = params_of(cell)
    if params.device != "cuda":
        return 0.0
    if params.gpus <= 1:
        return NCCL_MIB_ONE_DEEPSPEED_RANK if engine(cell)[0] == "zero" else 0.0
    return NCCL_MIB_BY_LAYOUT[nccl_layout(cell)]


def emulated_rank_shortfall_mib(cell: CellParams | CellView) -> float:
    """What a real GPU rank of the cell's world shows beyond its emulated twin."""
    nccl = nccl_buffers_mib(cell)
    return nccl + EMULATED_CONTEXT_SHORTFALL_MIB if nccl else 0.0



def completed_gpu_mem_used_mib(result: Result) -> tuple[list[float], float] | None:
    """An emulated result's GPU 'used' completed by the model of now (measured + shortfall), and the
    shortfall; None if not emulated. The shortfall depends on the strategy alone: a result of a model
    of one's own is read without the config that defines it."""
    measured = result.emulation.measured.get("gpu_mem_used_mib") if result.emulation else None
    if not measured or not result.metrics.gpu_mem_used_mib:
        return None
    added = emulated_rank_shortfall_mib(result.cell)
    return [round(u + added, 1) for u in measured], added



def gpu_mem_used_now_mib(result: Result) -> list[float] | None:
    """GPU 'used' as a prediction is set against: measured, or completed (emulated)."""
    completed = completed_gpu_mem_used_mib(result)
    return completed[0] if completed is not None else result.metrics.gpu_mem_used_mib


def _r(value):
    return None if value is None else round(value, 1)


def engine(cell: CellParams | CellView) -> tuple[str, int | None]:
    """Which memory layout a cell's strategy has: ('replicated'|'fsdp'|'zero', ZeRO stage or None)."""
    strategy = strategy_of_cell(cell)
    return strategy.layout, strategy.zero_stage


def vocab_parallel(cell: CellParams | CellView) -> bool:
    """Whether the cell's tensor parallelism splits the token embedding and the tied LM head."""
    cell = as_view(cell)
    params = cell.params
    split = cell.strategy.tensor_parallel
    return (params.tp > 1 and split is not None and split.vocab_parallel
            and not cell.model.user_defined)


def block_shard_params(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """Parameters of one block on one tensor-parallel rank."""
    cell = as_view(cell)
    params = cell.params
    if spec.user_defined:  # what its plan splits (ModelFacts.tp_block_params), the rest whole
        return spec.block_params() - spec.facts.tp_block_params * (1 - 1 / params.tp)
    if vocab_parallel(cell):  # sharded: the norms and row-parallel biases stay whole
        whole = spec.block_whole_params()
        return (spec.block_params() - whole) / params.tp + whole
    return spec.block_params() / params.tp  # AutoTP, counted as splitting the whole block


def shard_params(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """Psi: parameters of rank 0's model-parallel shard, before data-parallel sharding."""
    cell = as_view(cell)
    params = cell.params
    total = spec.param_count(params.head, params.num_classes)
    blocks = spec.n_layer * spec.block_params()
    psi = total - blocks + spec.n_layer * block_shard_params(cell, spec)
    if vocab_parallel(cell):
        psi -= (spec.vocab_size - -(-spec.vocab_size // params.tp)) * spec.d_model
    if spec.user_defined:  # the layers its plan splits outside the blocks (an untied LM head)
        psi -= spec.facts.tp_other_params * (1 - 1 / params.tp)
    return psi / params.pp


def float8_linear_params(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """Weights of the linear layers a float8 cell trains in float8: the blocks' of trainbench's GPT."""
    cell = as_view(cell)
    params = cell.params
    if not params.float8 or spec.family != "gpt":
        return 0.0
    d, f = spec.d_model, spec.ffn
    return spec.n_layer * (4 * d * d + 2 * d * f) / params.tp


def model_states(cell: CellParams | CellView, spec: ModelSpec) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes of weights, gradients, optimizer states and buffers: (on the device, on the host) per rank."""
    cell = as_view(cell)
    psi = shard_params(cell, spec)
    kind, stage = engine(cell)
    device: dict[str, float] = {}
    host: dict[str, float] = {}
    if kind == "replicated":
        _replicated_states(cell, spec, psi, device)
    elif kind == "fsdp":
        _fsdp_states(cell, spec, psi, device, host)
    else:
        _zero_states(cell, spec, psi, stage, device, host)
    return device, host


def _replicated_states(cell: CellView, spec: ModelSpec, psi: float, device: dict[str, float]) -> None:
    """A replicated model's (DDP, one GPU) states, `psi` parameters on every rank."""
    params = cell.params
    mixed = params.precision != "fp32"
    device["weights"] = 4 * psi
    device["gradients"] = 4 * psi
    device["optimizer"] = 8 * psi
    if params.gpus > 1 and not params.ddp_bucket_view:
        device["buffers"] = 4 * psi  # DDP's gradient buckets (with ddp_bucket_view, the gradients)
    if mixed:
        # autocast's cached half weights; torchao casts float8 layers' weights at each use, keeping none
        cached = psi - float8_linear_params(cell, spec)
        device["buffers"] = device.get("buffers", 0) + 2 * cached


def _fsdp_states(cell: CellView, spec: ModelSpec, psi: float, device: dict[str, float],
                 host: dict[str, float]) -> None:
    """FSDP's states: sharded over the data-parallel ranks, a unit or two gathered in flight."""
    params = cell.params
    n, mixed = params.dp, params.precision != "fp32"
    _, offload_param = cell.offloads
    memory = cell.framework.memory
    block = block_shard_params(cell, spec)
    compute = 2 if mixed else 4
    if memory.fsdp_reduce_bytes and mixed:
        # the current and prefetched unit's weights; the current one's gradient and its reduction copy
        gathered = block * compute
        if params.float8_all_gather:
            gathered -= (compute - 1) * float8_linear_params(cell, spec) / spec.n_layer
        in_flight = 2 * gathered + block * (compute + memory.fsdp_reduce_bytes)
    else:
        in_flight = 2 * block * (compute + compute)
    states = {"weights": 4 * psi / n, "gradients": 4 * psi / n, "optimizer": 8 * psi / n}
    (host if offload_param else device).update(states)
    device["buffers"] = in_flight
    if params.fsdp_reshard in ("after_backward", "after_step"):
        # every block's gathered weights kept to backward: beyond the two in flight, all of them
        device["unsharded_weights"] = max(0, spec.n_layer - 2) * block * compute
    if params.grad_accum > 1 and memory.fsdp_accumulates_unsharded:
        # accumulating without synchronising keeps every unit's unsharded gradient, whatever N
        device.pop("gradients", None)
        device["unsharded_gradients"] = ((memory.fsdp_reduce_bytes if mixed else 0) or compute) * psi
        if not memory.fsdp_reduce_bytes:
            device["allocator_gradient_shards"] = 4 * psi / n


def _zero_states(cell: CellView, spec: ModelSpec, psi: float, stage: int, device: dict[str, float],
                 host: dict[str, float]) -> None:
    """ZeRO's states at `stage` (0-3): what each stage partitions, offloads, and its reduction buckets."""
    params = cell.params
    n, mixed = params.dp, params.precision != "fp32"
    offload_optimizer, offload_param = cell.offloads
    memory = cell.framework.memory
    weight = 2 if mixed else 4
    master = 4  # the optimizer's fp32 copy (a separate partition even in fp32 for stages 1-3)
    bucket_elements = params.reduce_bucket_size or memory.reduce_bucket_elements(spec)
    if params.device == "cpu":
        # host pages of an untouched torch.empty are not resident: only what reduction writes counts
        bucket_elements = min(bucket_elements, psi)
    # with overlap_comm, stages 1 and 2 fill one bucket while the other is reduced
    overlaps = cell.overlaps_comm and params.contiguous_gradients is not False
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


def _compiled(cell: CellParams | CellView, spec: ModelSpec) -> bool:
    """Whether torch.compile (inductor) builds the backward of trainbench's GPT in this cell."""
    cell = as_view(cell)
    params = cell.params
    return bool(params.compile) and spec.family in cell.framework.compiles


def _compiled_whole(cell: CellParams | CellView, spec: ModelSpec) -> bool:
    """Whether the model is compiled whole, loss included, rather than block by block (FSDP2)."""
    cell = as_view(cell)
    params = cell.params
    if not _compiled(cell, spec) or engine(cell)[0] == "fsdp":
        return False
    return not (params.gpus > 1 and params.ddp_compile == "blocks")


def _recomputes_in_backward(cell: CellParams | CellView, spec: ModelSpec) -> bool:
    """Whether inductor recomputes a block's norms and GELU in backward: float8 blocks only."""
    cell = as_view(cell)
    params = cell.params
    return _compiled(cell, spec) and bool(params.float8)


def _block_tensors(spec: ModelSpec, compiled: bool = False) -> list[tuple[float, str]]:
    """What one block saves for backward per token: (width, dtype class): 'res' residual stream, 'c'
    compute dtype, 'rep' that too but whole on every tensor-parallel rank, 'mask' 1 byte."""
    h, f = spec.d_model, spec.ffn
    if spec.family == "llama":
        # LlamaDecoderLayer: two RMSNorms, q k v, attention output twice, gate, up, SiLU, product
        return [(2 * h, "res"), (h, "rep"), (3 * h, "c"), (2 * h, "c"), (2 * h, "res"), (h, "rep"),
                (4 * f, "c")]
    if spec.family == "distilbert":
        # post-LN: q/k/v input, q k v, context, LayerNorm and FFN inputs, lin1 and GELU outputs, a mask
        return [(h, "qkv_in"), (3 * h, "c"), (h, "c"), (h, "res"), (h, "c"), (2 * f, "c"), (h, "res"),
                (h, "mask")]
    # GPT-2: Megatron's 10 + 24/t bytes in fp16, less its dropout masks and attention scores
    if compiled:  # the LayerNorm outputs and GELU recomputed in backward: 24 bytes under bf16, not 36
        return [(h, "res"), (3 * h, "c"), (h, "c"), (h, "res"), (f, "c")]
    return [(h, "res"), (h, "rep"), (3 * h, "c"), (h, "c"), (h, "res"), (h, "rep"), (2 * f, "c")]


def _dtype_bytes(cell: CellParams | CellView) -> tuple[int, int]:
    """(compute dtype, residual-stream dtype) bytes of a cell's activations."""
    cell = as_view(cell)
    params = cell.params
    mixed = params.precision != "fp32"
    kind, _ = engine(cell)
    # DeepSpeed, and FSDP where it casts the parameters, run the model itself in half precision
    half_engine = mixed and (kind == "zero" or (kind == "fsdp"
                                                and cell.framework.memory.fsdp_casts_parameters))
    return (2 if mixed else 4), (2 if half_engine else 4)


def traced(cell: CellParams | CellView, spec: ModelSpec) -> ActivationTrace:
    """What a user's model saves for backward per sample, traced as the cell runs it on one rank."""
    cell = as_view(cell)
    params = cell.params
    compute, residual = _dtype_bytes(cell)
    mode = "fp32" if compute == 4 else ("half-16" if residual == 2 else "autocast-16")
    tp = params.tp if spec.facts.tp_collectives_per_block or spec.facts.tp_other_params else 1
    kernel = "eager" if spec.attention_run(params.attention) == "eager" else "sdpa"
    return spec.facts.activations(spec, mode, kernel, params.seq_len or spec.max_seq, tp)


def block_bytes_per_token(cell: CellParams | CellView, spec: ModelSpec, *, traffic: bool = False) -> float:
    """Bytes one block saves for backward per token on one rank (`traffic`: as the time model counts)."""
    cell = as_view(cell)
    params = cell.params
    if spec.user_defined:  # traced, not listed: the architecture is the user's
        return traced(cell, spec).block_bytes / (params.seq_len or spec.max_seq)
    compute, residual = _dtype_bytes(cell)
    # an input three linear layers read (DistilBERT's q, k, v): under autocast each saves its own cast
    qkv_in = compute if compute == residual else 3 * compute
    sizes = {"c": compute, "rep": compute, "res": residual, "mask": 1, "qkv_in": qkv_in}
    recomputes = _compiled(cell, spec) if traffic else _recomputes_in_backward(cell, spec)
    # tensor parallelism splits what is inside attention and the MLP, not the residual stream or norms
    return sum(width * sizes[dtype] / (params.tp if dtype == "c" else 1)
               for width, dtype in _block_tensors(spec, recomputes))


def _logit_bytes(cell: CellParams | CellView, spec: ModelSpec, compute: int) -> int:
    """Bytes per logit at the loss's peak: three fp32 tensors eager; compiled, the compute dtype's (and
    a gradient where the loss is compiled alone), plus fp32 unless the vocabulary is a multiple of 64."""
    cell = as_view(cell)
    params = cell.params
    if not _compiled(cell, spec) or (engine(cell)[0] == "fsdp" and params.tp > 1):
        return 4 + 4 + 4  # FSDP2 under tensor parallelism runs its loss eager, on vocabulary shards
    fp32_copy = 0 if spec.vocab_size % 64 == 0 else 4
    if _compiled_whole(cell, spec):
        return compute + fp32_copy
    return compute + compute + fp32_copy


def eager_score_bytes_per_token(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """Bytes eager attention's score matrices save per token and block on one rank (SDPA: none)."""
    cell = as_view(cell)
    params = cell.params
    eager = params.attention == "eager" or (
        cell.framework.memory.eager_attention_when_deterministic and params.deterministic)
    if not eager or spec.user_defined:  # a traced block's bytes hold its scores already
        return 0.0
    compute, residual = _dtype_bytes(cell)
    # per score: the softmax's output, its cast that multiplies V, the dropout's mask
    softmax_bytes = 4 if spec.softmax_fp32 else residual
    dropout = spec.attention_dropout > 0
    cast = compute if (dropout or compute != softmax_bytes) else 0
    scores_per_token = spec.n_head / params.tp * (params.seq_len or spec.max_seq)
    return scores_per_token * (softmax_bytes + cast + dropout)


def activations(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """Bytes of activations saved for backward at the end of forward, per rank (a pipeline's first)."""
    cell = as_view(cell)
    params = cell.params
    in_flight = min(params.pp, params.grad_accum) if params.pp > 1 else 1
    return _block_activations(cell, spec, in_flight) + _logits(cell, spec) + _outside_blocks(cell, spec)


def _outside_blocks(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """DistilBERT's embeddings' sum and mask, and three tensors of its last block, at its peak."""
    cell = as_view(cell)
    params = cell.params
    if spec.family != "distilbert":
        return 0.0
    _, residual = _dtype_bytes(cell)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    return tokens * spec.d_model * (residual + 1 + 3 * residual)


def _block_activations(cell: CellParams | CellView, spec: ModelSpec, in_flight: int) -> float:
    """What the rank's blocks save for backward on the device, for `in_flight` micro batches."""
    cell = as_view(cell)
    params = cell.params
    _, residual = _dtype_bytes(cell)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    block = tokens * block_bytes_per_token(cell, spec)
    block += tokens * eager_score_bytes_per_token(cell, spec)
    layers = spec.n_layer / params.pp
    # what a checkpointed block keeps: its input, the residual stream (traced for a user's model)
    kept = (traced(cell, spec).block_input_bytes / (params.seq_len or spec.max_seq) if spec.user_defined
            else spec.d_model * residual)
    if params.activation_checkpointing and params.checkpoint_in_cpu:
        # the inputs wait on the host; here, the one block being recomputed
        return tokens * kept + block
    if params.activation_checkpointing:
        return layers * tokens * kept * in_flight + block
    return layers * block * in_flight


def checkpoints_in_host(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """Bytes of checkpointed block inputs one rank keeps in host memory (checkpoint_in_cpu)."""
    cell = as_view(cell)
    params = cell.params
    if not (params.activation_checkpointing and params.checkpoint_in_cpu):
        return 0.0
    _, residual = _dtype_bytes(cell)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    return spec.n_layer / params.pp * tokens * spec.d_model * residual / params.tp


def _logits(cell: CellParams | CellView, spec: ModelSpec) -> float:
    """What the loss holds of the logits at its peak: all of them, or a vocabulary-parallel rank's."""
    cell = as_view(cell)
    params = cell.params
    if params.head != "lm":
        return 0.0
    compute, _ = _dtype_bytes(cell)
    tokens = (params.seq_len or spec.max_seq) * params.micro_batch
    if spec.user_defined:
        # traced, and the loss's fp32 gradient of the logits, which backward makes first
        return traced(cell, spec).outside_bytes * params.micro_batch + tokens * spec.vocab_size * 4
    vocab = -(-spec.vocab_size // params.tp) if vocab_parallel(cell) else spec.vocab_size
    return tokens * vocab * _logit_bytes(cell, spec, compute)


def allocated_mib(parts_mib: dict[str, float]) -> float:
    """What torch allocates at the peak: every part but the allocator's reserve and the CUDA context."""
    return sum(v for k, v in parts_mib.items() if not k.startswith("allocator_") and k != "cuda_context")


def predict(cell: CellParams | CellView, hardware: Hardware | None = None) -> Prediction:
    """Peak memory of one rank's GPU, the busiest node's host memory, and whether both fit."""
    cell = as_view(cell)
    params = cell.params
    spec = cell.model.with_vocab_multiple(params.vocab_multiple)  # as built
    on_device, on_host = model_states(cell, spec)
    acts = activations(cell, spec)
    if params.checkpoint_in_cpu:
        on_host["checkpointed_activations"] = checkpoints_in_host(cell, spec)
    ranks_per_node = params.gpus_per_node
    kind, stage = engine(cell)
    memory = cell.framework.memory
    base = (HOST_RANK_BASE_MIB[params.device] + memory.host_extra_mib[params.device]
            + (DEEPSPEED_IMPORT_MIB if kind == "zero" else 0.0))
    parts = {k: v / MIB for k, v in on_device.items()}
    parts["activations"] = acts / MIB
    if kind == "replicated" and params.grad_accum == 1 and memory.replicated_gradients_freed:
        # backward makes each layer's gradients as it frees its activations: the larger, not the sum
        beyond = parts.pop("gradients") - parts["activations"]
        if beyond > 0:
            parts["gradients_beyond_activations"] = beyond
    elif kind == "zero" and stage < 3 and params.grad_accum == 1:
        # ZeRO 0-2 make gradients and bucket after the loss's peak: the largest of three moments
        grads = parts.pop("gradients") + parts.pop("buffers", 0.0)
        logits = _logits(cell, spec)
        if spec.user_defined:  # what its embeddings and head save stays to their backward
            logits -= traced(cell, spec).outside_bytes * params.micro_batch
        blocks = parts["activations"] - logits / MIB
        copy = 0.0
        if stage > 0 and params.precision != "fp32" and not cell.offloads[0]:
            copy = 4 * shard_params(cell, spec) / params.dp / MIB
        beyond = max(blocks + grads, grads + copy) - parts["activations"]
        if beyond > 0:
            parts["gradients_beyond_activations"] = beyond
    allocated = allocated_mib(parts)
    if params.device == "cuda":
        parts["allocator_slack"] = allocated * (ALLOCATOR_SLACK - 1)
        parts["cuda_context"] = CUDA_CONTEXT_MIB + nccl_buffers_mib(cell)
        gpu = sum(parts.values())
        split = cell.strategy.tensor_parallel if params.tp > 1 else None
        if split is not None and split.builds_whole_model:
            # AutoTP splits a model built whole: each GPU first holds every fp32 weight
            whole = 4 * spec.param_count(params.head, params.num_classes) / MIB
            if whole * ALLOCATOR_SLACK + parts["cuda_context"] > gpu:
                parts = {"whole_model_before_autotp": whole, "allocator_slack": whole * (ALLOCATOR_SLACK - 1),
                         "cuda_context": parts["cuda_context"]}
                gpu = sum(parts.values())
        elif split is not None:
            # built sharded: at initialisation, its fp32 shards and one parameter drawn whole
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
    """hardware_of, from a metrics.json document."""
    return hardware_of(doc.get("params") or {}, doc.get("provenance") or {},
                       (doc.get("metrics") or {}).get("gpu_mem_total_mib"), bool(doc.get("emulation")))


def hardware_of_result(result: Result) -> Hardware | None:
    """hardware_of, from a Result."""
    return hardware_of(result.params, result.provenance, result.metrics.gpu_mem_total_mib, result.emulated)


def hardware_of(params_dict: dict[str, Any], provenance: Mapping[str, Any], totals: list[float] | None,
                emulated: bool) -> Hardware | None:
    """The machine a cell ran on, as far as its result says."""
    if not totals and provenance.get("gpu_memory_mib") and provenance.get("gpu_count"):
        # a run that died before NVML sampled (an OOM in the first step): the GPUs it was given
        totals = [provenance["gpu_memory_mib"]] * provenance["gpu_count"]
    host = provenance.get("host_mem_total_mib") or float("inf")
    if not totals and host == float("inf"):
        return None
    kind = gpu_type_of(provenance.get("gpu_name"))
    try:
        params = CellParams.from_dict(params_dict)
    except (TypeError, ValueError):  # not a whole cell's parameters (a hand-made document): as recorded
        return Hardware(min(totals) if totals else None, host, len(totals or []), gpu=kind)
    gpu_mib = held_gpu_mib(min(totals) if totals else None, params)
    if emulated or params.emulate:
        return emulated_node(gpu_mib, host, params, gpu=kind)
    return Hardware(gpu_mib, host, len(totals or []), gpu=kind)


def held_gpu_mib(gpu_mib: float | None, params: CellParams) -> float | None:
    """A GPU's memory as a cell's rank sees it: at most the cell's gpu_mem_limit_gib."""
    limit = params.gpu_mem_limit_gib
    if not limit:
        return gpu_mib
    return min(gpu_mib, limit * 1024) if gpu_mib is not None else limit * 1024


def emulated_node(gpu_mib: float | None, host_mib: float, params: CellParams, name: str = "",
                  gpu: GpuType | None = None) -> Hardware:
    """The node an emulated rank stands for: its world's ranks per node, each with this host's memory."""
    per_node = params.gpus_per_node
    return Hardware(gpu_mib, host_mib * per_node, per_node, name, gpu)


def hardware_from_args(gpu: str | None, gpu_mem_gib: float | None, host_mem_gib: float,
                       gpus_per_node: int) -> Hardware:
    """Hardware from command-line words: a GPU type (or any name, with its memory) and host memory."""
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


def heaviest_rank(cell: CellParams | CellView) -> int:
    """The rank whose GPU holds the most: rank 0, or a pipeline's last stage's first, (pp - 1) x dp."""
    cell = as_view(cell)
    params = cell.params
    if params.pp == 1:
        return 0
    spec = cell.model.with_vocab_multiple(params.vocab_multiple)
    # beyond the embedding both ends hold: the first stage's positions, the last's norm and head
    states, _ = model_states(cell, spec)
    per_parameter = sum(states.values()) / shard_params(cell, spec)
    positions = spec.embedding_params() - spec.vocab_size * spec.d_model
    tail = (spec.param_count(params.head, params.num_classes) - spec.embedding_params()
            - spec.n_layer * spec.block_params())
    first = (_block_activations(cell, spec, min(params.pp, params.grad_accum))
             + positions * per_parameter)
    last = _block_activations(cell, spec, 1) + _logits(cell, spec) + tail * per_parameter
    return 0 if first >= last else (params.pp - 1) * params.dp
