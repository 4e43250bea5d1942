"""A user's own models: config.yaml's `models` map (or a study file's), checked and registered by name.

Two kinds of entry:

- a transformers architecture: `hf_config: PATH` (a config.json, relative to the folder of config.yaml)
  or the same keys inline under `hf:`; built by AutoModelForCausalLM.from_config with random weights.
  `block` names the repeated layer class where the model's `_no_split_modules` does not.
- a module of the user's: `factory: "module:function"` returning a torch.nn.Module (called with `args`),
  whose forward(input_ids, labels=None) returns the mean loss when labels are given; `block` names the
  class repeated in it, `vocab_size` and `max_seq` what its tokens may be.

Either may give a `tp_plan` (module paths to tensor-parallel styles, as transformers writes its plans):
how tensor parallelism splits it. A transformers architecture without one splits by the plan
transformers publishes for it.

Here the entries are checked as data (keys, files, types) and each becomes a ModelSpec whose
`definition` is the canonical JSON a cell's `model_definition` carries: the config's keys themselves,
not the file's path, so that editing a config.json reruns the cells of its model. What needs torch
(importing the factory, building the model, finding its blocks, counting it) is
trainbench.training.user_models's, which the workflow calls once the config has loaded.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from trainbench.errors import ConfigError
from trainbench.registry.models import MODELS, TP_STYLES, ModelSpec

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
BLOCK = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")

# transformers configs name their sizes in a few ways (GPT-2's n_embd, Falcon's n_layer, ...)
HF_KEYS = {
    "d_model": ("hidden_size", "n_embd", "d_model", "dim"),
    "n_layer": ("num_hidden_layers", "n_layer", "num_layers"),
    "n_head": ("num_attention_heads", "n_head", "num_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim"),
    "max_seq": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "context_length"),
}
ENTRY_KEYS = ("hf_config", "hf", "factory", "args", "block", "vocab_size", "max_seq", "tp_plan",
              "description")
MODULE_PATH = re.compile(r"^[A-Za-z0-9_*]+(\.[A-Za-z0-9_*]+)*$")


def _first(config: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((config[n] for n in names if isinstance(config.get(n), int) and config[n] > 0), None)


def text_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys that describe a config's language model: its own, or, where it nests the text model
    (Gemma 3, Llama 4, Qwen3.5 and other multimodal configs), those of its `text_config` over them."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def default_vocab_size(model_type: str) -> int | None:
    """The vocabulary transformers gives a model_type's config by default (its text model's), for a
    config that leaves it out; None where transformers does not know the type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return None
    default = CONFIG_MAPPING[model_type]()
    vocab = getattr(default.get_text_config(), "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def _hf_entry(name: str, entry: dict[str, Any], base: Path, problems: list[str]) -> dict[str, Any] | None:
    where = f"models.{name}"
    if "hf_config" in entry:
        path = Path(entry["hf_config"])
        path = path if path.is_absolute() else base / path
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            problems.append(f"{where}.hf_config: no such file: {path}")
            return None
        try:
            config = json.loads(path.read_text())
        except ValueError as error:
            problems.append(f"{where}.hf_config: {path} is not JSON: {error}")
            return None
    else:
        config = entry["hf"]
    if not isinstance(config, dict):
        problems.append(f"{where}: a transformers config is a mapping of its keys, not {config!r}"[:200])
        return None
    if not isinstance(config.get("model_type"), str):
        key = "hf_config" if "hf_config" in entry else "hf"
        problems.append(f"{where}.{key}: gives no model_type (transformers' name of the architecture, "
                        "e.g. 'qwen2')")
        return None
    vocab = text_keys(config).get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        problems.append(f"{where}: vocab_size {vocab!r} is not a positive integer")
        return None
    if vocab is None and default_vocab_size(config["model_type"]) is None:
        problems.append(f"{where}: the config gives no vocab_size, and transformers has no default for "
                        f"model_type {config['model_type']!r}")
        return None
    return config


def parse_models(raw: dict[str, Any] | None, base: Path) -> dict[str, ModelSpec]:
    """The `models` map as specs (not yet counted), or a ConfigError naming each bad entry and key."""
    problems: list[str] = []
    specs: dict[str, ModelSpec] = {}
    for name, entry in (raw or {}).items():
        where = f"models.{name}"
        if not MODEL_NAME.match(str(name)):
            problems.append(f"{where}: model names use letters, digits, '_', '.' and '-' only")
            continue
        if name in MODELS:
            problems.append(f"{where}: the registry already has a model of that name (`trainbench models`); "
                            "give yours another")
            continue
        kinds = [k for k in ("hf_config", "hf", "factory") if k in entry]
        if len(kinds) != 1:
            problems.append(f"{where}: give one of hf_config (a config.json), hf (its keys inline) or "
                            f"factory ('module:function'), not {' and '.join(kinds) or 'none'}")
            continue
        block = entry.get("block")
        if block is not None and not (isinstance(block, str) and BLOCK.match(block)):
            problems.append(f"{where}.block: {block!r} is not a class name (e.g. 'Qwen2DecoderLayer' or "
                            "'mypkg.model.Block')")
            continue
        if not _tp_plan_ok(where, entry.get("tp_plan"), problems):
            continue
        if kinds[0] == "factory":
            spec = _factory_spec(name, entry, problems)
            spec = spec and dataclasses.replace(spec, source_dir=str(Path(base).resolve()))
        else:
            spec = _hf_spec(name, entry, base, problems)
        if spec is not None:
            specs[name] = spec
    if problems:
        raise ConfigError(problems)
    return specs


def _tp_plan_ok(where: str, plan: Any, problems: list[str]) -> bool:
    if plan is None:
        return True
    if not isinstance(plan, dict) or not plan:
        problems.append(f"{where}.tp_plan: a mapping of module paths to styles (e.g. "
                        f"'layers.*.mlp.up_proj: colwise'), not {plan!r}"[:200])
        return False
    for path, style in plan.items():
        if not (isinstance(path, str) and MODULE_PATH.match(path)):
            problems.append(f"{where}.tp_plan: {path!r} is not a module path ('*' stands for one part)")
            return False
        if style not in TP_STYLES:
            problems.append(f"{where}.tp_plan.{path}: {style!r} is not a style; known: "
                            f"{', '.join(TP_STYLES)}")
            return False
    return True


def _with_plan(definition: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    # only where given: a definition without one keeps the JSON (and its cells' ids) it had
    return {**definition, "tp_plan": entry["tp_plan"]} if entry.get("tp_plan") else definition


def _hf_spec(name: str, entry: dict[str, Any], base: Path, problems: list[str]) -> ModelSpec | None:
    config = _hf_entry(name, entry, base, problems)
    if config is None:
        return None
    for key in ("vocab_size", "max_seq", "args"):
        if key in entry:
            problems.append(f"models.{name}.{key}: a transformers model takes it from its config; "
                            f"`{key}` is for a factory's model")
            return None
    definition = _with_plan({"kind": "hf", "config": config, "block": entry.get("block")}, entry)
    return spec_from_definition(name, definition, entry.get("description"))


def spec_from_definition(name: str, definition: dict[str, Any], note: str | None = None) -> ModelSpec:
    """A model's spec from its definition (as a cell's `model_definition` carries it), not yet counted:
    what the definition says of its shape; the rest comes from counting the model."""
    if definition["kind"] == "factory":
        return ModelSpec(name, "custom", 0, 0, 1, definition["vocab_size"], definition["max_seq"],
                         learned_positions=False, block_class=definition["block"].rsplit(".", 1)[-1],
                         note=note or definition["factory"], definition=canonical(definition))
    config = text_keys(definition["config"])
    sizes = {field: _first(config, names) for field, names in HF_KEYS.items()}
    vocab = config.get("vocab_size") or default_vocab_size(definition["config"]["model_type"])
    return ModelSpec(
        name, "custom", sizes["n_layer"] or 0, sizes["d_model"] or 0, sizes["n_head"] or 1,
        vocab, sizes["max_seq"] or 2048, ffn_hidden=sizes["ffn_hidden"] or 0,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)), learned_positions=False,
        block_class=definition.get("block") or "", note=note or f"transformers {config['model_type']}",
        definition=canonical(definition))


