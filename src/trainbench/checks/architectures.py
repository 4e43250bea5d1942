"""Which causal LMs of the installed transformers trainbench counts, and how right
(`trainbench check-models architectures`).

Every `model_type` transformers maps to a causal LM is made tiny the way a user shrinks a config (its
widths, layers, experts and vocabulary cut by the names transformers gives them), then:

1. plain transformers trains it one step on the CPU (real tensors, the model's own loss, eager
   attention): where it cannot, the type is *not trained by transformers at this size* and leaves the
   count; that step is also the reference: its parameters, its FLOPs (torch's counter over forward and
   backward) and the bytes it saves for backward (every tensor autograd keeps, parameters left out);
2. trainbench defines it as a user does (`models: {m: {hf: ...}}`), counts it and traces its step at
   each precision mode, as a cell's prediction would: *accepted*, or *refused* with the one line a user
   would read;
3. an accepted type is *counted right* where its parameters, its FLOPs per token and its traced
   activations are each within TOLERANCE of the reference step's.

The result is the coverage table of docs/architectures.md (`--write`); the test suite runs the sweep and
holds the page to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

TOLERANCE = 0.10
MODES = ("half-16",)  # the 16-bit mode traced: the model in bf16, as FSDP2 and DeepSpeed hold it
MODE_SEQ = 8  # ... traced at so few tokens: whether they run, not what they weigh
MAX_TINY_PARAMS = 30e6  # a shrunk config still larger than this is not tiny: not built at all
PAGE = Path("docs/architectures.md")

# A user's shrinking, by the names transformers gives sizes: the first pattern a key matches sets its
# value (never raising it). Lists of ints shrink element-wise (Gemma 3n's per-layer widths).
SIZES: tuple[tuple[str, int], ...] = (
    (r"(hidden_size|n_embd|d_model|dim|embed_dim|hidden_dim|model_dim|emb_dim|n_embed|d_embed)", 64),
    (r"(num_hidden_layers|n_layer|num_layers|n_layers|decoder_layers|num_decoder_layers)", 2),
    (r"(encoder_layers|num_encoder_layers)", 1),
    (r"(num_attention_heads|n_head|num_heads|n_heads|decoder_attention_heads|encoder_attention_heads"
     r"|attention_heads)", 4),
    (r"(num_key_value_heads|n_kv_heads|num_kv_heads|multi_query_group_num|kv_n_heads)", 2),
    (r"(head_dim|attention_head_dim|kv_channels|attention_head_size|d_head|dim_head|v_head_dim"
     r"|qk_nope_head_dim)", 16),
    (r"qk_rope_head_dim", 8), (r".*lora_rank", 16), (r"rotary_dim", 8),
    (r"(mamba_d_head|mamba_head_dim|ssm_head_dim)", 16),
    (r"(mamba_n_heads|mamba_num_heads|ssm_num_heads)", 8),
    (r".+_head_dim", 16), (r".+_(num_heads|n_heads)", 4), (r"attention_hidden_size", 64),
    (r"num_layers_per_stack", 2),
    (r"(moe_intermediate_size|expert_intermediate_size|shared_expert_intermediate_size|moe_ffn_hidden_size"
     r"|expert_hidden_size|moe_hidden_size|shared_intermediate_size|expert_ffn_hidden_size)", 32),
    (r"(intermediate_size|n_inner|ffn_dim|decoder_ffn_dim|encoder_ffn_dim|ffn_hidden_size"
     r"|inner_hidden_size|d_ff|intermediate_dim)", 128),
    (r"(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|n_experts)", 4),
    (r"(num_experts_per_tok|moe_topk|top_k|num_experts_per_token|moe_k|moe_top_k|topk)", 2),
    (r"(n_shared_experts|num_shared_experts)", 1), (r"(n_group|topk_group)", 1),
    (r"first_k_dense_replace", 1),
    (r"(vocab_size|decoder_vocab_size)", 512),
    (r"(max_position_embeddings|n_positions|max_seq_len|seq_length|n_ctx|max_sequence_length"
     r"|context_length)", 32),
    (r"(sliding_window|attention_window|window_size)", 32),
    (r"(mamba_d_state|state_size|ssm_state_size|d_state)", 16),
    (r"mamba_d_ssm", 128), (r"(mamba_chunk_size|chunk_size)", 32), (r"(time_step_rank|dt_rank)", 8),
)
# sizes a default config leaves unset that its model needs (transformers derives them in the model)
FILL_WHEN_UNSET = ("head_dim", "num_key_value_heads", "moe_intermediate_size", "intermediate_size",
                   "num_experts_per_tok", "n_routed_experts", "n_shared_experts", "n_group", "topk_group")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# the lists that name each layer's kind: a hybrid keeps one layer of each kind
LAYER_KINDS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types", "layers_type",
               "mlp_layer_types")
# where a user's shrinking must say more than widths (the shape checks of these configs)
OVERRIDES = {
    "reformer": {"is_decoder": True},
    "mamba2": {"num_heads": 8},
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
}
NOISE = ("_name_or_path", "output_attentions", "architectures", "transformers_version", "torch_dtype",
         "dtype", "id2label", "label2id")


def _shrunk(key: str, value: int) -> int:
    for pattern, small in SIZES:
        if re.fullmatch(pattern, key):
            return min(value, small) if value > 0 else value
    return value


def _size_of_unset(key: str) -> int | None:
    return next((small for pattern, small in SIZES if re.fullmatch(pattern, key)), None) \
        if key in FILL_WHEN_UNSET else None


def shrink(config: dict, depth: int = 0) -> dict:
    """A config dict with its sizes cut (nested configs too), its layers fewer and its per-layer lists
    cut to match, special token ids inside the vocabulary."""
    out: dict = {}
    for key, value in config.items():
        if not isinstance(key, str) or key in NOISE:
            continue
        if isinstance(value, dict) and depth < 2:
            out[key] = shrink(value, depth + 1)
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = _shrunk(key, value)
        elif value is None:
            if _size_of_unset(key) is not None:
                out[key] = _size_of_unset(key)
        elif isinstance(value, list) and value and all(type(x) is int for x in value):
            out[key] = [_shrunk(key, x) for x in value]
        else:
            out[key] = value
    if "kv_lora_rank" in out and "num_attention_heads" in out:  # latent attention: a key head per query head
        out["num_key_value_heads"] = out["num_attention_heads"]
    if "qk_rope_head_dim" in out:
        out["head_dim"] = out["qk_rope_head_dim"]
        if "qk_head_dim" in out:
            out["qk_head_dim"] = out["qk_rope_head_dim"] + out.get("qk_nope_head_dim", 0)
    vocab = out.get("vocab_size")
    for key, value in list(out.items()):
        if key.endswith("token_id") and type(value) is int and type(vocab) is int and value >= vocab:
            out[key] = min(2, vocab - 1)
    _fewer_layers(config, out)
    return out


def _fewer_layers(original: dict, out: dict) -> None:
    layers = next((original[k] for k in LAYER_KEYS if type(original.get(k)) is int), None)
    fewer = next((out[k] for k in LAYER_KEYS if type(out.get(k)) is int), None)
    if not layers or not fewer or fewer >= layers:
        return
    for key in LAYER_KINDS:
        kinds = out.get(key)
        if isinstance(kinds, (list, str)) and len(kinds) == layers:
            fewer = min(max(fewer, max(list(kinds).index(x) for x in set(kinds)) + 1), 8)
    for key in LAYER_KEYS:
        if key in out:
            out[key] = fewer
    for key, value in list(out.items()):
        if isinstance(value, (list, str)) and len(value) == layers:
            out[key] = value[:fewer]
        elif isinstance(value, dict) and value and all(str(x).isdigit() for x in value):
            out[key] = {x: y for x, y in value.items() if int(x) < fewer}


def tiny_config(model_type: str) -> dict:
    """The config a user would write for a tiny model of this type: transformers' defaults, shrunk."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    small = shrink(CONFIG_MAPPING[model_type]().to_dict())
    small.pop("model_type", None)
    small.update(OVERRIDES.get(model_type, {}))
    return {"model_type": model_type, **small}


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# --- the reference: plain transformers, one step on the CPU ---------------------------------------------

