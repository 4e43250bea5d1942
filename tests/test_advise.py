"""`trainbench advise`: every set-up of a model on a cluster predicted, those that fit ranked by predicted
tokens/s per GPU, and a study written that measures the best of them and judges the predicted order."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from trainbench.cli import main
from trainbench.predict import advise as advising
from trainbench.registry import frameworks
from trainbench.registry.hardware import GPUS
from trainbench.reporting.findings import evaluate
from trainbench.study.config import load_config
from trainbench.study.grid import check_cell
from trainbench.workflow import load_checked

from conftest import PROJECT_CONFIG, REPO

H100 = GPUS["h100"]


def request(model: str = "gpt2-350m", **changes) -> advising.Request:
    cluster = advising.Cluster(H100, changes.pop("gpus_per_node", 8), changes.pop("nodes", 1),
                               changes.pop("host_mem_gib", 1024))
    return advising.Request(model, cluster, **changes)


@pytest.fixture(scope="module")
def gpt2():
    return advising.advise(request())


def test_the_set_ups_that_fit_are_ranked_fastest_first_and_nothing_invalid_is_listed(gpt2):
    assert gpt2.ranked
    speeds = [s.tokens_per_s_per_gpu for s in gpt2.ranked]
    assert speeds == sorted(speeds, reverse=True)
    for setup in gpt2.ranked:
        p = setup.params
        assert setup.memory.gpu_mem_mib < H100.memory_mib and setup.headroom_mib(gpt2.request.cluster) > 0
        assert setup.memory.host_mem_mib <= 1024 * 1024
        assert check_cell(p) == ([], None) and frameworks.not_implemented(p) is None
        assert (p.gpus, p.nodes, p.model, p.precision, p.seq_len) == (8, 1, "gpt2-350m", "bf16", 1024)
    counts = gpt2.counts
    assert counts["considered"] == sum(counts[k] for k in (advising.INVALID, advising.CANNOT_RUN,
                                                           advising.TOO_BIG, advising.FITS))
    assert counts[advising.FITS] == len(gpt2.ranked)
    # a one-rank strategy on 8 GPUs, tp beyond GPT-2's 16 heads' divisors: checked, skipped, counted
    assert counts[advising.INVALID] > 0 and counts[advising.TOO_BIG] > 0
    assert not any(frameworks.strategy_of(s.params).single_rank for s in gpt2.ranked)
    # what the search varies is there: both frameworks that build GPT-2, splits, offload, checkpointing
    assert {s.params.framework for s in gpt2.ranked} == {"torch", "deepspeed"}
    assert any(s.params.tp > 1 for s in gpt2.ranked) and any(s.params.pp > 1 for s in gpt2.ranked)
    assert any(s.params.offload_optimizer for s in gpt2.ranked)
    assert {s.params.activation_checkpointing for s in gpt2.ranked} == {False, True}
    assert {s.params.micro_batch for s in gpt2.ranked} <= set(advising.powers_of_two(1, 64))


def test_a_global_batch_is_made_by_accumulation_in_every_set_up():
    found = advising.advise(request(global_batch=256, micro_batches=advising.powers_of_two(1, 16)))
    assert found.ranked and all(s.params.global_batch == 256 for s in found.ranked)
    assert len({s.params.grad_accum for s in found.ranked}) > 1


def study_cells(tmp_path, text: str, name: str):
    """The study a text holds, as the workflow loads it (its findings checked too)."""
    (tmp_path / "studies/local").mkdir(parents=True, exist_ok=True)
    (tmp_path / "studies/local/advised.yaml").write_text(text)
    config = {"study_files": ["studies/local/*.yaml"],
              "default_studies": {"without_gpus": [name], "with_gpus": [name]}}
    load_checked(config)  # the findings and report columns, as `snakemake` checks them first
    return load_config(config, base=tmp_path).study(name)


def test_the_plain_set_ups_and_each_frameworks_fastest_are_measured_beside_the_fastest(gpt2):
    plain, best = gpt2.plain, gpt2.best_of_framework
    assert plain["FSDP"] is gpt2.ranked[0] and plain["DDP"].params.strategy == "ddp"  # torch's, GPT-2's
    assert list(best) == ["torch", "deepspeed"] and best["torch"] is gpt2.ranked[0]
    assert advising.chosen(gpt2, 5) == gpt2.ranked[:5]  # all among the five fastest
    # beyond the two fastest: plain DDP, and DeepSpeed's fastest, named as such in its label
    assert advising.chosen(gpt2, 1) == sorted({gpt2.ranked[0], plain["DDP"], best["deepspeed"]},
                                              key=gpt2.rank)
    assert advising._label(gpt2, best["deepspeed"]).endswith(", fastest deepspeed)")
    assert "fastest" not in advising._label(gpt2, gpt2.ranked[0])  # the fastest of all needs no such word


def measured(study, setups, speeds) -> list[dict]:
    """The study's cells as results, measured at these tokens/s (each within 0.1%)."""
    return [{"status": "ok", "cell_id": c.cell_id, "params": c.params.as_dict(),
             "metrics": {"tokens_per_s": v, "tokens_per_s_ci": [0.999 * v, 1.001 * v]}}
            for c, v in zip(study.cells, speeds)]


