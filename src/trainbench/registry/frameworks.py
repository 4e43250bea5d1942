"""The frameworks trainbench runs, and every fact the package knows about each: one Framework per
runner, registered here in one line. The config schema's choices, the cell checks, `trainbench
strategies` and `models`, the memory and time models and the worker all read REGISTRY; no other module
names a framework or parses a strategy's name (tests/test_frameworks.py scans the package for one).

A framework says how to build its runner (imported only when a cell runs), which model families that
runner builds, its strategies with their structured attributes (memory layout, ZeRO stage, what they
offload, whether they split the model), the few memory facts and time-model facts that belong to it
(`MemoryFacts`, `TimeFacts`), and which model families it compiles.

Two kinds of answer come out of `check`: a user mistake (offload on DDP, `single` on 4 GPUs), which
is a config error naming the key; and a fact about the software stack (Lightning has no ColossalAI
strategy any more), which makes the cell a result of status `unsupported` with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from trainbench.registry.models import TP_STYLES, ModelSpec, known_models, tensor_parallel_plan


class CellParams(Protocol):
    """What the registry reads of a cell's parameters (study.params.CellParams has them all): the
    registry sits below the study stage that defines cells, and names none of its types."""

    framework: str
    strategy: str
    model: str
    head: str
    float8: str | None
    model_definition: str
    device: str
    launcher: str
    gpus: int
    nodes: int
    tp: int
    pp: int
    offload_optimizer: bool
    offload_param: bool
    checkpoint_in_cpu: bool
    deterministic: bool
    ort: bool

# whether a strategy offloads: never, if the cell asks, itself
NO, OPTIONAL, ALWAYS = "no", "optional", "always"
# parameters only some runners read: a cell that sets one for a runner that ignores it is refused
OPTIONAL_SETTINGS = ("overlap_comm", "dataset_path", "pretrained_path", "float8", "fsdp_reshard",
                     "ddp_compile", "ddp_bucket_cap_mb", "contiguous_gradients", "reduce_bucket_size",
                     "allgather_bucket_size", "prefetch_bucket_size")
# switches (off by default) only some runners honour: a cell may turn one on only for those
OPTIONAL_SWITCHES = ("checkpoint_in_cpu", "float8_all_gather", "ddp_bucket_view", "ddp_static_graph",
                     "deterministic")


@dataclass(frozen=True)
class TensorParallel:
    """How a strategy splits a model over its tensor-parallel ranks (tp > 1): what the memory and
    time models need to know of it. Both put the blocks in Megatron's layout (qkv and the MLP's
    first layer column-parallel, the output projections row-parallel, the residual stream and the
    norms whole on every rank)."""

    name: str
    description: str
    builds_whole_model: bool  # each GPU first builds every fp32 weight, then splits the blocks
    vocab_parallel: bool  # the token embedding and the tied LM head split over the vocabulary


# DeepSpeed AutoTP: splits a model built whole; the embeddings and the tied LM head stay whole
AUTOTP = TensorParallel(
    "autotp", "DeepSpeed AutoTP: the model built whole on each GPU, then its blocks split; embeddings "
    "and the tied LM head whole on every rank", builds_whole_model=True, vocab_parallel=False)
# PyTorch DTensor tensor parallel under FSDP2 on a 2-D mesh (trainbench.training.tensor_parallel)
SHARDED_TP = TensorParallel(
    "sharded", "PyTorch DTensor tensor parallel on the meta device, each rank building only its "
    "shard; vocabulary-parallel embedding and LM head (loss_parallel)", builds_whole_model=False,
    vocab_parallel=True)


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    # where model states live: replicated, fsdp (sharded units), zero (ZeRO stages)
    layout: str = "replicated"
    zero_stage: int | None = None
    # NO, OPTIONAL (the cell's offload_optimizer says), ALWAYS (the strategy does)
    offload_optimizer: str = NO
    offload_param: str = NO
    tensor_parallel: TensorParallel | None = None  # accepts tp > 1, split this way
    pipeline_parallel: bool = False  # accepts pp > 1
    single_rank: bool = False  # exactly one rank
    unsupported: str | None = None  # the stack cannot run it at all
    needs_cuda: str | None = None  # why it cannot run on CPU ranks, if it cannot
    wrapper: str | None = None  # the class a framework that owns its loop must wrap the model in
    label: str = ""  # how plots and legends name it ("ZeRO-3", "FSDP2"); "": its name


@dataclass(frozen=True)
class MemoryFacts:
    """What the memory model needs to know of a framework beyond its strategies' layouts."""

    host_extra_mib: dict[str, float] = field(default_factory=lambda: {"cpu": 0.0, "cuda": 0.0})  # per rank
    reduce_bucket_elements: Callable[[ModelSpec], float] = lambda spec: 5e8  # DeepSpeed's default bucket
    # accumulating without synchronising (FSDP1's no_sync, FSDP2's set_requires_gradient_sync) keeps
    # every unit's unsharded gradient
    fsdp_accumulates_unsharded: bool = False
    # FSDP's mixed precision casts the parameters: the whole model computes in half precision, the
    # residual stream included (no autocast keeping it fp32)
    fsdp_casts_parameters: bool = False
    # The loop frees the gradients after each optimizer step (zero_grad(set_to_none=True)): without
    # accumulation, a replicated model's gradients are made in backward as its activations are freed
    replicated_gradients_freed: bool = False
    eager_attention_when_deterministic: bool = False  # deterministic runs use eager attention (s x s scores)
    # The bytes per element FSDP reduce-scatters gradients in, where its mixed precision reduces in another
    # dtype than it computes (torch's FSDP2 here: MixedPrecisionPolicy(reduce_dtype=float32)); None: the
    # compute dtype. The time model reads it too: the bytes of the reduce-scatter
    fsdp_reduce_bytes: int | None = None


