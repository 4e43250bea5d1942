"""What each framework's strategies are, what they accept, and what the stack cannot do.

Two kinds of answer come out of `check`: a user mistake (offload on DDP, `single` on 4 GPUs), which
is a config error naming the key; and a fact about the software stack (Lightning has no ColossalAI
strategy any more), which makes the cell a result of status `unsupported` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainbench.models import BUILDABLE_FAMILIES, MODELS


@dataclass(frozen=True)
class Strategy:
    framework: str
    name: str
    description: str
    offload_optimizer: bool = False  # may offload optimizer states
    offload_param: bool = False  # may offload parameters
    parallel_dims: bool = False  # accepts tp/pp > 1
    single_rank: bool = False  # exactly one rank
    unsupported: str | None = None  # the stack cannot run it at all
    needs_cuda: str | None = None  # why it cannot run on CPU ranks, if it cannot


_LIGHTNING_CUDA_ONLY = "Lightning's FSDP and DeepSpeed strategies refuse a CPU accelerator"
_COLOSSALAI = (
    "Lightning removed its ColossalAI strategy (Lightning-AI/pytorch-lightning#19528, 2024) after the "
    "external lightning-colossalai package was archived; lightning 2.x has no strategy='colossalai'"
)
_HF_FSDP_CUDA_ONLY = ("accelerate runs the Trainer's FSDP only on GPUs; on CPU ranks the Trainer quietly trains "
                      "with DDP instead")
ORT_UNSUPPORTED = (
    "ORTModule needs onnxruntime-training, which is no longer published after 1.19.2, has no build for "
    "Python 3.12+ or current torch (pytorch/ort#199), and was removed from onnxruntime "
    "(microsoft/onnxruntime#28058)"
)

STRATEGIES: dict[tuple[str, str], Strategy] = {
    (s.framework, s.name): s
    for s in (
        Strategy("torch", "single", "one process, no distributed wrapper", single_rank=True),
        Strategy("torch", "ddp", "torch DistributedDataParallel"),
        Strategy("torch", "fsdp", "torch FSDP2 (fully_shard) of every transformer block, then the root",
                 offload_param=True),
        Strategy("deepspeed", "zero0", "DeepSpeed engine, ZeRO disabled (data parallel)", parallel_dims=True),
        Strategy("deepspeed", "zero1", "DeepSpeed ZeRO stage 1: optimizer states partitioned",
                 offload_optimizer=True, parallel_dims=True),
        Strategy("deepspeed", "zero2", "DeepSpeed ZeRO stage 2: optimizer states and gradients partitioned",
                 offload_optimizer=True, parallel_dims=True),
        Strategy("deepspeed", "zero3", "DeepSpeed ZeRO stage 3: optimizer states, gradients and parameters "
                 "partitioned", offload_optimizer=True, offload_param=True, parallel_dims=True),
        Strategy("lightning", "single", "Trainer(devices=1)", single_rank=True),
        Strategy("lightning", "ddp", "Trainer(strategy='ddp')"),
        Strategy("lightning", "fsdp", "Trainer(strategy='fsdp')", needs_cuda=_LIGHTNING_CUDA_ONLY),
        Strategy("lightning", "deepspeed_stage_2", "Trainer(strategy='deepspeed_stage_2')", needs_cuda=_LIGHTNING_CUDA_ONLY),
        Strategy("lightning", "deepspeed_stage_2_offload", "Trainer(strategy='deepspeed_stage_2_offload')", needs_cuda=_LIGHTNING_CUDA_ONLY),
        Strategy("lightning", "deepspeed_stage_3", "Trainer(strategy='deepspeed_stage_3')", needs_cuda=_LIGHTNING_CUDA_ONLY),
        Strategy("lightning", "deepspeed_stage_3_offload", "Trainer(strategy='deepspeed_stage_3_offload')", needs_cuda=_LIGHTNING_CUDA_ONLY),
        Strategy("lightning", "colossalai", "Trainer(strategy='colossalai')", unsupported=_COLOSSALAI),
        Strategy("hf_trainer", "ddp", "Hugging Face Trainer, plain data parallel"),
        Strategy("hf_trainer", "fsdp", "Trainer fsdp='full_shard auto_wrap' (offload_param adds 'offload')",
                 offload_param=True, needs_cuda=_HF_FSDP_CUDA_ONLY),
        Strategy("hf_trainer", "zero3", "Trainer with a DeepSpeed ZeRO-3 config",
                 offload_optimizer=True, offload_param=True),
    )
}

# deepspeed/runtime/pipe/engine.py asserts this when the pipeline engine starts (checked by a test)
PIPELINE_ZERO_UNSUPPORTED = ("DeepSpeed's pipeline engine refuses ZeRO stage 2 and 3: "
                             "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'")

# Frameworks with a runner in this version. Cells of the others expand, validate and dry-run, but
# running one stops with a clear error (and no result): a later runner must not find stale outcomes.
IMPLEMENTED_FRAMEWORKS = ("torch", "deepspeed", "lightning", "hf_trainer")


def names(framework: str) -> list[str]:
    return [name for (fw, name) in STRATEGIES if fw == framework]


def check(params: dict[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    """Check one cell's strategy-related keys.

    Returns (errors, unsupported_reason): errors are (key, message) pairs for user mistakes.
    """
    errors: list[tuple[str, str]] = []
    framework, name = params["framework"], params["strategy"]
    strategy = STRATEGIES.get((framework, name))
    if strategy is None:
        errors.append(("strategy", f"{name!r} is not a {framework} strategy; allowed: {', '.join(names(framework))}"))
        return errors, None

    if strategy.single_rank and (params["gpus"] != 1 or params["nodes"] != 1):
        errors.append(("gpus", f"strategy {name!r} runs one rank: gpus and nodes must be 1, "
                               f"not gpus={params['gpus']}, nodes={params['nodes']}"))
    if params["offload_optimizer"] and not strategy.offload_optimizer:
        where = "DeepSpeed ZeRO stages 1-3 (strategies zero1, zero2, zero3)"
        if framework == "lightning":
            where = "Lightning's *_offload strategies, which set it themselves"
        errors.append(("offload_optimizer", f"means nothing for {framework} strategy {name!r}; "
                                            f"it applies to {where}"))
    if params["offload_param"] and not strategy.offload_param:
        errors.append(("offload_param", f"means nothing for {framework} strategy {name!r}; it applies to "
                                        "ZeRO-3 (zero3) and FSDP (fsdp)"))
    if (params["tp"] > 1 or params["pp"] > 1) and not strategy.parallel_dims:
        errors.append(("tp" if params["tp"] > 1 else "pp",
                       f"{framework} strategy {name!r} has no tensor or pipeline parallelism; "
                       "use a deepspeed zero* strategy"))
    if params["tp"] > 1 and params["model"] in MODELS:
        spec = MODELS[params["model"]]
        if spec.n_head % params["tp"] or spec.ffn % params["tp"]:
            errors.append(("tp", f"tensor parallelism splits heads and the MLP across ranks: tp={params['tp']} "
                                 f"must divide {spec.name}'s {spec.n_head} heads and MLP width {spec.ffn}"))
    if params["pp"] > 1 and params["model"] in MODELS and params["pp"] > MODELS[params["model"]].n_layer:
        errors.append(("pp", f"pp={params['pp']} stages need at least as many layers; "
                             f"{params['model']} has {MODELS[params['model']].n_layer}"))
    if params["overlap_comm"] is not None and framework != "deepspeed":
        errors.append(("overlap_comm", f"is a DeepSpeed engine setting; framework is {framework}"))
    if params["launcher"] == "deepspeed" and framework != "deepspeed":
        errors.append(("launcher", f"the DeepSpeed launcher starts DeepSpeed engine runs, not {framework}"))
    if framework == "hf_trainer" and params["dataset_path"]:
        errors.append(("dataset_path", "the Hugging Face Trainer runner trains on synthetic tokens in this version; "
                                       "leave dataset_path null"))
    if params["launcher"] == "python" and params["gpus"] > 1:
        errors.append(("launcher", f"'python' starts one process; this cell has {params['gpus']} ranks"))

    if strategy.unsupported:
        return errors, strategy.unsupported
    if params["pp"] > 1 and name in ("zero2", "zero3"):
        return errors, PIPELINE_ZERO_UNSUPPORTED
    if strategy.needs_cuda and params["device"] == "cpu":
        return errors, strategy.needs_cuda
    if params["ort"]:
        return errors, ORT_UNSUPPORTED
    return errors, None


def not_implemented(params: dict[str, Any]) -> str | None:
    """Why this version cannot run the cell although the stack could; None if it can."""
    if params["framework"] not in IMPLEMENTED_FRAMEWORKS:
        return f"framework {params['framework']!r} has no runner in this version"
    if params["pp"] > 1 and params["tp"] > 1:
        return "pipeline and tensor parallelism together have no runner in this version"
    family = MODELS[params["model"]].family
    if family not in BUILDABLE_FAMILIES.get(params["framework"], ()):
        return f"{params['framework']} cannot build model family {family!r} ({params['model']}) in this version"
    return None