@pytest.mark.parametrize("gpus_here", [8, 1])
def test_the_written_study_holds_the_chosen_set_ups_and_judges_their_order(gpt2, tmp_path, monkeypatch,
                                                                          gpus_here):
    monkeypatch.chdir(tmp_path)
    chosen = advising.chosen(gpt2, 5)
    study = study_cells(tmp_path, advising.study_text(gpt2, "advised", 5, gpus_here), "advised")
    # each cell is the set-up it stands for; where the machine has fewer GPUs, one emulated rank of it,
    # held to the cluster's GPU memory
    emulated = {"emulate": True, "gpu_mem_limit_gib": 79.6} if gpus_here < 8 else {}
    assert [c.params for c in study.cells] == [s.params.replace(**emulated) for s in chosen]
    assert study.findings[0] == {"claim": "every set-up predicted to fit trains", "fits": {}}
    predicted = [s.time.tokens_per_s for s in chosen]
    docs = measured(study, chosen, predicted)
    # the note on emulated ranks is there where they are
    assert ("note" in study.findings[1]) == (gpus_here < 8)
    if gpus_here < 8:  # an emulated rank's steps time its compute alone: its order is not measured
        docs = [{**d, "emulation": {"rank": 0, "world_size": 8}} for d in docs]
        verdicts = [r.verdict for r in evaluate(study.findings, docs, study.id_keys)]
        assert verdicts[0] == "reproduced" and set(verdicts[1:]) == {"not yet measured"}
        return
    # measured in the predicted order, every claim holds; in the reverse order, no "faster" one does
    results = evaluate(study.findings, docs, study.id_keys)
    assert len(results) == len(chosen) and {r.verdict for r in results} == {"reproduced"}
    backwards = evaluate(study.findings, measured(study, chosen, predicted[::-1]), study.id_keys)
    faster = [r.verdict for r in backwards if "more" in (study.findings[r.index - 1].get("compare") or {})]
    assert faster and set(faster) == {"not reproduced"}


def test_set_ups_predicted_alike_are_claimed_as_fast_not_faster(gpt2):
    chosen = advising.chosen(gpt2, 5)
    varying = [k for k in advising.SETUP_KEYS if len({s.params.get(k) for s in chosen}) > 1]
    claims = advising.findings(gpt2, chosen, varying)[1:]
    # GPT-2 350M at micro batch 32: ZeRO-1 and ZeRO-2 predicted alike (neither accumulates)
    tied = [c for c in claims if "same" in c["compare"]]
    assert tied and all(" is as fast as " in c["claim"] for c in tied)
    assert all(" is faster than " in c["claim"] or "fastest" in c["claim"] for c in claims if c not in tied)