@dataclass(frozen=True)
class TimeFacts:
    """What the time model (trainbench.predict.time_model) needs to know of a framework beyond its
    strategies' layouts."""

    # The starting value, in seconds, of the fixed cost per step of the framework's own training loop:
    # a constant of the time model, fitted as `Constants.step_s[<the framework's name>]` (the fitted
    # values in time_model_constants.json are keyed by name). None: the framework adds no loop of its
    # own to the step (the DeepSpeed runner: its fixed cost is the engine's, by ZeRO stage)
    loop_step_s: float | None = 0.02
    # Its DeepSpeed config overlaps ZeRO's gradient reduction with backward at every stage where a
    # cell leaves overlap_comm unset (Lightning's DeepSpeedStrategy sets overlap_comm=True); False:
    # DeepSpeed's default, overlapped at stage 3 only
    zero_overlaps_comm: bool = False
    # Whether that loop cost recurs every micro batch rather than once a step: the Hugging Face
    # Trainer runs its training_step (inputs prepared, accelerate's backward, its accumulation context)
    # for each micro batch. Its profiles: 169 ms idle a step at 2 micro batches (LLaMA-1.3B), 927 ms at
    # 8 (one emulated rank of LLaMA-7B), 85 and 116 ms a micro batch
    loop_per_micro_batch: bool = False
    # What its timed windows hold besides the step, where they hold more (said beside its cells' errors
    # by `trainbench check-models time`; the fit absorbs it in the loop's fixed cost)
    window_holds: str = ""


@dataclass(frozen=True)
class Practice:
    """One setting of a framework's best practice: what a cell of `tuning: best` (the default) runs with
    where it leaves the key out. `why` is what the documentation and `trainbench strategies` say of it:
    the framework's guidance and what it measured on one host."""

    key: str
    value: object
    why: str
    strategies: tuple[str, ...] = ()  # the strategies it applies to; (): every strategy
    ranks: int = 1  # the fewest ranks it applies to: 2 for settings of a collective
    accumulating: bool = False  # only where micro batches accumulate (grad_accum > 1)

    def applies(self, strategy: str, gpus: int, grad_accum: int) -> bool:
        return ((not self.strategies or strategy in self.strategies) and gpus >= self.ranks
                and (grad_accum > 1 or not self.accumulating))


# the settings more than one framework's practice holds
GC_EVERY = Practice("gc_every", 50, "torchtitan's gc_freq: automatic collection off, a generation-1 "
                    "collection every 50th step (FSDP2 350M on 4 H200s: 99.6% scaling, not 92.7%; one-GPU "
                    "cells unchanged within their intervals)")
