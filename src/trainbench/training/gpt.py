"""A GPT-2-layout transformer (nanoGPT's shape) with an LM or a classification head.

Built from a ModelSpec; the constructor leaves weights to `init_weights(seed)`, so a runner can build
on the meta device and fill parameters after sharding (`to_empty`), or initialise layer by layer
under ZeRO-3, and still get the same model a plain build gets.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainbench.registry.models import ModelSpec
from trainbench.study.params import SDPA_KERNELS


def hold_attention_kernel(attention: str) -> None:
    """Restrict SDPA to the cell's kernel in this process (a rank; the bare loop), before any model is
    built or compiled, so that compiled graphs are traced with it. No fallback: a shape the kernel
    cannot run fails the cell rather than quietly measuring another kernel."""
    if attention not in SDPA_KERNELS:
        return
    torch.backends.cuda.enable_flash_sdp(attention == "flash")
    torch.backends.cuda.enable_cudnn_sdp(attention == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(attention == "efficient")
    torch.backends.cuda.enable_math_sdp(False)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V with the scores materialised (seq x seq per head), the softmax in fp32
    as Hugging Face's eager attention does: what attention costs without a fused kernel."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        seq = q.shape[-2]
        future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.float().softmax(dim=-1).to(v.dtype) @ v


class SelfAttention(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str = "sdpa"):
        super().__init__()
        self.head_dim = spec.head_dim
        self.causal = spec.causal
        self.eager = attention == "eager"
        self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model, bias=spec.bias)
        self.proj = nn.Linear(spec.d_model, spec.d_model, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Under tensor parallelism qkv is column-parallel ([q; k; v] each split across ranks) and
        # this rank computes width / tp of the heads; the widths below are this rank's.
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        width = q.shape[-1]
        q, k, v = (t.reshape(batch, seq, width // self.head_dim, self.head_dim).transpose(1, 2)
                   for t in (q, k, v))
        if self.eager:
            y = eager_attention(q, k, v, self.causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.fc = nn.Linear(spec.d_model, spec.ffn, bias=spec.bias)
        self.proj = nn.Linear(spec.ffn, spec.d_model, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str = "sdpa"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.d_model, bias=spec.bias)
        self.attn = SelfAttention(spec, attention)
        self.ln_2 = nn.LayerNorm(spec.d_model, bias=spec.bias)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def pool(x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The position a classifier reads: causal models see the whole sequence at its last token;
    bidirectional ones pool the first."""
    return x[:, -1] if causal else x[:, 0]


