"""torch DDP's settings (ddp_bucket_view, ddp_static_graph, ddp_bucket_cap_mb, ddp_compile) and gc_every:
real DDP over two gloo ranks, the checks that keep them to DDP cells, and what the memory model makes of
them."""

from __future__ import annotations

import json

import pytest

from trainbench.execute.cellrun import run_cell
from trainbench.contract.result import read_json, schema_problems
from trainbench.predict.memory_model import ALLOCATOR_SLACK, predict
from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams

from conftest import TINY, make_cell

TUNED = {"ddp_bucket_view": True, "ddp_bucket_cap_mb": 1, "gc_every": 2}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """gpt2-tiny under DDP on two CPU ranks, 2 micro batches a step: DDP's own defaults (tuning:
    framework), and the gradients in buckets of 1 MiB with Python's collector run every 2 steps."""
    runs = {}
    for name, settings in (("defaults", {"tuning": "framework"}), ("tuned", TUNED)):
        folder = tmp_path_factory.mktemp(name)
        cell = make_cell(strategy="ddp", gpus=2, grad_accum=2, timed_steps=4, **settings)
        assert run_cell(cell, folder / "metrics.json", runtime_min=5, retries=0) == 0
        doc = read_json(folder / "metrics.json")
        assert schema_problems(doc) == [] and doc["status"] == "ok", doc.get("reason")
        runs[name] = doc, json.loads((folder / "torch_config.json").read_text())
    return runs


def test_the_settings_change_no_step_of_training(trained):
    curves = {name: doc["metrics"]["loss_curve"] for name, (doc, _) in trained.items()}
    assert curves["defaults"] == curves["tuned"] and len(curves["defaults"]) >= 5


def test_the_config_written_beside_the_result_says_how_ddp_ran(trained):
    said = {name: config["DistributedDataParallel"] for name, (_, config) in trained.items()}
    assert said["defaults"] == {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "static_graph": False,
                                "dynamo_optimize_ddp": None}
    assert said["tuned"]["bucket_cap_mb"] == 1 and said["tuned"]["gradient_as_bucket_view"] is True


def test_gc_every_collects_on_its_steps_and_says_so(trained):
    metrics = {name: doc["metrics"] for name, (doc, _) in trained.items()}
    assert "gc" not in metrics["defaults"]["timing"]  # Python collected by itself
    steps = metrics["tuned"]["warmup_steps"] + metrics["tuned"]["steps_timed"]
    said = metrics["tuned"]["timing"]["gc"]
    assert said["every"] == 2 and said["collections"] == len(range(2, steps + 1, 2)) >= 2
    assert 0 < said["collected_s"] < metrics["tuned"]["wall_time_s"]


@pytest.mark.parametrize("key, value, words", [
    ("ddp_bucket_view", True, "sets up torch DDP; strategy 'fsdp' is not DDP"),
    ("ddp_compile", "blocks", "sets up torch DDP; strategy 'fsdp' is not DDP"),
])
def test_a_cell_that_is_not_ddp_is_refused_the_settings(key, value, words):
    errors, _ = check_cell(CellParams.resolve({**TINY, "strategy": "fsdp", "gpus": 2, key: value}))
    assert [k for k, _ in errors][0] == key and words in errors[0][1]


def test_ddp_compile_needs_compile_and_a_framework_that_reads_it():
    ddp = {**TINY, "strategy": "ddp", "gpus": 2}
    errors, _ = check_cell(CellParams.resolve({**ddp, "ddp_compile": "blocks"}))
    assert [k for k, _ in errors] == ["ddp_compile"] and "set compile: true" in errors[0][1]
    errors, _ = check_cell(CellParams.resolve({**ddp, "framework": "deepspeed", "strategy": "zero0",
                                               "ddp_bucket_view": True}))
    assert any(k == "ddp_bucket_view" and "the deepspeed runner does not read it" in m for k, m in errors)


def test_a_static_graph_is_refused_where_micro_batches_accumulate():
    """torch's reducer breaks under no_sync with a static graph: it asserts, and past the assert it stops
    all-reducing the gradients."""
    ddp = {**TINY, "strategy": "ddp", "gpus": 2, "ddp_static_graph": True}
    errors, _ = check_cell(CellParams.resolve({**ddp, "grad_accum": 2}))
    assert [k for k, _ in errors] == ["ddp_static_graph"] and "grad_accum: 1" in errors[0][1]
    assert check_cell(CellParams.resolve({**ddp, "grad_accum": 1})) == ([], None)


def test_gradients_in_the_buckets_save_the_buckets_copy():
    base = {"model": "gpt2-350m", "strategy": "ddp", "gpus": 2, "precision": "bf16", "seq_len": 1024,
            "micro_batch": 16, "grad_accum": 4}
    plain, viewed = (predict(CellParams.resolve({**base, "ddp_bucket_view": view})) for view in (False, True))
    params = 354_823_168  # gpt2-350m's, as the registry counts them
    saved = (plain.gpu_mem_mib - viewed.gpu_mem_mib) * 2**20
    assert saved == pytest.approx(4 * params * ALLOCATOR_SLACK, rel=0.01)  # fp32 buckets, as allocated
