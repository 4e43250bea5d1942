"""A user's own models (config.yaml's `models`): built, checked, counted and traced from the model itself.

- `LanguageModel` wraps what the user gave (a transformers causal LM built from its config, or the
  module a factory returns) in the interface every runner trains: forward(inputs, targets) -> the mean
  loss (targets are the next tokens), `blocks` (the repeated layer: what FSDP2 shards one at a time and
  checkpointing recomputes), `init_weights(seed)` (after a meta-device build).
- `count_model` builds the model on fake tensors (no memory, no GPU) and counts what the predictions
  need: parameters (whole, per block, in embeddings, the largest), the matmul parameters and attention's
  FLOPs per position from torch's FLOP counter over one forward at two sequence lengths (x 3 for the step),
  and the width of a block's input. Anything wrong with the definition (a model_type transformers does
  not know, a factory that does not import or returns no module, no block of the class named, a forward
  that gives no loss) is a ConfigError naming the model and key.
- `trace_activations` (the registry's ACTIVATION_TRACER) runs one step on fake tensors at a cell's
  precision mode, attention kernel and sequence length and adds up what each block saves for backward,
  as torchtitan's memory estimator traces a step: the memory model's activations for an architecture
  its formulas do not know.

Facts and traces are kept in `results/models/<name>.json` (beside the results they predicted), keyed
by the definition's hash, so a definition is counted once, however many processes ask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainbench.errors import ConfigError
from trainbench.registry import models as registry
from trainbench.registry.models import ActivationTrace, ModelFacts, ModelSpec, trace_key
from trainbench.study.models import definition_of

FACTS_DIR = Path("results/models")  # relative to the workspace (the folder of config.yaml)
COUNT_SEQ = (64, 128)  # the two sequence lengths FLOPs are counted at (the model's context permitting)


# --- building ---------------------------------------------------------------------------------------

def _hf_config(spec: ModelSpec, attention: str):
    from transformers import AutoConfig

    keys = dict(definition_of(spec)["config"])
    model_type = keys.pop("model_type")
    for drop in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        keys.pop(drop, None)
    try:
        config = AutoConfig.for_model(model_type, **keys)
    except ValueError as error:  # transformers' "Unrecognized model identifier" among others
        import transformers

        raise ConfigError(f"models.{spec.name}: transformers {transformers.__version__} cannot make a config "
                          f"of model_type {model_type!r}: {str(error).splitlines()[0][:200]}") from None
    config.use_cache = False
    # the cell's kernel: SDPA (whichever kernel the worker holds it to) or the eager softmax(QK^T)V; a
    # model transformers gives no SDPA implementation runs its own (the model's facts say so: sdpa)
    config._attn_implementation = "sdpa" if attention != "eager" and has_sdpa(config) else "eager"
    return config


def has_sdpa(config) -> bool:
    """Whether transformers implements the causal LM of this config (and every sub-model it builds) with
    torch's scaled_dot_product_attention."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    return bool(getattr(model_class, "_supports_sdpa", False))


def _factory(spec: ModelSpec) -> nn.Module:
    definition = definition_of(spec)
    module_name, function_name = definition["factory"].split(":")
    where = f"models.{spec.name}.factory"
    folder = spec.source_dir or os.getcwd()  # the factory's module is found from the folder defining it
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 (whatever the user's module raises while importing)
        raise ConfigError(f"{where}: cannot import {module_name!r}: {type(error).__name__}: "
                          f"{error}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"{where}: module {module_name!r} has no function {function_name!r}")
    try:
        built = function(**definition["args"])
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"{where}: {definition['factory']}(**args) raised {type(error).__name__}: "
                          f"{error}"[:400]) from None
    if not isinstance(built, nn.Module):
        raise ConfigError(f"{where}: {definition['factory']} returned a {type(built).__name__}, not a "
                          "torch.nn.Module")
    return built


def build_inner(spec: ModelSpec, attention: str = "sdpa", dtype: torch.dtype | None = None,
                initialise: bool = True) -> nn.Module:
    """The user's model itself, in the current device context (meta, fake or a device), its parameters in
    `dtype` (default: torch's, fp32); random weights, or, with initialise=False, a transformers model's
    left as allocated (built under ZeRO-3's partitioning, whose placeholders cannot be initialised: the
    weights are drawn afterwards, module by module, gathered; and on fake tensors, where nothing is)."""
    with _default_dtype(dtype):
        if definition_of(spec)["kind"] == "hf":
            from transformers import AutoModelForCausalLM
            from transformers.initialization import no_init_weights

            with contextlib.nullcontext() if initialise else no_init_weights():
                model = AutoModelForCausalLM.from_config(_hf_config(spec, attention),
                                                         dtype=dtype or torch.get_default_dtype())
            if not initialise:  # transformers ties the LM head to the embedding in what was skipped
                model.tie_weights()
            return model
        return _factory(spec)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype or before)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def block_names(spec: ModelSpec, inner: nn.Module) -> set[str]:
    """The class names a block may have: the definition's `block`, else transformers' _no_split_modules
    where the model holds them, else the classes of the longest ModuleList of the model (its layers)."""
    block = definition_of(spec).get("block")
    if block:
        return {block.rsplit(".", 1)[-1]}
    present = {type(m).__name__ for m in inner.modules()}
    named = set(getattr(inner, "_no_split_modules", None) or ()) & present
    return named or repeated_classes(inner)


