"""Model registry: architecture shapes by name, their parameter counts and training FLOPs.

Two kinds of models. The registry's own (MODELS): shapes whose counts are analytic, so that the memory
model and MFU work for models never built here (a 180B model on a laptop); `trainbench.training.gpt`
and the runners turn a spec into a module. And a user's, defined in config.yaml's `models` (a
transformers config or a factory of their own module): registered by name when the config loads
(`register_user_models`), with facts counted from the model itself (`ModelFacts`: built on the meta
device, one step traced on fake tensors by trainbench.training.user_models) where the registry's
formulas know nothing of the architecture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ActivationTrace:
    """What one sample's forward saves for backward, in bytes, as traced on fake tensors (one step of
    the model at one precision mode, attention kernel and sequence length): each repeated block's
    saved tensors (mean over the blocks), the block's input (what a checkpointed block keeps), and
    everything outside the blocks (embeddings, final norm, head, loss). Parameters are not counted
    (the memory model counts them as model states); what autocast casts of them is."""

    block_bytes: float
    block_input_bytes: float
    outside_bytes: float


@dataclass(frozen=True)
class ModelFacts:
    """A user's model counted from itself. FLOPs per token are 6 x matmul_params (each weight's multiply
    and add, forward, and twice that backward) plus attention_flops_per_position x the sequence length,
    both read off torch's FLOP counter at two sequence lengths."""

    params_total: int
    embedding_params: int  # parameters of the input embeddings: looked up, no FLOPs
    block_params: int  # one repeated block's (the mean, where they differ)
    largest_param: int
    matmul_params: int
    block_matmul_params: int  # one block's share of matmul_params (a mixture of experts: its active ones)
    attention_flops_per_position: float
    hidden: int  # the width of a block's input (the residual stream)
    n_blocks: int
    block_class: str
    # under its tensor-parallel plan (`tensor_parallel_plan`; 0 where it has none): the parameters of the
    # layers the plan splits, in one block (the mean) and outside the blocks (an untied LM head), and
    # the collectives one block's forward and backward make (an all-reduce of each row-parallel output
    # and of each column-parallel input's gradient)
    tp_block_params: int = 0
    tp_other_params: int = 0
    tp_collectives_per_block: int = 0
    # whether its attention is torch's scaled_dot_product_attention; False: the model's own (transformers
    # implements some architectures no other way), whatever kernel a cell asks for
    sdpa: bool = True
    # a mixture of experts: the parameters of all its experts, and those of the experts one token is
    # routed to (0 for a dense model)
    expert_params: int = 0
    active_expert_params: int = 0
    vocab_size: int = 0  # the token embedding's rows (from the config, or transformers' default for it)
    # modules of one block (the mean) owning parameters of PERSISTENT_PARAMS elements or more: what
    # ZeRO-3 fetches one by one (smaller ones, norms, stay on every rank)
    fetched_modules_per_block: float = 0.0
    # activation traces by key (`trace_key`), filled as cells ask; `tracer` makes a missing one
    traces: dict[str, ActivationTrace] = field(default_factory=dict, compare=False, hash=False)

    @property
    def params_active(self) -> int:
        """The parameters one token meets: all of a dense model's; a mixture's without the experts it is
        not routed to."""
        return self.params_total - self.expert_params + self.active_expert_params

    def activations(self, spec: ModelSpec, mode: str, attention: str, seq_len: int,
                    tp: int = 1) -> ActivationTrace:
        key = trace_key(mode, attention, seq_len, tp)
        if key not in self.traces:
            if ACTIVATION_TRACER is None:
                raise LookupError(f"model {spec.name!r}: no activation trace for {key} and no tracer "
                                  "loaded (trainbench.training.user_models installs it)")
            self.traces[key] = ACTIVATION_TRACER(spec, mode, attention, seq_len, tp)
        return self.traces[key]


def trace_key(mode: str, attention: str, seq_len: int, tp: int = 1) -> str:
    """`mode`: fp32; autocast-16 (fp32 weights, matmuls in a 16-bit type: single, DDP); or half-16 (the
    model in a 16-bit type: FSDP2's mixed precision, DeepSpeed). bf16 and fp16 save the same bytes.
    `tp`: one rank of the model split by its tensor-parallel plan."""
    return f"{mode}/{attention}/{seq_len}" + (f"/tp{tp}" if tp > 1 else "")