DDP_BUCKETS = Practice("ddp_bucket_cap_mb", 100, "fewer, larger all-reduces (GPT-2 124M on 2 H200s: "
                       "98.1-98.3% scaling, 97.6% at DDP's 25 MiB)", strategies=("ddp",), ranks=2)
DDP_BUCKET_VIEW = Practice("ddp_bucket_view", True, "torch's advice: gradients live in the buckets, no "
                           "copy after backward and one gradient-sized buffer less", strategies=("ddp",),
                           ranks=2)


@dataclass(frozen=True)
class Framework:
    name: str
    description: str
    runner: str  # "module:Class", imported when a cell runs
    families: tuple[str, ...]  # model families its runner builds (others: planning only)
    strategies: tuple[Strategy, ...]
    memory: MemoryFacts = MemoryFacts()
    honours: tuple[str, ...] = ()  # optional parameters its runner reads (others must stay unset)
    launchers: tuple[str, ...] = ("python", "torchrun")  # how its ranks may start
    time: TimeFacts = TimeFacts()
    # model families whose blocks its runner torch.compiles where a cell sets compile; others ignore the
    # setting. Inductor's backward saves fewer tensors: the memory and time models count that for
    # trainbench's GPT (memory_model._block_tensors), any other family as if uncompiled
    compiles: tuple[str, ...] = ()
    # what `tuning: best` gives a cell that leaves these keys out (`tuning: framework`: the framework's
    # own defaults); every key is one the runner honours
    best_practice: tuple[Practice, ...] = ()
    label: str = ""  # how plots name it ("DeepSpeed"); "": its name

    def strategy(self, name: str) -> Strategy | None:
        return next((s for s in self.strategies if s.name == name), None)


REGISTRY: dict[str, Framework] = {}  # read it through registry(), which loads the plugins first


def register(framework: Framework) -> Framework:
    REGISTRY[framework.name] = framework
    return framework


def registry() -> dict[str, Framework]:
    """Every framework: the ones below, and those of the modules TRAINBENCH_PLUGINS names."""
    if not _plugins_settled:
        _load_plugins()
    return REGISTRY


def best_practice(framework: str, strategy: str, gpus: int, grad_accum: int) -> dict[str, object]:
    """The settings `tuning: best` gives a cell of this framework and strategy (each unless the cell
    gives the key itself); nothing for a framework or strategy the registry does not know, which the
    cell's checks report."""
    known = registry().get(framework)
    chosen = known.strategy(strategy) if known else None
    if chosen is None or chosen.unsupported:
        return {}
    return {p.key: p.value for p in known.best_practice if p.applies(strategy, gpus, grad_accum)}


def framework_label(framework: str) -> str:
    """How plots name a framework ("DeepSpeed"): its registry label, or its name."""
    found = registry().get(framework)
    return (found.label if found else "") or framework


def strategy_label(framework: str, strategy: str) -> str:
    """How plots name a framework's strategy ("FSDP2", "ZeRO-3"): its registry label, or its name where
    the registry has none or knows no such framework or strategy."""
    found = registry().get(framework)
    known = found.strategy(strategy) if found else None
    return (known.label if known else "") or strategy


def framework_of(params: CellParams) -> Framework:
    return registry()[params.framework]


def strategy_of(params: CellParams) -> Strategy:
    strategy = framework_of(params).strategy(params.strategy)
    if strategy is None:
        raise KeyError(f"{params.framework} has no strategy {params.strategy!r}")
    return strategy


def offloads(params: CellParams) -> tuple[bool, bool]:
    """(optimizer offloaded, parameters offloaded): the strategy's own, or the cell's where it may choose."""
    strategy = strategy_of(params)
    return ((strategy.offload_optimizer == ALWAYS or (strategy.offload_optimizer == OPTIONAL
                                                      and bool(params.offload_optimizer))),
            (strategy.offload_param == ALWAYS or (strategy.offload_param == OPTIONAL
                                                  and bool(params.offload_param))))