def repeated_classes(inner: nn.Module) -> set[str]:
    """The classes of the layers of a model that names none: the nn.ModuleList of one or two classes (a
    hybrid stacks two kinds of layer) that holds the most parameters (the layers hold any list of
    experts inside them)."""
    best, most = None, -1
    for module in inner.modules():
        if isinstance(module, nn.ModuleList) and 0 < len({type(m) for m in module}) <= 2:
            size = sum(p.numel() for p in module.parameters())
            if size > most:
                best, most = module, size
    return {type(m).__name__ for m in best} if best is not None else set()


def find_blocks(spec: ModelSpec, inner: nn.Module) -> list[nn.Module]:
    """The outermost modules of the block class, in order; a ConfigError naming the classes the model
    has where it holds none."""
    names = block_names(spec, inner)
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in inner.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in names:
            found.append(module)
            inside |= {id(m) for m in module.modules()}
    if not found:
        classes = sorted({type(m).__name__ for m in inner.modules()})
        what = f"class {sorted(names)[0]!r}" if names else "class named (the model has no list of layers)"
        raise ConfigError(f"models.{spec.name}.block: no module of {what} in the model; set `block` to the "
                          f"class repeated in it (its classes: {', '.join(classes)})"[:500])
    return found


class LanguageModel(nn.Module):
    """A user's model as every runner trains it: forward(inputs, targets) gives the mean cross-entropy
    of the next tokens (a transformers model's logits taken in fp32, as trainbench's GPT does; a
    factory's module computes its own)."""

    def __init__(self, spec: ModelSpec, attention: str = "sdpa", dtype: torch.dtype | None = None,
                 initialise: bool = True):
        super().__init__()
        self.spec = spec
        self.inner = build_inner(spec, attention, dtype, initialise)
        self.hf = definition_of(spec)["kind"] == "hf"
        # a list, not a ModuleList: the blocks stay where they are in the user's model
        self.blocks = find_blocks(spec, self.inner)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.hf:
            logits = self.inner(input_ids=inputs).logits
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss = self.inner(inputs, labels=targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = list(loss.shape) if isinstance(loss, torch.Tensor) else ""
            raise TypeError(f"model {self.spec.name!r}: forward(input_ids, labels) returned "
                            f"{type(loss).__name__}{shape}, not the mean loss (a scalar tensor)")
        return loss

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Random weights after a meta-device build (to_empty): transformers' own initialisation, which
        also remakes its non-persistent buffers (rotary tables), or a factory model's `init_weights()`,
        else every submodule's reset_parameters()."""
        torch.manual_seed(seed)
        if not self.hf and callable(getattr(self.inner, "init_weights", None)):
            self.inner.init_weights()
            return
        for module in self.inner.modules():
            self._init_one(module)

    def init_targets(self):
        """(index, name, module) of every module that owns parameters: what ZeRO-3 gathers and
        initialises one at a time (as trainbench's GPT gives them)."""
        return [(i, name, m) for i, (name, m) in enumerate(self.inner.named_modules())
                if any(True for _ in m.parameters(recurse=False))]

    @torch.no_grad()
    def init_module(self, index: int, name: str, module: nn.Module, seed: int) -> None:
        torch.manual_seed(seed * 1_000_003 + index)
        self._init_one(module)

    def _init_one(self, module: nn.Module) -> None:
        if self.hf:
            self.inner._init_weights(module)
        elif callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()

    def set_activation_checkpointing(self) -> None:
        """Each block recomputed in backward (torch's checkpoint wrapper in place of the block)."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        wrapped = []
        for block in self.blocks:
            parent, name = _parent_of(self.inner, block)
            wrapper = checkpoint_wrapper(block)
            setattr(parent, name, wrapper) if not name.isdigit() else parent.__setitem__(int(name), wrapper)
            wrapped.append(wrapper)
        self.blocks = wrapped


def _parent_of(root: nn.Module, child: nn.Module) -> tuple[nn.Module, str]:
    for module in root.modules():
        for name, sub in module.named_children():
            if sub is child:
                return module, name
    raise ValueError("the block is not inside the model")


# --- counting and tracing on fake tensors ------------------------------------------------------------

# what a facts file was counted by: a change to the counting makes every model count again
COUNTING = "step-flops/tp-plan/gpu-attention-autocast/experts/fetches"


def _hash(spec: ModelSpec) -> str:
    return hashlib.sha256(f"{COUNTING}\n{spec.definition}".encode()).hexdigest()[:16]


def _storage(tensor: torch.Tensor):
    return tensor.untyped_storage()._cdata


class _FakeStepMode(torch.utils._python_dispatch.TorchDispatchMode):
    """What one step on fake tensors needs beyond FakeTensorMode, as a dispatch mode above it:

    - it notes every copy of a parameter in another dtype (autocast's cached casts): the memory model
      counts those with the weights, so the trace leaves them out of the activations;
    - a mixture of experts' grouped matmul in fp32 or fp16 runs on bf16 fake operands (the fake kernel
      accepts bf16 alone; its output, and what autograd saves, keep the model's dtype);
    - a branch on a random draw or a flag (`if torch.rand([]) < layerdrop`, `if mask.any()`) reads False:
      the path where nothing is dropped or special, the expected step's. A number read off a tensor
      (`.item()`, `.tolist()`) stays data-dependent: such a model's step runs on real tensors (_step).
    On real tensors it only notes the casts."""

    GROUPED = tuple(getattr(torch.ops.aten, name).default for name in ("_grouped_mm", "grouped_mm")
                    if hasattr(torch.ops.aten, name))

    def __init__(self, parameters: set, fake: bool = True):
        super().__init__()
        self.parameters, self.casts, self.fake = parameters, set(), fake
        self.held: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.fake:
            return self._noting_casts(func, args, kwargs)
        if func is torch.ops.aten._local_scalar_dense.default and args[0].dtype == torch.bool:
            return False
        if func in self.GROUPED and args[0].dtype != torch.bfloat16:
            dtype = args[0].dtype
            half = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                    for a in args]
            return func(*half, **kwargs).to(dtype)
        return self._noting_casts(func, args, kwargs)

    def _noting_casts(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if func is torch.ops.aten._to_copy.default and _storage(_local(args[0])) in self.parameters:
            self.casts.add(_storage(_local(out)))
            self.held.append(_local(out).untyped_storage())  # its address stays its own (_SavedByBlock)
        return out


class _AttentionAsOnGpu(torch.overrides.TorchFunctionMode):
    """scaled_dot_product_attention as a CUDA GPU runs it, on whatever device the step is traced: the
    flash kernel for 16-bit operands of one head width without a mask, the memory-efficient one
    otherwise (fp32, a mask, a value head of another width). Neither keeps the attention matrix; the
    CPU falls back to the math path (which keeps it) wherever dropout is on, so that a model with
    attention dropout traced on the CPU's kernels is counted several times too heavy."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        return _sdpa_as_on_gpu(*args, **(kwargs or {}))


def _sdpa_as_on_gpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    from torch._subclasses.fake_tensor import FakeTensor

    aten = torch.ops.aten
    if torch.is_autocast_enabled("cpu"):
        # autocast casts attention's operands to its 16-bit type (on a GPU too: SDPA is on its list), so the
        # kernel keeps 16-bit copies; called by its aten name, the kernel would not be cast
        half = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(half) if t.is_floating_point() else t for t in (query, key, value))
    if key.size(-3) != query.size(-3):  # grouped-query attention: the kernels take one key per query head
        repeat = query.size(-3) // key.size(-3)
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # the kernels add a bias: -inf where masked
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    if attn_mask is not None:
        attn_mask = attn_mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    if not isinstance(query, FakeTensor):
        # on real tensors, the CPU's flash kernel, which keeps what the GPU's do (inputs, output, the
        # softmax's log-sum-exp), with dropout off (a GPU's dropout keeps its random state, no mask); a
        # value head of another width padded to the query's (transformers does the same for flash)
        width = value.size(-1)
        if width != query.size(-1):
            value = F.pad(value, (0, query.size(-1) - width))
        out = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                               attn_mask=attn_mask, scale=scale)[0]
        return out[..., :width]
    head = query.size(-1)
    half = query.dtype in (torch.float16, torch.bfloat16)
    if attn_mask is None and half and head <= 256 and head % 8 == 0 and value.size(-1) == head:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, True, dropout_p,
                                                        is_causal, scale=scale)[0]


