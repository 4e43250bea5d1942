"""Checkpointed activations in host memory, split across tensor-parallel ranks (checkpoint_in_cpu):
the blocks' inputs leave the device, come back whole for the recomputation, and the training is the
same training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainbench.execute.cellrun import run_cell
from trainbench.errors import ConfigError
from trainbench.registry.frameworks import not_implemented
from trainbench.training.gpt import GPT, CheckpointsInHostMemory
from trainbench.study.grid import expand_study
from trainbench.study.params import CellParams
from trainbench.predict.memory_model import activations, checkpoints_in_host, predict
from trainbench.registry.models import get_model

from conftest import TINY, make_cell, tiny_study

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

CHECKPOINTED = {**TINY, "activation_checkpointing": True}


class Recording(CheckpointsInHostMemory):
    def __init__(self, group=None):
        super().__init__(group)
        self.kept: list[torch.Tensor] = []

    def pack(self, tensor):
        packed = super().pack(tensor)
        if not isinstance(packed, torch.Tensor):
            self.kept.append(packed[0])
        return packed


def _loss_and_grads(storage):
    torch.manual_seed(0)
    model = GPT(get_model("gpt2-tiny"), activation_checkpointing=True)
    model.init_weights(0)
    model.checkpoint_storage = storage
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = model(tokens, tokens)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def test_a_block_input_waits_in_host_memory_and_the_gradients_are_the_same():
    storage = Recording()
    loss, grads = _loss_and_grads(storage)
    plain_loss, plain_grads = _loss_and_grads(None)
    assert loss == plain_loss and all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    spec = get_model("gpt2-tiny")
    # one input per block, the residual stream of the micro batch, whole (no tensor-parallel group)
    assert [t.numel() for t in storage.kept] == [2 * 16 * spec.d_model] * spec.n_layer
    assert all(t.device.type == "cpu" for t in storage.kept)


SPLIT = """
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from trainbench.training.gpt import CheckpointsInHostMemory

dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
group = dist.new_group([0, 1])  # this rank is the group's second
storage = CheckpointsInHostMemory(group)
x = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(2, 3, 5).requires_grad_()
packed = storage.pack(x)
back = storage.unpack(packed)
print(packed[0].numel(), packed[0].tolist()[:2], tuple(back.shape), back.requires_grad)
"""


def test_each_tensor_parallel_rank_keeps_its_share_and_gets_the_whole_input_back():
    result = subprocess.run([sys.executable, "-c", SPLIT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # 30 elements split over 2 ranks: the second keeps elements 15.. (a fake all-gather returns its
    # share in every place, in the whole input's shape)
    assert result.stdout.strip().splitlines()[-1] == "15 [15.0, 16.0] (2, 3, 5) True"


def _run(tmp_path: Path, name: str, **params) -> dict:
    output = tmp_path / name / "metrics.json"
    assert run_cell(make_cell(activation_checkpointing=True, **params), output, runtime_min=5, retries=0) == 0
    doc = json.loads(output.read_text())
    assert doc["status"] == "ok", doc["reason"]
    return doc["metrics"]


@pytest.mark.parametrize("params", [{"strategy": "fsdp", "gpus": 4, "tp": 2},
                                    {"framework": "deepspeed", "strategy": "zero3", "gpus": 4, "tp": 2}])
def test_tensor_parallel_ranks_train_the_same_with_their_checkpoints_split_in_host_memory(params, tmp_path):
    plain = _run(tmp_path, "plain", **params)
    host = _run(tmp_path, "host", **params, checkpoint_in_cpu=True)
    # real gloo ranks gather each input back whole: the same losses, step by step
    assert (host["loss_first"], host["loss_last"]) == (plain["loss_first"], plain["loss_last"])


def test_checkpoint_in_cpu_where_it_means_nothing_or_has_no_runner_says_so():
    with pytest.raises(ConfigError, match="checkpoint_in_cpu: keeps checkpointed activations in host memory"):
        expand_study("s", {**tiny_study(strategy="ddp", gpus=2, checkpoint_in_cpu=True), "include": [{}]})
    with pytest.raises(ConfigError, match="checkpoint_in_cpu: the lightning runner does not read it"):
        expand_study("s", {**tiny_study(framework="lightning", model="distilbert-tiny", head="classifier",
                                        strategy="ddp", gpus=2, activation_checkpointing=True,
                                        checkpoint_in_cpu=True), "include": [{}]})
    pipeline = resolve({**CHECKPOINTED, "framework": "deepspeed", "strategy": "zero1", "gpus": 2, "pp": 2,
                        "checkpoint_in_cpu": True})
    assert "the pipeline engine checkpoints its stages itself" in not_implemented(pipeline)


def test_the_memory_model_moves_the_checkpointed_inputs_from_the_gpu_to_the_host():
    base = {"framework": "torch", "strategy": "fsdp", "model": "bert-180b", "nodes": 8, "gpus": 64, "tp": 16,
            "micro_batch": 32, "seq_len": 2048, "precision": "fp16", "activation_checkpointing": True,
            "offload_param": True}
    kept, moved = resolve(base), resolve({**base, "checkpoint_in_cpu": True})
    spec = get_model("bert-180b")
    one_input = 32 * 2048 * spec.d_model * 2  # fp16 residual stream of a micro batch
    # the device holds one input (gathered back for its block) instead of all 96
    assert activations(kept, spec) - activations(moved, spec) == pytest.approx((spec.n_layer - 1) * one_input)
    assert checkpoints_in_host(moved, spec) == pytest.approx(spec.n_layer * one_input / 16)
    per_node = predict(moved).host_mem_mib - predict(kept).host_mem_mib
    assert per_node * 2**20 == pytest.approx(8 * spec.n_layer * one_input / 16)