def zero_overlaps_comm(params: CellParams) -> bool:
    """Whether a DeepSpeed ZeRO cell reduces its gradients during backward (overlap_comm): the cell's
    setting, else DeepSpeed's default (stage 3 only) or its framework's config (TimeFacts)."""
    if params.overlap_comm is not None:
        return params.overlap_comm
    return strategy_of(params).zero_stage == 3 or framework_of(params).time.zero_overlaps_comm


# Settings that configure one strategy's wrapper, by that strategy's name: another strategy would ignore them
STRATEGY_SETTINGS = {"fsdp_reshard": "fsdp", "float8_all_gather": "fsdp", **dict.fromkeys(
    ("ddp_compile", "ddp_bucket_cap_mb", "ddp_bucket_view", "ddp_static_graph"), "ddp")}
# DeepSpeed's ZeRO settings, and the stages whose optimizer reads each (stage 0 reduces gradients in
# the engine, not in a ZeRO optimizer)
ZERO_SETTING_STAGES = {"contiguous_gradients": (1, 2, 3), "reduce_bucket_size": (1, 2, 3),
                       "allgather_bucket_size": (1, 2), "prefetch_bucket_size": (3,)}


def configures_another_strategy(params: CellParams, key: str) -> str | None:
    """The strategy a setting the cell gives configures (STRATEGY_SETTINGS), where the cell's strategy is
    another; None where the setting is unset or the cell's strategy is the one."""
    owner = STRATEGY_SETTINGS[key]
    return owner if getattr(params, key) and params.strategy != owner else None


def zero_settings_unread(params: CellParams) -> tuple[int | None, dict[str, tuple[int, ...]]]:
    """The cell's ZeRO stage (None: not a ZeRO strategy), and the ZeRO settings it gives that its stage
    never reads, each with the stages that do: DeepSpeed would accept them and ignore them."""
    framework = registry().get(params.framework)
    strategy = framework and framework.strategy(params.strategy)
    stage = getattr(strategy, "zero_stage", None)
    if stage is None:  # not a ZeRO strategy: check() refuses what its runner does not honour
        return None, {}
    return stage, {key: stages for key, stages in ZERO_SETTING_STAGES.items()
                   if getattr(params, key) is not None and stage not in stages}


def deepspeed_ops(params: CellParams) -> tuple[str, ...]:
    """The DeepSpeed ops a cell's ranks compile or load: CPU Adam, with which every framework here steps
    an optimizer offloaded from a GPU (ZeRO-Offload takes no other; a CPU cell steps torch's Adam)."""
    return ("cpu_adam",) if offloads(params)[0] and params.device == "cuda" else ()


# --- the frameworks ------------------------------------------------------------------------------

_LIGHTNING_CUDA_ONLY = "Lightning's FSDP and DeepSpeed strategies refuse a CPU accelerator"
_COLOSSALAI = (
    "Lightning removed its ColossalAI strategy (Lightning-AI/pytorch-lightning#19528, 2024) after the "
    "external lightning-colossalai package was archived; lightning 2.x has no strategy='colossalai'"
)
_HF_FSDP_CUDA_ONLY = ("accelerate runs the Trainer's FSDP only on GPUs; on CPU ranks the Trainer quietly "
                      "trains with DDP instead")
ORT_UNSUPPORTED = (
    "ORTModule needs onnxruntime-training, which is no longer published after 1.19.2, has no build for "
    "Python 3.12+ or current torch (pytorch/ort#199), and was removed from onnxruntime "
    "(microsoft/onnxruntime#28058)"
)
# deepspeed/runtime/pipe/engine.py asserts this when the pipeline engine starts (checked by a test)
PIPELINE_ZERO_UNSUPPORTED = ("DeepSpeed's pipeline engine refuses ZeRO stage 2 and 3: "
                             "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'")


def _lightning_zero(stage: int, offload: bool) -> Strategy:
    name = f"deepspeed_stage_{stage}" + ("_offload" if offload else "")
    return Strategy(name, f"Trainer(strategy={name!r})", layout="zero", zero_stage=stage,
                    offload_optimizer=ALWAYS if offload else NO,
                    offload_param=ALWAYS if offload and stage == 3 else NO, needs_cuda=_LIGHTNING_CUDA_ONLY,
                    label=f"ZeRO-{stage}" + (" offloaded" if offload else ""))


