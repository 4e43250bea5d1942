"""Runners: one small adapter per framework from a cell to a training run.

A runner builds the model, wraps it for its strategy and makes the optimizer (`setup`), then runs one
optimizer step over `grad_accum` micro batches per `train_step`; the worker owns the loop. A runner
whose framework owns the loop (Lightning, the Hugging Face Trainer) instead has `train(recorder)` and calls the recorder
around each step. Either way the worker's recorder times steps and handles OOMs and results, so every
framework is measured the same way. An optional `evaluate()` adds results (test accuracy).
"""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainbench.data import SyntheticBatches
from trainbench.models import ModelSpec, get_model
from trainbench.timing import TimingSettings, fixed_step_count


@dataclass
class RunContext:
    params: dict[str, Any]
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    work_dir: Path = Path(".")  # the attempt's scratch directory (checkpoints, logs)
    timing: TimingSettings = TimingSettings()

    @property
    def fixed_steps(self) -> int:
        """All steps of a run whose framework owns the loop (see StepRecorder)."""
        return fixed_step_count(self.params["warmup_steps"], self.params["timed_steps"], self.timing)

    @property
    def spec(self) -> ModelSpec:
        return get_model(self.params["model"])

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def batches(self, rank: int | None = None) -> SyntheticBatches:
        """This rank's data shard; `rank`: the data-parallel rank where it differs from the global one."""
        p = self.params
        return SyntheticBatches(vocab_size=self.spec.vocab_size, seq_len=p["seq_len"], micro_batch=p["micro_batch"],
                                head=p["head"], num_classes=p["num_classes"], seed=p["seed"],
                                rank=self.rank if rank is None else rank, device=self.device)

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)


class Runner(Protocol):
    def setup(self) -> None: ...

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns the mean loss of its micro batches (a detached scalar)."""

    def model(self) -> torch.nn.Module:
        """The unwrapped model (for parameter counts)."""

    def params_total(self) -> int: ...

    def local_numel(self, parameter: torch.nn.Parameter) -> int:
        """Elements of this parameter held by this rank (a shard under ZeRO-3 or FSDP)."""


def params_per_module(runner: Runner) -> dict[str, int]:
    """Parameter elements held by this rank, by the class of the module that owns them."""
    counts: Counter[str] = Counter()
    for module in runner.model().modules():
        for parameter in module.parameters(recurse=False):
            counts[type(module).__name__] += runner.local_numel(parameter)
    return dict(sorted(counts.items()))


_RUNNERS = {
    "torch": "trainbench.runners.torch_native:TorchRunner",
    "deepspeed": "trainbench.runners.deepspeed_engine:DeepSpeedRunner",
    "lightning": "trainbench.runners.lightning_trainer:LightningRunner",
    "hf_trainer": "trainbench.runners.hf_trainer:HfTrainerRunner",
}


def make_runner(context: RunContext) -> Runner:
    module_name, class_name = _RUNNERS[context.params["framework"]].split(":")
    return getattr(importlib.import_module(module_name), class_name)(context)
