"""Every causal LM of the installed transformers, made tiny as a user makes it, is accepted and counted
right (trainbench.checks.architectures), and the published coverage page is what the sweep finds. The
single cases below each hold one way an architecture used to be refused or miscounted.

The sweep (minutes on one core) runs in two halves, one here and one in test_architectures_sweep.py, so
that the suite's two workers each run one; the totals and the page, there, read both."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from trainbench.checks import architectures
from trainbench.checks.architectures import Row, causal_lm_types, sweep, tiny_config
from trainbench.predict import memory_model
from trainbench.registry import models as registry

from conftest import made_once, tiny_study

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
HALVES = 2


def sweep_half(tmp_path_factory, half: int) -> list[Row]:
    """The sweep's rows of every other causal-LM type (from the `half`th), made once for the session by
    whichever worker asks first."""
    def swept(_folder: Path) -> str:
        return json.dumps([dataclasses.asdict(row) for row in sweep(causal_lm_types()[half::HALVES])])

    return [Row(**row) for row in json.loads(made_once(tmp_path_factory, f"architectures-{half}", swept))]


@pytest.fixture(autouse=True)
def fresh_registry():
    yield
    registry.register_user_models({})


def is_mixture(model_type: str) -> bool:
    config = tiny_config(model_type)
    nested = [v for v in config.values() if isinstance(v, dict)]
    return any(isinstance(c.get(k), int) and c[k] > 1 and c.get("is_moe", True)
               for c in [config, *nested] for k in EXPERT_KEYS)


def trained_and_mixtures(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    trained = [r for r in rows if r.status != "not trained by transformers"]
    return trained, [r for r in trained if is_mixture(r.model_type)]


def assert_each_accepted_type_counted_right(rows: list[Row]) -> None:
    """Every mixture of experts that plain transformers trains is accepted as one, and each accepted type
    is within 10% of the plain step in parameters, FLOPs and activations."""
    trained, mixtures = trained_and_mixtures(rows)
    assert all(r.status == "accepted" and r.mixture for r in mixtures), [
        (r.model_type, r.status, r.reason) for r in mixtures if r.status != "accepted" or not r.mixture]
    wrong = {r.model_type: r.errors for r in trained if r.status == "accepted" and not r.counted_right}
    assert not wrong


def test_every_causal_lm_of_the_first_half_that_transformers_trains_is_counted_right(tmp_path_factory):
    assert_each_accepted_type_counted_right(sweep_half(tmp_path_factory, 0))


# --- single cases -------------------------------------------------------------------------------------

def load(tmp_path, monkeypatch, models: dict, **settings):
    monkeypatch.chdir(tmp_path)
    study = tiny_study(**settings)
    del study["settings"]["model"]
    study["axes"] = {"model": list(models)}
    from trainbench.workflow import load_checked

    return load_checked({"models": models, "studies": {"t": study}})


def test_a_mixture_of_experts_counts_all_its_experts_as_states_and_the_routed_ones_as_flops(tmp_path,
                                                                                           monkeypatch):
    """Mixtral's layout with 4 experts, 2 routed per token: the experts' weights are all in the model's
    parameters (what the memory model's states count), and half of them in its FLOPs per token."""
    config = {**tiny_config("mixtral"), "num_local_experts": 4, "num_experts_per_tok": 2}
    load(tmp_path, monkeypatch, {"moe": {"hf": config}})
    facts = registry.get_model("moe").facts
    hidden, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    assert facts.expert_params == layers * 4 * 3 * hidden * ffn
    assert facts.active_expert_params == pytest.approx(layers * 2 * 3 * hidden * ffn, rel=0.01)
    assert facts.params_active == facts.params_total - facts.expert_params + facts.active_expert_params
    dense = registry.get_model("moe").block_matmul_params() * layers
    assert dense == pytest.approx(facts.active_expert_params + layers * (4 * hidden * hidden // 2
                                                                         + hidden * 4), rel=0.15)


def test_a_model_without_sdpa_is_predicted_with_its_own_attention(tmp_path, monkeypatch):
    """GPT-J has no SDPA implementation in transformers: a cell asking for sdpa runs (and is predicted
    with) the model's own attention, as a cell asking for eager is."""
    loaded = load(tmp_path, monkeypatch, {"j": {"hf": tiny_config("gptj")}}, device="cuda", precision="bf16",
                  seq_len=32, micro_batch=4)
    spec = registry.get_model("j")
    assert spec.facts.sdpa is False and spec.attention_run("sdpa") == "eager"
    params = loaded.study("t").cells[0].params
    eager = params.__class__.from_dict({**params.as_dict(), "attention": "eager"})
    assert memory_model.predict(params).gpu_mem_mib == memory_model.predict(eager).gpu_mem_mib


def test_a_config_nesting_its_text_model_reads_its_vocabulary_there(tmp_path, monkeypatch):
    config = tiny_config("gemma3")
    assert "vocab_size" not in config and config["text_config"]["vocab_size"] == 512
    load(tmp_path, monkeypatch, {"g": {"hf": config}})
    assert registry.get_model("g").vocab_size == 512


def test_attention_dropout_is_traced_as_a_gpu_runs_it_not_as_the_cpus_math_fallback(tmp_path):
    """On the CPU, SDPA with dropout falls back to the math path, which keeps every score matrix; a GPU's
    flash kernel keeps none: the trace with dropout weighs what it does without."""
    from trainbench.study.models import parse_models
    from trainbench.training.user_models import counted, trace_activations

    base = {**tiny_config("qwen2"), "max_position_embeddings": 1024}
    specs = parse_models({"d0": {"hf": {**base, "attention_dropout": 0.0}},
                          "d1": {"hf": {**base, "attention_dropout": 0.1}}}, tmp_path)
    without, with_dropout = (trace_activations(counted(specs[name], tmp_path), "half-16", "sdpa", 512,
                                               facts_dir=tmp_path) for name in ("d0", "d1"))
    assert with_dropout.block_bytes == pytest.approx(without.block_bytes, rel=0.02)


def test_a_model_reading_numbers_off_its_tensors_is_counted_on_real_ones(tmp_path):
    """JetMoE routes by `.tolist()`, which fake tensors cannot give: it is counted by a step on real CPU
    tensors with two layers, its per-layer figures scaled to its own eight."""
    row = architectures.check("jetmoe", tmp_path)
    assert row.status == "accepted" and row.mixture and row.counted_right
    config = {**tiny_config("jetmoe"), "num_hidden_layers": 8}
    reference = architectures.reference_step(config, 16)
    from trainbench.study.models import parse_models
    from trainbench.training.user_models import counted

    spec = counted(parse_models({"j8": {"hf": config}}, Path("."))["j8"], tmp_path)
    assert spec.facts.n_blocks == 8
    assert spec.train_flops_per_token(16) == pytest.approx(reference.flops_per_token, rel=0.02)
    assert spec.facts.params_total == reference.params


def test_the_sweep_writes_its_rows(tmp_path, capsys):
    from trainbench.cli import main

    out = tmp_path / "rows.json"
    assert main(["check-models", "architectures", "llama", "opt", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["model_type"] for r in rows] == ["llama", "opt"]
    assert all(r["status"] == "accepted" for r in rows)
    assert "2 of 2 trained types accepted" in capsys.readouterr().out
    assert torch.get_default_dtype() == torch.float32  # the sweep leaves the process as it found it
