"""How far MFU goes on one GPU: the baseline cells' configuration with some of the usual tunings.

    python3 bench/mfu.py [--steps 20] [--out results/bench/mfu]        (on a GPU host)

Each variant is the bare loop of bench/bare_loop.py (trainbench's GPT, fused AdamW, bf16 autocast,
torch.compile) with one change: a larger micro batch at the same global batch, or the vocabulary
padded to a multiple of 64 (nanoGPT's 50304: the LM head's matmul tiles evenly). MFU counts the
model's own FLOPs (the unpadded vocabulary: the padding's work is waste, not model FLOPs), against
the GPU's dense bf16 peak (src/trainbench/metrics.py). Variants run one after another in one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bare_loop import build_step  # noqa: E402
from trainbench.config import load_config  # noqa: E402
from trainbench.metrics import peak_flops  # noqa: E402
from trainbench.models import get_model  # noqa: E402

VARIANTS = [  # (baseline cell, changes to its parameters, padded vocabulary)
    ("strategy~single__model~gpt2-124m__gpus~1__micro_batch~32", {}, None),
    ("strategy~single__model~gpt2-124m__gpus~1__micro_batch~32", {"micro_batch": 64, "grad_accum": 2}, None),
    ("strategy~single__model~gpt2-124m__gpus~1__micro_batch~32", {}, 50304),
    ("strategy~single__model~gpt2-124m__gpus~1__micro_batch~32", {"micro_batch": 64, "grad_accum": 2}, 50304),
    ("strategy~single__model~gpt2-350m__gpus~1__micro_batch~16", {}, 50304),
    ("strategy~single__model~gpt2-350m__gpus~1__micro_batch~16", {"micro_batch": 32, "grad_accum": 2}, 50304),
]


def measure(params: dict, vocab: int | None, steps: int) -> dict:
    spec = get_model(params["model"])
    step = build_step(params, dataclasses.replace(spec, vocab_size=vocab) if vocab else spec)
    for _ in range(params["warmup_steps"]):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / steps
    tokens = params["micro_batch"] * params["grad_accum"] * params["seq_len"] / seconds
    flops = tokens * spec.train_flops_per_token(params["seq_len"])  # the model's own FLOPs
    peak = peak_flops(torch.cuda.get_device_name(0), params["precision"], params["tf32"])
    torch._dynamo.reset()
    return {"step_time_s": seconds, "tokens_per_s": tokens, "tflops": flops / 1e12, "mfu": flops / peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "mfu")
    args = parser.parse_args()
    study = load_config(REPO / "config.yaml").study("baseline")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"bench/mfu.py on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{args.steps} timed steps each")
    for cell_id, changes, vocab in VARIANTS:
        params = {**study.cell(cell_id).params, **changes}
        row = {"model": params["model"], "micro_batch": params["micro_batch"],
               "grad_accum": params["grad_accum"],
               "vocab": vocab or get_model(params["model"]).vocab_size, **measure(params, vocab, args.steps)}
        rows.append(row)
        print(f"{row['model']:<10} micro batch {row['micro_batch']:>3} x {row['grad_accum']}  "
              f"vocab {row['vocab']:>6}  "
              f"{row['step_time_s'] * 1e3:7.1f} ms  {row['tokens_per_s']:>9,.0f} tokens/s  "
              f"{row['tflops']:6.1f} TFLOPS  "
              f"MFU {row['mfu']:.1%}", flush=True)
        (args.out / "mfu.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
