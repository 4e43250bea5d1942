"""The Hugging Face Trainer runner on CPU ranks: real Trainer, real DeepSpeed ZeRO-3 with offload on gloo."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams
from trainbench.registry.models import get_model
from trainbench.training.runners.hf_trainer import (_initialise_on_device, build_for_fsdp, deepspeed_config,
                                                    llama_config, training_arguments)
from test_cellrun import make_cell, run

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

LLAMA = {"framework": "hf_trainer", "model": "llama-tiny", "gpus": 2, "seq_len": 32, "grad_accum": 2,
         "precision": "fp32"}


def test_fsdp_arguments_follow_the_alpaca_recipe(tmp_path):
    from transformers import TrainingArguments

    spec = get_model("llama-tiny")
    for offload, expected in ((False, "full_shard auto_wrap"), (True, "full_shard auto_wrap offload")):
        p = resolve({**LLAMA, "strategy": "fsdp", "offload_param": offload, "device": "cuda"})
        kwargs = training_arguments(p, spec, tmp_path, "cuda", max_steps=5)
        assert kwargs["fsdp"] == expected
        assert kwargs["fsdp_config"] == {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "version": 1}
        assert "deepspeed" not in kwargs
    p = resolve({**LLAMA, "strategy": "fsdp", "device": "cpu"})
    args = TrainingArguments(**{**training_arguments(p, spec, tmp_path, "cpu", max_steps=5)})
    assert args.max_steps == 5 and args.gradient_accumulation_steps == 2 and args.warmup_steps == 0.03
    assert args.save_strategy == "no"  # a final checkpoint of a 7B model would outlast the measured steps


def test_the_cells_settings_replace_the_trainers_auto_buckets_and_set_ddps(tmp_path):
    """The Trainer's "auto" ZeRO-3 buckets (width^2) cost GPT-2 32-38% of its tokens/s (the study
    deepspeed_settings): a cell may set DeepSpeed's own; and DDP's bucket size through its argument."""
    from transformers import TrainingArguments

    zero3 = {**LLAMA, "strategy": "zero3"}
    default = deepspeed_config(resolve({**zero3, "tuning": "framework"}), "cuda")["zero_optimization"]
    assert default["reduce_bucket_size"] == default["stage3_prefetch_bucket_size"] == "auto"
    assert default["overlap_comm"] is True and default["contiguous_gradients"] is True
    best = deepspeed_config(resolve(zero3), "cuda")["zero_optimization"]  # tuning: best, the default
    assert (best["reduce_bucket_size"], best["stage3_prefetch_bucket_size"]) == (500_000_000, 50_000_000)
    chosen = deepspeed_config(resolve({**zero3, "reduce_bucket_size": 5e8, "prefetch_bucket_size": 5e7,
                                       "overlap_comm": False}), "cuda")["zero_optimization"]
    assert chosen["reduce_bucket_size"] == 5e8 and chosen["stage3_prefetch_bucket_size"] == 5e7
    assert chosen["overlap_comm"] is False
    ddp = resolve({**LLAMA, "strategy": "ddp", "ddp_bucket_cap_mb": 100})
    assert check_cell(ddp)[0] == []
    args = TrainingArguments(**training_arguments(ddp, get_model("llama-tiny"), tmp_path, "cpu", max_steps=5))
    assert args.ddp_bucket_cap_mb == 100
    # what the Trainer's runner does not read stays refused by name
    errors, _ = check_cell(resolve({**zero3, "allgather_bucket_size": 5e8}))
    assert {key for key, _ in errors} == {"allgather_bucket_size"}


def test_fsdp_on_cpu_ranks_is_unsupported_not_silently_ddp():
    errors, unsupported = check_cell(resolve({**LLAMA, "strategy": "fsdp", "device": "cpu"}))
    assert not errors and "falls back" not in unsupported and "instead" in unsupported


def test_meta_model_is_materialised_and_initialised_module_by_module():
    # What FSDP's param_init_fn does to each wrapped unit on a GPU, here on the CPU for every module.
    from transformers import LlamaForCausalLM

    spec = get_model("llama-tiny")
    reference = LlamaForCausalLM(llama_config(spec))
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(spec))
    init = _initialise_on_device(model, torch.device("cpu"))
    for module in model.modules():
        init(module)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.std().item() == pytest.approx(model.config.initializer_range, rel=0.15)
    assert torch.equal(model.model.norm.weight, torch.ones(spec.d_model))
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    loss = model(input_ids=tokens, labels=tokens).loss.item()
    assert loss == pytest.approx(math.log(spec.vocab_size), abs=0.3)  # random weights: uniform guesses


def test_fsdp_materialises_the_meta_model_unit_by_unit_through_accelerate():
    # The path a GPU run takes, on a one-rank gloo group: FSDP (version 1, as accelerate builds it) wraps
    # each LlamaDecoderLayer of a meta-device model and calls our param_init_fn through accelerate's
    # wrapper that re-ties shared weights.
    import functools

    import torch.distributed as dist
    from accelerate.utils.fsdp_utils import ensure_weights_retied
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    spec = get_model("llama-tiny")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        cpu = torch.device("cpu")
        model = build_for_fsdp(spec, cpu)
        assert all(p.is_meta for p in model.model.layers.parameters())
        assert not model.model.embed_tokens.weight.is_meta
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                      transformer_layer_cls={LlamaDecoderLayer}),
            param_init_fn=ensure_weights_retied(_initialise_on_device(model, cpu), model, cpu),
            device_id=cpu, use_orig_params=True)
        assert not [name for name, p in wrapped.named_parameters() if p.is_meta]
        tokens = torch.randint(0, spec.vocab_size, (2, 16))
        assert (wrapped(input_ids=tokens, labels=tokens).loss.item()
                == pytest.approx(math.log(spec.vocab_size), abs=0.3))
    finally:
        dist.destroy_process_group()


def test_ddp_trains_through_the_trainer(tmp_path):
    doc = run(make_cell(**LLAMA, strategy="ddp"), tmp_path)
    m = doc["metrics"]
    assert doc["status"] == "ok", doc["reason"]
    # the Trainer owns its loop: its 2 timed steps become six fixed windows of one step
    assert m["steps_timed"] == 6 and m["windows"] == 6 and all(t > 0 for t in m["step_times_s"])
    assert m["params_total"] == get_model("llama-tiny").param_count()
    assert m["loss_first"] == pytest.approx(math.log(512), abs=0.3)  # each step's mean token loss
    assert doc["predicted"]["host_mem_mib"] == pytest.approx(m["host_mem_peak_mib"], rel=0.25)


def test_zero3_with_offload_partitions_the_model_and_keeps_the_filled_config(tmp_path):
    doc = run(make_cell(**LLAMA, strategy="zero3", offload_optimizer=True, offload_param=True), tmp_path)
    m = doc["metrics"]
    assert doc["status"] == "ok", doc["reason"]
    spec = get_model("llama-tiny")
    assert m["params_total"] == spec.param_count()
    # zero.Init built the model partitioned: rank 0 holds half of every Linear
    assert m["params_per_module_rank0"]["Linear"] * 2 == pytest.approx(
        spec.n_layer * (4 * spec.d_model**2 + 3 * spec.d_model * spec.ffn) + spec.vocab_size * spec.d_model,
        abs=2)
    config = json.loads((tmp_path / "results/runs/t/c/deepspeed_config.json").read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu"
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}  # no pinning without CUDA
    # at its best practice (tuning: best) DeepSpeed's bucket sizes, not the Trainer's "auto" (width^2)
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (500_000_000, 50_000_000)
    assert config["train_batch_size"] == 2 * 2 * 2 and config["train_micro_batch_size_per_gpu"] == 2  # "auto"
