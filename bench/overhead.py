"""What the harness costs: the pipeline's own cell against a bare training loop of the same configuration.

    python bench/overhead.py [--cells ID ...] [--rounds 3] [--out DIR]        (on a GPU host)

For each cell of the `baseline` study named (default: the one-GPU cells, and the 2-GPU DDP cells
where the host has 2 GPUs), rounds of two fresh processes each, in alternating order so that drift
cancels: the bare loop (bench/bare_loop.py: the same model code, data, optimizer, precision and
compile setting, timed as one window synchronised at its two ends), and the cell exactly as the
train_cell rule runs it (`trainbench run-cell`, its metrics.json read back). Each round gives the
ratio cell/bare of tokens/s per GPU; the set-up's figure is their mean with a 95% t-interval over
the rounds. The goal is >= 0.98.

With --ablation, one process per one-GPU cell also times, interleaved with the bare loop, what the
earlier harness did around each step: synchronising the device and reading the loss every step,
and a memory-sampler thread in the training process, against the sampler process used now.

Writes DIR/overhead.json (every round's figures and the versions, GPU and command) and
DIR/overhead.txt (the summary printed last); the cells' metrics.json files stay under DIR/runs for
`trainbench compare` (a cell run twice on one host is a rerun).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BARE = REPO / "bench" / "bare_loop.py"
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t-interval (None for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def cache_environment(base) -> dict:
    from trainbench.execute.launch import cache_environment as cells_cache

    return cells_cache(base)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def launcher(gpus: int) -> list[str]:
    return ([sys.executable] if gpus == 1 else
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"])


def run_bare(cell, out: Path, steps: int, log) -> dict:
    result = out / "bare.json"
    command = [*launcher(cell.params.gpus), str(BARE), "--params", cell.canonical, "--steps", str(steps),
               "--out", str(result)]
    # the compile cache the cell's ranks get (launch.py), so that neither compiles where the other does not
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                   env={**os.environ, **cache_environment(os.environ), "PYTHONUNBUFFERED": "1"})
    figures = json.loads(result.read_text())
    return {"tokens_per_s_per_gpu": figures["tokens_per_s"] / figures["gpus"],
            "step_time_s": figures["step_time_s"], "steps": figures["steps"]}


MINIMAL = REPO / "validation" / "scripts" / "minimal_loop.py"
MINIMAL_SIZES = {"gpt2-124m": "124m", "gpt2-350m": "350m"}  # the shapes MINIMAL writes


def run_minimal(cell, out: Path, steps: int, log) -> dict:
    """validation/scripts/minimal_loop.py, the loop written apart from trainbench, at the cell's shape."""
    params = cell.params
    if params.model not in MINIMAL_SIZES or params.gpus != 1 or params.grad_accum != 4:
        raise SystemExit(f"--reference minimal: {cell.cell_id} is not a one-GPU GPT-2 cell of 4 micro "
                         f"batches (validation/scripts/minimal_loop.py's shapes: {sorted(MINIMAL_SIZES)})")
    result = out / "minimal.json"
    command = [sys.executable, str(MINIMAL), "--model", MINIMAL_SIZES[params.model],
               "--micro-batch", str(params.micro_batch), "--steps", str(steps), "--out", str(result)]
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                   env={**os.environ, **cache_environment(os.environ), "PYTHONUNBUFFERED": "1"})
    figures = json.loads(result.read_text())
    return {"tokens_per_s_per_gpu": figures["tokens_per_s"], "step_time_s": figures["seconds"] / steps,
            "steps": steps}


def run_cell(cell, out: Path, log) -> dict:
    metrics_path = out / "runs" / cell.study / cell.cell_id / "metrics.json"
    resources = cell.resources()
    command = [sys.executable, "-m", "trainbench", "run-cell", "--study", cell.study, "--cell", cell.cell_id,
               "--params", cell.canonical,
               "--retries", "0", "--cpus-per-rank", str(resources["cpus_per_rank"]),
               "--runtime-min", str(resources["runtime"]), "--timing", resources["timing"],
               "--output", str(metrics_path)]
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    doc = json.loads(metrics_path.read_text())
    if doc["status"] != "ok":
        raise RuntimeError(f"{cell.cell_id}: {doc['status']}: {doc['reason']}")
    m = doc["metrics"]
    return {"tokens_per_s_per_gpu": m["tokens_per_s"] / cell.params.gpus, "step_time_s": m["step_time_s"],
            "steps": m["steps_timed"], "windows": m["windows"], "ci_half_width": m["ci_half_width"],
            "mfu": m["mfu"], "noisy": m["noisy"], "stopped": m["timing"]["stopped"]}