def _factory_spec(name: str, entry: dict[str, Any], problems: list[str]) -> ModelSpec | None:
    where = f"models.{name}"
    factory = entry["factory"]
    if not (isinstance(factory, str) and FACTORY.match(factory)):
        problems.append(f"{where}.factory: {factory!r} is not 'module:function' (e.g. "
                        "'my_models.tiny:build', importable from the folder of config.yaml)")
        return None
    for key in ("block", "vocab_size", "max_seq"):
        if entry.get(key) is None:
            what = {"block": "the class repeated in the model (e.g. 'my_models.tiny.Block')",
                    "vocab_size": "the tokens its embedding takes", "max_seq": "its longest sequence"}[key]
            problems.append(f"{where}.{key}: a factory's model needs it: {what}")
            return None
    for key in ("vocab_size", "max_seq"):
        if not isinstance(entry[key], int) or isinstance(entry[key], bool) or entry[key] < 1:
            problems.append(f"{where}.{key}: {entry[key]!r} is not a positive integer")
            return None
    args = entry.get("args") or {}
    if not isinstance(args, dict):
        problems.append(f"{where}.args: the factory's keyword arguments are a mapping, not {args!r}"[:200])
        return None
    definition = _with_plan({"kind": "factory", "factory": factory, "args": args, "block": entry["block"],
                             "vocab_size": entry["vocab_size"], "max_seq": entry["max_seq"]}, entry)
    return spec_from_definition(name, definition, entry.get("description"))


def canonical(definition: dict[str, Any]) -> str:
    return json.dumps(definition, sort_keys=True, separators=(",", ":"))


def definition_of(spec: ModelSpec) -> dict[str, Any]:
    return json.loads(spec.definition)


def summary(spec: ModelSpec) -> str:
    """What `trainbench models` shows of a model: its shape (layers, width, heads, context) and what it
    is. A model of the config's shows only what is known of it, never the placeholders its spec holds
    until it is counted: a transformers config names its heads, a factory's module does not (so its
    line names the factory and its block instead), and layers and width are counted from the model."""
    if not spec.user_defined:
        return f"L={spec.n_layer} d={spec.d_model} h={spec.n_head} ctx={spec.max_seq}  {spec.note}"
    definition = definition_of(spec)
    counted = spec.facts is not None
    shape = [f"L={spec.n_layer}"] if counted or spec.n_layer else []
    shape += [f"d={spec.d_model}"] if counted or spec.d_model else []
    if definition["kind"] == "hf":
        heads = _first(definition["config"], HF_KEYS["n_head"])
        shape += [f"h={heads}"] if heads else []
        what = spec.note
    else:
        factory = f"factory {definition['factory']}, block {definition['block']}"
        what = factory if spec.note == definition["factory"] else f"{spec.note}; {factory}"
    if not counted:
        what += "; layers and width counted when a cell uses it"
    return " ".join([*shape, f"ctx={spec.max_seq}"]) + f"  {what}"

