"""Runners: one small adapter per framework from a cell to a training run.

Two kinds, one base: a StepRunner builds the model, wraps it for its strategy and makes the
optimizer (`setup`), then runs one optimizer step over `grad_accum` micro batches per `train_step`,
and the worker owns the loop; a LoopRunner's framework owns the loop (Lightning, the Hugging Face
Trainer), and `train(recorder)` calls the recorder around each step. Either way the worker's recorder
times steps and handles OOMs and results, so every framework is measured the same way. Every runner
can add results (`results`: test accuracy) and hand out the framework's own config as it ran.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainbench.study.cell_view import CellView, view_of
from trainbench.study.params import CellParams
from trainbench.training import OPTIMIZER_RANGE
from trainbench.training.data import SyntheticBatches, TokenWindows
from trainbench.registry.models import ModelSpec
from trainbench.study.timing import TimingSettings, fixed_step_count


@dataclass
class RunContext:
    params: CellParams
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    work_dir: Path = Path(".")  # the attempt's scratch directory (checkpoints, logs)
    timing: TimingSettings = TimingSettings()
    # the cell's model, framework and strategy, resolved once: the worker hands in the view it built,
    # and every runner reads the cell through it (built here where a caller hands none)
    view: CellView = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.view is None:
            self.view = view_of(self.params)

    @property
    def fixed_steps(self) -> int:
        """All steps of a run whose framework owns the loop (see StepRecorder)."""
        return fixed_step_count(self.params.warmup_steps, self.params.timed_steps, self.timing)

    @property
    def spec(self) -> ModelSpec:
        return self.view.model

    @property
    def user_model(self) -> bool:
        """A model of the config's `models` (trainbench.training.user_models builds it)."""
        return bool(self.params.model_definition)

    def new_model(self, initialise: bool = True) -> torch.nn.Module:
        """The cell's model, in the current device context: trainbench's GPT, or a user's wrapped as
        a LanguageModel; either trains as forward(inputs, targets) -> loss, with `blocks` and
        `init_weights(seed)`. initialise=False: a user's model's weights are drawn later (ZeRO-3)."""
        p = self.params
        if self.user_model:
            from trainbench.training.user_models import LanguageModel

            model = LanguageModel(self.spec, p.attention, initialise=initialise)
            if p.activation_checkpointing:
                model.set_activation_checkpointing()
            return model
        from trainbench.training.gpt import GPT

        return GPT(self.built_spec, head=p.head, num_classes=p.num_classes,
                   activation_checkpointing=p.activation_checkpointing, attention=p.attention)

    @property
    def built_spec(self) -> ModelSpec:
        """The model as the runner builds it: its vocabulary padded where the cell asks (`spec` is what
        the data and the FLOPs count use)."""
        return self.view.built

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def batches(self, rank: int | None = None) -> SyntheticBatches | TokenWindows:
        """This rank's data shard: synthetic tokens, or windows of the cell's token file; `rank`: the
        data-parallel rank where it differs from the global one."""
        p = self.params
        rank = self.rank if rank is None else rank
        if p.tokens is not None:
            return TokenWindows(path=p.tokens, dtype=p.tokens_dtype, seq_len=p.seq_len,
                                micro_batch=p.micro_batch, seed=p.seed, rank=rank, ranks=p.dp,
                                device=self.device)
        return SyntheticBatches(vocab_size=self.spec.vocab_size, seq_len=p.seq_len,
                                micro_batch=p.micro_batch,
                                head=p.head, num_classes=p.num_classes, seed=p.seed, rank=rank,
                                device=self.device)

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)