register(Framework(
    "torch", "plain torch: one process, DistributedDataParallel, or FSDP2 (fully_shard)",
    "trainbench.training.runners.torch_native:TorchRunner", ("gpt", "custom"), (
        Strategy("single", "one process, no distributed wrapper", single_rank=True, label="single"),
        Strategy("ddp", "torch DistributedDataParallel", label="DDP"),
        Strategy("fsdp", "torch FSDP2 (fully_shard) of every transformer block, then the root; with tp > 1 "
                 "on a 2-D mesh (data x tensor parallel), the blocks and the vocabulary split by DTensor "
                 "tensor parallel", layout="fsdp", offload_param=OPTIONAL, tensor_parallel=SHARDED_TP,
                 label="FSDP2"),
    ),
    MemoryFacts(fsdp_casts_parameters=True, replicated_gradients_freed=True, fsdp_reduce_bytes=4,
                fsdp_accumulates_unsharded=True),
    honours=("checkpoint_in_cpu", "float8", "float8_all_gather", "fsdp_reshard", "ddp_compile",
             "ddp_bucket_cap_mb", "ddp_bucket_view", "ddp_static_graph"),
    time=TimeFacts(loop_step_s=0.005),
    compiles=("gpt",), label="torch",
    best_practice=(
        GC_EVERY, DDP_BUCKETS, DDP_BUCKET_VIEW,
        Practice("fsdp_reshard", "after_step", "torchtitan's way with accumulation: each block gathered "
                 "once a step, not 2 x grad_accum times (GPT-2 on 2 H200s: 124M 99.6% scaling, not 96.0%; "
                 "350M 98.4%, not 61.5%), at the cost of the whole model's weights unsharded through the "
                 "step, which the memory model counts", strategies=("fsdp",), ranks=2, accumulating=True),
    )))

register(Framework(
    "deepspeed", "the DeepSpeed engine: ZeRO stages 0-3, offload, AutoTP tensor and pipeline parallelism",
    "trainbench.training.runners.deepspeed_engine:DeepSpeedRunner", ("gpt", "custom"), (
        Strategy("zero0", "DeepSpeed engine, ZeRO disabled (data parallel)", layout="zero", zero_stage=0,
                 tensor_parallel=AUTOTP, pipeline_parallel=True, label="ZeRO-0"),
        Strategy("zero1", "DeepSpeed ZeRO stage 1: optimizer states partitioned", layout="zero", zero_stage=1,
                 offload_optimizer=OPTIONAL, tensor_parallel=AUTOTP, pipeline_parallel=True, label="ZeRO-1"),
        Strategy("zero2", "DeepSpeed ZeRO stage 2: optimizer states and gradients partitioned", layout="zero",
                 zero_stage=2, offload_optimizer=OPTIONAL, tensor_parallel=AUTOTP, pipeline_parallel=True,
                 label="ZeRO-2"),
        Strategy("zero3", "DeepSpeed ZeRO stage 3: optimizer states, gradients and parameters partitioned",
                 layout="zero", zero_stage=3, offload_optimizer=OPTIONAL, offload_param=OPTIONAL,
                 tensor_parallel=AUTOTP, pipeline_parallel=True, label="ZeRO-3"),
    ),
    honours=("overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
             "prefetch_bucket_size", "checkpoint_in_cpu"),
    launchers=("python", "torchrun", "deepspeed"), time=TimeFacts(loop_step_s=None),
    # DeepSpeed's own defaults are its guidance, and the best measured: overlap_comm on at ZeRO-1/2 gave
    # 2-5% fewer tokens/s on 2 H200s
    best_practice=(GC_EVERY,), label="DeepSpeed"))

