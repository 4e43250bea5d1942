"""The memory model: model states against the ZeRO paper's formulas, activations against what real
blocks save for backward on CPU, host memory against measured CPU runs, and its use by the pipeline."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest
import torch

from trainbench.study.params import CellParams
from trainbench.predict.memory_model import Hardware, _block_activations, activations, model_states, predict
from trainbench.registry.models import get_model

from conftest import PROJECT_CONFIG

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

GIB = 2**30


def cell(**params) -> dict:
    return resolve({"device": "cuda", "seq_len": 2048, **params})


@pytest.mark.parametrize("name, count", [
    # the published LLaMA sizes (Touvron et al. 2023; the Hugging Face checkpoints' parameter counts)
    ("llama-7b", 6_738_415_616), ("llama-13b", 13_015_864_320), ("llama-30b", 32_528_943_616),
])
def test_llama_parameter_counts_are_the_published_ones(name, count):
    assert get_model(name).param_count() == count


def test_zero_stages_hold_the_model_states_of_the_zero_paper():
    # ZeRO (Rajbhandari et al. 2020), mixed-precision Adam: 2 + 2 + K=12 bytes per parameter;
    # stage 2 holds 2 psi + 14 psi / N, stage 3 holds 16 psi / N.
    spec = get_model("llama-7b")
    psi = spec.param_count()
    n = 64
    common = dict(framework="deepspeed", model="llama-7b", precision="bf16", gpus=n)

    def states(**kw):
        device, host = model_states(cell(**common, **kw), spec)
        return device, host

    device, _ = states(strategy="zero2")
    assert (device["weights"] + device["gradients"] + device["optimizer"]
            == pytest.approx(2 * psi + 14 * psi / n))
    device, _ = states(strategy="zero3")
    assert device["weights"] + device["gradients"] + device["optimizer"] == pytest.approx(16 * psi / n)
    # DeepSpeed's stage 1 reduces into gradient partitions too: it measures like stage 2 (gpt2_zero runs)
    assert states(strategy="zero1") == states(strategy="zero2")
    # offload moves the optimizer's fp32 copy, moments and fp32 gradient partition to the host
    device, host = states(strategy="zero3", offload_optimizer=True, offload_param=True)
    assert "optimizer" not in device and "weights" not in device
    assert host["optimizer"] == pytest.approx(12 * psi / n) and host["weights"] == pytest.approx(2 * psi / n)
    # with the staging copies of the CPU step beside them, partitioned like the rest (peak RSS of the
    # offload cells on H200, GPT-345M to Llama-7B: 22-25 bytes per parameter of a rank's partition)
    assert sum(host.values()) - host["weights"] == pytest.approx(22 * psi / n)
    # plain data parallel with autocast: fp32 weights, gradients and moments, and DDP's bucket copy
    device, _ = model_states(cell(model="llama-7b", strategy="ddp", gpus=2, precision="bf16"), spec)
    assert device["weights"] + device["gradients"] + device["optimizer"] == pytest.approx(16 * psi)
    # FSDP shards all of it
    device, _ = model_states(cell(model="llama-7b", strategy="fsdp", gpus=8, precision="bf16"), spec)
    assert device["weights"] + device["gradients"] + device["optimizer"] == pytest.approx(16 * psi / 8)


def _saved_bytes(model: torch.nn.Module, run) -> int:
    """Bytes of distinct storages autograd saves for backward while `run()` executes, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        is_weight = t.requires_grad and (t.is_leaf or (t._base is not None and t._base.is_leaf))
        if storage.data_ptr() not in params and not is_weight and t.dtype.is_floating_point:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _block_only(params, spec):
    """The model's activation bytes of the blocks alone (no LM head), fp32."""
    return activations(params.replace(head="classifier"), spec)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gpt_block_activations_match_what_the_blocks_save(checkpointing):
    from trainbench.training.gpt import GPT

    spec = get_model("gpt2-small-cpu")
    params = resolve({"model": spec.name, "device": "cpu", "seq_len": 64, "micro_batch": 3,
                      "head": "classifier", "activation_checkpointing": checkpointing})
    model = GPT(spec, head="classifier", num_classes=2, activation_checkpointing=checkpointing).train()
    x = torch.randn(3, 64, spec.d_model, requires_grad=True)

    def blocks():
        h = x * 1  # the first block's input is an activation too, not a leaf
        for block in model.blocks:
            h = (torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False) if checkpointing
                 else block(h))

    measured = _saved_bytes(model, blocks)
    predicted = _block_only(params, spec)
    if checkpointing:  # the model adds the one block recomputed during backward
        predicted -= (activations(params.replace(activation_checkpointing=False, head="classifier"), spec)
                      / spec.n_layer)
    assert predicted == pytest.approx(measured, rel=0.05)


