"""Tensor parallelism that builds sharded: torch FSDP2 with DTensor tensor parallel on a 2-D mesh, on
CPU ranks (gloo); its registration, and what the memory and time models make of it."""

from __future__ import annotations

import pytest
import torch

from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams
from trainbench.predict.memory_model import activations, block_bytes_per_token, predict, shard_params
from trainbench.registry.models import get_model
from trainbench.training.tensor_parallel import qkv_layout
from trainbench.predict.time_model import work
from trainbench.registry.hardware import gpu_type
from test_cellrun import make_cell, run

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

SHARDED = {"framework": "torch", "strategy": "fsdp", "gpus": 2, "tp": 2, "seq_len": 32, "timed_steps": 3}
# the study's full-size set-up: bert-180b, fp16, checkpointing, everything offloaded
FULL = {"framework": "torch", "strategy": "fsdp", "model": "bert-180b", "seq_len": 2048, "precision": "fp16",
        "activation_checkpointing": True, "offload_param": True, "nodes": 8, "gpus": 64, "micro_batch": 1}


def test_torch_fsdp_takes_tp_and_the_checks_name_who_has_which_parallelism():
    assert check_cell(resolve({**SHARDED, "device": "cpu"})) == ([], None)
    errors, _ = check_cell(resolve({**SHARDED, "strategy": "ddp", "device": "cpu"}))
    assert [(key, message.split(";")[0]) for key, message in errors] == [
        ("tp", "torch strategy 'ddp' has no tensor parallelism")]
    assert "torch fsdp" in errors[0][1] and "deepspeed zero3" in errors[0][1]
    errors, _ = check_cell(resolve({**SHARDED, "tp": 1, "pp": 2, "device": "cpu"}))
    assert errors[0][0] == "pp" and "has no pipeline parallelism" in errors[0][1]
    assert "torch fsdp" not in errors[0][1] and "deepspeed zero1" in errors[0][1]