@contextlib.contextmanager
def _fake_tensor_parallel(tp: int):
    """A tensor-parallel mesh of `tp` ranks in a fake process group (its collectives return at once, as
    torchtitan's memory estimator fakes them), to trace rank 0 of a split model; nothing without tp."""
    if tp == 1:
        yield None
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a tensor-parallel trace makes a process group of its own; this process has one")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        yield init_device_mesh("cpu", (tp,))  # made outside the fake tensors: its ranks are real numbers
    finally:
        dist.destroy_process_group()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A rank's own part of a tensor tensor parallelism splits (a DTensor), or the tensor."""
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor


@dataclasses.dataclass
class _Step:
    """What one traced step of one sample found: the model, the bytes each block saved for backward
    (parameters and their casts left out), each block's input bytes and width, what was saved outside
    the blocks, and the FLOP counter where one counted the forward."""

    model: LanguageModel
    per_block: list[int]
    block_inputs: list[int]
    outside: int
    hidden: list[int]
    counter: Any = None
    real_layers: int = 0  # a step on real tensors: the layers it was built with (fewer than the model's)


class _SavedByBlock:
    """Hooks that attribute each tensor saved for backward to the block running when it was saved (-1:
    outside every block), counting a storage once where it is first saved (rotary tables every block
    multiplies by) and never a parameter's."""

    def __init__(self, model: LanguageModel, parameters: set):
        self.parameters, self.counted = parameters, set()
        # every storage seen, held until the step ends: one freed in the forward (a branch the loss does not
        # use) would otherwise leave its address to a later tensor, which would then count as seen
        self.held: list = []
        self.stack: list[int] = [-1]
        self.saved: dict[int, dict[int, int]] = {}
        self.block_inputs: list[int] = []
        self.hidden: list[int] = []
        index = {id(b): i for i, b in enumerate(model.blocks)}
        self.handles = [h for b in model.blocks for h in (
            b.register_forward_pre_hook(lambda m, a, k: self._enter(index[id(m)], a, k), with_kwargs=True),
            b.register_forward_hook(self._leave, with_kwargs=True))]

    def _enter(self, block: int, args, kwargs) -> None:
        self.stack.append(block)
        first = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(first, torch.Tensor):
            self.block_inputs.append(first.untyped_storage().nbytes())
            self.hidden.append(first.shape[-1])

    def _leave(self, module, args, kwargs, output) -> None:  # a hook that returned a value would replace
        self.stack.pop()                                        # the block's output

    def pack(self, saved_tensor):
        tensor = _local(saved_tensor)
        key = _storage(tensor)
        self.held.append(tensor.untyped_storage())
        if key not in self.parameters and key not in self.counted:
            self.counted.add(key)
            self.saved.setdefault(self.stack[-1], {})[key] = tensor.untyped_storage().nbytes()
        return saved_tensor

    def remove(self, casts: set) -> None:
        for handle in self.handles:
            handle.remove()
        for tensors in self.saved.values():
            for key in casts & set(tensors):
                del tensors[key]


