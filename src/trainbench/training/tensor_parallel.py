"""Tensor parallelism that builds sharded: trainbench's GPT split in Megatron's layout with PyTorch's
DTensor tensor parallel, under FSDP2 on a 2-D mesh (data parallel x tensor parallel), as torchtitan
parallelises its models.

The model is built on the meta device, so no rank ever holds more than its shard of a layer:

- each block's attention qkv and MLP fc are column-parallel (ColwiseParallel: rows of the weight,
  and the bias, split over the tp ranks), the two output projections row-parallel (RowwiseParallel:
  columns split, the bias whole, an all-reduce of the output). The residual stream, the LayerNorms
  and the row-parallel biases stay whole on every rank (no sequence parallelism).
- the token embedding is vocabulary-parallel (RowwiseParallel on nn.Embedding: each rank holds
  vocab / tp rows, looks up the tokens it has and the outputs are all-reduced), and the LM head,
  tied to it as in GPT-2, multiplies by the same sharded weight: each rank computes its vocab / tp
  columns of the logits (Shard(-1)), and the loss is computed without gathering them
  (`loss_parallel`). The learned positions stay whole (max_seq x d).
- FSDP2's `fully_shard` then shards every parameter over the data-parallel ranks; with CPU
  offload the shards live in host memory. `materialise` allocates only the local shards and fills
  them.

Two things differ from torchtitan's LLaMA because trainbench's GPT differs:

- the fused qkv projection computes [q; k; v]: a plain row split would give rank 0 all of q and
  half of k. The weight is laid out per rank instead ([q_0; k_0; v_0; q_1; k_1; v_1; ...], Megatron's
  arrangement too), so that each rank's rows are its heads' q, k and v and the forward's
  `chunk(3)` of the local output is right. `qkv_layout` is that permutation of the rows.
- the tied LM head: the tied weight is one parameter, vocabulary-sharded (Shard(0)) for both uses.

A model of the user's (config.yaml's `models`) splits by its own plan instead (`parallelize_plan`):
transformers' for its architecture (`base_model_tp_plan`, the LM head's `_tp_plan`) or the definition's
`tp_plan`, module paths to styles that map onto PyTorch's ColwiseParallel and RowwiseParallel as
transformers maps them. Its weights are then initialised on their shards by the model's own
initialisation (DTensor draws each shard from one generator state the ranks agree on).

Initialisation draws each parameter whole from the generator a plain build uses (`GPT.init_module`),
one parameter at a time, and keeps this rank's shard, so every tp (and dp) starts from the model one
rank builds: what Megatron's `--use-cpu-initialization` does. The transient is the largest single
parameter (the memory model counts it).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from trainbench.errors import ConfigError
from trainbench.training.gpt import GPT, init_gpt_module

# which linear layers of a block are column- and row-parallel (Megatron's layout)
COLUMN_PARALLEL = ("attn.qkv", "mlp.fc")
ROW_PARALLEL = ("attn.proj", "mlp.proj")


def linear_plans(float8: str | None) -> tuple[type, type]:
    """The (column-parallel, row-parallel) plan classes for a block's linear layers. torchao's float8
    plans for the tensorwise recipe: they cast a layer's input to float8 where it enters the layer and
    its output gradient where it leaves, with one scale over the whole (sharded) tensor, so the
    all-gathers and reductions around the matmul move float8 and the scale agrees across ranks. They
    assume tensorwise scaling; rowwise layers (a scale per row, computed where the matmul runs) take
    the plain plans, as torchtitan's `parallelize_llama` does."""
    if float8 == "tensorwise":
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        return Float8ColwiseParallel, Float8RowwiseParallel
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return ColwiseParallel, RowwiseParallel


def parallelize(model: GPT, tp_mesh, float8: str | None = None) -> None:
    """Swap the model's (meta) parameters for DTensors sharded over `tp_mesh` in Megatron's layout. A
    float8 model's linear layers must already be torchao's (`float8`: their recipe)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    # vocabulary-parallel embedding: token ids replicated in, the looked-up rows all-reduced out
    parallelize_module(model, tp_mesh, {"wte": RowwiseParallel(input_layouts=Replicate())})
    column, row = linear_plans(float8)
    plan = {**{name: column() for name in COLUMN_PARALLEL}, **{name: row() for name in ROW_PARALLEL}}
    for block in model.blocks:
        parallelize_module(block, tp_mesh, plan)


def qkv_layout(full: torch.Tensor, tp: int) -> torch.Tensor:
    """A fused qkv weight (3d x d) or bias (3d) from the plain layout [q; k; v] to the per-rank one
    [q_0; k_0; v_0; q_1; ...]: row block r of tp is then rank r's heads' q, k and v."""
    rows = full.shape[0]
    return full.reshape(3, tp, rows // (3 * tp), *full.shape[1:]).transpose(0, 1).reshape(full.shape)


def _whole_module(module: nn.Module, device: torch.device) -> nn.Module:
    """An unsharded module of the same kind and shape as `module`, uninitialised, on `device`."""
    with torch.device("meta"):
        if isinstance(module, nn.Linear):
            whole = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
        elif isinstance(module, nn.Embedding):
            whole = nn.Embedding(module.num_embeddings, module.embedding_dim)
        elif isinstance(module, nn.LayerNorm):
            whole = nn.LayerNorm(module.normalized_shape, eps=module.eps)
        else:
            raise TypeError(f"no sharded initialisation for {type(module).__name__}")
    return whole.to_empty(device=device)


@torch.no_grad()
def materialise(model: GPT, device: torch.device, init_device: torch.device, seed: int, tp: int) -> None:
    """Allocate this rank's shard of every parameter on `device` and fill it with its part of the
    weights a plain build makes (drawn whole, one parameter at a time, on `init_device`)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    model.to_empty(device=device)
    for index, name, module in model.init_targets():
        whole = _whole_module(module, init_device)
        generator = torch.Generator(device=init_device).manual_seed(GPT.init_seed(seed, index))
        init_gpt_module(whole, name, model.spec.n_layer, generator)
        for key, parameter in module.named_parameters(recurse=False):
            value = getattr(whole, key)
            if tp > 1 and name.endswith("attn.qkv"):
                value = qkv_layout(value, tp)
            if isinstance(parameter, DTensor):
                value = distribute_tensor(value, parameter.device_mesh, parameter.placements,
                                          src_data_rank=None).to_local()
                parameter = parameter.to_local()
            parameter.copy_(value)
        if init_device.type == "cuda":
            # each module's whole weights are drawn in blocks of their own size, which the caching
            # allocator would keep, and the next module's are other sizes (13 GiB reserved for 6
            # allocated on bert-180b's rank 0 at tp 16, before this release)
            del whole, value
            torch.cuda.empty_cache()


