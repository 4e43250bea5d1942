"""fsdp_reshard: when torch FSDP2 frees a block's gathered weights. Real FSDP2 over two gloo ranks; the
memory and time models' terms for each policy."""

from __future__ import annotations

import json
import pytest

from trainbench.execute.cellrun import run_cell
from trainbench.contract.result import read_json, schema_problems
from trainbench.predict.communication import Interconnect
from trainbench.predict.memory_model import predict, shard_params
from trainbench.predict.time_model import work
from trainbench.registry.hardware import gpu_type
from trainbench.registry.models import get_model
from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams

from conftest import TINY, make_cell

POLICIES = (None, "after_backward", "after_step")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """gpt2-tiny under FSDP2 on two CPU ranks, 2 micro batches a step: FSDP2's default, and the policy
    that departs most from it (kept from forward to backward, and across the micro batches)."""
    runs = {}
    for policy in (None, "after_step"):
        folder = tmp_path_factory.mktemp(str(policy))
        cell = make_cell(strategy="fsdp", gpus=2, grad_accum=2, fsdp_reshard=policy, timed_steps=4)
        assert run_cell(cell, folder / "metrics.json", runtime_min=5, retries=0) == 0
        doc = read_json(folder / "metrics.json")
        assert schema_problems(doc) == [] and doc["status"] == "ok", doc.get("reason")
        runs[policy] = doc, json.loads((folder / "torch_config.json").read_text())
    return runs


def test_freeing_gathered_weights_later_changes_no_step_of_training(trained):
    curves = {policy: doc["metrics"]["loss_curve"] for policy, (doc, _) in trained.items()}
    assert curves[None] == curves["after_step"]
    assert len(curves[None]) >= 5


def test_the_config_written_beside_the_result_says_how_it_resharded(trained):
    said = {policy: config["fully_shard"] for policy, (_, config) in trained.items()}
    assert said[None]["reshard_after_forward"] is True and said[None]["reshard_after_backward"] is True
    assert said["after_step"]["reshard_after_forward"] is False
    assert said["after_step"]["reshard_after_backward"] == "last micro batch only"


def test_a_cell_that_gathers_nothing_is_refused_the_setting():
    cell = CellParams.resolve({**TINY, "strategy": "ddp", "gpus": 2, "fsdp_reshard": "after_step"})
    errors, _ = check_cell(cell)
    assert [key for key, _ in errors] == ["fsdp_reshard"] and "strategy 'ddp' gathers none" in errors[0][1]


def test_the_models_hold_the_kept_weights_and_gather_less():
    base = {"model": "gpt2-350m", "strategy": "fsdp", "gpus": 2, "precision": "bf16", "seq_len": 1024,
            "micro_batch": 16, "grad_accum": 4}
    cells = {policy: CellParams.resolve({**base, "fsdp_reshard": policy}) for policy in POLICIES}
    spec = get_model("gpt2-350m")
    memory = {policy: predict(p).parts_mib for policy, p in cells.items()}
    assert "unsharded_weights" not in memory[None]
    kept = memory["after_step"]["unsharded_weights"]
    assert kept == memory["after_backward"]["unsharded_weights"]
    # the bf16 weights of every block but the two in flight
    assert kept == pytest.approx((spec.n_layer - 2) * spec.block_params() * 2 / 2**20)
    assert predict(cells["after_step"]).gpu_mem_mib > predict(cells[None]).gpu_mem_mib
    h200 = gpu_type("h200")
    timed = {policy: work(p, h200).overlapped_link_s for policy, p in cells.items()}  # by the H200 table
    assert timed[None] > timed["after_backward"] > timed["after_step"]
    # in bytes (no table, the link's full bandwidth): all-gathers of the blocks' bf16 weights 8, 4,
    # then 1 times a step, the root's (embeddings) once a micro batch or once a step, beside one fp32
    # reduce-scatter of everything
    links = Interconnect("h200", {}, 1.0)
    moved = {policy: work(p, h200, links=links).overlapped_link_s for policy, p in cells.items()}
    blocks = spec.n_layer * spec.block_params()
    root = shard_params(cells[None], spec) - blocks
    assert moved[None] / moved["after_step"] == pytest.approx(
        (8 * 2 * blocks + 4 * 2 * root + 4 * (blocks + root)) / (2 * blocks + 2 * root + 4 * (blocks + root)))