# what a step on fake tensors cannot run: a value read off a tensor, or a shape that depends on one
DATA_DEPENDENT = ("DataDependentOutputException", "DynamicOutputShapeException",
                  "GuardOnDataDependentSymNode")
# a model whose step must run on real tensors is built with this many layers at most (more where it
# stacks kinds of layer: one of each), its per-layer figures scaled to its own layers
REAL_STEP_LAYERS = 2
REAL_STEP_HOST_SHARE = 0.25  # of the host's memory, at most, for a step on real tensors


class _NeedsRealTensors(Exception):
    """The model's step reads values off its tensors (`.item()`, `.tolist()`), which fake tensors lack."""


def _step(spec: ModelSpec, mode: str, attention: str, seq_len: int, flops: bool = False,
          tp: int = 1) -> _Step:
    """One forward and backward of one sample, attention as a GPU runs it (with tp: on rank 0 of the model
    split by its tensor-parallel plan): on fake tensors, or, where the model reads values off its tensors
    (value-dependent routing), on real tensors on the CPU, the model built with fewer layers."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with _fake_tensor_parallel(tp) as mesh, FakeTensorMode():
            return _run_step(spec, mode, attention, seq_len, flops, mesh, fake=True)
    except _NeedsRealTensors as why:
        if tp > 1:
            raise ConfigError(f"models.{spec.name}: {why}; a tensor-parallel rank of it cannot be "
                              "traced") from None
        shorter = _with_fewer_layers(spec)
        _check_real_step_fits(spec, shorter, why)
        step = _run_step(shorter, mode, attention, seq_len, flops, None, fake=False)
        step.real_layers = len(step.model.blocks)
        return step


def _run_step(spec: ModelSpec, mode: str, attention: str, seq_len: int, flops: bool, mesh,
              fake: bool) -> _Step:
    count_kernels()
    model = LanguageModel(spec, attention, torch.bfloat16 if mode.startswith("half") else None,
                          initialise=not fake)
    if mesh is not None:
        from trainbench.registry.models import tensor_parallel_plan
        from trainbench.training.tensor_parallel import parallelize_plan

        parallelize_plan(model, mesh, tensor_parallel_plan(definition_of(spec))[0])
    parameters = {_storage(_local(p)) for p in model.parameters()}
    hooks = _SavedByBlock(model, parameters)
    step_mode = _FakeStepMode(parameters, fake)
    counter = _flop_counter() if flops else contextlib.nullcontext()
    where = "on fake tensors" if fake else "on the CPU"
    try:
        with step_mode, torch.autograd.graph.saved_tensors_hooks(hooks.pack, lambda t: t), \
                _AttentionAsOnGpu():
            _forward_backward(model, spec, mode, seq_len, counter)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 (the user's model, however it fails)
        if fake and type(error).__name__ in DATA_DEPENDENT:
            raise _NeedsRealTensors(f"its step reads values off its tensors "
                                    f"({type(error).__name__})") from None
        raise ConfigError(f"models.{spec.name}: one training step of the model {where} failed "
                          f"({type(error).__name__}: {str(error)[:300]})") from None
    finally:
        hooks.remove(step_mode.casts)
    per_block = [sum(hooks.saved.get(i, {}).values()) for i in range(len(model.blocks))]
    return _Step(model, per_block, hooks.block_inputs, sum(hooks.saved.get(-1, {}).values()), hooks.hidden,
                 counter if flops else None)


def _with_fewer_layers(spec: ModelSpec) -> ModelSpec:
    """The spec of the same transformers model with REAL_STEP_LAYERS layers (one of each kind where its
    config lists its layers' kinds), every per-layer list of its config cut to as many; a factory's
    model as it is."""
    definition = definition_of(spec)
    if definition["kind"] != "hf":
        return spec
    config = json.loads(json.dumps(definition["config"]))
    target = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    from trainbench.study.models import HF_KEYS, canonical

    keys = [k for k in HF_KEYS["n_layer"] if isinstance(target.get(k), int)]
    if not keys:
        return spec
    layers = target[keys[0]]
    kinds = [v for v in target.values() if isinstance(v, list) and len(v) == layers
             and all(isinstance(x, str) for x in v)]
    fewer = max([REAL_STEP_LAYERS] + [max(kind.index(x) for x in set(kind)) + 1 for kind in kinds])
    fewer = min(layers, fewer)
    for key, value in list(target.items()):
        if key in keys:
            target[key] = fewer
        elif isinstance(value, list) and len(value) == layers:
            target[key] = value[:fewer]
    return dataclasses.replace(spec, definition=canonical({**definition, "config": config}), facts=None)


def _check_real_step_fits(spec: ModelSpec, shorter: ModelSpec, why: _NeedsRealTensors) -> None:
    """A ConfigError naming the model where its step on real tensors would take too much of the host."""
    from trainbench.registry.hardware import host_memory_mib

    with torch.device("meta"):
        size = sum(p.numel() for p in build_inner(shorter, initialise=False).parameters())
    need_mib = size * 16 / 2**20  # weights, gradients and what the step allocates beside them, in fp32
    if need_mib > REAL_STEP_HOST_SHARE * host_memory_mib():
        raise ConfigError(f"models.{spec.name}: {why}, so it is counted by a step on real tensors on the "
                          f"CPU, which at {size / 1e9:.1f}B parameters in its first layers needs "
                          f"{need_mib / 1024:.0f} GiB; this host has {host_memory_mib() / 1024:.0f}")


def _forward_backward(model: LanguageModel, spec: ModelSpec, mode: str, seq_len: int, counter) -> None:
    """The step itself, its FLOPs counted forward and backward (model_flops makes them model FLOPs)."""
    tokens = torch.randint(0, spec.vocab_size, (1, seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if mode.startswith("autocast")
                else contextlib.nullcontext())
    with counter:
        with autocast:
            loss = model(inputs, targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(f"forward gave {type(loss).__name__}, not a scalar loss")
        loss.backward()


def _attention_ops() -> dict:
    """Each attention kernel's backward op, by its forward op."""
    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention: aten._scaled_dot_product_flash_attention_backward,
            aten._scaled_dot_product_efficient_attention:
                aten._scaled_dot_product_efficient_attention_backward,
            aten._scaled_dot_product_flash_attention_for_cpu:
                aten._scaled_dot_product_flash_attention_for_cpu_backward,
            aten.convolution: aten.convolution_backward}