def local_loss(loss: torch.Tensor) -> torch.Tensor:
    """The loss as a plain tensor (the vocabulary-parallel loss is a replicated DTensor)."""
    from torch.distributed.tensor import DTensor

    return loss.to_local() if isinstance(loss, DTensor) else loss


# --- a user's model, split by its plan ------------------------------------------------------------------

# the styles that split a layer's output features (and bias); the others split its input features or
# an embedding's rows, and leave a linear layer's bias whole (added after the all-reduce)
COLUMN_STYLES = ("colwise", "colwise_gather_output")


def parallel_style(style: str, module: nn.Module):
    """PyTorch's ParallelStyle for one of transformers' style names (registry.models.TP_STYLES)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if style == "colwise":
        return ColwiseParallel()
    if style == "colwise_gather_output":  # the output gathered whole (an LM head's logits)
        return ColwiseParallel(output_layouts=Replicate())
    if style == "rowwise" and not isinstance(module, nn.Embedding):
        return RowwiseParallel()
    # rowwise_split_input, and an embedding split over its rows: the input whole on every rank
    return RowwiseParallel(input_layouts=Replicate())


def resolve_plan(model_name: str, inner: nn.Module, plan: dict[str, str],
                 tp: int | None = None) -> dict[str, tuple[str, nn.Module]]:
    """The plan's paths as the modules they name: {module path: (style, module)}. A layer whose weight is
    tied to another's (a tied LM head) stays whole, as the embedding it shares its weight with. A path
    that names no layer, a module no style splits, or (given `tp`) a size tp does not divide is a
    ConfigError naming the model and the path."""
    where = f"models.{model_name}.tp_plan"
    shared: dict[int, int] = {}
    for _, parameter in inner.named_parameters(remove_duplicate=False):
        shared[id(parameter)] = shared.get(id(parameter), 0) + 1
    modules = dict(inner.named_modules())
    resolved: dict[str, tuple[str, nn.Module]] = {}
    for path, style in plan.items():
        pattern = re.compile(re.escape(path).replace(r"\*", r"[^.]+"))
        names = [name for name in modules if pattern.fullmatch(name)]
        if not names:
            raise ConfigError(f"{where}: {path!r} names no module of the model")
        for name in names:
            module = modules[name]
            if not isinstance(module, (nn.Linear, nn.Embedding)):
                raise ConfigError(f"{where}: {name} is a {type(module).__name__}; a plan splits "
                                  "nn.Linear and nn.Embedding layers")
            if shared[id(module.weight)] > 1:
                continue
            if tp is not None:
                size, what = _split_size(style, module)
                if size % tp:
                    raise ConfigError(f"{where}: tp={tp} does not divide {name}'s {size} {what}")
            resolved[name] = (style, module)
    return resolved


def _split_size(style: str, module: nn.Module) -> tuple[int, str]:
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, "rows"
    if style in COLUMN_STYLES:
        return module.out_features, "output features"
    return module.in_features, "input features"


def split_params(resolved: dict[str, tuple[str, nn.Module]]) -> dict[str, int]:
    """Elements of each split layer that its ranks share out (a column-parallel bias too; a row-parallel
    bias stays whole)."""
    counts = {}
    for name, (style, module) in resolved.items():
        bias = module.bias if style in COLUMN_STYLES and getattr(module, "bias", None) is not None else None
        counts[name] = module.weight.numel() + (bias.numel() if bias is not None else 0)
    return counts


def parallelize_plan(model: nn.Module, tp_mesh, plan: dict[str, str]) -> dict[str, str]:
    """Split a user's (meta) model over `tp_mesh` by its plan; returns {module path: style} as applied."""
    from torch.distributed.tensor.parallel import parallelize_module

    resolved = resolve_plan(model.spec.name, model.inner, plan, tp_mesh.size())
    parallelize_module(model.inner, tp_mesh,
                       {name: parallel_style(style, module) for name, (style, module) in resolved.items()})
    return {name: style for name, (style, _) in resolved.items()}
