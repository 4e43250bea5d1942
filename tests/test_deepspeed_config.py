"""The DeepSpeed JSON config each gpt2_zero scenario gets, built from the cell alone."""

from __future__ import annotations

import pytest

from trainbench.study.params import CellParams
from trainbench.training.runners.deepspeed_engine import deepspeed_config

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters


def config(**params):
    p = resolve({"framework": "deepspeed", "model": "gpt2-124m", "gpus": 4, "micro_batch": 4, "grad_accum": 2,
                 **params})
    return deepspeed_config(p, p.device)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_stage_batch_and_optimizer(stage):
    c = config(strategy=f"zero{stage}")
    assert c["zero_optimization"] == {"stage": stage}
    assert (c["train_micro_batch_size_per_gpu"], c["gradient_accumulation_steps"],
            c["train_batch_size"]) == (4, 2, 32)
    assert c["optimizer"]["type"] == "AdamW" and c["optimizer"]["params"]["torch_adam"] is True


@pytest.mark.parametrize("precision, fp16, bf16", [("fp32", False, False), ("fp16", True, False),
                                                   ("bf16", False, True)])
def test_precision(precision, fp16, bf16):
    c = config(strategy="zero2", precision=precision)
    assert (c["fp16"]["enabled"], c["bf16"]["enabled"]) == (fp16, bf16)


def test_offload_on_gpus_uses_pinned_memory_and_deepspeeds_cpu_adam():
    c = config(strategy="zero3", offload_optimizer=True, offload_param=True)
    assert c["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert c["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    # ZeRO-Offload refuses a client optimizer; torch_adam false selects DeepSpeedCPUAdam
    assert c["optimizer"]["params"]["torch_adam"] is False


def test_offload_on_cpu_ranks_keeps_torch_adam_and_no_pinning():
    c = config(strategy="zero2", offload_optimizer=True, device="cpu")
    assert c["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    assert c["optimizer"]["params"]["torch_adam"] is True


def test_overlap_comm_only_when_the_cell_sets_it():
    assert "overlap_comm" not in config(strategy="zero3")["zero_optimization"]
    assert config(strategy="zero3", overlap_comm=False)["zero_optimization"]["overlap_comm"] is False
