"""The parameters a grid cell can set: one table, the source of the config schema and of cell defaults.

Every key a study may use in `settings`, `axes`, `include` or `exclude` is declared here with its
type, default and meaning. `workflow/schemas/config.schema.yaml` is generated from this table
(`trainbench schema`), and a test keeps the two in sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any


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

# Order matters: it is the order of keys in cell ids and table columns, most telling first.
PARAMS: tuple[Param, ...] = (
    Param("framework", "str", "torch", "What drives training (`trainbench strategies` lists the "
          "frameworks and their strategies).", choices=_frameworks),
    Param("strategy", "str", "single", "Parallelism strategy, in the framework's own vocabulary "
          "(`trainbench strategies` lists them).") ,
    Param("model", "str", "gpt2-tiny", "Architecture name from the model registry (`trainbench models`); "
          "built from its config with random weights."),
    Param("head", "str", "lm", "Output head: next-token language modelling or sequence classification.",
          choices=("lm", "classifier")),
    Param("num_classes", "int", 2, "Classes of the classification head (head: classifier).", minimum=2),
    Param("seq_len", "int", None, "Tokens per sample; null means the model's context length.",
          minimum=1, nullable=True),
    Param("precision", "str", "fp32", "Training precision: fp32, or fp16/bf16 mixed precision.",
          choices=("fp32", "fp16", "bf16")),
    Param("tf32", "bool", False, "Allow TF32 matmuls for fp32 work on Ampere and newer GPUs."),
    Param("device", "str", "cuda", "Where ranks run: one CUDA GPU per rank (NCCL), or CPU processes (gloo).",
          choices=("cuda", "cpu")),
    Param("nodes", "int", 1, "Nodes the cell spans.", minimum=1),
    Param("gpus", "int", 1, "Ranks in total, one per GPU (with device: cpu, CPU processes standing in for "
          "GPUs); must be a multiple of nodes and of tp x pp.", minimum=1),
    Param("tp", "int", 1, "Tensor-parallel size.", minimum=1),
    Param("pp", "int", 1, "Pipeline-parallel size.", minimum=1),
    Param("micro_batch", "int", 1, "Samples per rank per forward/backward pass.", minimum=1),
    Param("grad_accum", "int", 1, "Micro batches accumulated per optimizer step.", minimum=1),
    Param("offload_optimizer", "bool", False, "Keep optimizer states (and the optimizer step) in CPU memory "
          "(DeepSpeed ZeRO 1-3)."),
    Param("offload_param", "bool", False, "Keep parameters in CPU memory between uses (DeepSpeed ZeRO-3; "
          "FSDP, where it offloads gradients and optimizer states too)."),
    Param("pin_memory", "bool", True, "Page-locked host memory for offloaded tensors (faster copies; memory "
          "the OS cannot swap). CUDA only."),
    Param("overlap_comm", "bool", None, "DeepSpeed: overlap gradient reduction with the backward pass; null "
          "keeps DeepSpeed's default for the stage.", nullable=True),
    Param("activation_checkpointing", "bool", False, "Recompute each transformer block's activations in "
          "the backward pass instead of storing them."),
    Param("checkpoint_in_cpu", "bool", False, "With activation checkpointing, keep each block's checkpointed "
          "input in host memory, split across the tensor-parallel ranks (each keeps 1/tp), and gather it "
          "back to the device for the block's recomputation: DeepSpeed's partition_activations with "
          "cpu_checkpointing. trainbench's GPT (torch and deepspeed frameworks).", optional=True),
    Param("attention", "str", "sdpa", "Attention kernel: sdpa (PyTorch's scaled_dot_product_attention, "
          "which picks FlashAttention, memory-efficient or cuDNN attention itself), flash, cudnn or "
          "efficient (SDPA held to that kernel; CUDA only), or eager (softmax(QK^T)V with the seq x seq "
          "scores kept for the backward, as Hugging Face's eager attention).",
          choices=("sdpa", *SDPA_KERNELS, "eager"), optional=True),
    Param("vocab_multiple", "int", 1, "Pad the token embedding (and the tied LM head) to a multiple of this "
          "many rows, as nanoGPT pads GPT-2's 50,257 to 50,304 (64): the head's matmul and the loss's rows "
          "then tile evenly. The padded rows are never a token of the data, and TFLOPS and MFU count the "
          "model's own vocabulary. trainbench's GPT models.", minimum=1, optional=True),
    Param("emulate", "bool", False, "Run one rank of the cell's world alone on one device (one GPU, or a CPU "
          "process), through PyTorch's fake process group: the framework builds, shards, computes and steps "
          "as that rank would, and the collectives return at once. Measures the rank's memory and compute "
          "time; communication time is not measured and NCCL's buffers are modelled (docs/emulation.md). "
          "An emulated cell is always named as such (`emulate~true` in its id).", optional=True),
    Param("emulate_rank", "int", None, "Which rank an emulated cell runs; null: the heaviest by the memory "
          "model (a pipeline's first or last stage; rank 0 where ranks hold alike).", minimum=0,
          nullable=True, optional=True),
    Param("gpu_mem_limit_gib", "float", None, "Hold each rank to a GPU of this many GiB (an A100's 40 or 80 "
          "on an H200): the caching allocator may reserve what such a GPU leaves after the CUDA context and "
          "NCCL's buffers, and runs out where it would. Null: the GPU's own memory. CUDA only; always in "
          "the cell's id when set.", minimum=1, nullable=True, optional=True),
    Param("ort", "bool", False, "Run the model under ONNX Runtime training (ORTModule)."),
    Param("compile", "bool", False, "Compile the model with torch.compile."),
    Param("lr", "float", 1e-4, "Peak learning rate.", minimum=0),
    Param("weight_decay", "float", 0.0, "AdamW weight decay.", minimum=0),
    Param("warmup_steps", "int", 3, "Optimizer steps run before timing starts (excluded from step time).",
          minimum=0),
    Param("timed_steps", "int", 10, "Optimizer steps timed after warm-up; step_time_s is their median.",
          minimum=1),
    Param("dataset_size", "int", None, "Samples per epoch of the whole run the study describes; with "
          "epochs, gives projected_run_s. Null: no projection.", minimum=1, nullable=True),
    Param("epochs", "int", None, "Epochs of the whole run the study describes.", minimum=1, nullable=True),
    Param("launcher", "str", "auto", "How ranks start: auto (plain python for one rank, else torchrun), "
          "torchrun, or the DeepSpeed launcher.", choices=("auto", "python", "torchrun", "deepspeed")),
    Param("seed", "int", 0, "Seed of model initialisation and synthetic data.", minimum=0),
    Param("deterministic", "bool", False, "Deterministic algorithms only (Lightning's deterministic=True); "
          "attention then uses the eager implementation, whose backward is deterministic."),
    Param("dataset_path", "str", None, "Real data to train and test on (the aclImdb folder for sentiment "
          "studies); null: synthetic data of the study's shape.", nullable=True),
    Param("pretrained_path", "str", None, "A local Hugging Face model folder to start from (weights and "
          "tokenizer); null: random weights from the architecture config.", nullable=True),
    Param("inject_oom_at_step", "int", None, "Testing aid: make the allocator fail at this step (0 = during "
          "initialisation) through a real allocation too large for any machine. Null: off.",
          minimum=0, nullable=True),
)

PARAMS_BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
PARAM_ORDER: dict[str, int] = {p.name: i for i, p in enumerate(PARAMS)}


def defaults() -> dict[str, Any]:
    return {p.name: p.default for p in PARAMS}


def identity(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that make a cell what it is: all of them but optional ones at their default."""
    return {k: v for k, v in params.items()
            if not (k in PARAMS_BY_NAME and PARAMS_BY_NAME[k].optional and v == PARAMS_BY_NAME[k].default)}


def with_optional_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """A cell's parameters with every optional parameter it leaves out at its default."""
    return {**{p.name: p.default for p in PARAMS if p.optional}, **params}


def sort_keys(keys) -> list[str]:
    """Keys in the table's order: declared parameters first, anything else alphabetically after."""
    return sorted(keys, key=lambda k: (PARAM_ORDER.get(k, len(PARAM_ORDER)), k))
