"""A cell's parameters: one frozen, typed object per cell (CellParams), which is also the table of every
key a study may set in `settings`, `axes`, `include` or `exclude`, with its type, default and meaning.

`workflow/schemas/config.schema.yaml` is generated from this table (`trainbench schema`), and a test
keeps the two in sync. A cell's parameters are resolved and checked once, where the grid makes the cell
(study.grid); they cross processes as `as_dict()` / `from_dict()` (JSON), the one serialisation.
Sizes derived from them (data-parallel degree, ranks per node, global batch) are properties, never
stored, so they cannot disagree with the parameters they come from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from trainbench.registry.models import known_models


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "int", "float", "bool", "str"
    default: Any
    description: str
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None  # a callable: read when asked
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    # An optional parameter was added after results were published: a cell that leaves it at its
    # default is the cell it was before the parameter existed (same canonical string and hash, so
    # nothing reruns), and a result that lacks it ran with its default.
    optional: bool = False

    @property
    def options(self) -> tuple[Any, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def json_schema(self) -> dict[str, Any]:
        base = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}[self.kind]
        schema: dict[str, Any] = {"type": [base, "null"] if self.nullable else base}
        if self.options is not None:
            schema["enum"] = list(self.options) + ([None] if self.nullable else [])
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        schema["description"] = self.description
        schema["default"] = self.default
        return schema

    def allowed(self) -> str:
        """A short phrase saying what values are allowed, for error messages."""
        if self.options is not None:
            text = "one of " + ", ".join(repr(c) for c in self.options)
        else:
            text = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[
                self.kind
            ]
            if self.minimum is not None and self.maximum is not None:
                text += f" from {self.minimum:g} to {self.maximum:g}"
            elif self.minimum is not None:
                text += f" >= {self.minimum:g}"
        return text + (" or null" if self.nullable else "")


# The kernels a cell can hold PyTorch's scaled_dot_product_attention to (`attention`).
SDPA_KERNELS = ("flash", "cudnn", "efficient")


def _frameworks() -> tuple[str, ...]:
    from trainbench.registry.frameworks import registry

    return tuple(registry())


def param(default: Any, description: str, *,
          choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None,
          minimum: float | None = None, maximum: float | None = None, optional: bool = False) -> Any:
    """A CellParams field: its default, and what the schema, the docs and error messages say of it."""
    return field(default=default, metadata={"description": description, "choices": choices,
                                            "minimum": minimum, "maximum": maximum, "optional": optional})


# Values computed from the parameters, carried beside them wherever a cell is serialised (the canonical
# string Snakemake compares, metrics.json) so that a result says what it ran with.
DERIVED = ("dp", "gpus_per_node", "global_batch")


@dataclass(frozen=True)
class CellParams:
    """One cell's parameters, in the table's order: the order of keys in cell ids and table columns, most
    telling first. Make one with `resolve` (a study's settings and axes) or `from_dict` (a serialised
    cell); `replace` gives a cell that differs in some of them."""

    framework: str = param("torch", "What drives training (`trainbench strategies` lists the frameworks and "
        "their strategies).",
        choices=_frameworks)
    strategy: str = param("single", "Parallelism strategy, in the framework's own vocabulary (`trainbench "
        "strategies` lists them).")
    model: str = param("gpt2-tiny", "Architecture name from the model registry or the config's own `models` "
        "(`trainbench models` lists both); built from its config with random weights.")
    model_definition: str = param("", "Filled in, never written: the definition of a model of the config's "
        "`models` as the cell ran it (its transformers config keys, or its factory and arguments), so that "
        "editing it reruns the model's cells. Empty for the registry's models.",
        optional=True)
    head: str = param("lm", "Output head: next-token language modelling or sequence classification.",
        choices=("lm", "classifier"))
    num_classes: int = param(2, "Classes of the classification head (head: classifier).",
        minimum=2)
    seq_len: int | None = param(None, "Tokens per sample; null means the model's context length.",
        minimum=1)
    precision: str = param("fp32", "Training precision: fp32, or fp16/bf16 mixed precision.",
        choices=("fp32", "fp16", "bf16"))
    tf32: bool = param(False, "Allow TF32 matmuls for fp32 work on Ampere and newer GPUs.")
    device: str = param("cuda", "Where ranks run: one CUDA GPU per rank (NCCL), or CPU processes (gloo).",
        choices=("cuda", "cpu"))
    nodes: int = param(1, "Nodes the cell spans.",
        minimum=1)
    gpus: int = param(1, "Ranks in total, one per GPU (with device: cpu, CPU processes standing in for "
        "GPUs); must be a multiple of nodes and of tp x pp.",
        minimum=1)
    tp: int = param(1, "Tensor-parallel size.",
        minimum=1)
    pp: int = param(1, "Pipeline-parallel size.",
        minimum=1)
    micro_batch: int = param(1, "Samples per rank per forward/backward pass.",
        minimum=1)
    grad_accum: int = param(1, "Micro batches accumulated per optimizer step.",
        minimum=1)
    offload_optimizer: bool = param(False, "Keep optimizer states (and the optimizer step) in CPU memory "
        "(DeepSpeed ZeRO 1-3).")
    offload_param: bool = param(False, "Keep parameters in CPU memory between uses (DeepSpeed ZeRO-3; FSDP, "
        "where it offloads gradients and optimizer states too).")
    pin_memory: bool = param(True, "Page-locked host memory for offloaded tensors (faster copies; memory "
        "the OS cannot swap). CUDA only.")
    tuning: str = param("best", "How a strategy's settings the cell leaves out are chosen. best: at its "
        "framework's best practice (`trainbench strategies` lists each setting and why; docs/frameworks.md); "
        "framework: each framework's own defaults, as a campaign that tuned nothing ran them. A setting "
        "the cell gives itself, null included, is kept either way. A cell is what its settings resolve to: "
        "two cells that resolve alike are one cell.",
        choices=("best", "framework"), optional=True)
    overlap_comm: bool | None = param(None, "DeepSpeed: overlap gradient reduction with the backward pass; "
        "null keeps DeepSpeed's default for the stage.")
    contiguous_gradients: bool | None = param(None, "DeepSpeed ZeRO 1-3: copy each gradient into one "
        "contiguous buffer as the backward produces it (no fragmentation; a copy per gradient). Null: "
        "DeepSpeed's (on).",
        optional=True)
    reduce_bucket_size: int | None = param(None, "DeepSpeed ZeRO 1-3: elements reduced at once "
        "(reduce_bucket_size): larger buckets are fewer collectives and a larger buffer. Null: DeepSpeed's "
        "500,000,000.",
        minimum=1, optional=True)
    allgather_bucket_size: int | None = param(None, "DeepSpeed ZeRO 1-2: elements of updated weights "
        "all-gathered at once after the optimizer step (allgather_bucket_size). Null: DeepSpeed's "
        "500,000,000.",
        minimum=1, optional=True)
    prefetch_bucket_size: int | None = param(None, "DeepSpeed ZeRO-3: elements of parameters gathered ahead "
        "of their use (stage3_prefetch_bucket_size). Null: DeepSpeed's 50,000,000.",
        minimum=1, optional=True)
    activation_checkpointing: bool = param(False, "Recompute each transformer block's activations in the "
        "backward pass instead of storing them.")
    checkpoint_in_cpu: bool = param(False, "With activation checkpointing, keep each block's checkpointed "
        "input in host memory, split across the tensor-parallel ranks (each keeps 1/tp), and gather it back "
        "to the device for the block's recomputation: DeepSpeed's partition_activations with "
        "cpu_checkpointing. trainbench's GPT (torch and deepspeed frameworks).",
        optional=True)
    attention: str = param("sdpa", "Attention kernel: sdpa (PyTorch's scaled_dot_product_attention, which "
        "picks FlashAttention, memory-efficient or cuDNN attention itself), flash, cudnn or efficient (SDPA "
        "held to that kernel; CUDA only), or eager (softmax(QK^T)V with the seq x seq scores kept for the "
        "backward, as Hugging Face's eager attention).",
        choices=("sdpa", *SDPA_KERNELS, "eager"), optional=True)
    vocab_multiple: int = param(1, "Pad the token embedding (and the tied LM head) to a multiple of this "
        "many rows, as nanoGPT pads GPT-2's 50,257 to 50,304 (64): the head's matmul and the loss's rows "
        "then tile evenly. The padded rows are never a token of the data, and TFLOPS and MFU count the "
        "model's own vocabulary. trainbench's GPT models.",
        minimum=1, optional=True)
    emulate: bool = param(False, "Run one rank of the cell's world alone on one device (one GPU, or a CPU "
        "process), through PyTorch's fake process group: the framework builds, shards, computes and steps "
        "as that rank would, and the collectives return at once. Measures the rank's memory and compute "
        "time; communication time is not measured and NCCL's buffers are modelled (docs/emulation.md). An "
        "emulated cell is always named as such (`emulate~true` in its id).",
        optional=True)
    emulate_rank: int | None = param(None, "Which rank an emulated cell runs; null: the heaviest by the "
        "memory model (a pipeline's first or last stage; rank 0 where ranks hold alike).",
        minimum=0, optional=True)
    gpu_mem_limit_gib: float | None = param(None, "Hold each rank to a GPU of this many GiB (an A100's 40 "
        "or 80 on an H200): the caching allocator may reserve what such a GPU leaves after the CUDA context "
        "and NCCL's buffers, and runs out where it would. Null: the GPU's own memory. CUDA only; always in "
        "the cell's id when set.",
        minimum=1, optional=True)
    float8: str | None = param(None, "Train the blocks' linear layers in float8 through torchao's float8 "
        "training (convert_to_float8_training): its recipe, tensorwise (one scale per tensor) or rowwise "
        "(one per row); what is not a matmul stays bf16 (precision: bf16). The LM head and any layer whose "
        "sizes are not multiples of 16 stay bf16, as torchtitan leaves them. FP8 tensor cores (compute "
        "capability 8.9: Ada, Hopper) on GPUs; CPU ranks run it through torch's CPU scaled matmul. "
        "torch framework; null: off.",
        choices=("tensorwise", "rowwise"), optional=True)
    float8_all_gather: bool = param(False, "With float8: tensorwise under FSDP2, all-gather the float8 "
        "layers' weights in float8 rather than bf16 (torchao's enable_fsdp_float8_all_gather: half the "
        "bytes), their scales computed in one all-reduce after each optimizer step "
        "(precompute_float8_dynamic_scale_for_fsdp), as torchtitan's float8 runs do. torch framework.",
        optional=True)
    fsdp_reshard: str | None = param(None, "torch FSDP2: when a block's gathered parameters are freed. "
        "after_forward: after its forward, and again after its backward on every micro batch (FSDP2's "
        "default, the least memory: 2 x grad_accum all-gathers of each block a step); after_backward: kept "
        "from forward to backward (reshard_after_forward=False: grad_accum all-gathers, the whole model "
        "unsharded at the end of forward); after_step: kept across an accumulation's micro batches and "
        "freed after the last backward (set_reshard_after_backward on that one only: one all-gather a "
        "step). Null: after_forward.",
        choices=("after_forward", "after_backward", "after_step"), optional=True)
    ddp_compile: str | None = param(None, "torch DDP with compile: how torch.compile meets DDP. wrapper: "
        "the DDP-wrapped model compiled whole, Dynamo's DDP optimizer splitting its graph at each gradient "
        "bucket (a graph per bucket, on every micro batch); blocks: each block compiled, and the loss, "
        "inside DDP's wrapper, whose hooks then start each bucket's all-reduce while the earlier blocks' "
        "backward runs (torchtitan's way). Null: wrapper.",
        choices=("wrapper", "blocks"), optional=True)
    ddp_bucket_cap_mb: int | None = param(None, "DDP (torch's, Lightning's, the Trainer's): the gradient "
        "bucket size in MiB, one all-reduce each (bucket_cap_mb). Null: DDP's 25.",
        minimum=1, optional=True)
    ddp_bucket_view: bool = param(False, "DDP (torch's, Lightning's): gradients as views into the all-reduce "
        "buckets (gradient_as_bucket_view): no copy into the buckets after backward, and one gradient-sized "
        "buffer less.",
        optional=True)
    ddp_static_graph: bool = param(False, "DDP (torch's, Lightning's): the graph is the same every step "
        "(static_graph): DDP then skips searching for unused parameters and fixes its bucket order after the "
        "first step.",
        optional=True)
    gc_every: int | None = param(None, "Python's garbage collector during training. Null: automatic, Python "
        "collecting whenever its allocation thresholds say, in whichever step that falls; N: automatic "
        "collection off from the first step, and a generation-1 collection at the start of every Nth step, "
        "timed with it (torchtitan's gc_freq, 50 by default there). Every framework.",
        minimum=1, optional=True)
    ort: bool = param(False, "Run the model under ONNX Runtime training (ORTModule).")
    compile: bool = param(False, "Compile the model with torch.compile.")
    lr: float = param(0.0001, "Peak learning rate.",
        minimum=0)
    weight_decay: float = param(0.0, "AdamW weight decay.",
        minimum=0)
    warmup_steps: int = param(3, "Optimizer steps run before timing starts (excluded from step time).",
        minimum=0)
    timed_steps: int = param(10, "Optimizer steps timed after warm-up; step_time_s is their median.",
        minimum=1)
    dataset_size: int | None = param(None, "Samples per epoch of the whole run the study describes; with "
        "epochs, gives projected_run_s. Null: no projection.",
        minimum=1)
    epochs: int | None = param(None, "Epochs of the whole run the study describes.",
        minimum=1)
    launcher: str = param("auto", "How ranks start: auto (plain python for one rank, else torchrun), "
        "torchrun, or the DeepSpeed launcher.",
        choices=("auto", "python", "torchrun", "deepspeed"))
    seed: int = param(0, "Seed of model initialisation and synthetic data.",
        minimum=0)
    deterministic: bool = param(False, "Deterministic algorithms only (Lightning's deterministic=True); "
        "attention then uses the eager implementation, whose backward is deterministic, and torch fills "
        "every tensor it allocates (a cost on the host: docs/time-model.md). Lightning only.")
    tokens: str | None = param(None, "Train a language model on your tokens: a flat binary file of token ids "
        "(as nanoGPT's prepare scripts write them), read in windows of seq_len + 1, each data-parallel rank "
        "its own; relative to the folder of config.yaml. Null: synthetic tokens.",
        optional=True)
    tokens_dtype: str = param("uint16", "The integer type of the token file's ids.",
        choices=("uint16", "uint32", "int32", "int64"), optional=True)
    dataset_path: str | None = param(None, "Real data to train and test on (the aclImdb folder for "
        "sentiment studies); null: synthetic data of the study's shape.")
    pretrained_path: str | None = param(None, "A local Hugging Face model folder to start from (weights and "
        "tokenizer); null: random weights from the architecture config.")
    inject_oom_at_step: int | None = param(None, "Testing aid: make the allocator fail at this step (0 = "
        "during initialisation) through a real allocation too large for any machine. Null: off.",
        minimum=0)

    # --- derived sizes (torchtitan's ParallelDims is the model) ---

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans: tensor x pipeline parallel."""
        return self.tp * self.pp

    @property
    def dp(self) -> int | None:
        """Data-parallel degree (None: gpus is not a multiple of tp x pp, which check_cell reports)."""
        return self.gpus // self.model_parallel if self.gpus % self.model_parallel == 0 else None

    @property
    def gpus_per_node(self) -> int | None:
        """Ranks on each node (None: gpus is not a multiple of nodes, which check_cell reports)."""
        return self.gpus // self.nodes if self.gpus % self.nodes == 0 else None

    @property
    def ranks_here(self) -> int | None:
        """Processes the cell starts on one machine: one for an emulated rank, else a node's ranks."""
        return 1 if self.emulate else self.gpus_per_node

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step: micro batch x accumulation x data-parallel degree."""
        return self.micro_batch * self.grad_accum * self.dp if self.dp else None

    # --- the one serialisation ---

    def as_dict(self) -> dict[str, Any]:
        """Every parameter but the choosers (what they chose is here), then the derived sizes: what
        metrics.json and the worker's cell file hold."""
        out = {name: getattr(self, name) for name in PARAM_NAMES if name not in CHOOSERS}
        out.update((name, getattr(self, name)) for name in DERIVED)
        return out

    @cached_property
    def identity(self) -> dict[str, Any]:
        """The parameters that make the cell what it is: all of as_dict but optional ones at their
        default (a cell that leaves a parameter added later at its default is the cell it was)."""
        return {k: v for k, v in self.as_dict().items() if not (k in OPTIONAL and v == DEFAULTS[k])}

    @cached_property
    def canonical(self) -> str:
        """The identity as canonical JSON: what Snakemake compares to decide a rerun, and hashes."""
        return canonical_json(self.identity)

    @cached_property
    def params_hash(self) -> str:
        """The canonical string's short hash: in metrics.json, it says what a result was made with."""
        return hashlib.sha256(self.canonical.encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> CellParams:
        """A serialised cell (as_dict's, the canonical string's, or a metrics.json's "params", which may
        predate an optional parameter: it ran with its default). Derived values are recomputed, not
        read; a key that is no parameter, or a parameter left out, is an error naming it. Values are taken
        as given: the cell was checked where it was made."""
        if not isinstance(mapping, Mapping):
            raise TypeError(f"a cell's parameters are a mapping, not a {type(mapping).__name__}")
        unknown = [k for k in mapping if k not in PARAMS_BY_NAME and k not in DERIVED]
        if unknown:
            raise ValueError(f"gives {', '.join(map(repr, unknown))}, which no cell parameter is called")
        lacking = [name for name in PARAM_NAMES if name not in mapping and name not in OPTIONAL]
        if lacking:
            raise ValueError(f"lacks {lacking[0]!r}: a serialised cell gives every parameter but optional "
                             "ones at their default")
        return cls(**{k: v for k, v in mapping.items() if k in PARAMS_BY_NAME})

    @classmethod
    def from_json(cls, text: str) -> CellParams:
        return cls.from_dict(json.loads(text))

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> CellParams:
        """A study's settings and axes for one cell as its parameters: defaults filled, numbers given as
        integers for float parameters made floats, and what `null`/`auto` mean made explicit (the
        model's context length, the launcher). Assumes schema-valid input; check_cell checks the rest."""
        p = {**DEFAULTS, **{k: (float(v) if k in FLOATS and isinstance(v, int) and not isinstance(v, bool)
                                else v) for k, v in given.items()}}
        model = known_models().get(p["model"])
        if p["seq_len"] is None and model is not None:
            p["seq_len"] = model.max_seq
        if model is not None and model.user_defined:  # the definition travels with the cell
            p["model_definition"] = model.definition
        if p["launcher"] == "auto":
            p["launcher"] = "python" if p["gpus"] == 1 and p["nodes"] == 1 else "torchrun"
        if p["tuning"] == "best":
            from trainbench.registry.frameworks import best_practice

            practice = best_practice(p["framework"], p["strategy"], p["gpus"], p["grad_accum"])
            p.update((key, value) for key, value in practice.items() if key not in given)
        return cls(**p)

    def replace(self, **changes: Any) -> CellParams:
        return dataclasses.replace(self, **changes)

    def get(self, name: str, default: Any = None) -> Any:
        """A parameter or derived size by name, for code that selects cells by key (patterns in
        config.yaml: `include`, `measure`, overrides)."""
        return getattr(self, name) if name in PARAMS_BY_NAME or name in DERIVED else default


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: one string per value, whatever the order it was built in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _kind(annotation: str) -> tuple[str, bool]:
    base, *rest = [part.strip() for part in annotation.split("|")]
    return base, "None" in rest


def _param(f: dataclasses.Field) -> Param:
    kind, nullable = _kind(f.type)
    meta = f.metadata
    return Param(f.name, kind, f.default, meta["description"], meta["choices"], meta["minimum"],
                 meta["maximum"], nullable, meta["optional"])


PARAMS: tuple[Param, ...] = tuple(_param(f) for f in dataclasses.fields(CellParams))
PARAMS_BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
PARAM_NAMES: tuple[str, ...] = tuple(PARAMS_BY_NAME)
PARAM_ORDER: dict[str, int] = {p.name: i for i, p in enumerate(PARAMS)}
DEFAULTS: dict[str, Any] = {p.name: p.default for p in PARAMS}
OPTIONAL = frozenset(p.name for p in PARAMS if p.optional)
FLOATS = frozenset(p.name for p in PARAMS if p.kind == "float")


# Parameters that choose other parameters' values where a study resolves its cells (`tuning`): the cell
# is what they chose, so they are neither in its identity nor serialised with it; a cell rebuilt from
# its JSON (the worker's, a result's) holds the choice already made, whatever the chooser says there
CHOOSERS = frozenset({"tuning"})


def with_optional_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """A result's parameters with every optional parameter it leaves out at its default (a result made
    before the parameter existed ran with it)."""
    return {**{name: DEFAULTS[name] for name in OPTIONAL - CHOOSERS}, **params}


def sort_keys(keys) -> list[str]:
    """Keys in the table's order: declared parameters first, anything else alphabetically after."""
    return sorted(keys, key=lambda k: (PARAM_ORDER.get(k, len(PARAM_ORDER)), k))
