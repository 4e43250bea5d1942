"""Your own models (config.yaml's `models`): a transformers architecture from its config, or a module of
your own from a factory, on your tokens. Their definitions are refused by name where wrong, counted from
the model itself (on fake tensors), predicted, and trained on CPU ranks under every framework that builds
them."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil

import numpy
import pytest
import torch

from trainbench.errors import ConfigError
from trainbench.predict.memory_model import shard_params
from trainbench.predict.time_model import work
from trainbench.registry.hardware import gpu_type
from trainbench.registry import models as registry
from trainbench.study.config import load_config
from trainbench.study.params import CellParams
from trainbench.workflow import load_checked

from conftest import FAST_TIMING, REPO, Workflow, tiny_study

EXAMPLE = REPO / "examples/your_model"
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 256, "max_position_embeddings": 128}
# three architectures beyond LLaMA, as tiny as transformers builds them
ARCHITECTURES = {
    "qwen2": {"model_type": "qwen2", **TINY, "num_key_value_heads": 2},
    "gpt-neox": {"model_type": "gpt_neox", **TINY},
    "phi3": {"model_type": "phi3", **TINY, "pad_token_id": 0},
}
FACTORY = {"factory": "examples.your_model.tiny_lm:build", "block": "Block", "vocab_size": 256,
           "max_seq": 128, "args": {"vocab_size": 256, "width": 32, "depth": 2, "heads": 4, "max_seq": 128}}


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test's config registers its own models; none leaks into the next test."""
    yield
    registry.register_user_models({})


def config_with(models: dict, **settings) -> dict:
    study = tiny_study(**settings)
    del study["settings"]["model"]
    study["axes"] = {"model": list(models)}
    return {"models": models, "studies": {"t": study}}


# --- definitions refused by name, before anything runs ------------------------------------------------

