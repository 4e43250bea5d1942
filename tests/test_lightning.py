"""The Lightning runner on CPU ranks, and the sentiment data it trains on."""

from __future__ import annotations

import json

import pytest
import torch

from trainbench.training import sentiment
from trainbench.study.config import load_config
from trainbench.registry.models import get_model
from trainbench.training.runners.lightning_trainer import build_classifier

from conftest import PROJECT_CONFIG
from test_cellrun import make_cell, run


def test_the_synthetic_set_is_balanced_and_carries_its_label():
    split = sentiment.synthetic(2000, 64, 30522, seed=3)
    assert 0.45 < split.labels.float().mean() < 0.55
    assert (split.tokens[:, 0] == sentiment.CLS).all()
    positive = ((split.tokens >= 200) & (split.tokens < 200 + sentiment.LEXICON_SIZE)).sum(1)
    negative = ((split.tokens >= 300) & (split.tokens < 300 + sentiment.LEXICON_SIZE)).sum(1)
    # counting lexicon words alone classifies almost every review: the task is learnable
    assert ((positive > negative).long() == split.labels).float().mean() > 0.95
    assert torch.equal(split.tokens, sentiment.synthetic(2000, 64, 30522, seed=3).tokens)  # deterministic


def test_imdb_reviews_are_read_from_an_aclimdb_folder(tmp_path):
    for label, words in (("pos", "wonderful brilliant"), ("neg", "dreadful boring")):
        folder = tmp_path / "test" / label
        folder.mkdir(parents=True)
        for i in range(3):
            (folder / f"{i}_7.txt").write_text(f"A {words} film, number {i}.")
    split = sentiment.imdb(tmp_path, "test", None, 16, 30522, seed=0)
    assert split.tokens.shape == (6, 16) and sorted(split.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    assert split.source == f"IMDB test from {tmp_path}"
    lengths = split.mask.sum(1)
    assert (lengths == 7).all()  # [CLS] + six words, the rest padding
    with pytest.raises(FileNotFoundError, match="aclImdb's layout"):
        sentiment.imdb(tmp_path, "train", None, 16, 30522, seed=0)


def test_the_classifier_is_the_registry_size():
    for name in ("distilbert-tiny", "distilbert-base"):
        spec = get_model(name)
        with torch.device("meta"):
            model = build_classifier(spec, 2, None, deterministic=True)
        assert sum(p.numel() for p in model.parameters()) == spec.param_count("classifier", 2)


LIGHTNING = {"framework": "lightning", "model": "distilbert-tiny", "head": "classifier", "seq_len": 32,
             "micro_batch": 16, "lr": 2e-3, "warmup_steps": 2, "timed_steps": 38, "deterministic": True}


# DDP's settings, passed through DDPStrategy to DistributedDataParallel (not its defaults: 25, off, off)
DDP_SETTINGS = {"ddp_bucket_cap_mb": 1, "ddp_bucket_view": True, "ddp_static_graph": True}


@pytest.mark.parametrize("strategy, gpus, settings", [("single", 1, {}), ("ddp", 2, DDP_SETTINGS)])
def test_lightning_trains_learns_and_tests_on_cpu_ranks(tmp_path, strategy, gpus, settings):
    doc = run(make_cell(**LIGHTNING, strategy=strategy, gpus=gpus, dataset_size=35000, epochs=3, **settings),
              tmp_path)
    m = doc["metrics"]
    config = tmp_path / "results/runs/t/c/lightning_config.json"
    if strategy == "ddp":  # the wrapped model as training started: the cell's settings, not DDP's defaults
        said = json.loads(config.read_text())
        assert said["strategy"] == "DDPStrategy" and said["DistributedDataParallel"] == {
            "bucket_cap_mb": 1.0, "gradient_as_bucket_view": True, "static_graph": True}
    else:
        assert not config.exists()
    assert doc["status"] == "ok", doc["reason"]
    # Lightning owns its loop: 38 timed steps fill six fixed windows of 7 steps
    assert m["steps_timed"] == 42 and m["windows"] == 6 and m["step_time_s"] > 0
    assert "fixed length" in m["timing"]["stopped"]
    assert m["dataset"] == "synthetic sentiment" and m["test_samples"] == 2048
    assert m["test_accuracy"] > 0.75  # chance is 0.5
    assert m["loss_last"] < m["loss_first"]
    global_batch = 16 * gpus
    assert m["projected_run_s"] == pytest.approx(-(-35000 // global_batch) * 3 * m["step_time_s"], rel=0.01)
    assert m["params_total"] == get_model("distilbert-tiny").param_count("classifier", 2)


def test_lightnings_deepspeed_strategies_are_built_with_the_cells_zero_settings():
    """Lightning's DeepSpeed strategies refuse CPU ranks, so the strategy the runner would hand the Trainer
    is built here, as it is on a GPU, and its ZeRO config read back; without settings, Lightning's name."""
    from trainbench.study.params import CellParams
    from trainbench.training.runners.lightning_trainer import lightning_strategy

    zero2 = {**LIGHTNING, "strategy": "deepspeed_stage_2", "gpus": 2}
    assert lightning_strategy(CellParams.resolve(zero2)) == "deepspeed_stage_2"
    built = lightning_strategy(CellParams.resolve({**zero2, "overlap_comm": False, "reduce_bucket_size": 5e8,
                                                   "allgather_bucket_size": 5e8}))
    zero = built.config["zero_optimization"]
    assert zero["stage"] == 2 and zero["overlap_comm"] is False
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 5e8
    assert zero["contiguous_gradients"] is True  # Lightning's own, left as it is


def test_lightning_sharded_strategies_on_cpu_are_unsupported_results(tmp_path):
    doc = run(make_cell(**LIGHTNING, strategy="deepspeed_stage_3", gpus=2), tmp_path)
    assert doc["status"] == "unsupported" and "refuse a CPU accelerator" in doc["reason"]


def test_the_lightning_study_keeps_colossalai_as_unsupported(repo):
    cells = {c.params.strategy: c for c in load_config(PROJECT_CONFIG).study("lightning").cells}
    assert "ColossalAI" in cells["colossalai"].unsupported
    assert all(c.unsupported is None for name, c in cells.items() if name != "colossalai")


def test_a_local_pretrained_model_is_loaded_instead_of_random_weights(tmp_path):
    spec = get_model("distilbert-tiny")
    torch.manual_seed(1)
    saved = build_classifier(spec, 2, None, deterministic=False)
    saved.save_pretrained(tmp_path)
    torch.manual_seed(2)
    loaded = build_classifier(spec, 2, str(tmp_path), deterministic=True)
    fresh = build_classifier(spec, 2, None, deterministic=True)
    key = "distilbert.transformer.layer.0.attention.q_lin.weight"
    assert torch.equal(loaded.state_dict()[key], saved.state_dict()[key])
    assert not torch.equal(fresh.state_dict()[key], saved.state_dict()[key])


def test_an_emulated_gpu_rank_gives_lightning_its_nodes_devices_on_its_one_gpu():
    # a GPU machine's emulated rank sees one GPU: Lightning's own CUDA accelerator refuses a node of 4
    from lightning.pytorch.accelerators import CUDAAccelerator
    from trainbench.training.runners.lightning_trainer import _emulated_gpu

    accelerator = type(_emulated_gpu())
    assert issubclass(accelerator, CUDAAccelerator)
    devices = accelerator.parse_devices(4)
    assert devices == [0, 1, 2, 3]
    # numbered as a node's (DeepSpeed's strategy checks it); LOCAL_RANK 0 takes the first, the one GPU
    assert accelerator.get_parallel_devices(devices)[0] == torch.device("cuda", 0)
    with pytest.raises(Exception, match="only has"):
        CUDAAccelerator.parse_devices(4)


def test_only_lightning_takes_deterministic():
    """The other runners do not switch torch to deterministic algorithms: a cell that asks them to is
    refused, naming the key, rather than labelled deterministic and run as it would be anyway."""
    from trainbench.registry.frameworks import check
    from trainbench.study.params import CellParams

    torch_cell = CellParams.resolve({"framework": "torch", "strategy": "single", "model": "gpt2-tiny",
                                     "device": "cpu", "deterministic": True})
    errors, _ = check(torch_cell)
    assert [k for k, _ in errors] == ["deterministic"] and "the torch runner does not read it" in errors[0][1]
    lightning_cell = CellParams.resolve({"framework": "lightning", "strategy": "single",
                                         "model": "distilbert-tiny", "head": "classifier", "device": "cpu",
                                         "deterministic": True})
    assert check(lightning_cell)[0] == []