def model_flops(ops: dict) -> float:
    """A step's model FLOPs from the FLOPs torch's counter found, op by op: as counted, except that the
    backward of an attention kernel or a convolution counts twice its forward (torch's count of a fused
    attention backward includes the scores it recomputes, which model FLOPs leave out; its count of a
    grouped convolution's backward ignores the groups)."""
    total = float(sum(ops.values()))
    for forward, backward in _attention_ops().items():
        if backward in ops:
            total += 2 * ops.get(forward, 0) - ops[backward]
    return total


def _flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def count_kernels() -> None:
    """FLOP formulas torch's counter lacks: the CPU kernel of scaled_dot_product_attention (where a step
    runs on the CPU; its FLOPs are the same matmuls), and the grouped matmul of a mixture of experts
    (each token's rows times its expert's weights: 2 x tokens x in x out)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward, backward = (aten._scaled_dot_product_flash_attention_for_cpu,
                         aten._scaled_dot_product_flash_attention_for_cpu_backward)
    if forward in flop_counter.flop_registry:
        return

    def forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    def backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    flop_counter.register_flop_formula(forward)(forward_flops)
    flop_counter.register_flop_formula(backward)(backward_flops)
    for grouped in _FakeStepMode.GROUPED:
        flop_counter.register_flop_formula(grouped.overloadpacket)(_grouped_mm_flops)


def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """A grouped matmul's FLOPs: two per output element and contracted element. Its groups split the
    rows (tokens through their experts) or, where both operands are 2-D, the contracted dimension (a
    weight gradient: one output per group, each over its own slice)."""
    outputs = math.prod(out_shape)
    if len(a_shape) == 2 and len(b_shape) == 2:
        outputs //= out_shape[0]
    return 2 * outputs * a_shape[-1]


def count_model(spec: ModelSpec, facts_dir: Path = FACTS_DIR) -> ModelFacts:
    """The model's facts, from its file under `facts_dir` where its definition was counted before."""
    cached = _read(spec, facts_dir)
    if cached is not None:
        return cached
    with torch.device("meta"):  # the whole model's shape: no memory, every layer
        model = LanguageModel(spec, initialise=False)
    seqs = count_lengths(spec)
    traces: dict[str, ActivationTrace] = {}
    (total_1, block_1, experts_1, hidden), (total_2, block_2, _, _) = [
        _training_flops_per_token(spec, seq, len(model.blocks), traces) for seq in seqs]
    # what grows with the sequence is attention's, the rest the matmuls' (6 per parameter that
    # multiplies each token, forward and backward)
    attention = (total_2 - total_1) / (seqs[1] - seqs[0])
    n_blocks = len(model.blocks)
    block_sizes = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    embeddings = sum(p.numel() for m in model.inner.modules() if isinstance(m, nn.Embedding)
                     for p in m.parameters(recurse=False))
    facts = ModelFacts(
        params_total=sum(p.numel() for p in model.parameters()), embedding_params=embeddings,
        block_params=round(sum(block_sizes) / n_blocks),
        largest_param=max(p.numel() for p in model.parameters()),
        matmul_params=round((total_1 - attention * seqs[0]) / 6),
        block_matmul_params=round((block_1 - (block_2 - block_1) / (seqs[1] - seqs[0]) * seqs[0])
                                  / 6 / n_blocks),
        attention_flops_per_position=attention, hidden=hidden or spec.d_model,
        n_blocks=n_blocks, block_class=type(model.blocks[0]).__name__,
        sdpa=model.inner.config._attn_implementation == "sdpa" if model.hf else True,
        expert_params=_expert_params(model), active_expert_params=round(experts_1 / 6),
        fetched_modules_per_block=_fetched_modules(model),
        vocab_size=spec.vocab_size, traces=traces, **_tp_facts(spec, model))
    _write(spec, facts, facts_dir)
    return facts


