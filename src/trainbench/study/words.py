"""A cell's parameters in words, as plots and their legends name cells: every parameter of CellParams
(and the values derived beside them) has its entry in WORDS, the one place that says how its values
read ("DDP buckets of 100 MiB", "4 CPU ranks", "weights kept across micro batches"); a strategy reads
as its framework's registry names it (registry.frameworks.strategy_label: "ZeRO-3", "FSDP2"), and a
framework as the registry does (framework_label: "DeepSpeed").

A value says something when set: a switch on, a number, a name; a switch off or an option left unset
says nothing (`value_label` gives ""), unless a cell's label would otherwise be empty (`unset_label`:
"not emulated", "whole GPU").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainbench.registry.frameworks import framework_label, strategy_label
from trainbench.study.params import PARAMS_BY_NAME


def _elements(count: int) -> str:
    """A bucket's elements in short words, to 3 digits: 500M, 1.05M, 590k."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= factor:
            return f"{count / factor:.3g}{suffix}"
    return f"{count:g}"


@dataclass(frozen=True)
class Said:
    """How one parameter's values read. `value`: a set value, a format of it ("TP {}") or a function;
    `count`: what a number counts (singular, plural); `choices`: a named value in words; `on` and `off`:
    a switch (off "" says nothing; None: "no <on>"); `unset`: the option left null."""
    value: str | Callable[[Any], str] = "{}"
    count: tuple[str, str] | None = None
    choices: dict[Any, str] = field(default_factory=dict)
    on: str = ""
    off: str | None = None
    unset: str = ""


WORDS: dict[str, Said] = {
    "framework": Said(),  # the registry's name of it (framework_label)
    "strategy": Said(),  # the registry's name of it (strategy_label)
    "model": Said(),
    "model_definition": Said(value="as defined in the config"),
    "head": Said(choices={"lm": "LM head", "classifier": "classifier head"}),
    "num_classes": Said(count=("class", "classes")),
    "seq_len": Said(value="seq. {}", unset="model's context"),
    "precision": Said(),
    "tf32": Said(on="TF32"),
    "device": Said(choices={"cuda": "GPUs", "cpu": "CPU ranks"}),
    "nodes": Said(count=("node", "nodes")),
    "gpus": Said(count=("GPU", "GPUs")),  # "CPU rank(s)" where the cell's device is cpu
    "tp": Said(value="TP {}"),
    "pp": Said(value="PP {}"),
    "micro_batch": Said(value="micro-batch {}"),
    "grad_accum": Said(value="accum. {}"),
    "offload_optimizer": Said(on="optim. offload"),
    "offload_param": Said(on="param offload"),
    "pin_memory": Said(on="pinned memory", off="unpinned memory"),
    "tuning": Said(choices={"best": "best practice", "framework": "framework defaults"}),
    "overlap_comm": Said(on="comm overlap"),
    "contiguous_gradients": Said(on="contiguous gradients"),
    "reduce_bucket_size": Said(value=lambda v: f"reduce buckets of {_elements(v)}"),
    "allgather_bucket_size": Said(value=lambda v: f"all-gather buckets of {_elements(v)}"),
    "prefetch_bucket_size": Said(value=lambda v: f"prefetch of {_elements(v)}"),
    "activation_checkpointing": Said(on="act. ckpt"),
    "checkpoint_in_cpu": Said(on="checkpoints in CPU"),
    "attention": Said(choices={"sdpa": "SDPA attention", "flash": "flash attention",
                               "cudnn": "cuDNN attention", "efficient": "mem-efficient attention",
                               "eager": "eager attention"}),
    "vocab_multiple": Said(value="vocab ×{}"),
    "emulate": Said(on="emulated", off="not emulated"),
    "emulate_rank": Said(value="as rank {}"),
    "gpu_mem_limit_gib": Said(value="{:g} GiB cap", unset="whole GPU"),
    "float8": Said(value="float8 {}", unset="no float8"),
    "float8_all_gather": Said(on="float8 all-gather"),
    "fsdp_reshard": Said(choices={"after_forward": "weights freed after each forward",
                                  "after_backward": "weights kept to the backward",
                                  "after_step": "weights kept across micro batches"},
                         unset="weights freed after each forward"),
    "ddp_compile": Said(choices={"wrapper": "compiled around DDP", "blocks": "blocks compiled inside DDP"}),
    "ddp_bucket_cap_mb": Said(value="buckets of {} MiB", unset="buckets of 25 MiB"),
    "ddp_bucket_view": Said(on="gradients as bucket views"),
    "ddp_static_graph": Said(on="static graph"),
    "gc_every": Said(value="GC every {} steps", unset="automatic GC"),
    "ort": Said(on="ORT"),
    "compile": Said(on="compiled", off="not compiled"),
    "lr": Said(value="lr {:g}"),
    "weight_decay": Said(value="w. decay {:g}"),
    "warmup_steps": Said(count=("warm-up step", "warm-up steps")),
    "timed_steps": Said(count=("timed step", "timed steps")),
    "dataset_size": Said(value="{:,} samples"),
    "epochs": Said(count=("epoch", "epochs")),
    "launcher": Said(value="{} launcher"),
    "seed": Said(value="seed {}"),
    "deterministic": Said(on="deterministic", off="not deterministic"),
    "tokens": Said(value="tokens of {}", unset="synthetic tokens"),
    "tokens_dtype": Said(value="{} tokens"),
    "dataset_path": Said(value="dataset {}", unset="synthetic data"),
    "pretrained_path": Said(value="weights of {}", unset="random weights"),
    "inject_oom_at_step": Said(value="OOM injected at step {}"),
    # derived beside the parameters (study.params.DERIVED)
    "dp": Said(value="DP {}"),
    "gpus_per_node": Said(count=("GPU per node", "GPUs per node")),
    "global_batch": Said(value="batch {}"),
}