def compare_cell(cell, rounds: int, out: Path, log, reference: str = "bare") -> dict:
    """Alternating rounds of the reference loop (bare or minimal) and the cell; the ratio of their
    tokens/s per GPU."""
    records = []
    run_reference = {"bare": run_bare, "minimal": run_minimal}[reference]
    for round_ in range(1, rounds + 1):
        round_dir = out / f"round-{round_}"
        round_dir.mkdir(parents=True, exist_ok=True)
        order = (reference, "cell") if round_ % 2 else ("cell", reference)
        record = {"round": round_, "order": list(order)}
        for which in order:
            started = time.monotonic()
            record[which] = (run_reference(cell, round_dir, cell.params.timed_steps, log)
                             if which == reference else run_cell(cell, round_dir, log))
            record[which]["wall_s"] = round(time.monotonic() - started, 1)
            print(f"  round {round_} {which}: {record[which]['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU "
                  f"({record[which]['wall_s']:.0f} s)", flush=True)
        record["ratio"] = record["cell"]["tokens_per_s_per_gpu"] / record[reference]["tokens_per_s_per_gpu"]
        records.append(record)
    mean, half = mean_interval([r["ratio"] for r in records])
    return {"cell": cell.cell_id, "params": cell.params.as_dict(), "reference": reference,
            "rounds": records, "ratio": mean, "ratio_half_width": half}


def ablation(cell, rounds: int, steps: int) -> dict:
    """In one process: the bare loop's steps against the same steps with what the earlier harness
    added around each step (rounds interleave the variants; each ratio is against the bare rounds)."""
    sys.path.insert(0, str(REPO / "bench"))
    from bare_loop import build_step, synchronize
    from trainbench.execute.memory_sampler import MemorySampler, PeakTracker

    step = build_step(cell.params)
    for _ in range(cell.params.warmup_steps):
        step()

    def timed(per_step_sync: bool) -> float:
        synchronize(cell.params)
        started = time.perf_counter()
        for _ in range(steps):
            if per_step_sync:  # the earlier StepClock and loss.item(): the host waits for every step
                synchronize(cell.params)
                step().item()
            else:
                step()
        synchronize(cell.params)
        return (time.perf_counter() - started) / steps

    def with_thread_sampler() -> float:
        stop, tracker = threading.Event(), PeakTracker(use_gpus=cell.params.device == "cuda")

        def sample():  # the earlier sampler: a thread of the training process, every 50 ms
            while not stop.is_set():
                tracker.sample()
                stop.wait(0.05)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            return timed(False)
        finally:
            stop.set()
            thread.join()

    def with_process_sampler() -> float:
        sampler = MemorySampler(use_gpus=cell.params.device == "cuda").start()
        try:
            return timed(False)
        finally:
            sampler.stop()

    variants = {"bare": lambda: timed(False), "sync and read the loss every step": lambda: timed(True),
                "sampler thread (50 ms)": with_thread_sampler,
                "sampler process (50 ms)": with_process_sampler}
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # rotate the order
            times[name].append(variants[name]())
    bare = times["bare"]
    result = {}
    for name, values in times.items():
        ratios = [b / v for b, v in zip(bare, values)]  # throughput relative to the bare round beside it
        mean, half = mean_interval(ratios)
        result[name] = {"step_time_s": values, "throughput_vs_bare": mean, "half_width": half}
    return result


