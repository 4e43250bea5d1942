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
import hashlib
import importlib
import json
import os
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
    # the cell's kernel: SDPA (whichever kernel the worker holds it to) or the eager softmax(QK^T)V
    config._attn_implementation = "eager" if attention == "eager" else "sdpa"
    return config


def _factory(spec: ModelSpec) -> nn.Module:
    definition = definition_of(spec)
    module_name, function_name = definition["factory"].split(":")
    where = f"models.{spec.name}.factory"
    if os.getcwd() not in sys.path:  # the factory's module is found from the folder of config.yaml
        sys.path.insert(0, os.getcwd())
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
    """The class names a block may have: the definition's `block`, else transformers' _no_split_modules."""
    block = definition_of(spec).get("block")
    if block:
        return {block.rsplit(".", 1)[-1]}
    return set(getattr(inner, "_no_split_modules", None) or ())


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
        what = f"class {sorted(names)[0]!r}" if names else "class named (the model has no _no_split_modules)"
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
COUNTING = "forward-flops-x3/tp-plan"


def _hash(spec: ModelSpec) -> str:
    return hashlib.sha256(f"{COUNTING}\n{spec.definition}".encode()).hexdigest()[:16]


class _CastsOfParameters(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes every copy of a parameter in another dtype (autocast's cached casts): the memory model counts
    those with the weights, so the trace leaves them out of the activations."""

    def __init__(self, parameters: set):
        super().__init__()
        self.parameters, self.casts = parameters, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and _storage(_local(args[0])) in self.parameters:
            self.casts.add(_storage(_local(out)))
        return out


def _storage(tensor: torch.Tensor):
    return tensor.untyped_storage()._cdata


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


def _fake_step(spec: ModelSpec, mode: str, attention: str, seq_len: int, flops: bool = False, tp: int = 1):
    """One forward and backward of one sample on fake tensors (with tp: on rank 0 of the model split by its
    tensor-parallel plan): (model, per-block saved bytes, block input bytes, outside saved bytes, FLOP
    counter or None)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    _count_cpu_attention()
    with _fake_tensor_parallel(tp) as mesh, FakeTensorMode():
        model = LanguageModel(spec, attention, torch.bfloat16 if mode.startswith("half") else None,
                              initialise=False)
        if mesh is not None:
            from trainbench.registry.models import tensor_parallel_plan
            from trainbench.training.tensor_parallel import parallelize_plan

            plan, _ = tensor_parallel_plan(definition_of(spec))
            parallelize_plan(model, mesh, plan)
        params = {_storage(_local(p)) for p in model.parameters()}
        tokens = torch.randint(0, spec.vocab_size, (1, seq_len + 1))
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        stack: list[int] = [-1]
        saved: dict[int, dict[int, int]] = {}
        block_inputs: list[int] = []
        hidden: list[int] = []

        def enter(module, args, kwargs):
            stack.append(index[id(module)])
            first = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(first, torch.Tensor):
                block_inputs.append(first.untyped_storage().nbytes())
                hidden.append(first.shape[-1])

        def leave(module, args, kwargs, output):
            stack.pop()

        index = {id(b): i for i, b in enumerate(model.blocks)}
        handles = [h for b in model.blocks for h in (b.register_forward_pre_hook(enter, with_kwargs=True),
                                                   b.register_forward_hook(leave, with_kwargs=True))]
        casts = _CastsOfParameters(params)

        counted: set = set()

        def pack(saved_tensor):
            # a tensor saved in several places (rotary tables every block multiplies by) counts once,
            # where it was first saved
            tensor = _local(saved_tensor)
            key = _storage(tensor)
            if key not in params and key not in counted:
                counted.add(key)
                saved.setdefault(stack[-1], {})[key] = tensor.untyped_storage().nbytes()
            return saved_tensor

        counter = FlopCounterMode(display=False) if flops else contextlib.nullcontext()
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if mode.startswith("autocast")
                    else contextlib.nullcontext())
        try:
            with casts, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                # the forward's FLOPs only: model FLOPs are three times them (the backward twice the
                # forward, PaLM's and MFU's convention), where a kernel's backward also recomputes
                with counter, autocast:
                    loss = model(inputs, targets)
                if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                    raise TypeError(f"forward gave {type(loss).__name__}, not a scalar loss")
                loss.backward()
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 (the user's model, however it fails)
            raise ConfigError(f"models.{spec.name}: one training step of the model on fake tensors failed "
                              f"({type(error).__name__}: {str(error)[:300]})") from None
        finally:
            for handle in handles:
                handle.remove()
    for tensors in saved.values():
        for key in casts.casts & set(tensors):
            del tensors[key]
    per_block = [sum(saved.get(i, {}).values()) for i in range(len(model.blocks))]
    return model, per_block, block_inputs, sum(saved.get(-1, {}).values()), hidden, counter


def _count_cpu_attention() -> None:
    """torch's FLOP counter knows the CUDA kernels of scaled_dot_product_attention, not the CPU one that
    fake tensors on the CPU dispatch to: count it as the others (its FLOPs are the same matmuls)."""
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


def count_model(spec: ModelSpec, facts_dir: Path = FACTS_DIR) -> ModelFacts:
    """The model's facts, from its file under `facts_dir` where its definition was counted before."""
    cached = _read(spec, facts_dir)
    if cached is not None:
        return cached
    seqs = [min(s, spec.max_seq) for s in COUNT_SEQ]
    if seqs[0] == seqs[1]:
        seqs[0] = max(1, seqs[1] // 2)
    counts = []
    for seq in seqs:
        model, per_block, _, _, hidden, counter = _fake_step(spec, "fp32", "sdpa", seq, flops=True)
        by_module = counter.get_flop_counts()
        total = counter.get_total_flops() / seq
        counts.append((total, _block_flops(model, by_module) / seq))
    # forward FLOPs per token at two lengths, made training FLOPs (x 3): what grows with the sequence
    # is attention's, the rest the matmuls' (6 per parameter that multiplies each token)
    (total_1, block_1), (total_2, block_2) = [(3 * total, 3 * block) for total, block in counts]
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
        attention_flops_per_position=attention, hidden=hidden[0] if hidden else spec.d_model,
        n_blocks=n_blocks, block_class=type(model.blocks[0]).__name__, **_tp_facts(spec, model))
    _write(spec, facts, facts_dir)
    return facts


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
            total += sum(ops.values())
    return total


def trace_activations(spec: ModelSpec, mode: str, attention: str, seq_len: int, tp: int = 1,
                      facts_dir: Path = FACTS_DIR) -> ActivationTrace:
    """What one sample saves for backward at this precision mode, kernel and length, on one rank of `tp`
    (the registry's ACTIVATION_TRACER); kept in the model's facts file."""
    key = trace_key(mode, attention, seq_len, tp)
    stored = _read_document(spec, facts_dir)
    if stored is not None and key in stored.get("traces", {}):
        return ActivationTrace(**stored["traces"][key])
    _, per_block, block_inputs, outside, _, _ = _fake_step(spec, mode, attention, seq_len, tp=tp)
    trace = ActivationTrace(block_bytes=sum(per_block) / len(per_block),
                            block_input_bytes=sum(block_inputs) / max(1, len(block_inputs)),
                            outside_bytes=float(outside))
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
