"""Parameter counts, FLOPs per token, throughput, TFLOPS and MFU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainbench.training.gpt import GPT
from trainbench.contract.figures import peak_flops, throughput
from trainbench.registry.models import MODELS, get_model
from trainbench.reporting.columns import hms, si


@pytest.mark.parametrize("name, published", [
    ("gpt2-124m", 124_439_808),  # GPT-2 small as Hugging Face counts it (tied embeddings)
    ("gpt2-350m", 354_823_168),
    ("llama-7b", 6_738_415_616),
    ("llama-13b", 13_015_864_320),
    ("llama-65b", 65_285_660_672),
])
def test_parameter_counts_match_published_models(name, published):
    assert get_model(name).param_count() == published


@pytest.mark.parametrize("name, head", [("gpt2-tiny", "lm"), ("gpt2-tiny", "classifier"),
                                        ("gpt2-small-cpu", "lm")])
@pytest.mark.parametrize("bias", [True, False])
def test_analytic_count_equals_the_built_module(name, head, bias):
    spec = dataclasses.replace(get_model(name), bias=bias)
    model = GPT(spec, head=head, num_classes=5)
    model.init_weights(0)  # GPT-2's init, where there are biases to zero and where there are none
    assert sum(p.numel() for p in model.parameters()) == spec.param_count(head, 5)
    biases = [n for n, p in model.named_parameters() if n.endswith(".bias") and "classifier" not in n]
    assert bool(biases) == bias  # nanoGPT's bias=False leaves none in the blocks and the final norm


def test_the_bias_free_gpt2s_are_gpt2_less_its_biases():
    for size in ("124m", "350m"):
        plain, free = get_model(f"gpt2-{size}"), get_model(f"gpt2-{size}-nobias")
        d, f = plain.d_model, plain.ffn
        per_block = 4 * d + f + d + 2 * d  # qkv, proj, fc, proj biases; the two LayerNorms' biases
        assert plain.param_count() - free.param_count() == plain.n_layer * per_block + d  # and ln_f's
        assert free.train_flops_per_token(1024) < plain.train_flops_per_token(1024)


def test_flops_per_token_is_palm_formula_on_gpt2_small():
    spec = get_model("gpt2-124m")
    n_without_positions = 124_439_808 - 1024 * 768  # nanoGPT's estimate_mfu uses this N
    # 12 L H Q T with L=12, H=12, Q=64, T=1024
    expected = 6 * n_without_positions + 12 * 12 * 12 * 64 * 1024
    # ours leaves out the final LayerNorm (1,536 parameters), which does no matmul
    assert spec.train_flops_per_token(1024) == pytest.approx(expected, rel=1e-4)


def test_classifier_head_flops_leave_out_the_unused_lm_head():
    spec = get_model("gpt2-124m")
    assert spec.train_flops_per_token(512, "classifier", 5) < spec.train_flops_per_token(512, "lm") - 6 * 38e6


def test_throughput_tflops_and_mfu_from_median_window_with_intervals():
    windows = [1.0, 0.5, 0.5, 9.0, 0.6, 0.7]  # six windows' mean step times
    rate = throughput(windows, global_batch=64, seq_len=1024, flops_per_token=1e9, gpus=2, peak=989e12)
    assert rate.step_time_s.value == pytest.approx(0.65)  # median, robust to one stray window
    assert (rate.step_time_s.low, rate.step_time_s.high) == (0.5, 9.0)  # six values: min and max
    assert rate.samples_per_s.value == pytest.approx(64 / 0.65)
    assert (rate.samples_per_s.low, rate.samples_per_s.high) == pytest.approx((64 / 9.0, 64 / 0.5))
    assert rate.tokens_per_s.value == pytest.approx(64 * 1024 / 0.65)
    assert rate.tflops_per_gpu.value == pytest.approx(64 * 1024 / 0.65 * 1e9 / 2 / 1e12)
    assert rate.mfu.value == pytest.approx(rate.tflops_per_gpu.value * 1e12 / 989e12)
    assert rate.mfu.high == pytest.approx(rate.tflops_per_gpu.high * 1e12 / 989e12)
    assert rate.half_width == pytest.approx((9.0 - 0.5) / 2 / 0.65)
    assert throughput(windows[:5], global_batch=64, seq_len=1024, flops_per_token=1e9, gpus=2,
                      peak=None).step_time_s.low is None  # five windows give no 95% interval; no MFU on CPUs


def test_peak_flops_by_gpu_and_precision():
    assert peak_flops("NVIDIA H200", "bf16", False) == 989e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32", True) == 494e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp16", False) == 312e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16", False) is None  # not the SXM part in the table
    assert peak_flops(None, "bf16", False) is None  # CPU: no MFU


def test_units():
    assert hms(3725.4) == "1:02:05"
    assert si(124_439_808) == "124.4M" and si(6.74e9) == "6.7B" and si(640) == "640"


def test_every_gpt_model_builds_on_meta_with_its_analytic_count():
    for spec in MODELS.values():
        if spec.family != "gpt":
            continue
        with torch.device("meta"):
            model = GPT(spec)
        assert sum(p.numel() for p in model.parameters()) == spec.param_count(), spec.name


@pytest.mark.parametrize("causal", [True, False])
def test_eager_attention_computes_what_sdpa_computes(causal):
    """`attention: eager` changes how attention is computed (and what it keeps), not what."""
    spec = dataclasses.replace(get_model("gpt2-tiny"), causal=causal)
    torch.manual_seed(0)
    tokens = torch.randint(spec.vocab_size, (2, 16))
    losses = {}
    for attention in ("sdpa", "eager"):
        model = GPT(spec, attention=attention)
        model.init_weights(seed=3)
        losses[attention] = model(tokens, tokens)
        losses[attention].backward()
        losses[attention] = (losses[attention].item(), model.blocks[0].attn.qkv.weight.grad.norm().item())
    assert losses["eager"] == pytest.approx(losses["sdpa"], rel=1e-5)


def test_a_compiled_loss_computes_what_the_eager_loss_does():
    """GPT.compile_loss (what the torch runner does where the blocks are compiled one by one) changes how
    the loss keeps the logits for backward, not what it computes: the same loss and gradients."""
    spec = get_model("gpt2-tiny")
    tokens = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(tokens, -1, dims=1)
    results = []
    for compiled in (False, True):
        model = GPT(spec)
        model.init_weights(0)
        if compiled:
            model.compile_loss()
        loss = model(tokens, targets)
        loss.backward()
        results.append((loss.item(), model.wte.weight.grad.clone()))
    (eager, eager_grad), (compiled, compiled_grad) = results
    assert compiled == pytest.approx(eager, rel=1e-5)
    assert torch.allclose(compiled_grad, eager_grad, rtol=1e-4, atol=1e-7)