class Runner:
    """What every runner does: build the model, wrap it for its strategy and make the optimizer
    (`setup`), and tell what it built. Subclass StepRunner or LoopRunner, not this."""

    def __init__(self, context: RunContext):
        self.ctx = context
        self.p = context.params
        self.view = context.view
        self.strategy = context.view.strategy

    @classmethod
    def prepare_process(cls, params: CellParams) -> None:
        """What the framework does once per process before anything of the cell is built (the worker
        times it apart, as the `builds` phase): compiling or loading its own ops. Nothing by default."""

    def setup(self) -> None:
        raise NotImplementedError

    def model(self) -> torch.nn.Module:
        """The unwrapped model (for parameter counts)."""
        raise NotImplementedError

    def params_total(self) -> int:
        """Parameters of the whole model (not this rank's shard)."""
        raise NotImplementedError

    def local_numel(self, parameter: torch.nn.Parameter) -> int:
        """Elements of this parameter held by this rank: a ZeRO-3 partition, an FSDP2 DTensor shard."""
        shard = getattr(parameter, "ds_tensor", None)
        if shard is not None:
            return shard.numel()
        to_local = getattr(parameter, "to_local", None)
        return to_local().numel() if to_local else parameter.numel()

    def optimizer_steps_skipped(self) -> int | None:
        """Optimizer steps the framework skipped so far (fp16 loss scaling found an overflow); None
        where it does not say."""
        return None

    def optimizer_object(self) -> Any:
        """The framework's optimizer as this rank holds it (its states are found inside)."""
        return getattr(self, "optimizer", None)

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """This rank's parameters, gradients and optimizer states: what a memory snapshot's blocks are
        matched against (execute/profiling.py). Parameters are the rank's shards (ZeRO-3's partitions,
        FSDP's local shards); optimizer states whatever the optimizer holds that is no parameter."""
        parameters = list(self.model().parameters())
        held = [getattr(p, "ds_tensor", None) for p in parameters]
        held = [h if h is not None else (p.to_local() if hasattr(p, "to_local") else p)
                for h, p in zip(held, parameters)]
        grads = [p.grad for p in parameters if p.grad is not None]
        mine = {id(t) for t in [*parameters, *held, *grads]}
        states = [t for t in tensors_in(self.optimizer_object()) if id(t) not in mine]
        # FSDP2's gradients and optimizer states are DTensors, whose storage is their local shard's
        return {"parameters": held, "gradients": [local_tensor(g) for g in grads],
                "optimizer_states": [local_tensor(t) for t in states]}

    CONFIG_FILE = "framework_config.json"  # where framework_config() is kept, beside metrics.json

    def framework_config(self) -> dict[str, Any] | None:
        """The framework's own configuration as it ran (DeepSpeed's JSON, FSDP's settings)."""
        return None

    def results(self) -> dict[str, Any]:
        """Results beyond the timed steps (test accuracy and its data set)."""
        return {}


class StepRunner(Runner):
    """A runner whose steps the worker drives: the worker owns the loop and its timing."""

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns the mean loss of its micro batches (a detached scalar, left on
        the device: the worker reads losses once per timed window)."""
        raise NotImplementedError


class LoopRunner(Runner):
    """A runner whose framework owns the loop (Lightning, the Hugging Face Trainer): it calls the
    worker's recorder around each optimizer step, from a callback."""

    def train(self, recorder) -> None:
        raise NotImplementedError


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank's memory holds); any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local else tensor


def tensors_in(root: Any, depth: int = 6) -> list[torch.Tensor]:
    """The tensors an object holds, through attributes, lists, tuples and dicts (keys too: torch's
    optimizer state is keyed by parameter), `depth` levels down; modules are not entered (their
    tensors are the parameters')."""
    found, seen, level = [], set(), [root]
    for _ in range(depth + 1):
        following = []
        for item in level:
            if id(item) in seen or isinstance(item, torch.nn.Module):
                continue
            seen.add(id(item))
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, dict):
                following += [*item.keys(), *item.values()]
            elif isinstance(item, (list, tuple, set)):
                following += list(item)
            elif hasattr(item, "__dict__") and not isinstance(item, type):
                following += list(vars(item).values())
        level = following
    return found


def optimizer_range(stepping: bool = True):
    """The profiler's range around a framework's optimizer step (execute/profiling.py), where the call
    steps; torch's own annotation covers only its optimizer's `step`, not a wrapper's unscaling,
    clipping and copies."""
    return torch.profiler.record_function(OPTIMIZER_RANGE) if stepping else contextlib.nullcontext()


def params_per_module(runner: Runner) -> dict[str, int]:
    """Parameter elements held by this rank, by the class of the module that owns them."""
    counts: Counter[str] = Counter()
    for module in runner.model().modules():
        for parameter in module.parameters(recurse=False):
            counts[type(module).__name__] += runner.local_numel(parameter)
    return dict(sorted(counts.items()))