def count_lengths(spec: ModelSpec) -> list[int]:
    """The two sequence lengths a model's FLOPs are counted at: COUNT_SEQ, within half its context (a
    model may offset its positions)."""
    seqs = [min(s, spec.max_seq // 2) for s in COUNT_SEQ]
    if seqs[0] == seqs[1]:
        seqs[0] = max(1, seqs[1] // 2)
    return seqs


def _training_flops_per_token(spec: ModelSpec, seq: int, n_blocks: int,
                              traces: dict[str, ActivationTrace]) -> tuple[float, float, float, int]:
    """Model FLOPs per token of one training step at this length (forward and backward, model_flops) of
    the whole model, of its blocks and of its experts, and the width of a block's input. A step run with
    fewer layers (on real tensors) has its blocks' FLOPs scaled to the model's layers."""
    step = _step(spec, "fp32", "sdpa", seq, flops=True)
    traces[trace_key("fp32", "sdpa", seq)] = _trace_of(step)  # the step is that trace's too
    by_module = step.counter.get_flop_counts()
    total, blocks, experts = (model_flops(by_module["Global"]), _block_flops(step.model, by_module),
                              _expert_flops(by_module))
    if step.real_layers:
        scale = n_blocks / step.real_layers
        total, blocks, experts = total + blocks * (scale - 1), blocks * scale, experts * scale
    return total / seq, blocks / seq, experts / seq, step.hidden[0] if step.hidden else 0


EXPERTS = re.compile(r"(^|\.)experts(\.\d+)?$")


def _experts_modules(names) -> set[str]:
    """The module paths that are a mixture's experts, by transformers' name for them (`experts`: one
    module of all experts, or a list of them, `experts.0`, ...), the list's members only where the list
    itself never ran as a module."""
    found = {name for name in names if EXPERTS.search(name)}
    whole = {name for name in found if name.endswith("experts")}
    return {name for name in found if name in whole or name.rsplit(".", 1)[0] not in whole}


def _fetched_modules(model: LanguageModel) -> float:
    """Modules per block (the mean) owning PERSISTENT_PARAMS parameter elements or more."""
    from trainbench.registry.models import PERSISTENT_PARAMS

    owned = [sum(p.numel() for p in m.parameters(recurse=False)) for b in model.blocks for m in b.modules()]
    return sum(size >= PERSISTENT_PARAMS for size in owned) / len(model.blocks)


def _expert_params(model: LanguageModel) -> int:
    paths = _experts_modules(name for name, _ in model.inner.named_modules())
    modules = dict(model.inner.named_modules())
    return sum(p.numel() for path in paths for p in modules[path].parameters())


def _expert_flops(by_module: dict[str, dict]) -> float:
    """FLOPs the counter found inside a mixture's experts (0 for a dense model)."""
    return sum(model_flops(by_module[name]) for name in _experts_modules(by_module))


def _tp_facts(spec: ModelSpec, model: LanguageModel) -> dict[str, int]:
    """What the model's tensor-parallel plan splits (ModelFacts.tp_*); nothing where it has no plan. A
    plan of the definition's own that does not fit the model is refused here, before anything runs;
    transformers' plan, only by a cell that splits by it."""
    from trainbench.registry.models import TP_STYLES, tensor_parallel_plan
    from trainbench.training.tensor_parallel import resolve_plan, split_params

    definition = definition_of(spec)
    plan, _ = tensor_parallel_plan(definition)
    if plan is None or any(style not in TP_STYLES for style in plan.values()):
        return {}
    try:
        resolved = resolve_plan(spec.name, model.inner, plan)
    except ConfigError:
        if definition.get("tp_plan"):
            raise
        return {}
    inside = [name for name, module in model.inner.named_modules() if any(module is b for b in model.blocks)]
    in_block = {name for name in resolved if any(name.startswith(block + ".") for block in inside)}
    sizes = split_params(resolved)
    return {"tp_block_params": round(sum(sizes[n] for n in in_block) / len(model.blocks)),
            "tp_other_params": sum(size for name, size in sizes.items() if name not in in_block),
            "tp_collectives_per_block": round(len(in_block) / len(model.blocks))}


def _block_flops(model: LanguageModel, by_module: dict[str, dict]) -> float:
    """FLOPs counted inside the blocks (FlopCounterMode's per-module totals, by module path)."""
    paths = {name for name, module in model.named_modules() if any(module is b for b in model.blocks)}
    # the counter's module names are the paths under the model's class name ("LanguageModel.inner...")
    total = 0.0
    for name, ops in by_module.items():
        path = name.split(".", 1)[1] if "." in name else ""
        if path in paths:
            total += model_flops(ops)
    return total


def _trace_of(step: _Step) -> ActivationTrace:
    return ActivationTrace(block_bytes=sum(step.per_block) / len(step.per_block),
                           block_input_bytes=sum(step.block_inputs) / max(1, len(step.block_inputs)),
                           outside_bytes=float(step.outside))


def trace_activations(spec: ModelSpec, mode: str, attention: str, seq_len: int, tp: int = 1,
                      facts_dir: Path = FACTS_DIR) -> ActivationTrace:
    """What one sample saves for backward at this precision mode, kernel and length, on one rank of `tp`
    (the registry's ACTIVATION_TRACER); kept in the model's facts file."""
    key = trace_key(mode, attention, seq_len, tp)
    stored = _read_document(spec, facts_dir)
    if stored is not None and key in stored.get("traces", {}):
        return ActivationTrace(**stored["traces"][key])
    trace = _trace_of(_step(spec, mode, attention, seq_len, tp=tp))
    document = _read_document(spec, facts_dir)
    if document is not None:
        document.setdefault("traces", {})[key] = trace.__dict__
        _write_json_atomic(_facts_path(spec, facts_dir), document)
    return trace


# --- the facts file ------------------------------------------------------------------------------------

def _facts_path(spec: ModelSpec, facts_dir: Path) -> Path:
    return facts_dir / f"{spec.name}.json"


def _read_document(spec: ModelSpec, facts_dir: Path) -> dict[str, Any] | None:
    path = _facts_path(spec, facts_dir)
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if document.get("definition_sha256") == _hash(spec) else None


def _read(spec: ModelSpec, facts_dir: Path) -> ModelFacts | None:
    document = _read_document(spec, facts_dir)
    if document is None:
        return None
    traces = {k: ActivationTrace(**v) for k, v in document.get("traces", {}).items()}
    return ModelFacts(**document["facts"], traces=traces)


def _write(spec: ModelSpec, facts: ModelFacts, facts_dir: Path) -> None:
    import transformers

    document = {"model": spec.name, "definition_sha256": _hash(spec),
                "definition": json.loads(spec.definition),
                "counted_with": f"torch {torch.__version__}, transformers {transformers.__version__}: built "
                                f"on fake tensors; FLOPs 3 x those torch's FLOP counter finds in one "
                                f"forward at sequence lengths {list(COUNT_SEQ)}",
                "facts": {k: v for k, v in facts.__dict__.items() if k != "traces"},
                "traces": {k: v.__dict__ for k, v in facts.traces.items()}}
    _write_json_atomic(_facts_path(spec, facts_dir), document)


def _write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


# --- the registry's view -------------------------------------------------------------------------------

def counted(spec: ModelSpec, facts_dir: Path = FACTS_DIR) -> ModelSpec:
    """The spec with its facts, its shape taken from them where its definition did not say."""
    import dataclasses

    facts = count_model(spec, facts_dir)
    return dataclasses.replace(spec, facts=facts, n_layer=facts.n_blocks, d_model=facts.hidden,
                               block_class=facts.block_class)


def count_registered(facts_dir: Path = FACTS_DIR) -> None:
    """Count every model the loaded config registered (the workflow calls this once it has loaded)."""
    registry.register_user_models({name: counted(spec, facts_dir)
                                   for name, spec in registry.USER_MODELS.items()})


def register_from_params(name: str, definition: str, facts_dir: Path = FACTS_DIR) -> None:
    """In a rank's process, which loads no config: the cell's model from the definition it carries."""
    if not definition or (name in registry.USER_MODELS and registry.USER_MODELS[name].facts is not None):
        return
    from trainbench.study.models import spec_from_definition

    spec = spec_from_definition(name, json.loads(definition))
    registry.register_user_models({**registry.USER_MODELS, name: counted(spec, facts_dir)})


registry.ACTIVATION_TRACER = trace_activations
