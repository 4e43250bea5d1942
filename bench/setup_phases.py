"""Where a one-GPU cell's `setup` phase goes (metrics.phases_s): the steps the worker and the torch
runner take between imports and the first step, each timed alone on the GPU host.

    PYTHONPATH=src python3 bench/setup_phases.py [--model gpt2-124m]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt2-124m")
    args = parser.parse_args()
    marks = [("start", time.perf_counter())]

    def mark(name):
        torch.cuda.synchronize()
        marks.append((name, time.perf_counter()))

    from trainbench.training.data import SyntheticBatches
    from trainbench.training.gpt import GPT
    from trainbench.execute.memory_sampler import MemorySampler
    from trainbench.registry.models import get_model
    mark("trainbench imports")
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    mark("CUDA context")
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    mark("NCCL process group (1 rank)")
    sampler = MemorySampler(use_gpus=True).start()
    mark("memory sampler process")
    spec = get_model(args.model).with_vocab_multiple(64)
    with torch.device("cuda"):
        model = GPT(spec)
    mark("model built on the GPU (default init)")
    model.init_weights(0)
    mark("GPT-2 init, module by module")
    compiled = torch.compile(model)
    mark("torch.compile wrapper (lazy)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    mark("fused AdamW")
    SyntheticBatches(vocab_size=50257, seq_len=1024, micro_batch=32, head="lm", num_classes=2, seed=0, rank=0,
                     device=torch.device("cuda"))
    mark("synthetic batches")
    sampler.stop()
    dist.destroy_process_group()
    del compiled, optimizer
    for (_, before), (name, after) in zip(marks, marks[1:]):
        print(f"{name:<40} {after - before:7.3f} s")
    print(f"{'all':<40} {marks[-1][1] - marks[0][1]:7.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