@torch.no_grad()
def init_gpt_module(module: nn.Module, name: str, n_layer: int, generator: torch.Generator | None) -> None:
    """GPT-2 initialisation of one module: normal(0.02) weights, residual projections scaled by
    1/sqrt(2 x layers), zero biases, LayerNorm at identity."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(".proj") else 0.02
        nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class CheckpointsInHostMemory:
    """Where the checkpointed blocks' inputs wait for their backward: in host memory, each tensor-
    parallel rank keeping its 1/tp of every one, gathered back to the device when the block is
    recomputed (DeepSpeed's `partition_activations` with `cpu_checkpointing`, Megatron's split of
    checkpointed activations across the model-parallel group). A block's input is the residual
    stream, whole on every tensor-parallel rank; kept so, a model of L blocks holds L of them on the
    device through the forward pass. Non-reentrant checkpointing saves a block's inputs through
    autograd's saved-tensor hooks before its own hooks take over: the hooks here see those inputs
    alone."""

    def __init__(self, group=None):
        self.group = group  # the tensor-parallel group the inputs are split across (None: kept whole)

    def _place(self) -> tuple[int, int]:
        if self.group is None:
            return 0, 1
        import torch.distributed as dist

        return dist.get_rank(self.group), dist.get_world_size(self.group)

    def pack(self, tensor: torch.Tensor):
        if not tensor.is_floating_point() or tensor.dim() < 2:  # the checkpoint's own bookkeeping
            return tensor
        rank, size = self._place()
        flat = tensor.detach().reshape(-1)
        part = -(-flat.numel() // size)
        if part * size != flat.numel():
            flat = F.pad(flat, (0, part * size - flat.numel()))
        mine = flat[rank * part:(rank + 1) * part]
        host = torch.empty(mine.shape, dtype=mine.dtype, device="cpu", pin_memory=tensor.is_cuda)
        host.copy_(mine, non_blocking=True)
        return host, tensor.shape, tensor.device, tensor.requires_grad

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        host, shape, device, requires_grad = packed
        mine = host.to(device, non_blocking=True)
        rank, size = self._place()
        if size > 1:
            import torch.distributed as dist

            whole = torch.empty(mine.numel() * size, dtype=mine.dtype, device=device)
            dist.all_gather_into_tensor(whole, mine, group=self.group)
        else:
            whole = mine
        numel = math.prod(shape)
        return whole[:numel].view(shape).requires_grad_(requires_grad)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec, head: str = "lm", num_classes: int = 2,
                 activation_checkpointing: bool = False, attention: str = "sdpa"):
        super().__init__()
        self.spec = spec
        self.head_kind = head
        self.activation_checkpointing = activation_checkpointing
        # where checkpointed blocks keep their inputs: on the device (None), or CheckpointsInHostMemory
        self.checkpoint_storage: CheckpointsInHostMemory | None = None
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.max_seq, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec, attention) for _ in range(spec.n_layer))
        self.ln_f = nn.LayerNorm(spec.d_model, bias=spec.bias)
        # The LM head reuses the token embedding (GPT-2 ties them); a classifier has its own layer.
        self.classifier = nn.Linear(spec.d_model, num_classes) if head == "classifier" else None
        self.lm_loss = lm_loss  # compile_loss() compiles it where the blocks are compiled one by one

    def compile_loss(self) -> None:
        """Compile the LM loss on its own, for a model whose blocks are compiled one by one (FSDP2
        compiles each block it shards, not the model). Eager, the loss's fp32 cast and log-softmax
        keep fp32 copies of the logits for backward and make another for their gradient (at GPT-2
        124M's 32 x 1024 tokens, the baseline's two-GPU FSDP2 cell allocated 29,561 MiB where the
        one-GPU cell, compiled whole, allocates 15,985). Compiled, inductor's fused loss
        keeps the logits in the compute dtype, as it does inside a model compiled whole."""
        self.lm_loss = torch.compile(lm_loss)

    def init_targets(self):
        """(index, name, module) of every module that owns parameters, in a fixed order."""
        return [(i, name, m) for i, (name, m) in enumerate(self.named_modules())
                if any(True for _ in m.parameters(recurse=False))]

    @torch.no_grad()
    def init_module(self, index: int, name: str, module: nn.Module, seed: int) -> None:
        """GPT-2 initialisation of one module, from a generator of its own.

        Seeding per module makes the weights independent of construction order and of how the
        parameters are later gathered, so ZeRO-3 (initialised layer by layer) matches a plain build.
        Sharded DTensor parameters (FSDP) draw from DTensor's own RNG: same distribution, other values.
        """
        weight = module.weight
        generator = None
        if type(weight) is nn.Parameter or type(weight) is torch.Tensor:
            generator = torch.Generator(device=weight.device).manual_seed(self.init_seed(seed, index))
        init_gpt_module(module, name, self.spec.n_layer, generator)

    @staticmethod
    def init_seed(seed: int, index: int) -> int:
        """The seed of the generator of the module at `index` of init_targets()."""
        return seed * 1_000_003 + index

    def init_weights(self, seed: int) -> None:
        for index, name, module in self.init_targets():
            self.init_module(index, name, module, seed)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy loss: next-token targets (batch, seq) or class labels (batch,)."""
        seq = tokens.shape[1]
        positions = torch.arange(seq, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                storage = self.checkpoint_storage
                with storage.hooks() if storage else contextlib.nullcontext():
                    x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        if self.classifier is not None:
            return F.cross_entropy(self.classifier(pool(x, self.spec.causal)).float(), targets)
        return self.lm_loss(self.lm_logits(x), targets)

    def lm_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head: the token embedding's weight, tied. Under sharded tensor parallelism
        (trainbench.training.tensor_parallel) that weight is vocabulary-parallel, a DTensor of vocab / tp rows
        per rank: each rank computes its columns of the logits (a DTensor sharded on the last
        dimension), and the loss is computed under loss_parallel without gathering them."""
        weight = self.wte.weight
        if type(weight) in (torch.Tensor, nn.Parameter):  # whole (or DeepSpeed's): no DTensor here
            return F.linear(x, weight)
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(weight, DTensor) and not isinstance(x, DTensor):
            # the input is whole on every rank (its gradient is all-reduced in backward)
            x = DTensor.from_local(x, weight.device_mesh, [Replicate()], run_check=False)
        return F.linear(x, weight)


