"""Plain torch: one process, DistributedDataParallel, or FSDP2 (`fully_shard`).

FSDP follows pytorch/examples' FSDP2 recipe: build on the meta device, shard every block and then the
root, materialise the local shards, initialise them. Mixed precision is autocast for single/DDP and
FSDP's MixedPrecisionPolicy (bf16/fp16 compute, fp32 gradient reduction) for FSDP.

With tp > 1, FSDP runs on a 2-D mesh (data parallel x tensor parallel, tensor-parallel ranks
adjacent) as torchtitan does: the meta model is first split by DTensor tensor parallel over the tp
dimension (trainbench.training.tensor_parallel: Megatron's layout, vocabulary-parallel embedding and LM head),
then sharded over the dp dimension, so each rank only ever allocates its shard. The ranks of one
tensor-parallel group read the same batch, and the loss is computed on the vocabulary-sharded logits
under `loss_parallel`.
"""

from __future__ import annotations

import contextlib
import json
import os

import torch
from torch.nn.parallel import DistributedDataParallel

from trainbench.training.gpt import GPT
from trainbench.training.runners import RunContext, StepRunner, optimizer_range

# Testing aid: TRAINBENCH_OVERFLOW_STEPS=N makes the first N optimizer steps' gradients infinite, as
# an fp16 loss scale still too large for the model overflows them: the real scaler skips those steps;
# =a,b,... the steps numbered so (from 1), as a scale that settles late skips now and then.
OVERFLOW_STEPS_ENV = "TRAINBENCH_OVERFLOW_STEPS"