@dataclass(frozen=True)
class Reference:
    params: int
    flops_per_token: float  # forward and backward, as torch's counter finds them (model_flops)
    saved_bytes: int  # what autograd keeps for backward, parameters left out


def reference_step(config: dict, seq: int) -> Reference:
    """One step of plain transformers on real CPU tensors (eager attention, the model's own loss)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainbench.training.user_models import count_kernels, model_flops

    keys = dict(config)
    model_type = keys.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **keys)
    hf_config.use_cache = False
    hf_config._attn_implementation = "eager"
    with torch.device("meta"):
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf_config).parameters())
    if size > MAX_TINY_PARAMS:
        raise ValueError(f"shrunk to {size / 1e6:.0f}M parameters, not tiny")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config).train()
    count_kernels()
    parameters = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}
    held = []  # every storage saved, held so that a freed one's address is not taken for another's

    def pack(tensor):
        held.append(tensor.untyped_storage())
        key = tensor.untyped_storage()._cdata
        if key not in parameters:
            saved[key] = tensor.untyped_storage().nbytes()
        return tensor

    vocab = hf_config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, seq))
    counter = FlopCounterMode(display=False)
    with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids).loss.backward()
    return Reference(size, model_flops(counter.get_flop_counts()["Global"]) / seq, sum(saved.values()))


# --- trainbench's count of the same model ---------------------------------------------------------------

@dataclass
class Row:
    model_type: str
    status: str  # accepted, refused, not trained by transformers
    reason: str = ""
    mixture: bool = False
    sdpa: bool = True
    refused_modes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)  # relative: params, flops, activations
    seconds: float = 0.0

    @property
    def counted_right(self) -> bool:
        return self.status == "accepted" and all(abs(e) <= TOLERANCE for e in self.errors.values())


def check(model_type: str, facts_dir: Path) -> Row:
    """One model_type through the reference step and trainbench's count, both at the longer of the two
    lengths trainbench counts the model at (its FLOPs per token are held affine in the length between
    them; a model that pads to chunks is not, below them)."""
    from trainbench.errors import ConfigError
    from trainbench.study.models import parse_models
    from trainbench.training import user_models

    started = time.perf_counter()
    name = "sweep-" + re.sub(r"[^A-Za-z0-9]", "-", model_type)
    refusal = spec = None
    try:
        config = tiny_config(model_type)
        spec = parse_models({name: {"hf": config}}, Path("."))[name]
    except ConfigError as error:  # a definition refused as data: whether transformers trains it decides
        refusal = error
    except Exception as error:  # noqa: BLE001 (transformers' config, however it fails)
        return Row(model_type, "not trained by transformers", _one_line(error))
    seq = user_models.count_lengths(spec)[1] if spec is not None else 16
    try:
        reference = reference_step(config, seq)
    except Exception as error:  # noqa: BLE001 (transformers' model, however it fails)
        row = Row(model_type, "not trained by transformers", _one_line(error))
    else:
        row = (Row(model_type, "refused", _one_line(refusal)) if refusal is not None
               else _counted(model_type, spec, seq, reference, facts_dir))
    row.seconds = time.perf_counter() - started
    return row


def _counted(model_type: str, spec, seq: int, reference: Reference, facts_dir: Path) -> Row:
    from trainbench.errors import ConfigError
    from trainbench.training import user_models

    try:
        spec = user_models.counted(spec, facts_dir)
    except ConfigError as error:
        return Row(model_type, "refused", _one_line(error))
    facts = spec.facts
    row = Row(model_type, "accepted", mixture=facts.expert_params > 0, sdpa=facts.sdpa)
    for mode in MODES:
        try:
            user_models.trace_activations(spec, mode, "sdpa", MODE_SEQ, facts_dir=facts_dir)
        except ConfigError as error:
            row.refused_modes[mode] = _one_line(error)
    eager = user_models.trace_activations(spec, "fp32", "eager", seq, facts_dir=facts_dir)
    traced = facts.n_blocks * eager.block_bytes + eager.outside_bytes
    row.errors = {"params": facts.params_total / reference.params - 1,
                  "flops": spec.train_flops_per_token(seq) / reference.flops_per_token - 1,
                  "activations": traced / reference.saved_bytes - 1}
    return row


def _one_line(error: BaseException) -> str:
    """An error as one line of the table: a refusal's own words without the sweep's model name, else the
    exception's type and first words."""
    from trainbench.errors import ConfigError

    text = " ".join(line.strip().lstrip("- ") for line in str(error).splitlines()
                    if line.strip() and line.strip() != "invalid configuration:")
    if isinstance(error, ConfigError):
        return re.sub(r"^models\.sweep-[\w-]+: ", "", text)[:240]
    return f"{type(error).__name__}: {text}"[:240]


