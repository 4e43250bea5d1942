"""The Hugging Face Trainer: the Alpaca-style fine-tuning recipe of the `llama` study, under torchrun.

Strategies, as the study's commands set them:
- fsdp: `fsdp="full_shard auto_wrap"` wrapping the model's decoder layer class (LlamaDecoderLayer);
  with offload_param, `"full_shard auto_wrap offload"` (parameters, gradients and optimizer on the host);
- zero3: a DeepSpeed ZeRO-3 config with the optimizer and the parameters offloaded to (pinned) CPU
  memory, "auto" wherever the Trainer fills the value in;
- ddp: the Trainer's plain data parallel.

The model is built from its architecture config with random weights and is never whole on one device
or in host memory: under ZeRO-3 it is constructed after the TrainingArguments, which makes
transformers build it inside `deepspeed.zero.Init` (each layer partitioned as it is created); under
FSDP it is built on the meta device and FSDP's `param_init_fn` materialises and initialises one
wrapped unit at a time on the GPU before sharding it.

The Trainer owns the loop; a callback hands each optimizer step to the worker's StepRecorder, so steps
are timed like every other runner's. After training the runner checks that the Trainer really wrapped
the model as asked: on CPU, accelerate quietly trains FSDP requests with DDP instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainbench.study.params import CellParams
from trainbench.training import emulation
from trainbench.study.cell_view import CellView, as_view
from trainbench.registry.models import ModelSpec
from trainbench.study.models import definition_of
from trainbench.training.runners import LoopRunner, RunContext
from trainbench.training.runners.deepspeed_engine import agree_with_rank0, load_ops


def llama_config(spec: ModelSpec, attention: str = "sdpa"):
    """`attention`: the cell's; every SDPA kernel runs through transformers' "sdpa" (the worker holds
    SDPA to one kernel where the cell names one)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=spec.d_model, intermediate_size=spec.ffn, num_hidden_layers=spec.n_layer,
                       num_attention_heads=spec.n_head, num_key_value_heads=spec.n_head,
                       vocab_size=spec.vocab_size, max_position_embeddings=spec.max_seq,
                       attn_implementation="eager" if attention == "eager" else "sdpa", use_cache=False)


def deepspeed_config(cell: CellParams | CellView, device_type: str) -> dict[str, Any]:
    """The study's ZeRO-3 config; "auto" values are filled in by the Trainer from its arguments, the
    buckets' from the model's width (width^2, 0.9 width^2) unless the cell sets them."""
    cell = as_view(cell)
    params = cell.params
    on_gpu = device_type == "cuda"
    pin = params.pin_memory and on_gpu
    offload_optimizer, offload_param = cell.offloads
    zero: dict[str, Any] = {
        "stage": 3, "overlap_comm": True if params.overlap_comm is None else params.overlap_comm,
        "contiguous_gradients": True if params.contiguous_gradients is None else params.contiguous_gradients,
        "sub_group_size": 1e9, "reduce_bucket_size": params.reduce_bucket_size or "auto",
        "stage3_prefetch_bucket_size": params.prefetch_bucket_size or "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True,
    }
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    return {
        "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {
            "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto",
            # CPU ranks have no DeepSpeedCPUAdam build to use; GPU runs measure the real offload path
            "torch_adam": not (offload_optimizer and on_gpu)}},
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False,
    }