def test_qkv_rows_are_laid_out_so_each_rank_holds_its_heads_q_k_and_v():
    d, tp = 8, 4
    rows = torch.arange(3 * d)  # q rows 0-7, k rows 8-15, v rows 16-23
    for rank, chunk in enumerate(qkv_layout(rows, tp).chunk(tp)):
        q, k, v = chunk.chunk(3)  # what SelfAttention.forward does with this rank's output
        heads = torch.arange(rank * d // tp, (rank + 1) * d // tp)
        assert q.tolist() == heads.tolist()
        assert k.tolist() == (d + heads).tolist() and v.tolist() == (2 * d + heads).tolist()
    weight = torch.randn(3 * d, 5)
    assert torch.equal(qkv_layout(weight, 1), weight)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The same model and batches on one rank, without any parallelism (make_cell's FAST_TIMING: the
    warm-up step and six one-step windows, the same steps as the split run's)."""
    return run(make_cell(strategy="single", gpus=1, seq_len=32, timed_steps=3),
               tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("offload", [False, True])
def test_tp2_ranks_hold_half_the_model_and_train_as_one_rank_does(tmp_path, one_rank, offload):
    spec = get_model("gpt2-tiny")
    split = run(make_cell(**SHARDED, activation_checkpointing=True, offload_param=offload), tmp_path / "tp")
    assert one_rank["status"] == "ok" and split["status"] == "ok", split["reason"]
    m, one = split["metrics"], one_rank
    assert m["params_total"] == spec.param_count()
    # the same initial weights (drawn whole, sharded after) and the same batches: the first loss and
    # the last, seven optimizer steps later, are the single rank's to float rounding (the all-reduces
    # sum in another order)
    assert m["steps_timed"] == one["metrics"]["steps_timed"] == 6
    assert m["loss_first"] == pytest.approx(one["metrics"]["loss_first"], rel=1e-5)
    assert m["loss_last"] == pytest.approx(one["metrics"]["loss_last"], rel=1e-5)
    assert m["loss_last"] < m["loss_first"] - 0.05
    # rank 0 holds half of every matrix, of the column-parallel biases and of the vocabulary; the
    # norms, the row-parallel biases and the positions whole
    h, f, layers, vocab = spec.d_model, spec.ffn, spec.n_layer, spec.vocab_size
    per_module = m["params_per_module_rank0"]
    assert per_module["Linear"] == layers * ((3 * h * h + 3 * h) // 2 + (h * f + f) // 2
                                             + (h * h + h * f) // 2 + 2 * h)
    assert per_module["LayerNorm"] == (2 * layers + 1) * 2 * h
    assert per_module["Embedding"] == vocab * h // 2 + spec.max_seq * h
    assert sum(per_module.values()) == shard_params(CellParams.from_dict(split["params"]), spec)  # its psi
    assert split["params"]["dp"] == 1 and split["params"]["global_batch"] == split["params"]["micro_batch"]


def test_sharded_tp_divides_model_states_and_split_activations_by_tp():
    spec = get_model("bert-180b")
    d, vocab, layers = spec.d_model, spec.vocab_size, spec.n_layer
    whole = layers * 6 * d + spec.max_seq * d + 2 * d  # norms, row-parallel biases, positions, final norm
    for tp in (1, 4, 8, 16, 32):
        params = resolve({**FULL, "tp": tp})
        split = spec.param_count() - whole  # the matrices, column-parallel biases and vocabulary
        assert shard_params(params, spec) == pytest.approx(split / tp + whole, rel=1e-4)
    gpu = [predict(resolve({**FULL, "tp": tp})).gpu_mem_mib for tp in (1, 4, 8, 16, 32)]
    assert gpu == sorted(gpu, reverse=True) and gpu[0] > 2 * gpu[-1]
    # AutoTP's prediction is what it was: the whole fp32 model first, on every GPU
    autotp = predict(resolve({**FULL, "framework": "deepspeed", "strategy": "zero3",
                              "offload_optimizer": True, "tp": 16}))
    assert "whole_model_before_autotp" in autotp.parts_mib and autotp.gpu_mem_mib > 700 * 1024
    # what a block saves is split inside attention and the MLP only (Megatron's 8 + 24/t bytes per token
    # and hidden unit in half precision, less dropout; the whole model computes in fp16 under FSDP2's
    # mixed precision), and the loss's three fp32 tensors of the logits' size by the vocabulary
    tokens = 2048
    for tp in (1, 4, 16):
        params = resolve({**FULL, "tp": tp, "activation_checkpointing": False})
        assert block_bytes_per_token(params, spec) == (8 + 24 / tp) * d
        logits = activations(params, spec) - activations(params.replace(head="classifier"), spec)
        assert logits == tokens * -(-vocab // tp) * (4 + 4 + 4)  # eager: three fp32 tensors at the loss


def test_the_time_model_splits_the_head_and_counts_the_vocabulary_all_reduces():
    h200 = gpu_type("h200")
    sharded = work(resolve({**FULL, "tp": 8}), h200)
    autotp = work(resolve({**FULL, "framework": "deepspeed", "strategy": "zero3", "offload_optimizer": True,
                           "tp": 8}), h200)
    # the head's matmul split eight ways; bert's whole 30,522-word head is unaligned (eager fp16: counted
    # apart), a rank's 3,816 rows of it are not
    assert sharded.matmul_s + sharded.unaligned_head_s < autotp.matmul_s + autotp.unaligned_head_s
    assert sharded.unaligned_head_s == 0 and autotp.unaligned_head_s > 0
    spec = get_model("bert-180b")
    per_block = 4 + 2  # two all-reduces forward, two backward, two recomputing
    assert sharded.calls - (2 + 1) * spec.n_layer == spec.n_layer * per_block + 2  # FSDP gathers aside


def test_the_sharded_loss_scaler_unscales_local_shards_and_skips_overflowing_steps():
    from trainbench.training.runners.torch_native import ShardedGradScaler

    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scaler = ShardedGradScaler(torch.device("cpu"), enabled=True, init_scale=8.0, growth_interval=2)
    scaler.scale(weight.sum()).backward()  # gradient 8 x 1
    scaler.step(optimizer)
    scaler.update()
    assert not scaler.skipped and torch.equal(weight.detach(), torch.zeros(4))  # stepped on the unscaled 1
    weight.grad = torch.tensor([1.0, float("inf"), 1.0, 1.0])
    scaler.step(optimizer)
    scaler.update()
    assert scaler.skipped and torch.equal(weight.detach(), torch.zeros(4)) and scaler.scale_value == 4.0
    for _ in range(2):
        weight.grad = torch.zeros(4)
        scaler.step(optimizer)
        scaler.update()
    assert scaler.scale_value == 8.0  # doubled after growth_interval good steps