def overflow_steps(value: str | None) -> set[int]:
    """The steps TRAINBENCH_OVERFLOW_STEPS overflows: 'N' the first N, 'a,b,...' those."""
    if not value:
        return set()
    if "," in value:
        return {int(step) for step in value.split(",") if step.strip()}
    return set(range(1, int(value) + 1))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def to_float8(model: GPT, recipe: str, fsdp_all_gather: bool = False) -> int:
    """The blocks' linear layers as torchao's Float8Linear (float8 matmuls with dynamic scales, the
    recipe's: tensorwise or rowwise), in place, before any wrapper or compilation sees the model; the LM
    head (F.linear on the tied embedding), a classifier and layers whose sizes are not multiples of 16
    (what FP8 matmuls tile) stay as they are, as torchtitan leaves its output layer. `fsdp_all_gather`:
    their weights become tensors that FSDP2 all-gathers in float8 (tensorwise only). Returns how many
    layers were converted."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def chosen(module: torch.nn.Module, name: str) -> bool:
        return (name.startswith("blocks.") and isinstance(module, torch.nn.Linear)
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=chosen)
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


class ShardedGradScaler:
    """fp16 dynamic loss scaling (GradScaler's defaults: 2^16, halved on overflow, doubled after 2000
    good steps) for sharded parameters wherever their shards live. torch's GradScaler hands FSDP2's
    DTensor gradients to DTensor, which reduces the overflow flag over the mesh on the gradients'
    device: with CPU offload that is a host tensor, which NCCL cannot reduce. Here each rank checks and
    unscales its local shards, and one MAX all-reduce on the rank's device makes every rank skip the
    same steps."""

    def __init__(self, device: torch.device, enabled: bool, init_scale: float = 2.0 ** 16,
                 growth_interval: int = 2000):
        self.device, self.enabled = device, enabled
        self.scale_value, self.growth_interval = init_scale, growth_interval
        self.good_steps, self.skipped = 0, False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value if self.enabled else loss

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.enabled:
            optimizer.step()
            return
        import torch.distributed as dist

        groups: dict[tuple, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    grad = parameter.grad
                    local = grad.to_local() if hasattr(grad, "to_local") else grad
                    groups.setdefault((local.device, local.dtype), []).append(local)
        found = torch.zeros(1, device=self.device)
        for (device, _), grads in groups.items():
            flag = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(
                grads, flag, torch.full((1,), 1.0 / self.scale_value, device=device))
            found += flag.to(self.device)
        if dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        self.skipped = bool(found.item())
        if not self.skipped:
            optimizer.step()

    def update(self) -> None:
        if not self.enabled:
            return
        if self.skipped:
            self.scale_value, self.good_steps = self.scale_value / 2, 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale_value, self.good_steps = self.scale_value * 2, 0


class TorchRunner(StepRunner):
    def __init__(self, context: RunContext):
        super().__init__(context)
        self.dtype = DTYPES[self.p.precision]
        self.sharded = self.strategy.layout == "fsdp"
        self.tp = self.p.tp  # > 1 only where the strategy has tensor parallelism (frameworks.check)
        self.data_parallel = self.strategy.layout == "replicated" and not self.strategy.single_rank
        self.inner: GPT | None = None
        self.wrapped: torch.nn.Module | None = None
        self.tp_group = None  # the tensor-parallel process group, where tp > 1
        self.tp_plan: dict[str, str] | None = None  # a user's model: {module path: style} as split
        self.tp_plan_source = ""
        self.float8_layers = 0  # linear layers trained in float8 (float8: a recipe)
        self.skipped_steps = 0  # optimizer steps fp16 loss scaling skipped
        self.steps_begun = 0
        self.overflow_steps = overflow_steps(os.environ.get(OVERFLOW_STEPS_ENV))

    def _new_model(self) -> torch.nn.Module:
        return self.ctx.new_model()

    def setup(self) -> None:
        device = self.ctx.device
        if self.sharded:
            self.inner = self._build_fsdp()
            self.wrapped = self.inner
        else:
            with device:
                self.inner = self._new_model()
            self.inner.init_weights(self.p.seed)
            if self.p.float8:
                self.float8_layers = to_float8(self.inner, self.p.float8)
            self.wrapped = self.inner
            per_block = self.p.compile and self.data_parallel and self.p.ddp_compile == "blocks"
            if per_block:  # compiled inside DDP's wrapper: its hooks see each block's gradients as they come
                for block in self.inner.blocks:
                    block.compile()
                if isinstance(self.inner, GPT):
                    self.inner.compile_loss()
            if self.data_parallel:
                options = {"gradient_as_bucket_view": bool(self.p.ddp_bucket_view),
                           "static_graph": bool(self.p.ddp_static_graph)}
                if self.p.ddp_bucket_cap_mb:
                    options["bucket_cap_mb"] = self.p.ddp_bucket_cap_mb
                self.wrapped = DistributedDataParallel(
                    self.inner, device_ids=[device.index] if self.ctx.is_cuda else None, **options)
            if self.p.compile and not per_block:
                self.wrapped = torch.compile(self.wrapped)
        if self.p.checkpoint_in_cpu:
            from trainbench.training.gpt import CheckpointsInHostMemory

            self.inner.checkpoint_storage = CheckpointsInHostMemory(self.tp_group)
        on_device = self.ctx.is_cuda and not self.p.offload_param
        self.optimizer = torch.optim.AdamW(self.inner.parameters(), lr=self.p.lr,
                                           weight_decay=self.p.weight_decay, fused=on_device or None)
        # Only fp16 needs loss scaling; the scaler is a no-op pass-through when disabled.
        fp16 = self.p.precision == "fp16"
        self.scaler = (ShardedGradScaler(device, fp16) if self.sharded
                       else torch.amp.GradScaler(device.type, enabled=fp16))
        # the ranks of a tensor-parallel group (adjacent ranks) compute on the same batch
        self.batches = self.ctx.batches(rank=self.ctx.rank // self.tp)

    def _build_fsdp(self) -> GPT:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        device = self.ctx.device
        with torch.device("meta"):
            model = self._new_model()
        # float8 on the meta model, before tensor parallelism and FSDP shard it (torchtitan's order:
        # the float8 tensor-parallel plans apply to torchao's layers)
        if self.p.float8:
            self.float8_layers = to_float8(model, self.p.float8, self.p.float8_all_gather)
        if self.tp > 1:
            from trainbench.training.tensor_parallel import parallelize, parallelize_plan

            mesh = init_device_mesh(device.type, (self.ctx.world_size // self.tp, self.tp),
                                    mesh_dim_names=("dp", "tp"))
            if isinstance(model, GPT):
                parallelize(model, mesh["tp"], self.p.float8)
            else:  # a model of the user's, by its plan (frameworks.user_model_unsupported: it has one)
                from trainbench.registry.models import tensor_parallel_plan

                plan, self.tp_plan_source = tensor_parallel_plan(json.loads(self.p.model_definition))
                self.tp_plan = parallelize_plan(model, mesh["tp"], plan)
            self.tp_group = mesh["tp"].get_group()
            options = {"mesh": mesh["dp"]}
        else:
            options = {"mesh": init_device_mesh(device.type, (self.ctx.world_size,))}
        if self.p.precision != "fp32":
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        if self.p.offload_param:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=self.ctx.is_cuda and self.p.pin_memory)
        # FSDP2 frees a block's gathered weights after its forward unless the cell keeps them to its
        # backward, or across the accumulation (_gradient_sync)
        keep_to_backward = self.p.fsdp_reshard in ("after_backward", "after_step")
        for block in model.blocks:
            if self.p.compile:
                block.compile()
            fully_shard(block, reshard_after_forward=not keep_to_backward, **options)
        if self.p.compile and self.tp == 1 and isinstance(model, GPT):
            # the loss outside the compiled blocks, compiled too; under tensor parallelism it runs on
            # vocabulary shards under loss_parallel, eager
            model.compile_loss()
        fully_shard(model, **options)
        # With CPU offload the sharded parameters live in host memory; FSDP copies them in per use.
        home = torch.device("cpu") if self.p.offload_param else device
        if self.tp > 1 and isinstance(model, GPT):
            from trainbench.training.tensor_parallel import materialise

            # every parameter drawn whole on the device, one at a time, and this rank's shard kept:
            # the weights of a plain build, whatever tp and dp
            materialise(model, home, device, self.p.seed, self.tp)
        else:
            model.to_empty(device=home)
            model.init_weights(self.p.seed)
        return model

    def _autocast(self):
        # FSDP casts through its policy; autocast on top would only add casts.
        if self.p.precision == "fp32" or self.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.dtype)

    def _gradient_sync(self, last_micro_batch: bool):
        """Skip the gradient all-reduce on all but the last micro batch of an accumulation."""
        if self.data_parallel and not last_micro_batch:
            return self.wrapped.no_sync()
        if self.sharded:
            self.inner.set_requires_gradient_sync(last_micro_batch)
            if self.p.fsdp_reshard == "after_step":  # gathered once a step, freed after the last backward
                self.inner.set_reshard_after_backward(last_micro_batch)
        return contextlib.nullcontext()

    def _loss_context(self):
        """Tensor parallelism's vocabulary-sharded logits: cross-entropy (forward and backward) on the
        shards, with all-reduces of their maxima and sums instead of gathering them."""
        if self.tp == 1 or self.tp_plan is not None:  # a user's plan gathers its logits whole
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def train_step(self) -> torch.Tensor:
        from trainbench.training.tensor_parallel import local_loss

        accumulation = self.p.grad_accum
        total = torch.zeros((), device=self.ctx.device)
        self.steps_begun += 1
        overflow = self.steps_begun in self.overflow_steps
        for micro in range(accumulation):
            inputs, targets = self.batches.next()
            with self._gradient_sync(micro == accumulation - 1), self._loss_context():
                with self._autocast():
                    loss = local_loss(self.wrapped(inputs, targets)) / accumulation
                total += loss.detach()
                self.scaler.scale(loss * float("inf") if overflow else loss).backward()
        with optimizer_range():
            # (fp16 only: GradScaler.step has synchronised already, reading its scale costs no wait)
            scale = (self.scaler.get_scale() if isinstance(self.scaler, torch.amp.GradScaler)
                     and self.scaler.is_enabled() else None)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # a step fp16 loss scaling skipped: its scale halved (torch's scaler), or it says so (ours)
            halved = scale is not None and self.scaler.get_scale() < scale
            if getattr(self.scaler, "skipped", False) or halved:
                self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.p.float8_all_gather:
                # every float8 weight's scale for the next all-gathers, in one all-reduce of their amaxes
                # (torchtitan's precompute_float8_dynamic_scale_for_fsdp) instead of one per weight
                from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

                precompute_float8_dynamic_scale_for_fsdp(self.inner)
        return total

    CONFIG_FILE = "torch_config.json"

    def framework_config(self) -> dict:
        """How torch wrapped, compiled and optimised this run (what a DeepSpeed JSON says for DeepSpeed)."""
        on_device = self.ctx.is_cuda and not self.p.offload_param
        config = {"wrapper": "fully_shard" if self.sharded else "DistributedDataParallel"
                             if self.data_parallel else None,
                  "compile_scope": None if not self.p.compile else "every block, then the root"
                  if self.sharded else "every block and the loss, inside DDP"
                  if self.data_parallel and self.p.ddp_compile == "blocks" else "the whole (wrapped) model",
                  "compile": bool(self.p.compile), "autocast": None if self.sharded else
                  (None if self.p.precision == "fp32" else str(self.dtype)),
                  "optimizer": {"type": "AdamW", "lr": self.p.lr, "weight_decay": self.p.weight_decay,
                                "fused": on_device},
                  "grad_scaler": None if self.p.precision != "fp16" else type(self.scaler).__name__}
        if self.p.float8:
            config["float8"] = {"implementation": "torchao.float8.convert_to_float8_training",
                                "recipe": self.p.float8, "layers": self.float8_layers,
                                "fsdp_float8_all_gather": bool(self.p.float8_all_gather),
                                "left_in_bf16": "the LM head, any classifier, layers not multiples of 16"}
        if self.sharded and self.tp_plan is not None:
            config["tensor_parallel"] = {
                "implementation": "torch.distributed.tensor.parallel (DTensor), built on the meta device",
                "size": self.tp, "plan": self.tp_plan_source, "layers": self.tp_plan,
                "logits": "gathered whole where the plan's LM head is colwise_gather_output; whole where "
                          "it is tied to the embedding"}
        elif self.sharded and self.tp > 1:
            from trainbench.training.tensor_parallel import COLUMN_PARALLEL, ROW_PARALLEL, linear_plans

            config["tensor_parallel"] = {
                "implementation": "torch.distributed.tensor.parallel (DTensor), built on the meta device",
                "size": self.tp, "column_parallel": list(COLUMN_PARALLEL), "row_parallel": list(ROW_PARALLEL),
                "plans": [plan.__name__ for plan in linear_plans(self.p.float8)],
                "qkv": "rows laid out per rank [q_r; k_r; v_r]",
                "vocabulary_parallel": ["wte (RowwiseParallel, input Replicate)",
                                        "LM head tied to wte (Shard(-1) logits, loss_parallel)"],
                "replicated": ["wpe", "LayerNorms", "row-parallel biases"]}
        if self.data_parallel:
            config["DistributedDataParallel"] = {
                "bucket_cap_mb": self.p.ddp_bucket_cap_mb or 25,
                "gradient_as_bucket_view": bool(self.p.ddp_bucket_view),
                "static_graph": bool(self.p.ddp_static_graph),
                "dynamo_optimize_ddp": torch._dynamo.config.optimize_ddp
                if self.p.compile and self.p.ddp_compile != "blocks" else None}
        if self.sharded:
            config["fully_shard"] = {
                "units": "every Block, then the root",
                "mesh": [self.ctx.world_size // self.tp, self.tp] if self.tp > 1 else [self.ctx.world_size],
                "mp_policy": None if self.p.precision == "fp32" else {"param_dtype": str(self.dtype),
                                                                        "reduce_dtype": "torch.float32"},
                "offload_policy": "CPUOffloadPolicy" if self.p.offload_param else None,
                "reshard_after_forward": self.p.fsdp_reshard not in ("after_backward", "after_step"),
                "reshard_after_backward": "last micro batch only" if self.p.fsdp_reshard == "after_step"
                else True}
        return config

    def optimizer_steps_skipped(self) -> int | None:
        return self.skipped_steps

    def model(self) -> torch.nn.Module:
        return self.inner

    def params_total(self) -> int:
        return sum(p.numel() for p in self.inner.parameters())