register(Framework(
    "lightning", "Lightning's Trainer with its own strategies (a DistilBERT-sized classifier)",
    "trainbench.training.runners.lightning_trainer:LightningRunner", ("distilbert",), (
        Strategy("single", "Trainer(devices=1)", single_rank=True, label="single"),
        Strategy("ddp", "Trainer(strategy='ddp')", label="DDP"),
        Strategy("fsdp", "Trainer(strategy='fsdp')", layout="fsdp", needs_cuda=_LIGHTNING_CUDA_ONLY,
                 label="FSDP"),
        _lightning_zero(2, False), _lightning_zero(2, True), _lightning_zero(3, False),
        _lightning_zero(3, True),
        Strategy("colossalai", "Trainer(strategy='colossalai')", unsupported=_COLOSSALAI, label="ColossalAI"),
    ),
    # measured on H200 (900 MiB per rank beyond torch's); 250 on CPU ranks is a guess
    MemoryFacts(host_extra_mib={"cpu": 250.0, "cuda": 900.0},
                reduce_bucket_elements=lambda spec: 2e8,  # DeepSpeedStrategy(reduce_bucket_size=2e8)
                fsdp_accumulates_unsharded=True, eager_attention_when_deterministic=True),
    honours=("dataset_path", "pretrained_path", "ddp_bucket_cap_mb", "ddp_bucket_view", "ddp_static_graph",
             "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
             "deterministic"),
    time=TimeFacts(loop_step_s=0.02, zero_overlaps_comm=True,
                   window_holds="what Lightning's loop does between steps"),
    best_practice=(GC_EVERY, DDP_BUCKETS, DDP_BUCKET_VIEW), label="Lightning"))

register(Framework(
    "hf_trainer", "the Hugging Face Trainer (the Alpaca-style LLaMA fine-tuning recipe)",
    "trainbench.training.runners.hf_trainer:HfTrainerRunner", ("llama", "custom"), (
        Strategy("ddp", "Hugging Face Trainer, plain data parallel", wrapper="DistributedDataParallel",
                 label="DDP"),
        Strategy("fsdp", "Trainer fsdp='full_shard auto_wrap' (offload_param adds 'offload')", layout="fsdp",
                 offload_param=OPTIONAL, needs_cuda=_HF_FSDP_CUDA_ONLY, wrapper="FullyShardedDataParallel",
                 label="FSDP"),
        Strategy("zero3", "Trainer with a DeepSpeed ZeRO-3 config", layout="zero", zero_stage=3,
                 offload_optimizer=OPTIONAL, offload_param=OPTIONAL, wrapper="DeepSpeedEngine",
                 label="ZeRO-3"),
    ),
    # measured in tests on CPU ranks (70 MiB); on GPUs taken from Lightning's
    MemoryFacts(host_extra_mib={"cpu": 70.0, "cuda": 900.0},
                reduce_bucket_elements=lambda spec: float(spec.d_model ** 2),  # the Trainer's "auto"
                fsdp_accumulates_unsharded=True),
    honours=("ddp_bucket_cap_mb", "overlap_comm", "contiguous_gradients", "reduce_bucket_size",
             "prefetch_bucket_size"),
    time=TimeFacts(loop_step_s=0.05, loop_per_micro_batch=True,
                   window_holds="the Trainer's loop work between steps"),
    best_practice=(
        GC_EVERY, DDP_BUCKETS,
        Practice("reduce_bucket_size", 500_000_000, "DeepSpeed's default in place of the Trainer's \"auto\" "
                 "(width squared: at ZeRO-3, such buckets cost GPT-2 124M 38% of its tokens/s, 350M 32%)",
                 strategies=("zero3",)),
        Practice("prefetch_bucket_size", 50_000_000, "DeepSpeed's default in place of the Trainer's \"auto\" "
                 "(0.9 x width squared)", strategies=("zero3",)),
    ), label="HF Trainer"))


# --- what the registry says about a cell ---------------------------------------------------------

def _offload_where(params: CellParams, key: str) -> str:
    """Which strategies of the cell's framework take `key` (for the error message)."""
    choosers = [s.name for s in framework_of(params).strategies if getattr(s, key) == OPTIONAL]
    builtin = [s.name for s in framework_of(params).strategies if getattr(s, key) == ALWAYS]
    if choosers:
        return f"{params.framework} strategies {', '.join(choosers)}"
    if builtin:
        return (f"none of {params.framework}'s strategies as a setting: {', '.join(builtin)} offload "
                "by themselves")
    return f"no {params.framework} strategy"