def test_a_model_that_fits_nowhere_gets_a_one_line_answer_and_exit_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["advise", "--model", "llama-65b", "--gpu", "a10", "--host-mem-gib", "256", "--config",
                 str(PROJECT_CONFIG), "--write", "advised.yaml"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1 and not (tmp_path / "advised.yaml").exists()
    [answer] = [line for line in out if "fits no set-up" in line]
    assert answer.startswith("llama-65b fits no set-up on 1 node of 8 a10 (22.5 GiB each, 256 GiB host per "
                             "node): the nearest, ")
    assert "GiB per GPU > 22.5 GiB" in answer
    assert re.match(r"[\d,]+ set-ups of llama-65b predicted in [\d.]+ s: 0 fit, [\d,]+ do not, ", out[-1])


@pytest.mark.parametrize("args, said", [
    (["--model", "llama-7b", "--gpu", "h900"], "--gpu: unknown GPU 'h900'; known: h100, h200,"),
    (["--model", "lama-7b", "--gpu", "h100"], "--model: unknown model 'lama-7b' (did you mean 'llama-7b'?)"),
    (["--gpu", "h100"], "name the model: --model NAME"),
    (["--model", "llama-7b", "--gpu", "v100-32g"], "--precision bf16: v100-32g has no bf16 tensor cores"),
    (["--model", "llama-7b", "--gpu", "h100", "--seq-len", "4096"],
     "--seq-len 4096 exceeds llama-7b's context of 2048 tokens"),
])
def test_the_command_names_a_bad_key_and_exits_2(args, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["advise", *args, "--host-mem-gib", "512", "--config", str(PROJECT_CONFIG)]) == 2
    assert said in capsys.readouterr().err


def test_your_transformers_model_is_advised_from_its_config_json_or_the_config(tmp_path, monkeypatch, capsys):
    """A config.json given on the command line is the written study's own model; once that study is in the
    config's study files, the model is advised by name."""
    shutil.copy(REPO / "examples/your_model/qwen2-tiny.json", tmp_path / "qwen2-tiny.json")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "study_files": ["studies/local/*.yaml"], "studies": {"other": {
            "description": "a study beside", "settings": {"model": "gpt2-tiny", "device": "cpu"},
            "include": [{"strategy": "single"}]}}}))
    monkeypatch.chdir(tmp_path)
    small = ["--gpu", "h100", "--gpus-per-node", "2", "--host-mem-gib", "64", "--micro-batch", "1-4",
             "--gpus-here", "2"]
    assert main(["advise", "--model-config", "qwen2-tiny.json", *small]) == 0
    said = capsys.readouterr()
    assert "wrote studies/local/advise-qwen2-tiny.yaml: " in said.err and " torch fsdp" in said.out
    assert "wrote" not in said.out  # the ranking alone on standard output
    written = yaml.safe_load((tmp_path / "studies/local/advise-qwen2-tiny.yaml").read_text())
    assert written["models"] == {"qwen2-tiny": {"hf_config": "qwen2-tiny.json"}}
    study = load_checked("config.yaml").study("advise-qwen2-tiny")
    assert {c.params.model for c in study.cells} == {"qwen2-tiny"} and len(study.cells) >= 2
    # defined now by that study file: by name, and not twice
    assert main(["advise", "--model", "qwen2-tiny", *small, "--write", "studies/local/again.yaml"]) == 0
    assert "models" not in yaml.safe_load((tmp_path / "studies/local/again.yaml").read_text())
    capsys.readouterr()
    assert main(["advise", "--model-config", "qwen2-tiny.json", *small, "--write", "elsewhere.yaml"]) == 2
    assert ("model 'qwen2-tiny' is defined in studies/local/advise-qwen2-tiny.yaml already"
            in capsys.readouterr().err)
