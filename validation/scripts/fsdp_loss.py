"""FSDP2's LM loss eager against compiled: the memory each holds at the peak and its step time, side by side.

    python3 bench/fsdp_loss.py [--cell baseline/<cell folder>] [--rounds 4] [--steps 10] --out DIR

A torch FSDP2 cell with torch.compile compiles each block as it shards it, not the model, so the loss
after the last block ran eager until GPT.compile_loss: the fp32 cast and log-softmax of the logits
keep fp32 copies of them for backward and make another for their gradient, where a model compiled
whole fuses them (trainbench.training.gpt). This builds the cell (default: the baseline's FSDP2 GPT-2
124M on 2 GPUs) as its runner does (TorchRunner), as rank 0 of its world through PyTorch's fake
process group (trainbench.training.emulation: the rank computes alone, its collectives return at
once), twice in one process: `compiled`, as the runner builds it now, and `eager`, the same runner
with the loss set back to the eager function, as it was. Then windows of --steps optimizer steps
alternate between the two (eager, compiled, compiled, eager, ...: drift cancels), each synchronised at
its two ends, its peak allocated memory read above what was allocated when it started (both models
are resident throughout; what a step adds is the comparison), and its last loss read after it.

The eager/compiled ratio of each round is of the mean step time of the two windows; the summary
gives its median and range over the rounds, and each variant's step-added peak. On CPU (the
benchmark's tests) there is no allocator peak to read and the figures time a CPU.

Writes DIR/fsdp_loss.json (every window and the environment) and DIR/fsdp_loss.txt (the summary).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CELL = "baseline/strategy~fsdp__model~gpt2-124m__gpus~2__micro_batch~32"
VARIANTS = ("eager", "compiled")


def cell_params(cell: str | None, params_json: str | None):
    from trainbench.execute.results import read_result
    from trainbench.study.params import CellParams

    if params_json:
        return CellParams.from_json(params_json)
    return CellParams.from_dict(read_result(REPO / "results/runs" / cell / "metrics.json")["params"])


def build(params, device: torch.device, variant: str):
    """The cell's runner, built; `eager`: its loss set back to the eager function."""
    from trainbench.training.gpt import lm_loss
    from trainbench.training.runners import RunContext
    from trainbench.training.runners.torch_native import TorchRunner

    torch.manual_seed(params.seed)
    runner = TorchRunner(RunContext(params, 0, params.gpus * params.nodes, 0, device))
    runner.setup()
    if variant == "eager":
        runner.inner.lm_loss = lm_loss
    elif runner.inner.lm_loss is lm_loss:  # a cell the runner compiles has its loss compiled already
        runner.inner.compile_loss()
    return runner


def window(runner, steps: int, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        start_mib = torch.cuda.memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    for _ in range(steps):
        loss = runner.train_step()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    figures = {"step_time_s": seconds / steps, "loss": float(loss)}
    if cuda:
        figures["added_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20 - start_mib
    return figures


def summarise(report: dict) -> str:
    windows = report["windows"]
    rounds = sorted({w["round"] for w in windows})
    lines = [f"{report['cell']} as rank 0 of {report['world']} (fake process group), {report['device']}, "
             f"{report['steps']} optimizer steps a window, {len(rounds)} rounds"]
    ratios = []
    for r in rounds:
        mean = {v: statistics.mean(w["step_time_s"] for w in windows if w["round"] == r and w["variant"] == v)
                for v in VARIANTS}
        ratios.append(mean["eager"] / mean["compiled"])
    lines.append(f"step time, eager loss / compiled loss: median {statistics.median(ratios):.3f} "
                 f"(rounds {min(ratios):.3f} to {max(ratios):.3f})")
    for v in VARIANTS:
        mine = [w for w in windows if w["variant"] == v]
        line = f"  {v:9s} {statistics.median(w['step_time_s'] for w in mine) * 1e3:9.1f} ms a step"
        if "added_peak_mib" in mine[0]:
            peak = max(w["added_peak_mib"] for w in mine)
            line += f", {peak:9.0f} MiB allocated at the peak above the start"
        graphs = report["graphs_compiled"][v]
        lines.append(line + f", last loss {mine[-1]['loss']:.4f}, {graphs} graphs compiled")
    if "added_peak_mib" in windows[0]:
        peaks = {v: max(w["added_peak_mib"] for w in windows if w["variant"] == v) for v in VARIANTS}
        more = peaks["eager"] - peaks["compiled"]
        lines.append(f"the eager loss's peak over the compiled loss's: {more:+.0f} MiB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", default=DEFAULT_CELL,
                        help="STUDY/CELL folder of a published torch FSDP cell")
    parser.add_argument("--params", help="the cell's parameters as JSON, instead of --cell (tests)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps a window")
    parser.add_argument("--warmup", type=int, default=3, help="steps of each variant before the rounds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from trainbench.training import emulation
    from trainbench.training.gpt import hold_attention_kernel

    params = cell_params(args.cell, args.params)
    if params.framework != "torch" or params.strategy != "fsdp":
        parser.error(f"{args.cell}: a torch FSDP cell is needed, not {params.framework} {params.strategy}")
    device = torch.device("cuda", 0) if params.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    world = params.gpus * params.nodes
    os.environ[emulation.EMULATED_ENV] = "1"
    hold_attention_kernel(params.attention)
    emulation.init_process_group(emulation.EmulatedRank(0, world, params.gpus_per_node or params.gpus))
    from torch._dynamo.utils import counters

    runners, graphs = {}, {}
    for variant in VARIANTS:
        before = counters["stats"]["unique_graphs"]
        runners[variant] = build(params, device, variant)
        for _ in range(args.warmup):  # the compiles, and the allocator's first blocks
            runners[variant].train_step()
        # the graphs dynamo compiled for this variant: its blocks' (where the cell compiles) and its loss's
        graphs[variant] = counters["stats"]["unique_graphs"] - before
        print(f"built and warmed up: {variant}, {graphs[variant]} graphs compiled", file=sys.stderr,
              flush=True)
    windows = []
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order + order[::-1]:
            windows.append({"round": r, "variant": variant, **window(runners[variant], args.steps, device)})
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    report = {"cell": args.params and "(--params)" or args.cell, "world": world, "steps": args.steps,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
              or "cpu", "torch": torch.__version__, "params": params.as_dict(), "graphs_compiled": graphs,
              "windows": windows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fsdp_loss.json").write_text(json.dumps(report, indent=1) + "\n")
    summary = summarise(report)
    (out / "fsdp_loss.txt").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
