"""A language model of your own, as trainbench takes one: a factory function returning a torch.nn.Module
whose forward(input_ids, labels=None) returns the mean loss given labels (the next tokens), the logits
otherwise. `Block` is the class repeated in it: the unit FSDP shards and checkpointing recomputes
(config.yaml's `block`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_1, self.norm_2 = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width, bias=False), nn.Linear(width, width, bias=False)
        self.up, self.down = nn.Linear(width, 4 * width, bias=False), nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm_1(x)).view(batch, length, 3, self.heads, -1).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(F.gelu(self.up(self.norm_2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, width: int, depth: int, heads: int, max_seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(max_seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.RMSNorm(width)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's initialisation. trainbench calls it after building the model on the meta device (FSDP2),
        so it must (re)make everything the model needs: weights, and any non-persistent buffer."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.norm(x), self.embed.weight)  # the head tied to the embedding
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def build(vocab_size: int = 512, width: int = 64, depth: int = 2, heads: int = 4,
          max_seq: int = 256) -> TinyLM:
    return TinyLM(vocab_size, width, depth, heads, max_seq)