# Installed by trainbench.training.user_models (the training stage builds and traces models; the
# registry sits below it): (spec, mode, attention, seq_len, tp) -> ActivationTrace
ACTIVATION_TRACER: Callable[[Any, str, str, int, int], ActivationTrace] | None = None

# DeepSpeed's stage3_param_persistence_threshold (its default): a module's parameters of fewer elements stay
# gathered on every rank under ZeRO-3
PERSISTENT_PARAMS = 100_000

# How a tensor-parallel plan may split a layer (transformers' names for PyTorch's DTensor styles):
# colwise splits a linear layer's output features (its input whole), rowwise its input features (its
# output all-reduced; on an embedding, the vocabulary); the gathered and split variants hand whole
# tensors to the code around the layer; embedding_rowwise splits an embedding's vocabulary.
TP_STYLES = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input", "embedding_rowwise")


def tensor_parallel_plan(definition: dict[str, Any]) -> tuple[dict[str, str] | None, str]:
    """A user's model's tensor-parallel plan, as module paths (`*` one path component) from the model
    itself to styles, and where it comes from; (None, why) where it has none. The definition's own
    `tp_plan`, else the plan transformers publishes for the architecture: the config class's
    `base_model_tp_plan` under the causal LM's base model, and the LM head's (`_tp_plan`)."""
    if definition.get("tp_plan"):
        return dict(definition["tp_plan"]), "the model's tp_plan"
    if definition["kind"] != "hf":
        return None, "a factory's model splits by the tp_plan its definition gives, and this one gives none"
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = definition["config"]["model_type"]
    config_class = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None
    published = getattr(config_class, "base_model_tp_plan", None)
    if not published:
        return None, (f"transformers {transformers.__version__} publishes no tensor-parallel plan for "
                      f"{model_type!r} (base_model_tp_plan); give the model a tp_plan")
    causal_lm = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), None)
    prefix = getattr(causal_lm, "base_model_prefix", "model")
    plan = {f"{prefix}.{path}": style for path, style in published.items()}
    plan.update(getattr(causal_lm, "_tp_plan", None) or {})
    return plan, f"transformers' plan for {model_type!r}"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # "gpt" (GPT-2 layout), "llama", "distilbert"
    n_layer: int
    d_model: int
    n_head: int
    vocab_size: int
    max_seq: int
    ffn_hidden: int = 0  # 0: 4 x d_model
    tied_embeddings: bool = True
    learned_positions: bool = True
    causal: bool = True
    block_class: str = "Block"  # the repeated layer: unit of FSDP wrapping and checkpointing
    attention_dropout: float = 0.0  # dropout on the attention probabilities (Hugging Face DistilBERT's 0.1)
    # whether eager attention computes its softmax in fp32 whatever the model's dtype (trainbench's GPT
    # and Hugging Face's LLaMA do; DistilBERT's follows the dtype: fp32 under autocast, half under DeepSpeed)
    softmax_fp32: bool = True
    # GPT: biases in the linear layers and LayerNorms (GPT-2's shape); False is nanoGPT's bias=False
    bias: bool = True
    note: str = ""
    # a user's model (config.yaml's `models`): its definition as canonical JSON (what the cells'
    # `model_definition` holds), and its facts counted from the model (None until counted)
    definition: str = field(default="", compare=False)
    # the folder a factory's module is imported from: that of the file defining the model (not part of
    # the definition, which must not depend on where a clone sits); "" for the working directory
    source_dir: str = field(default="", compare=False)
    facts: ModelFacts | None = field(default=None, compare=False, hash=False)

    @property
    def user_defined(self) -> bool:
        return bool(self.definition)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def _counted(self) -> ModelFacts:
        if self.facts is None:
            raise LookupError(f"model {self.name!r} is defined in the config and has not been counted yet "
                              "(trainbench.training.user_models.count_model)")
        return self.facts

    def attention_run(self, requested: str) -> str:
        """The attention a cell of this model runs: the kernel it asks for, or the model's own ("eager")
        where the model has no scaled_dot_product_attention."""
        if self.user_defined and self.facts is not None and not self.facts.sdpa:
            return "eager"
        return requested

    def fetched_modules_per_block(self) -> float:
        """Modules of a block whose parameters ZeRO-3 fetches one by one (each a call on the host): the
        linear layers of the registry's layouts (GPT-2's qkv, out, fc and proj; LLaMA's seven;
        DistilBERT's six), or those a user's model was counted to have."""
        if self.user_defined and self.facts is not None and self.facts.fetched_modules_per_block:
            return self.facts.fetched_modules_per_block
        return {"gpt": 4, "llama": 7, "distilbert": 6}.get(self.family, 4)

    def block_params(self) -> int:
        if self.user_defined:
            return self._counted().block_params
        d, f = self.d_model, self.ffn
        if self.family == "llama":
            # q, k, v, o without bias; gated MLP (gate, up, down); two RMSNorm weights
            return 4 * d * d + 3 * d * f + 2 * d
        # GPT-2 and DistilBERT: qkv and out projections and a 2-layer MLP, all with bias; two LayerNorms
        if not self.bias:  # the weights alone, and the LayerNorms' scales
            return 4 * d * d + 2 * d * f + 2 * d
        return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d

    def block_matmul_params(self) -> int:
        """A block's parameters that multiply every token (6 FLOPs each per token): all of a dense
        block's; of a mixture of experts, the experts a token is routed to."""
        return self._counted().block_matmul_params if self.user_defined else self.block_params()

    def block_whole_params(self) -> int:
        """Parameters of a block that tensor parallelism in Megatron's layout leaves whole on every rank:
        the norms, and the biases of the row-parallel output projections (added after their all-reduce)."""
        if self.family == "llama" or not self.bias or self.user_defined:
            return 2 * self.d_model  # two norms' weights; no biases
        return 6 * self.d_model  # two LayerNorms (weight and bias), the two output projections' biases

    def largest_param(self) -> int:
        """Elements of the model's largest single parameter (token embedding, qkv or MLP weight)."""
        if self.user_defined:
            return self._counted().largest_param
        qkv = 3 * self.d_model * self.d_model
        return max(self.vocab_size * self.d_model, self.d_model * self.ffn, qkv)

    def embedding_params(self) -> int:
        if self.user_defined:
            return self._counted().embedding_params
        tokens = self.vocab_size * self.d_model
        positions = self.max_seq * self.d_model if self.learned_positions else 0
        return tokens + positions

    def with_vocab_multiple(self, multiple: int) -> ModelSpec:
        """The model as built with its token embedding padded to a multiple of `multiple` rows (the
        `vocab_multiple` parameter); FLOPs and data stay the model's own."""
        return dataclasses.replace(self, vocab_size=-(-self.vocab_size // multiple) * multiple)

    def param_count(self, head: str = "lm", num_classes: int = 2) -> int:
        if self.user_defined:
            return self._counted().params_total
        final_norm = self.d_model if self.family == "llama" or not self.bias else 2 * self.d_model
        total = self.embedding_params() + self.n_layer * self.block_params() + final_norm
        return total + self.head_params(head, num_classes)

    def head_params(self, head: str = "lm", num_classes: int = 2) -> int:
        if head == "classifier":
            # Hugging Face's DistilBERT classifier has a hidden layer before the output layer
            hidden = self.d_model * self.d_model + self.d_model if self.family == "distilbert" else 0
            return hidden + self.d_model * num_classes + num_classes
        return 0 if self.tied_embeddings else self.vocab_size * self.d_model

    def matmul_params(self, head: str = "lm", num_classes: int = 2) -> int:
        """Parameters that take part in a matmul per token: the N of 6N FLOPs per token.

        Embedding lookups cost no FLOPs; a tied embedding still does the LM head's matmul.
        """
        if self.user_defined:
            return self._counted().matmul_params
        blocks = self.n_layer * self.block_params()
        if head == "classifier":
            hidden = self.d_model * self.d_model if self.family == "distilbert" else 0
            return blocks + hidden + self.d_model * num_classes
        return blocks + self.vocab_size * self.d_model

    def train_flops_per_token(self, seq_len: int, head: str = "lm", num_classes: int = 2) -> float:
        """Model FLOPs of forward + backward per token (PaLM appendix B; nanoGPT estimate_mfu).

        6N for the weight matmuls plus 12 L H Q T for attention scores and values. Recomputation
        under activation checkpointing is not counted: this is model FLOPs, the numerator of MFU.
        """
        if self.user_defined:
            facts = self._counted()
            return 6 * facts.matmul_params + facts.attention_flops_per_position * seq_len
        attention = 12 * self.n_layer * self.n_head * self.head_dim * seq_len
        return 6 * self.matmul_params(head, num_classes) + attention


def _gpt(name, n_layer, d_model, n_head, vocab=50257, max_seq=1024, **kw) -> ModelSpec:
    return ModelSpec(name, "gpt", n_layer, d_model, n_head, vocab, max_seq, **kw)


def _llama(name, n_layer, d_model, n_head, ffn, vocab=32000, max_seq=2048, **kw) -> ModelSpec:
    return ModelSpec(name, "llama", n_layer, d_model, n_head, vocab, max_seq, ffn_hidden=ffn,
                     tied_embeddings=False, learned_positions=False, block_class="LlamaDecoderLayer", **kw)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt("gpt2-tiny", 2, 64, 2, vocab=512, max_seq=128, note="CPU tests and the smoke study"),
        _gpt("gpt2-small-cpu", 4, 128, 4, vocab=2048, max_seq=256,
             note="a CPU study that still has some work"),
        _gpt("gpt2-124m", 12, 768, 12, note="GPT-2 small"),
        _gpt("gpt2-350m", 24, 1024, 16, note="GPT-2 medium"),
        _gpt("gpt2-124m-nobias", 12, 768, 12, bias=False,
             note="GPT-2 small without biases (nanoGPT's bias=False): another model, lighter per step"),
        _gpt("gpt2-350m-nobias", 24, 1024, 16, bias=False, note="GPT-2 medium without biases"),
        _gpt("gpt-345m", 24, 1024, 16, vocab=50304, note="Megatron GPT-345M"),
        _gpt("gpt-2.5b", 48, 2048, 16, vocab=50304, note="Megatron GPT-2.5B"),
        _gpt("gpt-5.8b", 72, 2560, 32, vocab=50304, note="Megatron GPT-5.8B"),
        _gpt("bert-180b", 96, 12288, 96, vocab=30522, max_seq=2048, causal=False,
             note="Megatron-DeepSpeed BERT-style ~180B (zero3_pipeline study)"),
        _gpt("bert-180b-l4", 4, 12288, 96, vocab=30522, max_seq=2048, causal=False,
             note="bert-180b layer shapes, 4 layers: the scaled-down runnable version"),
        _llama("llama-tiny", 2, 64, 4, 172, vocab=512, max_seq=128, note="LLaMA layout for CPU tests"),
        _llama("llama-1.3b", 24, 2048, 16, 5504,
               note="Sheared-LLaMA-1.3B's layout: a LLaMA that one GPU trains whole"),
        _llama("llama-7b", 32, 4096, 32, 11008),
        _llama("llama-13b", 40, 5120, 40, 13824),
        _llama("llama-30b", 60, 6656, 52, 17920),
        _llama("llama-65b", 80, 8192, 64, 22016),
        ModelSpec("distilbert-base", "distilbert", 6, 768, 12, 30522, 512, causal=False,
                  block_class="TransformerBlock", attention_dropout=0.1, softmax_fp32=False,
                  note="DistilBERT-base sized classifier"),
        ModelSpec("distilbert-tiny", "distilbert", 2, 64, 2, 2048, 128, causal=False,
                  block_class="TransformerBlock", attention_dropout=0.1, softmax_fp32=False,
                  note="DistilBERT layout for CPU tests"),
    )
}


# the models of the loaded config's `models`, by name (register_user_models)
USER_MODELS: dict[str, ModelSpec] = {}


def register_user_models(specs: dict[str, ModelSpec]) -> None:
    """The config's models, replacing any registered before (one config is loaded at a time). A name
    of the registry's own is refused by the config's checks before this."""
    USER_MODELS.clear()
    USER_MODELS.update(specs)


def known_models() -> dict[str, ModelSpec]:
    """Every model a cell may name: the registry's, then the loaded config's."""
    return {**MODELS, **USER_MODELS}


def get_model(name: str) -> ModelSpec:
    return MODELS[name] if name in MODELS else USER_MODELS[name]
