"""A language model of our own for the architecture round, written apart from every model trainbench knows:
pre-norm blocks whose attention and gated MLP read the same normed input and add to the residual stream
together (a parallel block), grouped-query attention with rotary embeddings, no biases, an untied head.
A factory's model as a user writes one: forward(input_ids, labels) gives the mean loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class ParallelBlock(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, width // heads
        self.norm = nn.RMSNorm(width)
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        normed = self.norm(x)
        q = self.q(normed).view(batch, length, self.heads, self.head).transpose(1, 2)
        k, v = self.kv(normed).view(batch, length, 2, self.kv_heads, self.head).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True,
                                                  enable_gqa=True)
        gate, up = self.gate_up(normed).chunk(2, dim=-1)
        mlp = self.down(F.silu(gate) * up)
        return x + self.out(attended.transpose(1, 2).reshape(batch, length, width)) + mlp


class GluLM(nn.Module):
    def __init__(self, vocab_size: int, width: int, depth: int, heads: int, kv_heads: int, hidden: int,
                 max_seq: int):
        super().__init__()
        self.head_width, self.max_seq = width // heads, max_seq
        self.embed = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(ParallelBlock(width, heads, kv_heads, hidden) for _ in range(depth))
        self.norm = nn.RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.register_buffer("inverse_frequency", torch.empty(self.head_width // 2), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Weights and the rotary frequencies, again after a build on the meta device."""
        half = self.head_width // 2
        self.inverse_frequency.copy_(1.0 / 10000 ** (torch.arange(half, dtype=torch.float32) / half))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device, dtype=torch.float32)
        angles = torch.outer(positions, self.inverse_frequency)
        x = self.embed(input_ids)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def build(vocab_size: int = 32000, width: int = 2048, depth: int = 16, heads: int = 16, kv_heads: int = 4,
          hidden: int = 5632, max_seq: int = 4096) -> GluLM:
    return GluLM(vocab_size, width, depth, heads, kv_heads, hidden, max_seq)