def test_a_tensor_parallel_rank_saves_its_slices_and_the_norms_outputs_whole():
    """What one rank of tp 2 saves: the blocks with Megatron's slices (qkv and fc column-parallel,
    both projections row-parallel), as AutoTP leaves them on a rank. The linear layers' inputs that
    come from the norms stay whole: that is the model's 'rep' class."""
    from trainbench.training.gpt import GPT

    spec, tp = get_model("gpt2-small-cpu"), 2
    params = resolve({"model": spec.name, "device": "cpu", "seq_len": 64, "micro_batch": 3,
                      "head": "classifier", "tp": tp})
    model = GPT(spec, head="classifier", num_classes=2).train()
    d, f = spec.d_model, spec.ffn
    for block in model.blocks:
        block.attn.qkv, block.attn.proj = torch.nn.Linear(d, 3 * d // tp), torch.nn.Linear(d // tp, d)
        block.mlp.fc, block.mlp.proj = torch.nn.Linear(d, f // tp), torch.nn.Linear(f // tp, d)
    x = torch.randn(3, 64, d, requires_grad=True)

    def blocks():
        h = x * 1
        for block in model.blocks:
            h = block(h)

    measured = _saved_bytes(model, blocks)
    assert _block_only(params, spec) == pytest.approx(measured, rel=0.05)  # splitting them too: 10% low


def test_llama_block_activations_match_what_hugging_face_saves():
    from transformers import LlamaForCausalLM

    from trainbench.training.runners.hf_trainer import llama_config

    spec = get_model("llama-tiny")
    model = LlamaForCausalLM(llama_config(spec)).train()  # as the Hugging Face Trainer runner builds it
    params = resolve({"framework": "hf_trainer", "strategy": "ddp", "model": spec.name, "device": "cpu",
                      "seq_len": 32, "micro_batch": 2, "gpus": 2})
    h0 = torch.randn(2, 32, spec.d_model, requires_grad=True)

    def blocks():
        rope = model.model.rotary_emb(h0, torch.arange(32)[None])
        h = h0 * 1
        for layer in model.model.layers:
            h = layer(h, position_embeddings=rope, attention_mask=None)

    measured = _saved_bytes(model, blocks)
    assert _block_only(params, spec) == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_distilbert_block_activations_match_what_its_blocks_save(precision):
    """Lightning's DistilBERT as it trains: under bf16 autocast its fp32 block input is cast once by
    each of q, k and v, and each keeps its own copy; in fp32 the one input is saved once."""
    from trainbench.training.runners.lightning_trainer import build_classifier

    spec, seq, batch = get_model("distilbert-tiny"), 96, 2
    model = build_classifier(spec, 2, None, False, "sdpa").train()
    for module in model.modules():
        # CUDA's dropout keeps a 1-byte mask, CPU's one of the input's dtype: none here, and the
        # model's mask taken off below
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout") and isinstance(module.dropout, torch.nn.Dropout):
            module.dropout.p = 0.0
    # autocast's casts of the weights are the weights', not the activations' (their shapes are the
    # parameters'; no activation here has one: seq x batch tokens differ from every width)
    weight_shapes = {tuple(p.shape) for p in model.parameters()}
    params = resolve({"framework": "lightning", "strategy": "single", "model": spec.name, "device": "cpu",
                      "seq_len": seq, "micro_batch": batch, "precision": precision, "head": "classifier"})
    h0 = torch.randn(batch, seq, spec.d_model, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if t.dtype.is_floating_point and tuple(t.shape) not in weight_shapes and not t.is_leaf:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            h = h0 * 1
            for layer in model.distilbert.transformer.layer:
                h = layer(h)
    masks = spec.n_layer * batch * seq * spec.d_model  # the FFN's dropout mask, 1 byte, switched off here
    blocks = _block_activations(params, spec, 1)
    assert blocks - masks == pytest.approx(sum(seen.values()), rel=0.05)


def test_prediction_adds_up_and_judges_the_hardware():
    p = cell(framework="hf_trainer", model="llama-7b", strategy="fsdp", gpus=2, micro_batch=1,
             precision="bf16")
    free = predict(p)
    assert free.fits is None and free.gpu_mem_mib == pytest.approx(sum(free.parts_mib.values()))
    big = predict(p, Hardware(143771, 2048 * 1024, 8))
    assert big.fits is True and big.why_not is None
    small = predict(p, Hardware(40960, 2048 * 1024, 8))
    assert small.fits is False and "per GPU > 40.0 GiB" in small.why_not and small.short_of == ["GPU memory"]
    # a node with fewer GPUs than the cell has ranks per node cannot hold it, whatever the memory
    one = predict(p, Hardware(143771, 2048 * 1024, 1))
    assert one.fits is False and one.short_of == ["GPUs"] and one.why_not == "needs 2 GPUs per node > 1"
    # more micro batch, more memory; checkpointing, less
    assert predict(p.replace(micro_batch=4)).gpu_mem_mib > free.gpu_mem_mib
    assert predict(p.replace(activation_checkpointing=True)).gpu_mem_mib < free.gpu_mem_mib
    # offload trades GPU memory for host memory
    offloaded = predict(p.replace(offload_param=True))
    assert offloaded.gpu_mem_mib < free.gpu_mem_mib / 2 and offloaded.host_mem_mib > 100 * 1024
    short = predict(p.replace(offload_param=True), Hardware(143771, 64 * 1024, 8))
    assert short.why_not.endswith("GiB host memory per node > 64.0 GiB") and short.short_of == ["host memory"]


def test_the_predict_command_prints_one_row_per_cell(repo):
    run = subprocess.run([sys.executable, "-m", "trainbench", "predict", "llama", "--config",
                          str(PROJECT_CONFIG),
                          "--gpu", "h200", "--gpus-per-node", "8", "--host-mem-gib", "2048"],
                         capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    assert len(rows) == 4 * 3 * 2 * 7 * 3 + 4 * 3 * 2 + 3  # the axes' grid and the emulated cells
    by_cell = {(r["model"], r["strategy"], r["gpus"], r["micro_batch"], r["activation_checkpointing"],
                r["offload_param"]): r for r in rows}
    assert by_cell[("llama-7b", "fsdp", "8", "1", "True", "False")]["fits"] == "True"
    assert by_cell[("llama-65b", "fsdp", "2", "32", "False", "False")]["fits"] == "False"
    bad = subprocess.run([sys.executable, "-m", "trainbench", "predict", "--gpu", "h900",
                          "--host-mem-gib", "1"],
                         capture_output=True, text=True, cwd=repo)
    assert bad.returncode == 2 and "unknown GPU 'h900'" in bad.stderr and "Traceback" not in bad.stderr


def test_predict_says_once_that_cpu_cells_have_no_gpu_prediction(tmp_path, monkeypatch, capsys):
    """A study of CPU ranks (device: cpu) predicted for a GPU type: one line on stderr names it, its rows
    keep host memory and leave the GPU's figures empty; a GPU study beside it is predicted in full."""
    import yaml

    from conftest import tiny_study
    from trainbench.cli import main

    cpu = {**tiny_study(strategy="ddp", gpus=2), "axes": {"micro_batch": [1, 2]}}
    gpu = {**tiny_study(strategy="ddp", gpus=2, device="cuda"), "axes": {"micro_batch": [1, 2]}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"studies": {"c": cpu, "g": gpu}}))
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--gpu", "h100", "--host-mem-gib", "64"]) == 0
    captured = capsys.readouterr()
    [note] = [line for line in captured.err.splitlines() if "CPU ranks" in line]
    assert note.startswith("trainbench: the cells of c run on CPU ranks (device: cpu): h100's memory, "
                           "step time and MFU do not apply to them")
    rows = {(r["study"], r["micro_batch"]): r for r in csv.DictReader(io.StringIO(captured.out))}
    assert len(rows) == 4
    assert rows[("c", "1")]["gpu_mem_gib"] == rows[("c", "1")]["step_time_s"] == ""
    assert float(rows[("c", "1")]["host_mem_gib_per_node"]) > 0
    assert float(rows[("g", "1")]["gpu_mem_gib"]) > 0 and float(rows[("g", "1")]["step_time_s"]) > 0


def test_fsdp1_accumulation_keeps_unsharded_gradients_in_the_compute_dtype():
    # accelerate and Lightning accumulate under FSDP1's no_sync: every rank holds 2 psi of bf16
    # gradients whatever N (measured on llama-7b: 12 psi/N + 2 psi without offload, 2 psi with)
    spec = get_model("llama-7b")
    psi = spec.param_count()
    for n in (2, 4):
        base = dict(framework="hf_trainer", model="llama-7b", strategy="fsdp", precision="bf16", gpus=n,
                    grad_accum=8)
        device, host = model_states(cell(**base), spec)
        assert device["unsharded_gradients"] == pytest.approx(2 * psi)
        assert (device["weights"] + device["optimizer"] == pytest.approx(12 * psi / n)
                and "gradients" not in device)
        device, host = model_states(cell(**base, offload_param=True), spec)
        assert "weights" not in device and device["unsharded_gradients"] == pytest.approx(2 * psi)
        assert host["weights"] + host["gradients"] + host["optimizer"] == pytest.approx(16 * psi / n)
    # one micro batch per step: no accumulation, the sharded states alone
    device, _ = model_states(cell(framework="hf_trainer", model="llama-7b", strategy="fsdp", precision="bf16",
                                  gpus=4, grad_accum=1), spec)
    assert "unsharded_gradients" not in device
    assert device["weights"] + device["gradients"] + device["optimizer"] == pytest.approx(16 * psi / 4)


def test_compiled_gpt_cells_save_less_and_keep_no_fp32_logits_at_a_padded_vocabulary(repo):
    """Compiled whole, the loss keeps one tensor of logits in the compute dtype and, at a vocabulary
    padded to 64, no fp32 copy; the blocks keep what eager ones do: the baseline's compiled one-GPU
    cells, measured on an H200, within 3% of torch's peak (-2.1% and -1.3%)."""
    from trainbench.study.config import load_config
    from trainbench.predict.memory_model import allocated_mib
    from trainbench.reporting.documents import read_reported

    eager = resolve({"model": "gpt2-124m", "precision": "bf16", "micro_batch": 8, "seq_len": 1024})
    compiled = eager.replace(compile=True)
    spec = get_model("gpt2-124m")
    padded = compiled.replace(vocab_multiple=64)
    assert activations(compiled, spec) < activations(eager, spec)
    logits_fp32 = 8 * 1024 * spec.vocab_size * 4
    assert activations(compiled, spec) - activations(padded, spec.with_vocab_multiple(64)) == pytest.approx(
        logits_fp32, rel=0.01)
    measured = 0
    for cell in load_config(PROJECT_CONFIG).study("baseline").cells:
        path = repo / cell.target
        if path.exists() and cell.params.strategy == "single":  # FSDP2's compiled cells: docs/results.md
            doc = read_reported(path)
            predicted = allocated_mib(predict(CellParams.from_dict(doc["params"])).parts_mib)
            assert predicted == pytest.approx(doc["metrics"]["torch_peak_allocated_mib"][0], rel=0.03)
            measured += 1
    assert measured == 2


def test_the_loss_holds_what_its_compilation_leaves_of_the_logits():
    """Eager, three fp32 tensors of the logits' size (the log-softmax's output and its backward's two
    gradients); a model compiled whole, one in the compute dtype; a loss compiled alone beside blocks
    compiled one by one (FSDP2, DDP with ddp_compile: blocks), the logits and their gradient; FSDP2
    under tensor parallelism runs its loss eager, on vocabulary shards (allocator snapshots at the peak,
    results/provenance/gpu-runs/memory-peaks-*.log)."""
    from trainbench.predict.memory_model import _logits

    spec = get_model("gpt2-124m").with_vocab_multiple(64)
    tokens = 8 * 1024
    base = {"model": "gpt2-124m", "precision": "bf16", "micro_batch": 8, "seq_len": 1024,
            "vocab_multiple": 64, "device": "cuda"}

    def per_logit(**cell):
        params = resolve({**base, **cell})
        return _logits(params, spec) / (tokens * -(-spec.vocab_size // params.tp))

    assert per_logit(strategy="ddp", gpus=2) == 12
    assert per_logit(strategy="ddp", gpus=2, compile=True) == 2
    assert per_logit(strategy="ddp", gpus=2, compile=True, ddp_compile="blocks") == 4
    assert per_logit(strategy="fsdp", gpus=2, compile=True) == 4
    assert per_logit(strategy="fsdp", gpus=4, tp=2, compile=True) == 12


def test_fsdp_accumulating_keeps_every_units_unsharded_gradient_in_its_reduction_dtype():
    """Accumulating without synchronising, torch's FSDP2 keeps every unit's gradient unsharded in the
    fp32 it reduces in (to_accumulated_grad_if_needed: 4 psi on every rank, GPT-2 350M's 1,354 MiB at
    the peak), the Trainer's FSDP1 under no_sync in the compute dtype (2 psi), beside the shards the
    allocator keeps; neither without accumulation."""
    from trainbench.predict.memory_model import shard_params

    torch_cell = {"framework": "torch", "strategy": "fsdp", "model": "gpt2-350m", "precision": "bf16",
                  "micro_batch": 8, "gpus": 4, "device": "cuda"}
    trainer_cell = {**torch_cell, "framework": "hf_trainer", "model": "llama-1.3b"}
    for cell, per_param, shards in ((torch_cell, 4, False), (trainer_cell, 2, True)):
        accumulating = resolve({**cell, "grad_accum": 4})
        parts = predict(accumulating).parts_mib
        psi = shard_params(accumulating, get_model(cell["model"]))
        assert parts["unsharded_gradients"] == pytest.approx(per_param * psi / 2**20)
        assert "gradients" not in parts and ("allocator_gradient_shards" in parts) == shards
        alone = predict(resolve(cell)).parts_mib
        assert "unsharded_gradients" not in alone and alone["gradients"] == pytest.approx(4 * psi / 4 / 2**20)


def test_a_torch_loop_without_accumulation_holds_the_larger_of_gradients_and_activations():
    """torch's runner frees its gradients after each step (set_to_none): without accumulation,
    backward makes them as it frees the activations; accumulating keeps both (the holdout study's
    torch cells against the baseline's)."""
    cell = {"model": "gpt-2.5b", "device": "cuda", "seq_len": 1024, "precision": "bf16", "micro_batch": 4}
    alone = predict(resolve({**cell, "grad_accum": 1}))
    accumulating = predict(resolve({**cell, "grad_accum": 2}))
    psi_bytes = 4 * get_model("gpt-2.5b").param_count() / 2**20
    assert "gradients" not in alone.parts_mib and "gradients_beyond_activations" not in alone.parts_mib
    assert accumulating.parts_mib["gradients"] == pytest.approx(psi_bytes, rel=0.01)
    assert alone.parts_mib["activations"] == accumulating.parts_mib["activations"]
    # a tiny batch, whose activations are less than the gradients: only the excess counts
    small = predict(resolve({**cell, "grad_accum": 1, "micro_batch": 1, "seq_len": 64}))
    assert small.parts_mib["gradients_beyond_activations"] == pytest.approx(
        psi_bytes - small.parts_mib["activations"], rel=0.01)


def test_deepspeed_zero_without_accumulation_peaks_at_the_largest_of_loss_backward_and_step():
    """ZeRO 0-2 make their gradients and bucket after the loss's peak and free them after the step
    (megatron's GPT-345M ranks, allocator snapshots at the peak): without accumulation the peak is the
    loss's backward, the blocks' (their activations, gradients and bucket) or the step (gradients,
    bucket and, in mixed precision at stages 1-2, the fp32 copy of the partition), whichever is larger."""
    from trainbench.predict.memory_model import _logits, shard_params

    spec = get_model("gpt-345m")
    cell = {"framework": "deepspeed", "strategy": "zero1", "model": "gpt-345m", "device": "cuda",
            "seq_len": 1024, "precision": "bf16", "gpus": 2, "micro_batch": 8}
    at_loss = predict(resolve(cell)).parts_mib
    assert not {"gradients", "buffers", "gradients_beyond_activations"} & set(at_loss)
    accumulating = predict(resolve({**cell, "grad_accum": 2})).parts_mib
    assert accumulating["gradients"] > 0 and accumulating["buffers"] > 0  # partitions outlive a micro batch

    def moments(params):
        parts = predict(params).parts_mib
        psi = shard_params(params, spec)
        grads = (2 * psi / 2 + 5e8 * 2) / 2**20  # the bf16 partition and DeepSpeed's default bucket
        blocks = parts["activations"] - _logits(params, spec) / 2**20
        return parts, blocks + grads, grads + 4 * psi / 2 / 2**20

    # a classifier (no logits) at a long sequence: the blocks' backward; a short one: the step
    for params, blocks_larger in ((resolve({**cell, "head": "classifier", "micro_batch": 4}), True),
                                  (resolve({**cell, "micro_batch": 1, "seq_len": 64}), False)):
        parts, backward, step = moments(params)
        assert (backward > step) == blocks_larger
        assert parts["gradients_beyond_activations"] == pytest.approx(
            max(backward, step) - parts["activations"], rel=1e-6)


@pytest.mark.parametrize("precision, dtype, per_score",
                         [("bf16", torch.bfloat16, 6), ("fp32", torch.float32, 4)])
def test_eager_attention_saves_the_bytes_per_score_the_model_counts(precision, dtype, per_score):
    """trainbench's eager attention saves its fp32 softmax output and, at half precision, the
    probabilities cast back for the product with V: 6 bytes per score element (measured 5.9 on an H200,
    holdout_5b), 4 at fp32 where the two are one tensor."""
    from trainbench.training.gpt import eager_attention
    from trainbench.predict.memory_model import eager_score_bytes_per_token

    spec = get_model("gpt2-small-cpu")
    batch, seq = 2, 64
    params = resolve({"model": spec.name, "device": "cpu", "seq_len": seq, "micro_batch": batch,
                      "precision": precision, "attention": "eager"})
    q, k, v = (torch.randn(batch, spec.n_head, seq, spec.head_dim, dtype=dtype, requires_grad=True)
               for _ in range(3))
    inputs = 3 * q.numel() * q.element_size()  # q and k for the scores, v for the product: saved too
    measured = _saved_bytes(torch.nn.Module(),
                            lambda: eager_attention(q * 1, k * 1, v * 1, causal=True)) - inputs
    assert measured == per_score * batch * spec.n_head * seq * seq
    assert eager_score_bytes_per_token(params, spec) * batch * seq == measured
    assert eager_score_bytes_per_token(params.replace(attention="sdpa"), spec) == 0