def training_arguments(cell: CellParams | CellView, spec: ModelSpec, output_dir: Path, device_type: str,
                       max_steps: int) -> dict[str, Any]:
    """The Trainer's arguments for a cell: the study's recipe, with a fixed number of steps."""
    cell = as_view(cell)
    params = cell.params
    on_gpu = device_type == "cuda"
    args: dict[str, Any] = dict(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=params.micro_batch,
        gradient_accumulation_steps=params.grad_accum, learning_rate=params.lr,
        # the study: 3% of the steps warm the learning rate up (a float below 1 is a ratio), cosine after
        weight_decay=params.weight_decay, warmup_steps=0.03, lr_scheduler_type="cosine",
        bf16=params.precision == "bf16", fp16=params.precision == "fp16",
        tf32=bool(params.tf32) if on_gpu else None,
        gradient_checkpointing=params.activation_checkpointing,
        gradient_checkpointing_kwargs=({"use_reentrant": False} if params.activation_checkpointing
                                       else None),
        # No checkpoint: the Trainer saves one at the end of any run with a save strategy, and a
        # 7B model's takes longer than the measured steps. (The study checkpoints every 100 steps,
        # keeping 1; its projected run time leaves that out.) No evaluation, as in the study.
        save_strategy="no", eval_strategy="no",
        logging_strategy="no", report_to=[], disable_tqdm=True, seed=params.seed, data_seed=params.seed,
        dataloader_drop_last=True, use_cpu=not on_gpu, ddp_find_unused_parameters=False,
        average_tokens_across_devices=False,  # each rank's loss is its own tokens' mean
    )
    if params.ddp_bucket_cap_mb:
        args["ddp_bucket_cap_mb"] = params.ddp_bucket_cap_mb
    layout = cell.strategy.layout
    if layout == "fsdp":
        args["fsdp"] = "full_shard auto_wrap" + (" offload" if cell.offload_param else "")
        # FSDP1, the study's (transformers 5 defaults to FSDP2, whose wrapping takes no param_init_fn)
        args["fsdp_config"] = {"transformer_layer_cls_to_wrap": [spec.block_class], "version": 1}
    elif layout == "zero":
        args["deepspeed"] = deepspeed_config(cell, device_type)
    return args


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token sequences of the study's length, the same on every run of a seed. `shifted`: the
    labels are the next tokens, a factory model's convention (a transformers model shifts its own)."""

    def __init__(self, size: int, seq_len: int, vocab_size: int, seed: int, shifted: bool = False):
        self.size, self.seq_len, self.vocab_size, self.seed = size, seq_len, vocab_size, seed
        self.shifted = shifted

    def __len__(self) -> int:
        return self.size

    def tokens(self, index: int, length: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randint(0, self.vocab_size, (length,), generator=generator)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.shifted:
            tokens = self.tokens(index, self.seq_len + 1)
            return {"input_ids": tokens[:-1], "labels": tokens[1:]}
        tokens = self.tokens(index, self.seq_len)
        return {"input_ids": tokens, "labels": tokens}


class FileTokens(SyntheticTokens):
    """Windows of seq_len + 1 ids of the cell's token file (`tokens`), in a seeded order; the Trainer's
    sampler hands each data-parallel rank its own."""

    def __init__(self, size: int, seq_len: int, path: str, dtype: str, seed: int, shifted: bool = False):
        import numpy

        super().__init__(size, seq_len, 0, seed, shifted)
        self.file = numpy.memmap(path, dtype=numpy.dtype(dtype), mode="r")
        windows = (len(self.file) - 1) // seq_len
        self.order = torch.randperm(windows, generator=torch.Generator().manual_seed(seed))

    def tokens(self, index: int, length: int) -> torch.Tensor:
        import numpy

        start = int(self.order[index % len(self.order)]) * self.seq_len
        return torch.from_numpy(numpy.asarray(self.file[start:start + length], dtype=numpy.int64))


class FactoryLoss(torch.nn.Module):
    """A factory model for the Trainer, which calls model(input_ids=..., labels=...) and reads `loss`."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_) -> dict[str, Any]:
        return {"loss": self.model(input_ids, labels)}


def _initialise_on_device(model, device: torch.device):
    """FSDP's param_init_fn: give one module's meta tensors storage on the device and initialise them
    as transformers would (its _init_weights), rotary tables recomputed."""

    def init(module: torch.nn.Module) -> torch.nn.Module:
        # accelerate's wrapper (which re-ties shared weights) carries on with the module returned
        module.to_empty(device=device, recurse=False)
        if hasattr(module, "rope_init_fn") and hasattr(module, "inv_freq"):
            inv_freq, _ = module.rope_init_fn(module.config, device)
            module.inv_freq = inv_freq
            module.original_inv_freq = inv_freq.clone()
        with torch.no_grad():
            model._init_weights(module)
        return module

    return init


def hf_model(spec: ModelSpec, attention: str = "sdpa") -> torch.nn.Module:
    """The cell's transformers model, random weights, in the current device context: LLaMA built from
    the registry's shape, or a user's architecture from its config."""
    if spec.user_defined:
        from trainbench.training.user_models import build_inner

        return build_inner(spec, attention)
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM._from_config(llama_config(spec, attention))


def build_for_fsdp(spec: ModelSpec, device: torch.device, attention: str = "sdpa"):
    """The model with its decoder layers on the meta device, for FSDP to materialise one at a time.

    The few modules outside the layers (embeddings, final norm, LM head, rotary tables) get storage
    and weights on the device now: FSDP's root unit then has nothing to materialise, and accelerate's
    re-tying of shared weights (which LLaMA does not share) never touches a meta tensor.
    """
    with torch.device("meta"):
        model = hf_model(spec, attention)
    if not model.config.tie_word_embeddings:
        model._tied_weights_keys = {}  # this instance shares no weights; nothing to re-tie
    init = _initialise_on_device(model, device)
    layers = [m for m in model.modules() if type(m).__name__ == spec.block_class]
    blocks = {id(m) for layer in layers for m in layer.modules()}
    for module in model.modules():
        if id(module) not in blocks:
            init(module)
    return model


class HfTrainerRunner(LoopRunner):
    CONFIG_FILE = "deepspeed_config.json"  # its ZeRO-3 cells' DeepSpeed config, "auto" values filled in

    def __init__(self, context: RunContext):
        super().__init__(context)

    @classmethod
    def prepare_process(cls, params: CellParams) -> None:
        load_ops(params)  # its ZeRO-3 strategy's ops

    def setup(self) -> None:
        from transformers import TrainingArguments

        p, spec = self.p, self.ctx.spec
        factory = self.ctx.user_model and definition_of(spec)["kind"] == "factory"
        sharded, zero = self.strategy.layout == "fsdp", self.strategy.layout == "zero"
        self.deepspeed_config = deepspeed_config(self.view, self.ctx.device.type) if zero else None
        self.max_steps = self.ctx.fixed_steps
        if self.deepspeed_config is not None:
            import deepspeed

            agree_with_rank0()

            # Wrap the process group the worker made: left alone, DeepSpeed's own view of the world
            # would be a single rank and its batch-size check fails.
            deepspeed.init_distributed(dist_backend="nccl" if self.ctx.is_cuda else "gloo")
        # Made before the model: with a ZeRO-3 config it tells transformers to build inside zero.Init.
        arguments = training_arguments(self.view, spec, Path(self.ctx.work_dir) / "trainer",
                                       self.ctx.device.type, self.max_steps)
        self.args = TrainingArguments(**arguments)
        torch.manual_seed(p.seed)
        if factory:  # the user's module, its loss under the Trainer's calling convention
            from trainbench.training.user_models import LanguageModel

            language_model = LanguageModel(spec, p.attention)
            self.hf_model = FactoryLoss(language_model.inner)
        elif sharded and self.ctx.is_cuda:
            self.hf_model = build_for_fsdp(spec, self.ctx.device, p.attention)
        else:
            self.hf_model = hf_model(spec, p.attention)
            if zero and emulation.in_this_process() and self.ctx.rank != 0:
                self._initialise_own_shards()
        self._params_total = sum(getattr(q, "ds_numel", q.numel()) for q in self.hf_model.parameters())
        size = self.max_steps * p.global_batch
        self.dataset = (FileTokens(size, p.seq_len, p.tokens, p.tokens_dtype, p.seed, shifted=factory)
                        if p.tokens else
                        SyntheticTokens(size, p.seq_len, spec.vocab_size, p.seed, shifted=factory))

    def _initialise_own_shards(self) -> None:
        """Under ZeRO-3 transformers initialises the weights on rank 0 and broadcasts them; an emulated
        rank r > 0 receives nothing from a fake broadcast (its shards stay zero), so it initialises
        them itself, each module's weights drawn whole and its shard kept, as rank 0 would have sent."""
        import deepspeed

        for module in self.hf_model.modules():
            own = list(module.parameters(recurse=False))
            if own:
                with deepspeed.zero.GatheredParameters(own, modifier_rank=self.ctx.rank):
                    self.hf_model._init_weights(module)

    def _trainer(self, recorder):
        from transformers import Trainer, TrainerCallback

        runner = self

        class MeasuredTrainer(Trainer):
            def create_accelerator_and_postprocess(self):
                super().create_accelerator_and_postprocess()
                plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
                if plugin is not None and runner.ctx.is_cuda:
                    # every rank starts from the meta model: no rank-0 copy to broadcast
                    plugin.param_init_fn = _initialise_on_device(runner.hf_model, runner.ctx.device)
                    plugin.sync_module_states = False

            def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
                result = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
                loss = result[0] if return_outputs else result
                # With num_items_in_batch the Trainer divides each micro batch's summed token loss by
                # the tokens of the whole accumulated step: the step's mean loss is their sum.
                scale = 1.0 if kwargs.get("num_items_in_batch") is not None else 1.0 / runner.p.grad_accum
                runner._micro_losses.append(loss.detach().float() * scale)
                return result

        class StepTiming(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                runner._micro_losses = []
                recorder.begin()

            def on_step_end(self, args, state, control, **kwargs):
                losses = runner._micro_losses
                recorder.end(torch.stack(losses).sum() if losses else float("nan"))

        self._micro_losses: list[torch.Tensor] = []
        return MeasuredTrainer(model=self.hf_model, args=self.args, train_dataset=self.dataset,
                               callbacks=[StepTiming()])

    def train(self, recorder) -> None:
        self.trainer = self._trainer(recorder)
        self.trainer.train()
        wrapper = type(self.trainer.model_wrapped).__name__
        expected = self.strategy.wrapper if self.ctx.world_size > 1 else None
        if expected and wrapper != expected:
            raise RuntimeError(f"the Trainer wrapped the model in {wrapper}, not {expected}: it did not run "
                               f"strategy {self.p.strategy!r} as asked")

    def framework_config(self) -> dict[str, Any] | None:
        if self.deepspeed_config is None:
            return None
        # the config as DeepSpeed ran it, the Trainer's "auto" values filled in
        return self.trainer.accelerator.state.deepspeed_plugin.deepspeed_config

    def model(self) -> torch.nn.Module:
        return self.hf_model

    def optimizer_object(self):
        trainer = getattr(self, "trainer", None)
        return trainer.optimizer if trainer is not None else None

    def params_total(self) -> int:
        return self._params_total
