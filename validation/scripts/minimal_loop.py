"""A minimal nanoGPT-style GPT-2 training loop, written apart from trainbench (it imports nothing of it).

The reference the baseline cells are held to (issue 34; bench/minimal_vs_cell.py runs both in one
process): nanoGPT's model code (fused qkv Linear, F.scaled_dot_product_attention(is_causal=True),
GELU MLP, LayerNorm, wte tied to lm_head, GPT-2 init) at vocabulary 50304, bf16 autocast,
torch.compile, fused AdamW over nanoGPT's two parameter groups (decay for matrices, none for biases
and LayerNorm), one fixed random batch on the device, 4 micro batches per optimizer step. After
--warmup steps the device is synchronised, --steps steps run, and it is synchronised again.

    python3 bench/minimal_loop.py --model 124m --micro-batch 32 --steps 30 --out minimal.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"124m": (12, 768, 12), "350m": (24, 1024, 16)}  # layers, width, heads (GPT-2 small, medium)
VOCAB, BLOCK = 50304, 1024  # GPT-2's 50257 padded to a multiple of 64, as nanoGPT does


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, bias):
        super().__init__()
        self.heads = heads
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d, heads, bias, gelu):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=bias), nn.LayerNorm(d, bias=bias)
        self.attn = CausalSelfAttention(d, heads, bias)
        self.c_fc, self.c_proj = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias)
        self.gelu = nn.GELU(approximate=gelu)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, bias=True, gelu="tanh"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(BLOCK, d)
        self.h = nn.ModuleList(Block(d, heads, bias, gelu) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=bias)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        for name, p in self.named_parameters():  # GPT-2 init, residual projections scaled
            if p.dim() == 1:
                nn.init.zeros_(p) if "ln" not in name or name.endswith(".bias") else nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def build(size: str, micro_batch: int, accum: int = 4, bias: bool = True, gelu: str = "tanh",
          lr: float = 6e-4, weight_decay: float = 0.1, seed: int = 1337, device: str = "cuda",
          batches: int = 1, compile: bool = True):
    """Model, optimizer and data on `device`; returns one optimizer step (it returns the last micro
    batch's loss, left on the device) and the model. `batches` > 1 cycles a pool of that many random
    batches instead of one, as the cells do (trainbench.training.data), to set the two on the same
    data."""
    torch.manual_seed(seed)
    model = GPT(*SIZES[size], bias=bias, gelu=gelu).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device == "cuda")
    compiled = torch.compile(model) if compile else model
    pool = []
    for _ in range(batches):  # one fixed batch by default
        data = torch.randint(50257, (micro_batch, BLOCK + 1), device=device)
        pool.append((data[:, :-1].contiguous(), data[:, 1:].contiguous()))
    position = 0

    def step():
        nonlocal position
        for _ in range(accum):
            x, y = pool[position % batches]
            position += 1
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
                loss = compiled(x, y) / accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step, model


def flops_per_token(model: GPT, seq: int = BLOCK) -> float:
    """6 N + 12 L H Q T (PaLM appendix B, nanoGPT's estimate_mfu), N without position embeddings and
    with GPT-2's own vocabulary of 50257 (the padding is waste, not model FLOPs)."""
    d = model.wpe.weight.shape[1]
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel() - (VOCAB - 50257) * d
    return 6 * n + 12 * len(model.h) * d * seq


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(SIZES), default="124m")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-bias", action="store_true", help="nanoGPT's bias=False (not GPT-2's shape)")
    parser.add_argument("--out", default="minimal_loop.json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as nanoGPT's train.py
    step, model = build(args.model, args.micro_batch, bias=not args.no_bias)
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens_per_s = args.steps * args.micro_batch * 4 * BLOCK / seconds
    result = {"model": args.model, "micro_batch": args.micro_batch, "steps": args.steps, "seconds": seconds,
              "tokens_per_s": tokens_per_s,
              "mfu_vs_989_tflops": tokens_per_s * flops_per_token(model) / 989e12,
              "bias": not args.no_bias, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(json.dumps(result))
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
