"""float8 training (the `float8` cell parameter, torchao): real cells on CPU ranks, which run torchao's
float8 linear layers through torch's CPU scaled matmul; what the config refuses; what the GPU check,
MFU and both models make of it. Its speed is a GPU's to measure (docs/float8.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainbench.errors import ConfigError
from trainbench.execute.cellrun import no_float8_here, run_cell
from trainbench.contract.figures import timed_metrics
from trainbench.contract.result import read_json, schema_problems
from trainbench.predict import memory_model, time_model
from trainbench.registry import frameworks
from trainbench.registry.hardware import GPUS
from trainbench.registry.models import get_model
from trainbench.study.params import CellParams
from trainbench.workflow import load_checked

from conftest import make_cell, tiny_study

pytest.importorskip("torchao")


def run(cell, folder: Path) -> tuple[dict, dict]:
    output = folder / "metrics.json"
    assert run_cell(cell, output, runtime_min=5, retries=0) == 0
    doc = read_json(output)
    assert schema_problems(doc) == []
    return doc, json.loads((folder / "torch_config.json").read_text())


@pytest.fixture(scope="module")
def single_rank(tmp_path_factory):
    """gpt2-tiny on one rank in bf16 and in tensorwise float8: {recipe: (result, torch_config)}."""
    folder = tmp_path_factory.mktemp("single")
    return {recipe: run(make_cell(strategy="single", precision="bf16", float8=recipe, timed_steps=6),
                        folder / str(recipe)) for recipe in (None, "tensorwise")}


def test_a_float8_cell_trains_beside_its_bf16_twin(single_rank):
    """gpt2-tiny's two blocks: their eight linear layers in float8 (the tied LM head stays bf16); the
    losses follow bf16's closely without being bf16's (the matmuls really are float8's)."""
    (bf16, _), (fp8, config) = single_rank[None], single_rank["tensorwise"]
    assert fp8["status"] == bf16["status"] == "ok"
    assert config["float8"]["recipe"] == "tensorwise" and config["float8"]["layers"] == 8
    first, last = fp8["metrics"]["loss_first"], fp8["metrics"]["loss_last"]
    assert last < first  # it learns
    assert first != bf16["metrics"]["loss_first"]
    assert first == pytest.approx(bf16["metrics"]["loss_first"], rel=1e-3)
    assert last == pytest.approx(bf16["metrics"]["loss_last"], rel=1e-3)
    assert fp8["metrics"]["mfu_fp8"] is None  # a CPU: no peak to hold it against
    # the whole curve, warm-up included, kept to be held against bf16's: within 0.1% of it at every step
    curve, twin = fp8["metrics"]["loss_curve"], bf16["metrics"]["loss_curve"]
    assert curve[0] == first and curve[-1] == last and len(curve) == 1 + fp8["metrics"]["steps_timed"]
    assert len(twin) == len(curve) and curve != twin
    assert curve == pytest.approx(twin, rel=1e-3)


def test_fsdp2_shards_a_float8_model_over_two_ranks(tmp_path):
    doc, config = run(make_cell(strategy="fsdp", gpus=2, precision="bf16", float8="rowwise", timed_steps=6),
                      tmp_path)
    assert doc["status"] == "ok"
    assert (config["float8"]["recipe"], config["float8"]["layers"]) == ("rowwise", 8)
    assert config["fully_shard"]["units"] == "every Block, then the root"
    assert config["float8"]["fsdp_float8_all_gather"] is False


def test_fsdp2_all_gathers_tensorwise_float8_weights_in_float8(tmp_path):
    """torchao's float8 all-gather (the weights cast to float8 before FSDP2 gathers them, their scales
    precomputed after each optimizer step): it trains, and its curve is its own (the casts happen before
    the gather), within 0.1% of the same cell gathering bf16."""
    curves = {}
    for all_gather in (False, True):
        doc, config = run(make_cell(strategy="fsdp", gpus=2, precision="bf16", float8="tensorwise",
                                    float8_all_gather=all_gather, timed_steps=6), tmp_path / str(all_gather))
        assert doc["status"] == "ok", doc["reason"]
        assert config["float8"]["fsdp_float8_all_gather"] is all_gather
        curves[all_gather] = doc["metrics"]["loss_curve"]
    assert curves[True][-1] < curves[True][0]
    assert curves[True] != curves[False] and curves[True] == pytest.approx(curves[False], rel=1e-3)


@pytest.mark.parametrize("settings, words", [
    ({"precision": "fp16"}, "float8: float8 training runs what is not a matmul in bf16; set precision: bf16"),
    ({"framework": "deepspeed", "strategy": "zero2"}, "float8: the deepspeed runner does not read it"),
    ({"float8": "blockwise"}, "float8: 'blockwise' is not allowed; float8 must be one of 'tensorwise', "
                              "'rowwise' or null"),
    ({"float8_all_gather": True}, "float8_all_gather: all-gathers FSDP2's tensorwise float8 weights"),
    ({"strategy": "fsdp", "gpus": 2, "float8": "rowwise", "float8_all_gather": True},
     "in float8 (torchao has none for rowwise scales); set float8: tensorwise and strategy: fsdp"),
])
def test_the_config_refuses_float8_where_it_cannot_mean_anything(settings, words):
    study = tiny_study(strategy="single", precision="bf16", float8="tensorwise")
    study["settings"].update(settings)
    study["include"] = [{}]
    with pytest.raises(ConfigError) as raised:
        load_checked({"studies": {"t": study}})
    assert words in str(raised.value), str(raised.value)


def test_float8_layers_split_by_tensor_parallelism_train_over_two_ranks(tmp_path):
    """FSDP2 on a 1 x 2 mesh, the blocks' linear layers split in Megatron's layout: tensorwise float8
    through torchao's float8 plans (one scale over a sharded tensor), rowwise through the plain ones
    (as torchtitan does), each beside its bf16 twin on the same split."""
    settings = {"strategy": "fsdp", "gpus": 2, "tp": 2, "precision": "bf16", "timed_steps": 6}
    resolved = CellParams.resolve({**settings, "framework": "torch", "model": "gpt2-tiny",
                                   "float8": "tensorwise", "device": "cpu"})
    assert frameworks.not_implemented(resolved) is None
    plans = {None: ["ColwiseParallel", "RowwiseParallel"], "rowwise": ["ColwiseParallel", "RowwiseParallel"],
             "tensorwise": ["Float8ColwiseParallel", "Float8RowwiseParallel"]}
    spec = get_model("gpt2-tiny")
    h, f = spec.d_model, spec.ffn
    curves = {}
    for recipe, expected_plans in plans.items():
        doc, config = run(make_cell(**settings, float8=recipe), tmp_path / str(recipe))
        assert doc["status"] == "ok", doc["reason"]
        assert config["tensor_parallel"]["plans"] == expected_plans
        curves[recipe] = doc["metrics"]["loss_curve"]
        if recipe:
            assert (config["float8"]["recipe"], config["float8"]["layers"]) == (recipe, 8)
            # rank 0 holds half of every block matrix: torchao's layers are split as nn.Linear's are
            assert doc["metrics"]["params_per_module_rank0"]["Float8Linear"] == spec.n_layer * (
                (3 * h * h + 3 * h) // 2 + (h * f + f) // 2 + (h * h + h * f) // 2 + 2 * h)
        if recipe == "tensorwise":
            # one rank of it emulated (collectives that return at once) holds what the real rank 1 holds
            real = doc["metrics"]
            emulated = run(make_cell(**settings, float8=recipe, emulate=True, emulate_rank=1),
                           tmp_path / "emulated")[0]["metrics"]
            assert emulated["params_held_per_rank"] == [real["params_held_per_rank"][1]]
            held, expected = (emulated["tensors_held_bytes_per_rank"][0]["cpu"],
                              real["tensors_held_bytes_per_rank"][1]["cpu"])
            assert abs(held - expected) <= 64, (held, expected)
    for recipe in ("tensorwise", "rowwise"):
        # float8's matmuls, not bf16's: the curve follows its bf16 twin's, never equal to it
        assert curves[recipe][-1] < curves[recipe][0]
        assert curves[recipe] != curves[None]
        assert curves[recipe] == pytest.approx(curves[None], rel=1e-3)


def test_gpus_without_fp8_tensor_cores_make_a_float8_cell_unsupported():
    params = CellParams.resolve({"framework": "torch", "strategy": "single", "model": "gpt2-tiny",
                                 "precision": "bf16", "float8": "rowwise", "device": "cuda"})
    assert "NVIDIA A100-SXM4-80GB has none" in no_float8_here(params, "NVIDIA A100-SXM4-80GB")
    assert no_float8_here(params, "NVIDIA H100 80GB HBM3") is None
    assert no_float8_here(params, "a GPU the table does not know") is None  # the run says
    assert no_float8_here(params.replace(float8=None), "NVIDIA A100-SXM4-80GB") is None


def test_a_float8_cells_mfu_is_held_against_both_peaks():
    params = CellParams.resolve({"framework": "torch", "strategy": "single", "model": "gpt2-124m",
                                 "seq_len": 1024, "micro_batch": 8, "precision": "bf16",
                                 "float8": "tensorwise", "device": "cuda"})
    figures = timed_metrics(params, [0.1] * 6, steps_per_window=1, gpu_name="NVIDIA H200")
    assert figures["mfu_fp8"] == pytest.approx(figures["mfu"] * 989 / 1979, abs=1e-4)
    assert figures["mfu_fp8_ci"] is not None
    assert "mfu_fp8" not in timed_metrics(params.replace(float8=None), [0.1] * 6, steps_per_window=1,
                                          gpu_name="NVIDIA H200")


def test_both_models_see_what_float8_changes():
    """The blocks' matmuls at the FP8 peak (less time where they dominate, a 5.8B model); activation
    memory as bf16's (torchao keeps its linear layers' inputs in bf16 for backward); no autocast copy of
    the float8 layers' weights (an allocator snapshot on an H200 found none)."""
    def cell(**changes):
        return CellParams.resolve({"framework": "torch", "strategy": "single", "model": "gpt-5.8b",
                                   "seq_len": 1024, "micro_batch": 4, "precision": "bf16", "device": "cuda",
                                   **changes})
    h200 = GPUS["h200"]
    bf16 = time_model.predict(cell(), h200)
    fp8 = time_model.predict(cell(float8="rowwise"), h200)
    assert fp8.parts_s["compute"] < 0.9 * bf16.parts_s["compute"]
    assert fp8.mfu > bf16.mfu  # the same model FLOPs in less time, against bf16's peak
    spec = get_model("gpt-5.8b")
    saved, saved_fp8 = (memory_model.block_bytes_per_token(p, spec) for p in (cell(), cell(float8="rowwise")))
    assert saved_fp8 == saved
    spared = (memory_model.predict(cell()).parts_mib["buffers"]
              - memory_model.predict(cell(float8="rowwise")).parts_mib["buffers"])
    linears = spec.n_layer * (4 * spec.d_model ** 2 + 2 * spec.d_model * spec.ffn)
    assert spared * 2 ** 20 == pytest.approx(2 * linears)  # their bf16 copies; the embedding's is kept
    # FSDP2 gathering the float8 layers' weights in float8: fewer bytes gathered and held in flight
    fsdp = cell(float8="tensorwise", strategy="fsdp", gpus=8)
    gathering = cell(float8="tensorwise", strategy="fsdp", gpus=8, float8_all_gather=True)
    gathered = [time_model.work(c, h200).overlapped_link_s for c in (gathering, fsdp)]
    assert gathered[0] < 0.8 * gathered[1]
    in_flight = [memory_model.predict(c).parts_mib["buffers"] for c in (gathering, fsdp)]
    assert in_flight[0] < in_flight[1]
    # tensor parallelism splits the casts of what is sharded on a rank and not of what is replicated
    casts = [time_model.work(cell(float8="tensorwise", strategy="fsdp", gpus=tp, tp=tp), h200).cast_s
             for tp in (1, 2, 4)]
    assert casts[0] > casts[1] > casts[2] > casts[0] / 4
    # on a GPU without FP8 tensor cores the model says nothing new: the cell would not run
    assert time_model.predict(cell(float8="rowwise"), GPUS["a100-80g"]).step_time_s == pytest.approx(
        time_model.predict(cell(), GPUS["a100-80g"]).step_time_s)