def environment() -> dict:
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("trainbench", "snakemake", "deepspeed"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    commit = os.environ.get("TRAINBENCH_GIT_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
        text=True).stdout.strip() or None
    return {"gpu": gpu, "gpus": gpu_count(), "host": platform.node(), "versions": versions,
            "git_commit": commit,
            "command": shlex.join([sys.executable, *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def summary_lines(report: dict) -> list[str]:
    env = report["environment"]
    lines = [f"bench/overhead.py on {env['gpus']} x {env['gpu']} ({env['host']}), "
             f"torch {env['versions']['torch']}, "
             f"commit {env['git_commit']}, {env['date']}", f"command: {env['command']}", "",
             "cell/reference: tokens/s per GPU of the pipeline's cell over the reference loop's (bare: "
             "bench/bare_loop.py, goal >= 0.98; minimal: validation/scripts/minimal_loop.py, goal >= 1.0), "
             "mean of the rounds with its 95% t-interval",
             f"{'cell':<58} {'ref. tok/s':>11} {'cell tok/s':>11} {'cell MFU':>8} {'cell/reference':>17}"
             "  rounds"]
    for item in report["cells"]:
        reference = item.get("reference", "bare")  # reports before --reference: the bare loop
        reference_rate = statistics.fmean(r[reference]["tokens_per_s_per_gpu"] for r in item["rounds"])
        cell = statistics.fmean(r["cell"]["tokens_per_s_per_gpu"] for r in item["rounds"])
        mfus = [r["cell"]["mfu"] for r in item["rounds"] if r["cell"]["mfu"] is not None]
        mfu = f"{statistics.fmean(mfus):.1%}" if mfus else "-"
        half = "" if item["ratio_half_width"] is None else f" ± {item['ratio_half_width']:.3f}"
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in item["rounds"])
        lines.append(f"{item['cell']:<58} {reference_rate:>11,.0f} {cell:>11,.0f} {mfu:>8} "
                     f"{item['ratio']:>9.3f}{half:<8}  {ratios}  ({reference})")
    for cell_id, variants in report.get("ablation", {}).items():
        lines += ["", f"ablation, {cell_id} (one process, variants interleaved; throughput relative to the "
                      f"bare loop's round beside it, mean ± 95% t-interval):"]
        for name, figures in variants.items():
            half = "" if figures["half_width"] is None else f" ± {figures['half_width']:.3f}"
            lines.append(f"  {name:<36} {figures['throughput_vs_bare']:.3f}{half}  "
                         f"(median step {statistics.median(figures['step_time_s']) * 1e3:.1f} ms)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="*", help="baseline cell ids (default: the one-GPU cells, and the "
                                                   "2-GPU DDP cells on a host with 2 GPUs or more)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reference", choices=["bare", "minimal"], default="bare",
                        help="the loop the cell is set against: bench/bare_loop.py (trainbench's model, the "
                             "harness's cost) or validation/scripts/minimal_loop.py (written apart: one-GPU "
                             "GPT-2 cells)")
    parser.add_argument("--ablation", action="store_true",
                        help="also the in-process ablation of the one-GPU cells")
    parser.add_argument("--ablation-only", action="store_true", help="only the ablation")
    parser.add_argument("--ablation-rounds", type=int, default=3)
    parser.add_argument("--ablation-steps", type=int, default=16)
    parser.add_argument("--config", default=str(REPO / "config.yaml"))
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "overhead")
    args = parser.parse_args()

    from trainbench.study.config import load_config

    study = load_config(args.config).study("baseline")
    gpus_here = gpu_count()
    if args.cells:
        cells = [study.cell(cell_id) for cell_id in args.cells]
    else:
        cells = [c for c in study.cells if c.params.gpus == 1 or
                 (c.params.gpus == 2 and c.params.strategy == "ddp" and gpus_here >= 2)]
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"environment": environment(), "cells": [], "ablation": {}}
    with open(args.out / "overhead.log", "a") as log:
        if args.ablation or args.ablation_only:
            for cell in (c for c in cells if c.params.gpus == 1):
                print(f"ablation: {cell.cell_id}", flush=True)
                report["ablation"][cell.cell_id] = ablation(cell, args.ablation_rounds, args.ablation_steps)
        if not args.ablation_only:
            for cell in cells:
                print(f"{cell.cell_id}: {args.rounds} rounds", flush=True)
                report["cells"].append(compare_cell(cell, args.rounds, args.out, log, args.reference))
                (args.out / "overhead.json").write_text(json.dumps(report, indent=1))
    (args.out / "overhead.json").write_text(json.dumps(report, indent=1))
    lines = summary_lines(report)
    (args.out / "overhead.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
