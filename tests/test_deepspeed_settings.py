"""DeepSpeed's ZeRO settings (overlap_comm, contiguous_gradients, reduce_bucket_size, allgather_bucket_size,
prefetch_bucket_size): a real ZeRO-2 engine over two gloo ranks with all of them set, the config that says
what a cell chose and nothing else, the checks that keep each to the stages that read it, and what the
models make of the bucket sizes."""

from __future__ import annotations

import json

import pytest

from trainbench.execute.cellrun import run_cell
from trainbench.contract.result import read_json, schema_problems
from trainbench.predict.communication import step_collectives
from trainbench.predict.memory_model import ALLOCATOR_SLACK, predict
from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams
from trainbench.training.runners.deepspeed_engine import deepspeed_config

from conftest import TINY, make_cell

TUNED = {"overlap_comm": True, "contiguous_gradients": False, "reduce_bucket_size": 20_000,
         "allgather_bucket_size": 30_000}


def test_a_zero2_engine_trains_with_every_setting_deepspeed_was_given(tmp_path):
    """DeepSpeed's config model refuses a key it does not know, so a run is the proof that each is its."""
    cell = make_cell(framework="deepspeed", strategy="zero2", gpus=2, grad_accum=2, timed_steps=3, **TUNED)
    assert run_cell(cell, tmp_path / "metrics.json", runtime_min=5, retries=0) == 0
    doc = read_json(tmp_path / "metrics.json")
    assert schema_problems(doc) == [] and doc["status"] == "ok", doc.get("reason")
    zero = json.loads((tmp_path / "deepspeed_config.json").read_text())["zero_optimization"]
    assert zero == {"stage": 2, **TUNED}
    curve = doc["metrics"]["loss_curve"]
    assert curve[-1] < curve[0]


def test_a_cell_that_sets_nothing_runs_at_deepspeeds_defaults():
    zero = deepspeed_config(CellParams.resolve({**TINY, "framework": "deepspeed", "strategy": "zero3",
                                                "gpus": 2}), "cuda")["zero_optimization"]
    assert zero == {"stage": 3}
    zero = deepspeed_config(CellParams.resolve({**TINY, "framework": "deepspeed", "strategy": "zero3",
                                                "gpus": 2, "prefetch_bucket_size": 10**8}), "cuda")
    assert zero["zero_optimization"] == {"stage": 3, "stage3_prefetch_bucket_size": 10**8}


@pytest.mark.parametrize("strategy, key, words", [
    ("zero0", "reduce_bucket_size", "is read by ZeRO stage 1 and 2 and 3, and strategy 'zero0' is stage 0"),
    ("zero3", "allgather_bucket_size", "is read by ZeRO stage 1 and 2, and strategy 'zero3' is stage 3"),
    ("zero2", "prefetch_bucket_size", "is read by ZeRO stage 3, and strategy 'zero2' is stage 2"),
])
def test_a_setting_is_refused_on_a_stage_that_never_reads_it(strategy, key, words):
    errors, _ = check_cell(CellParams.resolve({**TINY, "framework": "deepspeed", "strategy": strategy,
                                               "gpus": 2, key: 10**6}))
    assert errors == [(key, f"{words}: leave it unset")]


def test_a_framework_that_builds_no_deepspeed_config_is_refused_them():
    errors, _ = check_cell(CellParams.resolve({**TINY, "strategy": "ddp", "gpus": 2,
                                               "reduce_bucket_size": 10**6}))
    assert any(k == "reduce_bucket_size" and "the torch runner does not read it" in m for k, m in errors)


def test_the_bucket_sizes_set_the_buffer_and_the_collectives_predicted():
    base = {"model": "gpt2-350m", "framework": "deepspeed", "strategy": "zero2", "gpus": 2,
            "precision": "bf16", "seq_len": 1024, "micro_batch": 16, "grad_accum": 4}
    default, small = (CellParams.resolve({**base, **extra})
                      for extra in ({}, {"reduce_bucket_size": 10**8, "allgather_bucket_size": 10**8}))
    saved = (predict(default).gpu_mem_mib - predict(small).gpu_mem_mib) * 2**20
    assert saved == pytest.approx((5e8 - 1e8) * 2 * ALLOCATOR_SLACK, rel=0.02)  # a bf16 bucket, as allocated
    counts = {}
    for params in (default, small):
        counts[params] = {}
        for collective in step_collectives(params):
            counts[params][collective.what] = counts[params].get(collective.what, 0) + collective.count
    # 354.8M parameters: one bucket of 5e8, or four of 1e8 (three full and the rest)
    assert counts[default] == {"ZeRO-2: gradients": 4, "ZeRO-2: updated weights": 1}
    assert counts[small] == {"ZeRO-2: gradients": 16, "ZeRO-2: updated weights": 4}


def test_zero3_reduces_each_micro_batchs_gradients_through_its_bucket():
    """The Trainer's "auto" bucket (width^2) cuts ZeRO-3's gradients into many small reduce-scatters."""
    base = {"model": "gpt2-124m", "framework": "deepspeed", "strategy": "zero3", "gpus": 2,
            "precision": "bf16", "seq_len": 1024, "micro_batch": 32, "grad_accum": 4}
    scatters = {}
    for bucket in (None, 768 ** 2):
        params = CellParams.resolve({**base, "reduce_bucket_size": bucket})
        scatters[bucket] = sum(c.count for c in step_collectives(params) if c.what == "ZeRO-3: gradients")
    assert scatters[None] == 4  # the model's 124.4M parameters in one bucket of 5e8, each micro batch
    # in buckets of 589,824 elements: 210 full and the rest, each micro batch
    assert scatters[768 ** 2] == 4 * 211