CASES = {
    "missing config.json": ({"m": {"hf_config": "no/such/config.json"}}, "models.m.hf_config: no such file"),
    "two kinds": ({"m": {"hf": ARCHITECTURES["qwen2"], "factory": "a:b"}},
                  "models.m: give one of hf_config (a config.json), hf (its keys inline) or factory"),
    "no model_type": ({"m": {"hf": {"hidden_size": 8, "vocab_size": 8}}}, "models.m.hf: gives no model_type"),
    "a factory that is no function name": ({"m": {**FACTORY, "factory": "tiny_lm.build"}},
                                           "models.m.factory: 'tiny_lm.build' is not 'module:function'"),
    "a factory without its block": ({"m": {k: v for k, v in FACTORY.items() if k != "block"}},
                                    "models.m.block: a factory's model needs it"),
    "a registry model's name": ({"gpt2-tiny": {"hf": ARCHITECTURES["qwen2"]}},
                                "models.gpt2-tiny: the registry already has a model of that name"),
    "a misspelt key": ({"m": {"hf_confg": "x.json"}}, "unknown key 'hf_confg' (did you mean 'hf_config'?)"),
    "max_seq given to a transformers model": (
        {"m": {"hf": ARCHITECTURES["qwen2"], "max_seq": 64}},
        "models.m.max_seq: a transformers model takes it from its config"),
    "a tensor-parallel style no one knows": (
        {"m": {**FACTORY, "tp_plan": {"blocks.*.up": "diagonal"}}},
        "models.m.tp_plan.blocks.*.up: 'diagonal' is not a style; known: colwise, rowwise"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_definition_is_refused_naming_the_model_and_key(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    models, words = CASES[case]
    with pytest.raises(ConfigError) as raised:
        load_config(config_with(models))
    assert words in str(raised.value), str(raised.value)


def test_a_models_mistakes_name_the_file_that_defines_it(tmp_path, monkeypatch, capsys):
    """A model defined in a study file (studies/local/) is refused naming that file, not config.yaml,
    whether its definition is wrong as data or its factory cannot build it."""
    import yaml

    from trainbench.cli import main

    monkeypatch.chdir(tmp_path)
    config = config_with({"qwen-0.5b": {"hf_config": "no/such.json"}})
    config["study_files"] = ["studies/local/*.yaml"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    mine = tmp_path / "studies/local/mine.yaml"
    mine.parent.mkdir(parents=True)
    study = config_with({"neox": {"hf_config": "models/neox.json"}})["studies"]["t"]
    mine.write_text(yaml.safe_dump({"models": {"neox": {"hf_config": "models/neox.json"}},
                                    "studies": {"mine": study}}))
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path / "config.yaml")
    assert sorted(p.split(".hf_config")[0] for p in raised.value.problems) == [
        "config.yaml: models.qwen-0.5b", "studies/local/mine.yaml: models.neox"]

    (tmp_path / "models").mkdir()
    (tmp_path / "models/neox.json").write_text(json.dumps(ARCHITECTURES["gpt-neox"]))
    config["models"] = {"qwen-0.5b": {"hf": ARCHITECTURES["qwen2"]}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    mine.write_text(yaml.safe_dump({"models": {"neox": {**FACTORY, "factory": "no_such_module:build"}},
                                    "studies": {"mine": study}}))
    assert main(["cells", "mine"]) == 2  # built when the config loads: the factory does not import
    err = capsys.readouterr().err
    assert "studies/local/mine.yaml: models.neox.factory: cannot import 'no_such_module'" in err, err
    assert "config.yaml" not in err, err


def test_models_lists_what_is_known_of_yours_and_the_file_defining_each(tmp_path, monkeypatch, capsys):
    """`trainbench models`: a factory's model shows its factory and block and its counted layers and
    width, no heads (its module names none; the spec's placeholder is 1); a transformers model its
    config's heads; each is tagged with the file that defines it."""
    import yaml

    from trainbench.cli import main

    monkeypatch.chdir(REPO)  # the factory's module is found from here
    config = config_with({"qwen": {"hf": ARCHITECTURES["qwen2"]}})
    config["study_files"] = ["studies/local/*.yaml"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "studies/local").mkdir(parents=True)
    (tmp_path / "studies/local/mine.yaml").write_text(yaml.safe_dump(
        {"models": {"tiny": FACTORY}, "studies": {"mine": config_with({"tiny": FACTORY})["studies"]["t"]}}))
    assert main(["models", "--config", str(tmp_path / "config.yaml")]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "h=" not in listed["tiny"] and "L=2 d=32 ctx=128" in listed["tiny"], listed["tiny"]
    assert "factory examples.your_model.tiny_lm:build, block Block" in listed["tiny"]
    assert listed["tiny"].endswith("[defined in studies/local/mine.yaml]")
    assert "L=2 d=32 h=4 ctx=128  transformers qwen2" in listed["qwen"]
    assert listed["qwen"].endswith("[defined in config.yaml]")
    assert "h=2" in listed["gpt2-tiny"] and "defined in" not in listed["gpt2-tiny"]
    from trainbench.study.models import spec_from_definition, summary

    uncounted = spec_from_definition("tiny", json.loads(registry.get_model("tiny").definition))
    assert summary(uncounted) == ("ctx=128  factory examples.your_model.tiny_lm:build, block Block; layers "
                                  "and width counted when a cell uses it")


BUILD_CASES = {
    "an architecture transformers does not know": (
        {"m": {"hf": {**ARCHITECTURES["qwen2"], "model_type": "qwen99"}}},
        "models.m: transformers", "cannot make a config of model_type 'qwen99'"),
    "a factory that does not import": ({"m": {**FACTORY, "factory": "no_such_module:build"}},
                                       "models.m.factory: cannot import 'no_such_module'"),
    "a factory with no such function": ({"m": {**FACTORY, "factory": "examples.your_model.tiny_lm:nope"}},
                                        "models.m.factory: module 'examples.your_model.tiny_lm' has no "
                                        "function 'nope'"),
    "a factory that raises": ({"m": {**FACTORY, "args": {"widht": 8}}},
                              "models.m.factory: examples.your_model.tiny_lm:build(**args) raised TypeError"),
    "a factory that returns no module": ({"m": FACTORY}, "models.m.factory", "returned"),
    "no block of that class": ({"m": {**FACTORY, "block": "Layer"}},
                               "models.m.block: no module of class 'Layer' in the model", "Block"),
    "a tensor-parallel plan naming no layer": (
        {"m": {**FACTORY, "tp_plan": {"blocks.*.mlp.up": "colwise"}}},
        "models.m.tp_plan: 'blocks.*.mlp.up' names no module"),
    "a tensor-parallel plan splitting a norm": (
        {"m": {**FACTORY, "tp_plan": {"blocks.*.norm_1": "colwise"}}},
        "models.m.tp_plan: blocks.0.norm_1 is a RMSNorm"),
}


@pytest.mark.parametrize("case", sorted(BUILD_CASES))
def test_a_definition_that_cannot_build_or_train_is_refused_when_the_config_loads(case, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.chdir(REPO)  # the factory's module is found from the folder of config.yaml
    models, *words = BUILD_CASES[case]
    if "returns no module" in case:  # main() reads argv: give it a factory of our own that returns a list
        (tmp_path / "returns_list.py").write_text("def build():\n    return [1, 2]\n")
        models = {"m": {**FACTORY, "factory": "returns_list:build", "args": {}}}
        monkeypatch.syspath_prepend(str(tmp_path))
        words = ["models.m.factory: returns_list:build returned a list, not a torch.nn.Module"]
    with pytest.raises(ConfigError) as raised:
        load_checked(config_with(models))
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_a_forward_that_gives_no_loss_is_refused(tmp_path, monkeypatch):
    (tmp_path / "logits_only.py").write_text(
        "import torch\n"
        "class Block(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__(); self.f = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        return self.f(x)\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.e = torch.nn.Embedding(16, 8); self.b = Block()\n"
        "    def forward(self, input_ids, labels=None):\n        return self.b(self.e(input_ids))\n"
        "def build():\n    return M()\n")
    monkeypatch.chdir(tmp_path)
    model = {"factory": "logits_only:build", "block": "Block", "vocab_size": 16, "max_seq": 16}
    with pytest.raises(ConfigError, match=r"models.m: one training step of the model on fake tensors failed "
                                          r"\(TypeError: .*not the mean loss"):
        load_checked(config_with({"m": model}, seq_len=8))


# --- split by a tensor-parallel plan --------------------------------------------------------------------

def test_tensor_parallelism_splits_by_the_models_plan_or_says_why_it_cannot(monkeypatch):
    """transformers' published plan, or the definition's own (here the MLP alone of the factory's model):
    the checks name the sizes tp must divide, and what has no plan, or no runner that splits by one, is
    unsupported with the reason."""
    monkeypatch.chdir(REPO)
    models = {"qwen2": {"hf": ARCHITECTURES["qwen2"]},
              "gpt2": {"hf": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4,
                              "vocab_size": 256, "n_positions": 128}},
              "mlp-split": {**FACTORY, "tp_plan": {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}},
              "mine": FACTORY}
    include = [{"model": "qwen2", "gpus": 4, "tp": 4}, {"model": "qwen2", "gpus": 2, "tp": 2},
               {"model": "gpt2", "gpus": 2, "tp": 2}, {"model": "mlp-split", "gpus": 2, "tp": 2},
               {"model": "mine", "gpus": 2, "tp": 2},
               {"model": "qwen2", "framework": "deepspeed", "strategy": "zero3", "gpus": 2, "tp": 2}]
    study = tiny_study(strategy="fsdp")
    del study["settings"]["model"]
    study["include"] = include
    with pytest.raises(ConfigError) as raised:
        load_config({"models": models, "studies": {"t": study}})
    # Qwen2's 2 key/value heads do not split 4 ways
    assert str(raised.value).count("tp=4 must divide qwen2's 4 heads and 2 key/value heads and 64 MLP width")
    study["include"] = include[1:]
    config = load_checked({"models": models, "studies": {"t": study}})
    reasons = {(c.params.model, c.params.framework): c.unsupported for c in config.studies["t"].cells}
    assert reasons[("qwen2", "torch")] is None and reasons[("mlp-split", "torch")] is None
    assert "publishes no tensor-parallel plan for 'gpt2' (base_model_tp_plan); give the model a tp_plan" \
        in reasons[("gpt2", "torch")]
    assert "a factory's model splits by the tp_plan its definition gives" in reasons[("mine", "torch")]
    assert "deepspeed zero3's tensor parallelism splits trainbench's GPT alone" \
        in reasons[("qwen2", "deepspeed")]
    # what the plan splits, counted from the model: the MLP's two weights of each block
    facts = registry.get_model("mlp-split").facts
    assert facts.tp_block_params == 2 * 32 * 4 * 32 and facts.tp_collectives_per_block == 2
    assert facts.tp_other_params == 0  # the head is tied to the embedding: whole
    spec = registry.get_model("mlp-split")
    one, split = (facts.activations(spec, "half-16", "sdpa", 32, tp) for tp in (1, 2))
    # a rank of two saves half of the MLP's hidden activations (its up output and GELU output), the rest
    # whole
    assert one.block_bytes - split.block_bytes == 2 * 32 * 4 * 32 * 2 / 2
    assert one.outside_bytes == split.outside_bytes
    # the time model: the MLP's matmuls split, the rest not; an all-reduce per split layer and micro batch
    cells = {c.params.model: c.params for c in config.studies["t"].cells if c.params.framework == "torch"}
    h200 = gpu_type("h200")
    whole = work(dataclasses.replace(cells["mlp-split"], tp=1, gpus=1), h200)
    halved = work(cells["mlp-split"], h200)
    share = facts.tp_block_params / facts.block_params
    assert whole.matmul_s * (1 - share / 2) < halved.matmul_s < whole.matmul_s
    assert halved.calls - whole.calls == cells["mlp-split"].grad_accum * 2 * 2


# --- counted from the model itself ----------------------------------------------------------------------

def test_a_transformers_llama_is_counted_and_predicted_as_the_registry_counts_its_shape(tmp_path,
                                                                                        monkeypatch):
    """The same LLaMA twice: the registry's analytic shape, and a transformers LlamaConfig given as the
    user's. Parameters match exactly, FLOPs per token within 0.5% (the FLOP counter against PaLM's
    formula), memory and step time predicted within 10% (a traced step against the listed tensors)."""
    monkeypatch.chdir(tmp_path)
    shape = dict(n_layer=4, d_model=512, n_head=8, ffn=1376, vocab=4096, max_seq=1024)
    monkeypatch.setitem(registry.MODELS, "llama-shape", registry._llama(
        "llama-shape", shape["n_layer"], shape["d_model"], shape["n_head"], shape["ffn"],
        vocab=shape["vocab"], max_seq=shape["max_seq"]))
    hf = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 4096,
          "max_position_embeddings": 1024, "tie_word_embeddings": False}
    config = config_with({"mine": {"hf": hf}}, framework="torch", device="cuda", precision="bf16",
                         seq_len=1024, micro_batch=4)
    config["studies"]["t"]["axes"] = {"model": ["mine", "llama-shape"],
                                      "activation_checkpointing": [False, True]}
    config["studies"]["t"]["variants"] = {"how": [{"strategy": "single"}, {"strategy": "fsdp", "gpus": 2}]}
    loaded = load_checked(config)
    mine, theirs = registry.get_model("mine"), registry.MODELS["llama-shape"]
    assert mine.param_count() == theirs.param_count()
    assert mine.train_flops_per_token(1024) == pytest.approx(theirs.train_flops_per_token(1024), rel=0.005)
    assert (tmp_path / "results/models/mine.json").exists()  # counted once, kept beside the results

    from trainbench.predict import memory_model, time_model
    from trainbench.registry.hardware import gpu_type

    by_model: dict[str, list] = {}
    for cell in loaded.study("t").cells:
        p = cell.params
        by_model.setdefault(p.model, []).append((memory_model.predict(p).gpu_mem_mib,
                                                 time_model.predict(p, gpu_type("h200")).step_time_s))
    assert len(by_model["mine"]) == len(by_model["llama-shape"]) == 4
    for (mem_mine, step_mine), (mem_theirs, step_theirs) in zip(by_model["mine"], by_model["llama-shape"]):
        assert mem_mine == pytest.approx(mem_theirs, rel=0.10)
        assert step_mine == pytest.approx(step_theirs, rel=0.10)


def test_a_cell_carries_its_models_definition_so_an_edit_reruns_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(ARCHITECTURES["qwen2"]))
    config = config_with({"m": {"hf_config": "config.json"}})
    before = load_config(config).study("t").cells[0].params
    assert json.loads(before.model_definition)["config"]["hidden_size"] == 32
    (tmp_path / "config.json").write_text(json.dumps({**ARCHITECTURES["qwen2"], "intermediate_size": 96}))
    after = load_config(config).study("t").cells[0].params
    assert after.params_hash != before.params_hash
    registry_cell = load_config({"studies": {"t": {**tiny_study(), "axes": {"seed": [0]}}}}).study("t")
    registry_cell = registry_cell.cells[0].params
    assert "model_definition" not in json.loads(registry_cell.canonical)  # the registry's cells: as before


# --- your tokens --------------------------------------------------------------------------------------

def test_token_windows_are_disjoint_across_ranks_and_shuffled_by_epoch(tmp_path):
    from trainbench.training.data import TokenWindows

    path = tmp_path / "tokens.bin"
    numpy.arange(8 * 4 + 1, dtype=numpy.uint16).tofile(path)  # 8 windows of 4 + 1 tokens
    ranks = [TokenWindows(path=str(path), dtype="uint16", seq_len=4, micro_batch=2, seed=1, rank=r, ranks=2,
                          device=torch.device("cpu")) for r in range(2)]
    firsts = [[int(t) for _ in range(2) for t in rank.next()[0][:, 0]] for rank in ranks]  # 4 windows each
    assert sorted(firsts[0] + firsts[1]) == [0, 4, 8, 12, 16, 20, 24, 28]  # one epoch: every window once
    inputs, targets = TokenWindows(path=str(path), dtype="uint16", seq_len=4, micro_batch=1, seed=1, rank=0,
                                   ranks=1, device=torch.device("cpu")).next()
    assert torch.equal(targets[0, :-1], inputs[0, 1:]) and targets[0, -1] == inputs[0, -1] + 1


@pytest.mark.parametrize("content, words", [
    (None, "tokens: no such file"),
    (numpy.arange(10, dtype=numpy.uint16), "holds 10 uint16 ids, fewer than a window of seq_len + 1 = 17"),
    (numpy.full(100, 300, dtype=numpy.uint16), "holds id 300, beyond m's vocabulary of 256"),
    # numpy maps neither of these, and its error names no file
    (numpy.array([], dtype=numpy.uint16), "tokens.bin is empty (0 bytes): it holds no token ids"),
    (numpy.zeros(41, dtype=numpy.uint8), "tokens.bin holds 41 bytes, not a whole number of uint16 ids"),
])
def test_a_token_file_that_cannot_feed_the_cells_is_refused(content, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        content.tofile(tmp_path / "tokens.bin")
    with pytest.raises(ConfigError) as raised:
        load_config(config_with({"m": {"hf": ARCHITECTURES["qwen2"]}}, tokens="tokens.bin"))
    assert "study 't', cell 'model~m': tokens: " in str(raised.value) and words in str(raised.value)


def test_an_empty_token_file_is_a_config_error_of_the_command_line(tmp_path, monkeypatch, capsys):
    """As a user meets it: `trainbench cells` refuses it in one line naming the study, cell and file,
    exit status 2, no traceback."""
    import yaml

    from trainbench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokens.bin").write_bytes(b"")
    config = config_with({"m": {"hf": ARCHITECTURES["qwen2"]}}, tokens="tokens.bin")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["cells", "t"]) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "tokens.bin" in line]
    assert "study 't', cell 'model~m': tokens: tokens.bin is empty (0 bytes)" in line
    assert "Traceback" not in err


# --- trained on CPU ranks ------------------------------------------------------------------------------

def test_your_models_train_on_your_tokens_under_every_framework_that_builds_them(tmp_path, monkeypatch,
                                                                                 capsys):
    """Three transformers architectures beyond LLaMA and a factory model, on a token file with structure
    (examples/your_model/make_tokens.py), through DDP, FSDP2, ZeRO-2, an emulated FSDP2 rank and the
    Hugging Face Trainer's ZeRO-3: each cell trains (its loss falls), says what its
    model is, and its table predicts it; what cannot run is a result saying why."""
    flow = Workflow(tmp_path)
    shutil.copytree(EXAMPLE, tmp_path / "examples/your_model")
    flow.shell("python examples/your_model/make_tokens.py tokens.bin --tokens 40000")
    setups = {  # every set-up for one model at least; each architecture under one or two
        # FSDP2, and FSDP2 split by the tensor-parallel plan transformers publishes for Qwen2
        "qwen2": [{"strategy": "fsdp"}, {"strategy": "fsdp", "tp": 2, "gpus": 2}],
        "gpt-neox": [{"framework": "hf_trainer", "strategy": "zero3"}],
        "phi3": [{"strategy": "fsdp", "emulate": True, "gpus": 4}],
        "mine": [{"strategy": "ddp"}, {"framework": "deepspeed", "strategy": "zero2"},
                 {"strategy": "fsdp", "tp": 2, "gpus": 2}],
    }
    include = [{"model": model, **setup} for model, chosen in setups.items() for setup in chosen]
    study = {"description": "your models", "settings": {
        "device": "cpu", "gpus": 2, "seq_len": 32, "micro_batch": 4, "warmup_steps": 2, "timed_steps": 16,
        "lr": 3e-3, "tokens": "tokens.bin"}, "include": include, "timing": dict(FAST_TIMING),
        "execution": {"runtime_min": 5, "cpus_per_rank": 1, "mem_mb_per_rank": 2000, "retries": 0}}
    models = {name: {"hf": config} for name, config in ARCHITECTURES.items()}
    models["mine"] = copy.deepcopy(FACTORY)
    flow.write_config({"default_studies": {"without_gpus": ["mine"]}, "models": models,
                       "studies": {"mine": study}})
    flow.snakemake("results/tables/mine.md", timeout=1500)

    docs = {p.parent.name: json.loads(p.read_text())
            for p in tmp_path.glob("results/runs/mine/*/metrics.json")}
    assert len(docs) == len(include)
    unsupported = [d for d in docs.values() if d["status"] == "unsupported"]
    # a factory's model without a tensor-parallel plan: a result saying why
    assert [(d["params"]["model"], d["params"]["tp"]) for d in unsupported] == [("mine", 2)]
    assert "no tensor-parallel plan: a factory's model splits by the tp_plan" in unsupported[0]["reason"]
    trained = [d for d in docs.values() if d["status"] != "unsupported"]
    assert all(d["status"] == "ok" for d in trained), [(d["cell_id"], d["reason"]) for d in trained]
    for doc in trained:
        m = doc["metrics"]
        # it learns the phrases: the loss falls well below its start (an emulated rank steps alone, on its
        # own gradients: it falls too)
        fall = 1.0 if doc["params"]["emulate"] else 0.85
        assert m["loss_last"] < fall * m["loss_first"], (doc["cell_id"], m["loss_first"], m["loss_last"])
        assert doc["model"]["facts"]["n_blocks"] == 2 and doc["model"]["tokens"]["bytes"] == 80000
        assert doc["predicted"]["host_mem_mib"] > 0
    assert {d["params"]["framework"] for d in trained} == {"torch", "deepspeed", "hf_trainer"}
    # split by the plan transformers publishes for Qwen2: attention and the MLP in every block, and the
    # LM head (Qwen2's is not tied); rank 0 holds what the memory model says it does
    split = next(d for d in trained if d["params"]["tp"] == 2)
    ran = json.loads((tmp_path / "results/runs/mine" / split["cell_id"] / "torch_config.json").read_text())
    layers = ran["tensor_parallel"]["layers"]
    assert layers["lm_head"] == "colwise_gather_output"
    assert layers["model.layers.1.mlp.down_proj"] == "rowwise"
    assert len(layers) == 2 * 7 + 1
    load_checked(tmp_path / "config.yaml")  # the models registered and counted, as the workflow does
    held = sum(split["metrics"]["params_per_module_rank0"].values())
    psi = shard_params(CellParams.from_dict(split["params"]), registry.get_model("qwen2"))
    assert held == psi < split["metrics"]["params_total"]
    table = (tmp_path / "results/tables/mine.all.md").read_text()  # every column of every cell
    assert "predicted host mem" in table and "unsupported" in table
    facts = json.loads((tmp_path / "results/models/qwen2.json").read_text())
    assert facts["facts"]["block_class"] == "Qwen2DecoderLayer"
    assert facts["traces"]  # traced for the predictions
    # the two commands in this process (the command line's own main), where the models are imported
    # already: as processes, each imports transformers' modeling code again to read Qwen2's plan (7-9 s).
    # tests/test_readme.py runs both as the commands a user types.
    from trainbench.cli import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["models"]) == 0
    listed = capsys.readouterr().out
    assert "phi3" in listed and "[defined in config.yaml]" in listed
    assert main(["predict", "mine", "--gpu", "h200", "--gpus-per-node", "8", "--host-mem-gib", "512"]) == 0
    predicted = capsys.readouterr().out
    assert predicted.count("\nmine,") == len(include)
