"""A bare training loop: the reference the pipeline's cells are measured against (bench/overhead.py).

The same model code (trainbench.training.gpt), synthetic data (trainbench.training.data), optimizer
(fused AdamW),
precision (autocast), compile setting and, on several GPUs, torch DDP, built from a cell's
parameters, and nothing else: no recorder, no memory sampler, no per-step synchronisation, no
loss read. After `warmup` steps the device is synchronised once, `steps` steps run, and the device
is synchronised again; tokens/s is their tokens over that time.

    python bench/bare_loop.py --params '<cell JSON>' --steps N --out result.json
    torchrun --standalone --nproc-per-node G bench/bare_loop.py ...       (DDP cells)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainbench.training.data import SyntheticBatches
from trainbench.training.gpt import GPT, hold_attention_kernel
from trainbench.registry.models import get_model
from trainbench.study.params import CellParams

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_step(params: CellParams, spec=None, compile_options: dict | None = None):
    """The cell's model, data and optimizer on this rank's GPU; returns one optimizer step (which
    returns its last micro batch's loss, a tensor left on the device). `spec`: another shape of the
    model than the cell's, `compile_options`: torch.compile's (validation/scripts/mfu.py tries some)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = params.device == "cuda"  # CPU cells: the benchmark's own tests
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    torch.manual_seed(params.seed)
    own = get_model(params.model)  # the data's vocabulary; the model may be built padded
    spec = spec or own.with_vocab_multiple(params.vocab_multiple)
    attention = params.attention  # optional: a cell at the default leaves it out
    hold_attention_kernel(attention)
    with device:
        model = GPT(spec, head=params.head, num_classes=params.num_classes, attention=attention)
    model.init_weights(params.seed)
    wrapped = DistributedDataParallel(model, device_ids=[local] if cuda else None) if world > 1 else model
    if params.compile:
        wrapped = torch.compile(wrapped, **(compile_options or {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr, weight_decay=params.weight_decay,
                                  fused=cuda or None)
    data = SyntheticBatches(vocab_size=own.vocab_size, seq_len=params.seq_len,
                            micro_batch=params.micro_batch, head=params.head,
                            num_classes=params.num_classes, seed=params.seed, rank=rank,
                            device=device)
    accumulation = params.grad_accum
    dtype = DTYPES.get(params.precision)

    def step() -> torch.Tensor:
        for micro in range(accumulation):
            inputs, targets = data.next()
            sync = wrapped.no_sync() if world > 1 and micro < accumulation - 1 else contextlib.nullcontext()
            with sync, torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = wrapped(inputs, targets) / accumulation
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def synchronize(params: CellParams) -> None:
    if params.device == "cuda":
        torch.cuda.synchronize()


def train(params: CellParams, steps: int, warmup: int) -> dict:
    step = build_step(params)
    for _ in range(warmup):
        step()
    synchronize(params)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(params)
    elapsed = time.perf_counter() - started
    world = int(os.environ.get("WORLD_SIZE", 1))
    tokens = steps * params.micro_batch * params.grad_accum * params.seq_len * world
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"steps": steps, "seconds": elapsed, "step_time_s": elapsed / steps,
            "tokens_per_s": tokens / elapsed, "gpus": world, "rank": int(os.environ.get("RANK", 0))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", required=True, help="the cell's parameters (its canonical JSON)")
    parser.add_argument("--steps", type=int, required=True, help="timed optimizer steps")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    params = CellParams.from_json(args.params)
    result = train(params, args.steps, params.warmup_steps)
    if result["rank"] == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
