"""Tensor parallelism in Megatron's layout through DeepSpeed AutoTP, with ZeRO, on CPU ranks (gloo)."""

from __future__ import annotations

import pytest

from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams
from trainbench.registry.models import get_model
from trainbench.training.runners.deepspeed_engine import deepspeed_config
from test_cellrun import make_cell, run

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

TP = {"framework": "deepspeed", "gpus": 2, "tp": 2, "seq_len": 32, "timed_steps": 3}


def test_the_config_asks_autotp_for_megatrons_layout():
    config = deepspeed_config(resolve({**TP, "strategy": "zero1", "device": "cpu"}), "cpu")
    tp = config["tensor_parallel"]
    assert tp["autotp_size"] == 2
    kinds = {spec["partition_type"] for spec in tp["partition_config"]["layer_specs"]}
    assert kinds == {"column", "row"}
    assert "train_batch_size" not in config  # DeepSpeed derives it (its check counts every rank)
    assert "tensor_parallel" not in deepspeed_config(resolve({**TP, "tp": 1, "strategy": "zero1",
                                                              "device": "cpu"}), "cpu")


def test_tp_must_divide_heads_and_mlp():
    errors, _ = check_cell(resolve({**TP, "strategy": "zero1", "tp": 3, "gpus": 3}))
    assert any(key == "tp" and "must divide gpt2-tiny's 2 heads" in message for key, message in errors)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The same model and first batch on one rank, without tensor parallelism."""
    return run(make_cell(framework="deepspeed", strategy="zero0", gpus=1, seq_len=32, timed_steps=3),
               tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("strategy", ["zero1", "zero3"])
def test_tensor_parallel_ranks_split_the_blocks_and_compute_what_one_rank_does(tmp_path, one_rank, strategy):
    spec = get_model("gpt2-tiny")
    one = one_rank
    split = run(make_cell(**TP, strategy=strategy), tmp_path / "tp")
    assert one["status"] == "ok" and split["status"] == "ok", split["reason"]
    m = split["metrics"]
    assert m["params_total"] == spec.param_count()
    # rank 0 holds half of each column- and row-parallel matrix (AutoTP's LinearLayer / LinearAllreduce;
    # (SubParamLinearLayer: the fused qkv, split as [q; k; v])
    per_module = m["params_per_module_rank0"]
    h, f, layers = spec.d_model, spec.ffn, spec.n_layer
    assert per_module["SubParamLinearLayer"] == layers * (3 * h * h + 3 * h) // 2
    assert per_module["LinearLayer"] == layers * (h * f + f) // 2
    assert per_module["LinearAllreduce"] == layers * ((h * h + h * f) // 2 + 2 * h)  # their biases stay whole
    # the same initial weights and the same batch: the first loss is the single rank's
    assert m["loss_first"] == pytest.approx(one["metrics"]["loss_first"], rel=1e-4)
    assert m["loss_last"] < m["loss_first"]
    # the global batch counts data-parallel ranks only: one here
    assert split["params"]["dp"] == 1 and split["params"]["global_batch"] == split["params"]["micro_batch"]