@contextlib.contextmanager
def _quiet():
    """transformers' and torch's warnings about tiny configs, off for the sweep."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    logging.disable(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)
            hf_logging.set_verbosity(before)


def sweep(types: list[str] | None = None, progress=None) -> list[Row]:
    """Every causal-LM model_type (or `types`), in order; `progress(row)` after each."""
    rows = []
    with tempfile.TemporaryDirectory() as facts_dir, _quiet():
        for model_type in types or causal_lm_types():
            rows.append(check(model_type, Path(facts_dir)))
            if progress:
                progress(rows[-1])
    return rows


# --- the coverage page ----------------------------------------------------------------------------------

def summary(rows: list[Row]) -> dict[str, int]:
    trained = [r for r in rows if r.status != "not trained by transformers"]
    return {"types": len(rows), "trained": len(trained),
            "accepted": sum(r.status == "accepted" for r in trained),
            "counted_right": sum(r.counted_right for r in trained),
            "mixtures": sum(r.mixture for r in trained),
            "own_attention": sum(r.status == "accepted" and not r.sdpa for r in trained)}


def _cell(row: Row) -> str:
    if row.status != "accepted":
        return f"{row.status}: {row.reason}".replace("|", "/")
    notes = []
    if row.mixture:
        notes.append("mixture of experts")
    if not row.sdpa:
        notes.append("its own attention (no SDPA)")
    for mode, why in row.refused_modes.items():
        notes.append(f"refused at {mode}: {why}".replace("|", "/"))
    if not row.counted_right:
        notes.append("counted off by more than 10%")
    return "accepted" + (f" ({'; '.join(notes)})" if notes else "")


def markdown(rows: list[Row], transformers_version: str) -> str:
    total = summary(rows)
    lines = [
        "# Architectures: which causal LMs are counted, and how right",
        "",
        f"Every `model_type` that transformers {transformers_version} maps to a causal LM, made tiny as a "
        "user shrinks a config (widths, layers, experts and vocabulary cut by transformers' names for them), "
        "trained one step by plain transformers on the CPU, then defined as your model "
        "(`models: {m: {hf: ...}}`) and counted by trainbench. *Counted right*: parameters, FLOPs per token "
        f"and the activations traced for backward each within {TOLERANCE:.0%} of what the plain step "
        "measured (parameters, torch's FLOP counter over forward and backward, and every tensor autograd "
        "kept), at the longer of the two lengths trainbench counts a model at. Made by "
        "`trainbench check-models architectures --write`; the test suite "
        "runs the same sweep and holds this page to it.",
        "",
        f"- {total['types']} model types; {total['trained']} trained by plain transformers at this size",
        f"- accepted: {total['accepted']} of {total['trained']}; counted right: {total['counted_right']}",
        f"- mixtures of experts among them: {total['mixtures']}; running their own attention (no SDPA): "
        f"{total['own_attention']}",
        "",
        "| model_type | trainbench | parameters | FLOPs/token | activations |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        errors = [f"{row.errors[k]:+.1%}" if k in row.errors else ""
                  for k in ("params", "flops", "activations")]
        lines.append(f"| `{row.model_type}` | {_cell(row)} | " + " | ".join(errors) + " |")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    import sys

    import transformers

    def progress(row: Row) -> None:
        print(f"  {row.model_type:<28} {row.status:<28} {row.seconds:5.1f} s", file=sys.stderr)

    rows = sweep(args.types or None, progress=progress)
    text = markdown(rows, transformers.__version__)
    total = summary(rows)
    print(f"{total['accepted']} of {total['trained']} trained types accepted, {total['counted_right']} "
          f"counted right, {total['mixtures']} mixtures of experts")
    if args.json:
        args.json.write_text(json.dumps([row.__dict__ for row in rows], indent=1))
    if args.write:
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    return 0