def check(params: CellParams) -> tuple[list[tuple[str, str]], str | None]:
    """Check one cell's framework and strategy keys.

    Returns (errors, unsupported_reason): errors are (key, message) pairs for user mistakes.
    """
    errors: list[tuple[str, str]] = []
    framework, name = registry().get(params.framework), params.strategy
    if framework is None:
        return [("framework",
                 f"{params.framework!r} is not a framework; known: {', '.join(registry())}")], None
    strategy = framework.strategy(name)
    if strategy is None:
        errors.append(("strategy", f"{name!r} is not a {framework.name} strategy; allowed: "
                                   f"{', '.join(s.name for s in framework.strategies)}"))
        return errors, None

    if strategy.single_rank and (params.gpus != 1 or params.nodes != 1):
        errors.append(("gpus", f"strategy {name!r} runs one rank: gpus and nodes must be 1, "
                               f"not gpus={params.gpus}, nodes={params.nodes}"))
    for key in ("offload_optimizer", "offload_param"):
        if getattr(params, key) and getattr(strategy, key) != OPTIONAL:
            errors.append((key, f"means nothing for {framework.name} strategy {name!r}; it applies to "
                                f"{_offload_where(params, key)}"))
    for key, kind, has in (("tp", "tensor", lambda s: s.tensor_parallel is not None),
                           ("pp", "pipeline", lambda s: s.pipeline_parallel)):
        if getattr(params, key) > 1 and not has(strategy):
            splitters = [f"{f.name} {s.name}" for f in registry().values() for s in f.strategies if has(s)]
            errors.append((key, f"{framework.name} strategy {name!r} has no {kind} parallelism; "
                                f"strategies with it: {', '.join(splitters)}"))
    spec = known_models().get(params.model)
    if params.tp > 1 and spec is not None:
        split = _tp_must_divide(spec)
        if any(size % params.tp for size in split.values()):
            errors.append(("tp", "tensor parallelism splits heads and the MLP across ranks: "
                                 f"tp={params.tp} must divide {spec.name}'s "
                                 f"{' and '.join(f'{size} {what}' for what, size in split.items())}"))
    if params.pp > 1 and spec is not None and not spec.user_defined and params.pp > spec.n_layer:
        errors.append(("pp", f"pp={params.pp} stages need at least as many layers; "
                             f"{params.model} has {spec.n_layer}"))
    for key in (*OPTIONAL_SETTINGS, *OPTIONAL_SWITCHES):
        value = getattr(params, key)
        given = bool(value) if key in OPTIONAL_SWITCHES else value is not None
        if given and key not in framework.honours:
            readers = [f.name for f in registry().values() if key in f.honours]
            errors.append((key, f"the {framework.name} runner does not read it (those that do: "
                                f"{', '.join(readers) or 'none'}); leave it "
                                f"{'off' if key in OPTIONAL_SWITCHES else 'null'}"))
    if params.launcher not in ("auto", *framework.launchers):
        errors.append(("launcher", f"{params.launcher!r} does not start {framework.name} runs; "
                                   f"allowed: {', '.join(framework.launchers)}"))
    if params.launcher == "python" and params.gpus > 1:
        errors.append(("launcher", f"'python' starts one process; this cell has {params.gpus} ranks"))
    return errors, unsupported(params)


def _tp_must_divide(spec: ModelSpec) -> dict[str, int]:
    """The sizes tensor parallelism splits, by what they are: the heads and the MLP's width (of a
    transformers model, what its config gives; a factory's model says none, and a size its plan cannot
    split fails where the layer is split)."""
    if not spec.user_defined:
        return {"heads": spec.n_head, "MLP width": spec.ffn}
    definition = json.loads(spec.definition)
    if definition["kind"] != "hf":
        return {}
    config = definition["config"]
    sizes = {"heads": spec.n_head if spec.n_head > 1 else None,
             "key/value heads": config.get("num_key_value_heads"), "MLP width": spec.ffn_hidden or None}
    return {what: size for what, size in sizes.items() if isinstance(size, int) and size > 0}


def unsupported(params: CellParams) -> str | None:
    """Why the stack cannot run this (checked) cell at all, which its result says; None if it can."""
    strategy = strategy_of(params)
    if strategy.unsupported:
        return strategy.unsupported
    if params.pp > 1 and (strategy.zero_stage or 0) >= 2:
        return PIPELINE_ZERO_UNSUPPORTED
    if strategy.needs_cuda and params.device == "cpu":
        return strategy.needs_cuda
    if params.ort:
        return ORT_UNSUPPORTED
    if params.model_definition:  # a model of the config's `models` (the cell carries its definition)
        return user_model_unsupported(params)
    return None


