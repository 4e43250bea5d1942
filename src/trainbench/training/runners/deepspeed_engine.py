"""The DeepSpeed engine with ZeRO stage 0-3, optimizer and parameter offload, one JSON config per cell.

`deepspeed_config` is a pure function of the cell's parameters; the cell's runner writes the config
it used next to metrics.json, as the study's origin kept one JSON file per scenario.

Tensor parallelism (tp > 1) goes through DeepSpeed AutoTP with Megatron's layout. Pipeline
parallelism (pp > 1) goes through DeepSpeed's pipeline engine: the GPT is rebuilt as a
PipelineModule (embeddings, blocks, final norm, LM head tied to the token embedding across the
first and last stage), blocks balanced over the stages, and each step is one `train_batch` of
`grad_accum` micro batches flowing through the pipeline.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import zlib

import torch
import torch.nn.functional as F
from torch import nn

from trainbench.study.params import CellParams
from trainbench.training import emulation
from trainbench.registry.frameworks import deepspeed_ops
from trainbench.study.cell_view import CellView, as_view
from trainbench.training.gpt import Block, init_gpt_module, lm_loss, pool
from trainbench.registry.models import ModelSpec
from trainbench.training.runners import RunContext, StepRunner, optimizer_range


# Megatron's layout for trainbench's GPT, as DeepSpeed AutoTP partition rules: attention's fused qkv
# and the MLP's first layer column-parallel (qkv split as [q; k; v], each across the ranks), the
# attention and MLP output projections row-parallel (an all-reduce after them).
GPT_TENSOR_PARALLEL_LAYOUT = {
    "use_default_specs": False,
    "layer_specs": [
        {"patterns": [r".*\.attn\.qkv\.(weight|bias)$"], "partition_type": "column", "shape": [3, -1],
         "partition_dim": 0},
        {"patterns": [r".*\.mlp\.fc\.(weight|bias)$"], "partition_type": "column"},
        {"patterns": [r".*\.attn\.proj\.weight$", r".*\.mlp\.proj\.weight$"], "partition_type": "row"},
    ],
}


def deepspeed_config(cell: CellParams | CellView, device_type: str) -> dict[str, Any]:
    cell = as_view(cell)
    params = cell.params
    stage = cell.strategy.zero_stage
    offload_optimizer, offload_param = cell.offloads
    on_gpu = device_type == "cuda"
    pin = params.pin_memory and on_gpu
    zero: dict[str, Any] = {"stage": stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    # DeepSpeed's own default wherever the cell leaves a setting unset, so that the config says only
    # what the cell chose
    for key, value in (("overlap_comm", params.overlap_comm),
                       ("contiguous_gradients", params.contiguous_gradients),
                       ("reduce_bucket_size", params.reduce_bucket_size),
                       ("allgather_bucket_size", params.allgather_bucket_size),
                       ("stage3_prefetch_bucket_size", params.prefetch_bucket_size)):
        if value is not None:
            zero[key] = value
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": params.micro_batch,
        "gradient_accumulation_steps": params.grad_accum,
        "train_batch_size": params.global_batch,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": params.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                "weight_decay": params.weight_decay,
                # torch's AdamW on the device; an offloaded optimizer on a GPU machine uses
                # DeepSpeedCPUAdam (compiled on first use), which is what offload is measured with.
                "torch_adam": not (offload_optimizer and on_gpu),
            },
        },
        "zero_optimization": zero,
        "fp16": {"enabled": params.precision == "fp16", "initial_scale_power": 16},
        "bf16": {"enabled": params.precision == "bf16"},
        "steps_per_print": 2**31 - 1,  # the worker reports progress; DeepSpeed's own lines are noise
        "wall_clock_breakdown": False,
    }
    if params.tp > 1:
        config["tensor_parallel"] = {"autotp_size": params.tp,
                                     "partition_config": GPT_TENSOR_PARALLEL_LAYOUT}
        # DeepSpeed 0.19 checks train_batch_size against every rank, not the data-parallel ones, when
        # AutoTP comes from the config; left out, it is derived (the cell's global_batch is still
        # micro batch x accumulation x data-parallel size).
        del config["train_batch_size"]
    return config


class PositionEmbedding(nn.Module):
    """Pipeline layer after the token embedding: adds learned positions."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.wpe = nn.Embedding(spec.max_seq, spec.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.wpe(torch.arange(x.shape[1], device=x.device))