# what a GPU count is called where the cell's ranks are CPU processes
CPU_COUNT = {"gpus": ("CPU rank", "CPU ranks"), "gpus_per_node": ("CPU rank per node", "CPU ranks per node")}


def on_cpu(params: dict[str, Any] | None) -> bool:
    return (params or {}).get("device") == "cpu"


def value_label(key: str, value: Any, params: dict[str, Any] | None = None) -> str:
    """A cell's value of one key in short words (`params`, the cell's parameters, give the context a
    value needs: the framework that names a strategy, the device that says what a rank is): names as
    they are (bf16), numbers with what they count (4 GPUs, TP 2), switches by what they turn on when
    on and not at all when off, unset options not at all."""
    if value is None or value is False:
        return ""
    if key == "framework":
        return framework_label(value)
    if key == "strategy":
        return strategy_label((params or {}).get("framework") or PARAMS_BY_NAME["framework"].default, value)
    said = WORDS.get(key)
    if said is None:  # a key of a newer result than these words: readable, if not in words
        return f"{key.replace('_', ' ')} {value}"
    if value is True:
        return said.on or key.replace("_", " ")
    if said.count:
        one, many = CPU_COUNT[key] if key in CPU_COUNT and on_cpu(params) else said.count
        return f"{value:g} {one if value == 1 else many}"
    if value in said.choices:
        return said.choices[value]
    return said.value(value) if callable(said.value) else said.value.format(value)


def unset_label(key: str, value: Any) -> str:
    """What a switch off, or an option left unset, means, for a cell whose label would say nothing
    else ("" where it means nothing worth saying)."""
    said = WORDS.get(key, Said())
    if value is None:
        return said.unset
    if value is False:
        return said.off if said.off is not None else f"no {said.on or key.replace('_', ' ')}"
    return ""


def words(params: dict[str, Any], keys: list[str]) -> list[str]:
    """The cell's values of `keys` in words; where every one is off or unset, what that means."""
    said = [value_label(k, params.get(k), params) for k in keys]
    return [w for w in said if w] or [w for w in (unset_label(k, params.get(k)) for k in keys) if w]


def said(params: dict[str, Any], keys: list[str]) -> list[str]:
    """The cell's values of `keys` that say something (switches on, options set), in words."""
    return [w for w in (value_label(k, params.get(k), params) for k in keys) if w]