def user_model_unsupported(params: CellParams) -> str | None:
    """Why a model of the config's `models` cannot run a cell, where it cannot: what trainbench builds
    into its own GPT alone (pipeline stages, DeepSpeed's tensor parallelism, float8 layers, host
    checkpoints), or tensor parallelism without a plan it can apply. (A framework whose runner builds no
    such model: not_implemented.)"""
    if params.head != "lm":
        return "your models train as language models (head: lm): forward(input_ids, labels) gives the loss"
    if params.pp > 1:
        return ("pipeline parallelism splits trainbench's GPT by its own layout; a model of your own trains "
                "under data parallelism, sharding and tensor parallelism (torch fsdp with tp)")
    if params.tp > 1:
        if strategy_of(params).tensor_parallel is not SHARDED_TP:
            return (f"{params.framework} {params.strategy}'s tensor parallelism splits trainbench's GPT "
                    "alone; a model of your own splits by its tensor-parallel plan under torch fsdp with tp")
        plan, source = tensor_parallel_plan(json.loads(params.model_definition))
        if plan is None:
            return f"no tensor-parallel plan: {source}"
        unknown = sorted({style for style in plan.values() if style not in TP_STYLES})
        if unknown:
            return (f"{source} splits layers as {', '.join(map(repr, unknown))}, which trainbench does not "
                    f"apply (it applies {', '.join(TP_STYLES)})")
    for key, what in (("float8", "float8 training"), ("checkpoint_in_cpu", "checkpoints in host memory")):
        if getattr(params, key):
            return f"{what} is built into trainbench's GPT; a model of your own trains without it"
    return None


def not_implemented(params: CellParams) -> str | None:
    """Why this version cannot run the cell although the stack could; None if it can."""
    if params.pp > 1 and params.tp > 1:
        return "pipeline and tensor parallelism together have no runner in this version"
    if params.pp > 1 and params.checkpoint_in_cpu:
        return ("the pipeline engine checkpoints its stages itself: checkpoint_in_cpu has no runner for it "
                "in this version")
    family = known_models()[params.model].family
    if family == "custom" and family not in framework_of(params).families:
        building = [name for name, f in registry().items() if "custom" in f.families]
        return (f"{params.framework}'s runner builds the registry's models only; a model of the config's "
                f"`models` trains under {', '.join(building)}")
    if family not in framework_of(params).families:
        return (f"{params.framework} cannot build model family {family!r} ({params.model}) "
                "in this version")
    return None


# --- frameworks of one's own ---------------------------------------------------------------------
# TRAINBENCH_PLUGINS names modules (comma-separated, importable) that register frameworks of their own
# with `register(Framework(...))`: they load wherever trainbench reads the registry (the workflow, the
# CLI, every rank), so a framework needs no change to this package. Loaded on first use, not at
# import: a plugin's runner may import trainbench's runners, which import this module.
PLUGINS_ENV = "TRAINBENCH_PLUGINS"
_plugins_loaded: set[str] = set()
_plugins_named: str | None = None  # the variable's value when its modules were last loaded
_plugins_settled = False  # inside settled_plugins(): the variable is not read again


@contextmanager
def settled_plugins() -> Iterator[None]:
    """A block that reads the registry many times and changes no TRAINBENCH_PLUGINS (a search of thousands
    of set-ups: every check and model looks a cell's framework up several times): the plugins are loaded at
    its start, and lookups inside skip reading the environment: 15-20% of such a search's CPU time."""
    global _plugins_settled
    _load_plugins()
    outer, _plugins_settled = _plugins_settled, True
    try:
        yield
    finally:
        _plugins_settled = outer


def _load_plugins() -> None:
    import importlib
    import os

    global _plugins_named
    named = os.environ.get(PLUGINS_ENV, "")
    if named == _plugins_named:  # every cell of a grid reads the registry: loaded once per value
        return
    for module in filter(None, (m.strip() for m in named.split(","))):
        if module not in _plugins_loaded:
            _plugins_loaded.add(module)
            importlib.import_module(module)
    _plugins_named = named