class ClassifierHead(nn.Module):
    """Pipeline layer for a classification head: pool one position (as GPT.forward does), project."""

    def __init__(self, spec: ModelSpec, num_classes: int):
        super().__init__()
        self.causal = spec.causal
        self.classifier = nn.Linear(spec.d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(pool(x, self.causal))


def _lm_head(embedding: nn.Embedding, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, embedding.weight)


def pipeline_module(spec: ModelSpec, params: CellParams):
    """trainbench's GPT as a DeepSpeed PipelineModule of `pp` stages (same layers, same loss)."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    layers: list[Any] = [TiedLayerSpec("embedding", nn.Embedding, spec.vocab_size, spec.d_model),
                         LayerSpec(PositionEmbedding, spec)]
    layers += [LayerSpec(Block, spec) for _ in range(spec.n_layer)]
    layers.append(LayerSpec(nn.LayerNorm, spec.d_model))
    if params.head == "classifier":
        layers.append(LayerSpec(ClassifierHead, spec, params.num_classes))
    else:  # GPT-2 ties the LM head to the token embedding: DeepSpeed keeps the copies in sync
        layers.append(TiedLayerSpec("embedding", nn.Embedding, spec.vocab_size, spec.d_model,
                                    forward_fn=_lm_head))
    # a classifier's loss is the same cross-entropy over its (batch, classes) logits
    return PipelineModule(layers=layers, loss_fn=lm_loss, num_stages=params.pp,
                          partition_method="type:Block",
                          activation_checkpoint_interval=1 if params.activation_checkpointing else 0,
                          # blocks only, as GPT.forward does: the embedding's input (token ids) needs no grad
                          checkpointable_layers=["Block"])


def init_pipeline_weights(module: nn.Module, spec: ModelSpec, seed: int) -> None:
    """GPT-2 initialisation of the layers this stage holds. Each module draws from a generator
    seeded by its name, which starts with the layer's global index (or the tied key), so a layer
    gets the same weights whichever stage holds it, and tied copies start equal."""
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            generator = torch.Generator(device=sub.weight.device).manual_seed(
                seed * 1_000_003 + zlib.crc32(name.encode()))
            init_gpt_module(sub, name, spec.n_layer, generator)


def load_ops(params: CellParams) -> None:
    """Compile or load the DeepSpeed ops the cell steps with (frameworks.deepspeed_ops): compiled once
    per environment into TORCH_EXTENSIONS_DIR (CPU Adam: 55-80 s on a fresh H200 host), then loaded by
    every cell. DeepSpeed keeps what it loaded, so the optimizer's own load later is free; concurrent
    ranks share one build (torch locks the extension's folder while one of them compiles)."""
    ops = deepspeed_ops(params)
    if ops:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        builders = {"cpu_adam": CPUAdamBuilder}
        for op in ops:
            builders[op]().load()


# DeepSpeed ZeRO-3 checks that every rank traced the same modules and parameters in the same order:
# rank 0 broadcasts its list and each rank compares. An emulated rank's broadcast leaves a rank r > 0
# with its placeholder, never rank 0's list, so the check would fail however alike the ranks are. The
# modules that import the check, each by its own name:
RANK0_CHECKS = ("deepspeed.runtime.zero.utils", "deepspeed.runtime.zero.stage3",
                "deepspeed.runtime.zero.partition_parameters",
                "deepspeed.runtime.zero.partitioned_param_coordinator")


def agree_with_rank0() -> None:
    """In an emulated rank other than rank 0, DeepSpeed's checks against rank 0 pass (they compare;
    they allocate nothing a real rank keeps). Called by the runners that use DeepSpeed before they
    build."""
    if not emulation.in_this_process() or int(os.environ.get("RANK", "0")) == 0:
        return
    for name in RANK0_CHECKS:
        module = importlib.import_module(name)
        if getattr(module, "assert_ints_same_as_other_ranks", None) is not None:
            module.assert_ints_same_as_other_ranks = _agrees_with_rank0


def _agrees_with_rank0(_ints) -> None:
    """DeepSpeed's assert_ints_same_as_other_ranks on an emulated rank r > 0: rank 0 is this rank's twin."""


class DeepSpeedRunner(StepRunner):
    CONFIG_FILE = "deepspeed_config.json"

    def __init__(self, context: RunContext):
        super().__init__(context)
        self.stage = self.strategy.zero_stage

    @classmethod
    def prepare_process(cls, params: CellParams) -> None:
        load_ops(params)

    def setup(self) -> None:
        import deepspeed

        agree_with_rank0()
        self.config = deepspeed_config(self.view, self.ctx.device.type)
        # Wrap the process group the worker made; zero.Init reads the world size from it.
        deepspeed.init_distributed(dist_backend="nccl" if self.ctx.is_cuda else "gloo")
        if self.p.pp > 1:
            return self._setup_pipeline(deepspeed)
        self.inner = self._build_model(deepspeed)
        self._params_total = sum(getattr(p, "ds_numel", p.numel()) for p in self.inner.parameters())
        self.engine, _, _, _ = deepspeed.initialize(model=self.inner,
                                                    model_parameters=self.inner.parameters(),
                                                    config=self.config)
        if emulation.in_this_process() and getattr(self.engine, "first_dataloader_check", None) is not None:
            # AutoTP's one-off check that a tensor-parallel group reads the same batch sums a flag over
            # the group, which a fake all-reduce leaves at one rank's: the data follows the data-parallel
            # rank here (below), as the check would confirm on a real world
            self.engine.first_dataloader_check.remove()
        # The ranks of one tensor-parallel group compute on the same batch: data follows the
        # data-parallel rank.
        from deepspeed.utils import groups

        data_rank = groups.get_data_parallel_rank() if self.p.tp > 1 else self.ctx.rank
        if self.p.tp > 1 and groups.get_tensor_model_parallel_world_size() != self.p.tp:
            raise RuntimeError(f"DeepSpeed made tensor-parallel groups of "
                               f"{groups.get_tensor_model_parallel_world_size()} ranks, "
                               f"not tp={self.p.tp}")
        if self.p.checkpoint_in_cpu:
            from trainbench.training.gpt import CheckpointsInHostMemory

            group = groups.get_tensor_model_parallel_group() if self.p.tp > 1 else None
            self.engine.module.checkpoint_storage = CheckpointsInHostMemory(group)
        self.batches = self.ctx.batches(rank=data_rank)

    def _setup_pipeline(self, deepspeed) -> None:
        spec = self.ctx.built_spec
        with self.ctx.device:
            self.inner = pipeline_module(spec, self.p)  # only this stage's layers are built
        init_pipeline_weights(self.inner, spec, self.p.seed)
        # each stage holds a part: the whole model is the spec's count (tied embedding once)
        self._params_total = spec.param_count(self.p.head, self.p.num_classes)
        self.engine, _, _, _ = deepspeed.initialize(
            model=self.inner, model_parameters=[q for q in self.inner.parameters() if q.requires_grad],
            config=self.config)
        # the first stage reads inputs, the last targets: both from the pipeline's data-parallel shard
        batches = self.ctx.batches(rank=self.engine.grid.get_data_parallel_id())
        self.pipeline_data = iter(batches.next, None)
        if emulation.in_this_process() and self.engine.stage_id > 0:
            self._receive_without_a_sender(spec)

    def _receive_without_a_sender(self, spec: ModelSpec) -> None:
        """An emulated stage after the first has no stage before it to tell it what it receives (the
        engine's first receive is the sent activations' dtype and shape, which a fake receive leaves
        unwritten): it is what every stage but the last sends, the hidden states of a micro batch in
        the engine's dtype. Nor does any stage send the activations themselves: the receive buffer
        keeps what it holds, which trainbench writes once, as hidden states a real stage could send
        (unit normal, seeded). Left as allocated (zeros), every hidden state of the stage would be
        zero (GPT-2's biases start at zero), each LayerNorm's backward would multiply the gradient by
        1/sqrt(eps), and a deep, wide stage's gradients would overflow: the optimizer would skip
        every step and never allocate its states (gpt-2.5b's last stage: AdamW's 5 GiB a rank)."""
        engine = self.engine
        dtype = next(engine.module.parameters()).dtype
        shape = [self.p.micro_batch, self.p.seq_len, spec.d_model]
        generator = torch.Generator(device=engine.device)
        generator.manual_seed(self.p.seed * 1_000_003 + engine.stage_id)

        def receive_meta(_sender):
            buffer = engine._allocate_or_extend_buffers(0, shape, dtype)
            with torch.no_grad():
                buffer.normal_(generator=generator)
            return buffer

        engine._recv_tensor_meta = receive_meta

    def _build_model(self, deepspeed) -> torch.nn.Module:
        if self.stage < 3 or self.p.tp > 1:
            # (with tensor parallelism AutoTP shards the built model inside deepspeed.initialize)
            with self.ctx.device:
                model = self.ctx.new_model()
            model.init_weights(self.p.seed)
            return model
        # ZeRO-3 partitions every layer as it is constructed, so no rank ever holds the whole model;
        # weights are then initialised one module at a time, gathered, written by rank 0.
        if self.ctx.user_model:
            # built once on the meta device first: what transformers imports lazily while a model is
            # built (torch._dynamo among it) must not be imported under zero.Init, which patches tensor
            # construction and breaks dynamo's import
            with torch.device("meta"):
                self.ctx.new_model()
        with deepspeed.zero.Init(config_dict_or_path=self.config):
            model = self.ctx.new_model(initialise=False)
        for index, name, module in model.init_targets():
            with deepspeed.zero.GatheredParameters(list(module.parameters(recurse=False)), modifier_rank=0):
                if self.ctx.rank == 0:
                    model.init_module(index, name, module, self.p.seed)
        return model

    def train_step(self) -> torch.Tensor:
        if self.p.pp > 1:
            # grad_accum micro batches through the stages, then the optimizer step; the mean loss
            # comes back to every stage
            return self.engine.train_batch(data_iter=self.pipeline_data).detach().float()
        accumulation = self.p.grad_accum
        total = torch.zeros((), device=self.ctx.device)
        for micro in range(accumulation):
            inputs, targets = self.batches.next()
            loss = self.engine(inputs, targets)
            self.engine.backward(loss)  # scales by 1/accumulation itself
            # steps the optimizer at the accumulation boundary only
            with optimizer_range(micro == accumulation - 1):
                self.engine.step()
            total += loss.detach().float() / accumulation
        return total

    def model(self) -> torch.nn.Module:
        return self.engine.module

    def optimizer_object(self):
        return self.engine.optimizer  # ZeRO's, holding the fp32 partitions and the inner optimizer

    def optimizer_steps_skipped(self) -> int | None:
        return getattr(self.engine, "skipped_steps", None)

    def params_total(self) -> int:
        return self._params_total  # counted before tensor parallelism split the layers

    def framework_config(self) -> dict[str, Any]:
        return self.config  # the exact JSON config this run used
