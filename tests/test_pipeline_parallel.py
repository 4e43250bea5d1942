"""Pipeline parallelism through DeepSpeed's pipeline engine (PipelineModule), on CPU ranks (gloo)."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap

import pytest

from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams
from trainbench.registry.models import get_model
from trainbench.registry.frameworks import PIPELINE_ZERO_UNSUPPORTED
from trainbench.execute.launch import cache_environment
from test_cellrun import make_cell, run

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

PP = {"framework": "deepspeed", "gpus": 2, "pp": 2, "seq_len": 32, "timed_steps": 3, "grad_accum": 2}


@pytest.mark.parametrize("strategy,checkpointing", [("zero0", False), ("zero1", True)])
def test_two_stages_train_the_model_with_micro_batches_flowing_through(tmp_path, strategy, checkpointing):
    spec = get_model("gpt2-tiny")
    doc = run(make_cell(**PP, strategy=strategy, activation_checkpointing=checkpointing), tmp_path)
    assert doc["status"] == "ok", doc["reason"]
    m = doc["metrics"]
    assert m["params_total"] == spec.param_count()
    # one pipeline replica on two ranks: the global batch is micro batch x accumulation
    assert doc["params"]["dp"] == 1 and doc["params"]["global_batch"] == 2 * doc["params"]["micro_batch"]
    # the first stage holds the embeddings and the first of the two blocks, nothing of the second
    per_module = m["params_per_module_rank0"]
    h, f = spec.d_model, spec.ffn
    assert per_module["Linear"] == (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    assert per_module["Embedding"] == spec.vocab_size * h + spec.max_seq * h
    # random initialisation: the first loss is the uniform guess's; training lowers it
    assert m["loss_first"] == pytest.approx(math.log(spec.vocab_size), abs=0.15)
    assert m["loss_last"] < m["loss_first"]


def test_pipeline_cells_check_their_shape():
    errors, _ = check_cell(resolve({**PP, "strategy": "zero0", "pp": 4, "gpus": 4}))
    assert ("pp", "pp=4 stages need at least as many layers; gpt2-tiny has 2") in errors
    _, unsupported = check_cell(resolve({**PP, "strategy": "zero3"}))
    assert unsupported == PIPELINE_ZERO_UNSUPPORTED


def test_deepspeed_really_refuses_zero_2_and_3_in_its_pipeline_engine(tmp_path):
    """The `unsupported` verdict quotes DeepSpeed: keep it true as DeepSpeed changes. Both stages in one
    process: DeepSpeed's import is most of the test's time."""
    script = textwrap.dedent("""
        import os, deepspeed, torch
        from torch import nn
        from deepspeed.pipe import PipelineModule, LayerSpec
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571", RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
        deepspeed.init_distributed(dist_backend="gloo")
        for stage in (2, 3):
            module = PipelineModule(layers=[LayerSpec(nn.Linear, 4, 4)], num_stages=1,
                                    loss_fn=nn.functional.mse_loss)
            config = {"train_batch_size": 1, "zero_optimization": {"stage": stage},
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
            try:
                deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
                print(f"stage {stage} ACCEPTED")
            except AssertionError as error:
                print(f"stage {stage} REFUSED:", error)
    """)
    # the environment's op cache, as the cells' ranks have it: DeepSpeed's CPU accelerator loads its
    # shared-memory collectives, which `make setup` built there; torch's default folder would compile
    # them again (30 s on a 2-core machine that has never built them, as CI's)
    env = {**os.environ, **cache_environment(os.environ), "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env=env)
    quoted = PIPELINE_ZERO_UNSUPPORTED.split(": ", 1)[1].strip("'")
    for stage in (2, 3):
        assert f"stage {stage} REFUSED: {quoted}" in result.stdout, result.stdout + result.stderr


def test_an_emulated_last_stage_steps_its_optimizer_on_the_activations_it_receives(tmp_path):
    """An emulated stage after the first receives no activations (a fake receive writes nothing). Left
    at zero, every hidden state of the stage was zero (GPT-2's biases start at zero), each LayerNorm's
    backward multiplied by 1/sqrt(eps), and a deep, wide stage's gradients overflowed: the optimizer
    skipped every step and never allocated AdamW's states (gpt-2.5b's last stage on 4 x H200: 5 GiB
    less than its real rank). gpt2-350m's 12 blocks a stage overflow so on CPU; gpt2-tiny's do not.
    Its real rank 3 (bf16, ZeRO-1 over 2 data-parallel ranks) keeps 8.02 bytes a parameter between
    steps: bf16 weights (2), the fp32 master partition (4 / 2) and AdamW's two fp32 states (8 / 2);
    the emulated rank kept 4.02 and its loss stayed at ln(vocabulary) / 2 (zero logits)."""
    from test_emulation import DEEPSPEED_HALF

    cell = make_cell(framework="deepspeed", strategy="zero1", model="gpt2-350m", gpus=4, pp=2,
                     micro_batch=1, seq_len=16, grad_accum=2, precision=DEEPSPEED_HALF, warmup_steps=1,
                     timed_steps=1, emulate=True, emulate_rank=3)
    if DEEPSPEED_HALF == "bf16":
        # One timed window: bf16 has no loss scale to settle, so the first step already steps the
        # optimizer (or, with zeros received, skips it), and on a CPU without AVX512-BF16 each of this
        # stage's steps takes 37 s (bf16 matmuls at 0.9 GFLOP/s): seven would pass the cell's limit.
        # fp16's dynamic loss scale skips its first steps, so it keeps the six windows.
        cell = dataclasses.replace(cell, timing=dataclasses.replace(cell.timing, min_windows=1))
    doc = run(cell, tmp_path)
    assert doc["status"] == "ok", doc["reason"]
    m = doc["metrics"]
    held, params = m["tensors_held_bytes_per_rank"][0]["cpu"], m["params_held_per_rank"][0]
    assert held >= (2 + 4 / 2 + 8 / 2) * params, held / params
    losses = m["loss_curve"]
    assert all(math.isfinite(loss) for loss in losses) and len(set(losses)) > 1, losses
