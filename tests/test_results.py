"""metrics.json: atomic writes and the schema every reader relies on."""

from __future__ import annotations

import json
import os

import pytest

from trainbench.contract import result as results
from trainbench.study.params import CellParams
from trainbench.contract.figures import timed_metrics
from trainbench.contract.result import schema_problems
from trainbench.reporting.documents import read_cells
from trainbench.contract.result import write_json_atomic

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters


class Unserialisable:
    pass


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(tmp_path):
    target = tmp_path / "cell" / "metrics.json"
    write_json_atomic(target, {"status": "ok", "n": 1})
    write_json_atomic(target, {"status": "ok", "n": 2})
    assert json.loads(target.read_text()) == {"status": "ok", "n": 2}
    assert os.listdir(target.parent) == ["metrics.json"]


def test_a_write_that_dies_midway_keeps_the_old_file_and_no_partial_one(tmp_path):
    target = tmp_path / "metrics.json"
    write_json_atomic(target, {"status": "ok"})
    with pytest.raises(TypeError):
        # json.dump fails after writing part of the document
        write_json_atomic(target, {"status": "failed", "metrics": [1, 2, Unserialisable()]})
    assert json.loads(target.read_text()) == {"status": "ok"}
    assert os.listdir(tmp_path) == ["metrics.json"]


def test_a_write_that_dies_before_the_first_file_leaves_nothing(tmp_path):
    target = tmp_path / "metrics.json"
    with pytest.raises(TypeError):
        write_json_atomic(target, {"x": Unserialisable()})
    assert os.listdir(tmp_path) == []


def _document(**overrides):
    params = resolve({"model": "gpt2-tiny", "device": "cpu"})
    doc = {"schema": 1, "study": "s", "cell_id": "c", "params": params.as_dict(),
           "params_hash": params.params_hash,
           "status": "ok", "reason": None, "metrics": results.empty_metrics(),
           "predicted": results.empty_predicted(),
           "provenance": {k: None for k in results.PROVENANCE_KEYS}}
    doc["metrics"].update(timed_metrics(params, [0.1] * 6, steps_per_window=1, gpu_name=None),
                          step_times_s=[0.1] * 6)
    doc["provenance"]["versions"] = {k: None for k in results.VERSION_KEYS}
    doc.update(overrides)
    return doc


def test_schema_problems_find_missing_keys_and_bad_statuses():
    assert schema_problems(_document()) == []
    assert schema_problems(_document(status="crashed", reason="?")) == [
        "status 'crashed' is not one of ('ok', 'oom', 'unsupported', 'infeasible', 'failed', 'timeout')"]
    assert schema_problems(_document(status="oom")) == ["status 'oom' needs a reason"]
    doc = _document()
    del doc["metrics"]["mfu"]
    assert schema_problems(doc) == ["missing key metrics.mfu"]
    # the JSON schema: types, and a finished run's timed windows
    assert schema_problems(_document(params_hash="h")) == ["params_hash: 'h' does not match '^[0-9a-f]{12}$'"]
    doc = _document()
    doc["metrics"]["step_time_s_ci"] = [0.1]
    assert schema_problems(doc) == ["metrics.step_time_s_ci: [0.1] is too short"]
    doc = _document()
    del doc["metrics"]["step_times_s"]
    assert schema_problems(doc) == ["metrics: 'step_times_s' is a required property"]
    assert schema_problems(_document(status="oom", reason="OOM at init",
                                     metrics=results.empty_metrics())) == []
    assert schema_problems(["not", "a", "result"]) == ["a list, not a JSON object"]


def test_reading_cells_refuses_a_malformed_file(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_document()))
    bad.write_text(json.dumps({"status": "ok"}))
    assert len(read_cells([good])) == 1
    with pytest.raises(ValueError, match="bad.json: not a metrics.json of schema 1: missing key 'schema'"):
        read_cells([good, bad])


def test_planned_rows_give_the_memory_models_verdict_in_grid_order():
    from trainbench.study.config import load_config
    from trainbench.reporting.tables import study_markdown, with_planned

    plan_for = {"name": "4 x H200", "gpu_mem_gib": 140.4, "gpus_per_node": 4, "host_mem_gib": 560}
    study = load_config({"studies": {"s": {
        "description": "d",
        "settings": {"framework": "hf_trainer", "strategy": "fsdp", "micro_batch": 1, "grad_accum": 8,
                     "activation_checkpointing": True},
        "axes": {"model": ["llama-7b", "llama-65b"], "gpus": [4, 8]},
        "include": [{"model": "llama-7b", "gpus": 2, "device": "cpu"}],  # FSDP on CPU: unsupported
        "measure": {"cells": [{"model": "llama-7b", "gpus": 4}], "plan_for": plan_for}}}}).study("s")
    measured = study.cell("model~llama-7b__gpus~4")
    doc = {"study": "s", "cell_id": measured.cell_id, "params": measured.params.as_dict(), "status": "ok",
           "reason": None, "metrics": {}, "provenance": {}}
    docs = with_planned([doc], study)
    assert [d["cell_id"] for d in docs] == [c.cell_id for c in study.cells]
    verdicts = {d["cell_id"]: (d["status"], d["reason"]) for d in docs}
    assert verdicts == {
        "model~llama-7b__gpus~4": ("ok", None),
        "model~llama-7b__gpus~8": ("planned", "predicted not to fit: GPUs"),  # 8 ranks on a 4-GPU node
        "model~llama-65b__gpus~4": ("planned", "predicted not to fit: GPU memory"),
        "model~llama-65b__gpus~8": ("planned", "predicted not to fit: GPUs, GPU memory"),
        "model~llama-7b__device~cpu__gpus~2": ("unsupported",
                                               study.cell("model~llama-7b__device~cpu__gpus~2").unsupported),
    }
    assert docs[2]["predicted"]["gpu_mem_mib"] > 140.4 * 1024
    text = study_markdown("s", "d", docs, id_keys=["model", "gpus"], plan_for=plan_for)
    # the measured cell is the table's row; the others are counted by outcome (their rows: the plan)
    assert "1 cell with a result of the study's 5: 1 ok." in text and "4 of the study's 5 cells" in text
    assert "| planned: predicted not to fit: GPU memory | 1 |" in text
    assert "for 4 x H200: 4 GPUs of 140.4 GiB and 560 GiB of host memory per node" in text
