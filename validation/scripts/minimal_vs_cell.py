"""The baseline cells against an independent minimal loop, in one process on one GPU (issue 34).

    python3 bench/minimal_vs_cell.py [--sizes 124m 350m] [--rounds 3] [--steps 20] [--pipeline-cell]
                                     [--variants nobias tf32] [--profile-steps 3] --out DIR

For each size: the minimal nanoGPT-style loop (bench/minimal_loop.py, which imports nothing of
trainbench) and the baseline cell's step as bench/bare_loop.py builds it (trainbench's GPT, data and
optimizer from the cell's parameters in config.yaml), both built and compiled in this process, then
timed in alternating windows (minimal, cell, cell, minimal, ...: drift cancels), each window `--steps`
optimizer steps synchronised at its two ends only. The cell/minimal ratio of each round is the cell's
tokens/s over the minimal loop's in the same round.

--pipeline-cell also runs the real cell in the middle of the rounds, as the train_cell rule runs it
(`trainbench run-cell`, bench/overhead.py's run_cell), in a child process while this one waits.
--variants adds windows of other set-ups after the rounds, each against a minimal window beside it:
`nobias` (the minimal loop with nanoGPT train.py's bias=False: no Linear or LayerNorm biases, not
GPT-2's shape), `tf32` (both loops with TF32 matmuls allowed, as nanoGPT's train.py sets; the cells
leave it off), `cellfix` (the cell's step built by each --fix-builder, a function 'module:name' taking the
cell's parameters and returning a step: a candidate fix; two are here, see below).
`pool` is the minimal loop cycling the cells' pool of four random batches instead of its one
(trainbench.training.data.POOL_SIZE): the two loops on the same data.
`draws` builds the pool loop and the cell once more from another seed (other random weights and
batches): `--round-loops "minimal pool" "minimal pool draw2" "cell draw2"` shows how far each loop moves
with its draw alone, beside the cell's gap to the minimal loop. Every window records its last loss.

--round-loops NAME ... puts those variants into every round beside the minimal loop and the cell
(the order rotated round by round), so that each has a ratio to the minimal loop per round and an
interval over the rounds, as the cell has: `--variants pool cellfix --fix-builder
minimal_vs_cell:cell_one_batch --round-loops "minimal pool" cell_one_batch` sets both loops on both
data set-ups.

Every window also records, from NVML, the GPU's mean SM clock and power over the window (sampled
every 10 ms in a thread) and its energy counter at the two ends: on a GPU at its power limit the
clock, not the code, can decide a 1% difference.

Then --profile-steps optimizer steps of each loop (and of --profile-also's) under torch.profiler (GPU
kernels only, after warm-up): the GPU time per step by kernel class (matmul, attention, loss,
optimizer, the compiler's fused kernels, embedding, copies), the GPU's busy time and idle share, and
the kernels whose time differs most from the minimal loop's, so that a gap can be attributed. The
trace itself is not kept.

Writes DIR/minimal_vs_cell.json (every window, the profiles, the environment) and
DIR/minimal_vs_cell.txt (the summary printed last; --render JSON prints it again from a saved
report). Dynamo's automatic dynamic shapes are off and its caches are reset between sizes, so that
every graph is compiled for its static shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from trainbench.execute.profiling import classify, union_length  # noqa: E402  (kernel classes, by name: the cells' list)
CELLS = {"124m": "strategy~single__model~gpt2-124m__gpus~1__micro_batch~32",
         "350m": "strategy~single__model~gpt2-350m__gpus~1__micro_batch~16"}
MINIMAL_SEED2 = 1338  # the `draws` variant's second seed of the minimal loop (its first: nanoGPT's 1337)

# What the profiler records and which of its trace's events are the device's (bench tests on CPU: cpu_op).
ACTIVITIES = ("CUDA",)
DEVICE_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")



def generic(kernel: str) -> str:
    """A kernel's name without the compiler's serial numbers, so that the two models' kernels meet."""
    return re.sub(r"_\d+$", "", kernel)[:150]


def cell_params(size: str):
    from trainbench.study.config import load_config

    return load_config(REPO / "config.yaml").study("baseline").cell(CELLS[size]).params


class Loop:
    """A named step function and what a window of it counts."""

    def __init__(self, name: str, step, tokens_per_step: int, flops_per_token: float, accum: int = 1):
        self.name, self.step, self.accum = name, step, accum
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token

    def warm(self, steps: int) -> float:
        import torch

        started = time.perf_counter()
        for _ in range(steps):
            self.step()
        torch.cuda.synchronize()
        return time.perf_counter() - started

    def window(self, steps: int, peak: float, sampler: GpuSampler | None = None) -> dict:
        import torch

        torch.cuda.synchronize()
        if sampler:
            sampler.start()
        started = time.perf_counter()
        for _ in range(steps):
            loss = self.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        gpu = sampler.stop() if sampler else {}
        gpu["loss"] = float(loss.detach()) * self.accum  # the last micro batch, unscaled
        tokens = steps * self.tokens_per_step / seconds
        if gpu.get("energy_j") is not None:
            gpu["energy_j_per_step"] = gpu.pop("energy_j") / steps
        return {"loop": self.name, "steps": steps, "step_time_s": seconds / steps, "tokens_per_s": tokens,
                "mfu": tokens * self.flops_per_token / peak, **gpu}


class GpuSampler:
    """NVML over one window: the SM clock and the power sampled every `every_s` in a thread, and the
    energy counter at the two ends. `for_device` is None where NVML is missing (CPU tests)."""

    def __init__(self, pynvml, handle, every_s: float = 0.01):
        import threading

        self.nvml, self.handle, self.every_s = pynvml, handle, every_s
        self._threading = threading
        self._thread = None

    @classmethod
    def for_device(cls, index: int = 0) -> GpuSampler | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        except Exception:
            return None
        return cls(pynvml, handle)

    def _energy_mj(self) -> int | None:
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception:
            return None

    def _sample(self) -> None:
        while not self._done.wait(self.every_s):
            self._clocks.append(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
            self._power.append(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3)

    def start(self) -> None:
        self._clocks, self._power = [], []
        self._done = self._threading.Event()
        self._energy_start = self._energy_mj()
        self._thread = self._threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._done.set()
        self._thread.join()
        end = self._energy_mj()
        return {"sm_clock_mhz": mean(self._clocks), "power_w": mean(self._power),
                "power_w_max": max(self._power, default=float("nan")), "samples": len(self._clocks),
                "energy_j": (end - self._energy_start) / 1e3
                if end is not None and self._energy_start is not None else None}


def build_loops(size: str, variants: list[str], fix_builders: list[str]) -> tuple[dict, dict[str, Loop]]:
    import minimal_loop
    from bare_loop import build_step
    from trainbench.registry.models import get_model
    from trainbench.training.data import POOL_SIZE

    params = cell_params(size)
    tokens = params.micro_batch * params.grad_accum * params.seq_len
    flops = get_model(params.model).train_flops_per_token(params.seq_len)  # the cells' MFU numerator

    def loop(name: str, step) -> Loop:
        return Loop(name, step, tokens, flops, params.grad_accum)

    def minimal(**options):
        return minimal_loop.build(size, params.micro_batch, accum=params.grad_accum, **options)[0]

    loops = {"cell": loop("cell", build_step(params)), "minimal": loop("minimal", minimal())}
    if "nobias" in variants:
        loops["minimal nobias"] = loop("minimal nobias", minimal(bias=False))
    if "pool" in variants:
        loops["minimal pool"] = loop("minimal pool", minimal(batches=POOL_SIZE))
    if "draws" in variants:
        # each loop again from another seed (other random weights and batches): how far a loop moves
        # with its draw alone, against which the cell's gap to the minimal loop is set
        loops["minimal pool draw2"] = loop("minimal pool draw2",
                                           minimal(batches=POOL_SIZE, seed=MINIMAL_SEED2))
        loops["cell draw2"] = loop("cell draw2",
                                   build_step(dataclasses.replace(params, seed=params.seed + 1)))
    for spec in (fix_builders if "cellfix" in variants else []):
        module, name = spec.split(":")
        loops[name] = loop(name, getattr(importlib.import_module(module), name)(params))
    return params, loops


def cell_nanogpt_groups(params):
    """The cell's step (bench/bare_loop.py) with the minimal loop's optimizer: nanoGPT's two parameter
    groups (no weight decay on biases and LayerNorms) and betas (0.9, 0.95)."""
    import torch

    import bare_loop

    original = torch.optim.AdamW

    def grouped(parameters, **kwargs):
        parameters = list(parameters)
        groups = [{"params": [p for p in parameters if p.dim() >= 2]},
                  {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]
        return original(groups, **{**kwargs, "betas": (0.9, 0.95)})

    torch.optim.AdamW = grouped
    try:
        return bare_loop.build_step(params)
    finally:
        torch.optim.AdamW = original


def cell_one_batch(params):
    """The cell's step with the minimal loop's data: one fixed batch, not a pool of four."""
    import bare_loop

    original = bare_loop.SyntheticBatches

    class OneBatch(original):
        def next(self):
            return self.batches[0]

    bare_loop.SyntheticBatches = OneBatch
    try:
        return bare_loop.build_step(params)
    finally:
        bare_loop.SyntheticBatches = original


def profile(loop: Loop, steps: int) -> dict:
    """`steps` optimizer steps under torch.profiler: GPU time per step by kernel class and by kernel,
    and the share of the timeline when no kernel ran."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    loop.warm(1)
    with torch_profile(activities=[getattr(ProfilerActivity, a) for a in ACTIVITIES]) as prof:
        for _ in range(steps):
            loop.step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") in DEVICE_EVENTS and "dur" in e]
    begin = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    # the union of kernel intervals: when the GPU was doing anything
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in kernels], begin, end)
    by_class: dict[str, float] = {}
    by_kernel: dict[str, list[float]] = {}
    for e in kernels:
        kind = classify(e["name"])
        by_class[kind] = by_class.get(kind, 0.0) + e["dur"] / 1e3 / steps
        entry = by_kernel.setdefault(generic(e["name"]), [0.0, 0])
        entry[0] += e["dur"] / 1e3 / steps
        entry[1] += 1
    return {"loop": loop.name, "steps": steps, "span_ms_per_step": (end - begin) / 1e3 / steps,
            "busy_ms_per_step": busy / 1e3 / steps, "gpu_idle_share": 1 - busy / (end - begin),
            "kernels_per_step": len(kernels) / steps,
            "classes_ms": dict(sorted(by_class.items(), key=lambda kv: -kv[1])),
            "kernels_ms": {name: {"ms": round(ms, 4), "calls": calls / steps, "class": classify(name)}
                           for name, (ms, calls) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])}}


def compare_size(size: str, args, log) -> dict:
    import torch

    from trainbench.execute.metrics import peak_flops

    torch._dynamo.reset()
    peak = peak_flops(torch.cuda.get_device_name(0), "bf16", False)
    started = time.perf_counter()
    params, loops = build_loops(size, args.variants, args.fix_builder or [])
    warm = {name: round(loop.warm(params.warmup_steps), 1) for name, loop in loops.items()}
    print(f"[{size}] built and warmed in {time.perf_counter() - started:.0f} s: {warm}", flush=True)
    windows = []
    sampler = GpuSampler.for_device(0)

    def window(name: str, tag: str) -> dict:
        w = {**loops[name].window(args.steps, peak, sampler), "tag": tag}
        windows.append(w)
        gpu = (f"  {w['sm_clock_mhz']:5.0f} MHz {w['power_w']:4.0f} W" if "sm_clock_mhz" in w else "")
        print(f"[{size}] {tag:<10} {name:<15} {w['tokens_per_s']:>10,.0f} tokens/s  "
              f"{w['step_time_s'] * 1e3:6.1f} ms  MFU {w['mfu']:.1%}{gpu}", flush=True)
        return w

    missing = [n for n in args.round_loops if n not in loops]
    if missing:
        raise SystemExit(f"--round-loops {missing}: not built (loops: {sorted(loops)}; see --variants)")
    in_rounds = ["minimal", "cell", *args.round_loops]
    rounds, pipeline = [], None
    for r in range(args.rounds):
        # each rotation of the loops twice, forward then reversed (ABBA for two loops): drift cancels
        shift = (r // 2) % len(in_rounds)
        order = in_rounds[shift:] + in_rounds[:shift]
        order = order if r % 2 == 0 else order[::-1]
        got = {name: window(name, f"round {r + 1}") for name in order}
        rounds.append({"round": r + 1, "order": list(order), "minimal": got["minimal"]["tokens_per_s"],
                       "cell": got["cell"]["tokens_per_s"],
                       "ratio": got["cell"]["tokens_per_s"] / got["minimal"]["tokens_per_s"],
                       "others": {n: got[n]["tokens_per_s"] for n in args.round_loops}})
        if args.pipeline_cell and r == (args.rounds - 1) // 2 and pipeline is None:
            pipeline = run_pipeline_cell(size, log)
    extra = []
    for name in [n for n in loops if n not in in_rounds]:
        a, b = window("minimal", "variant"), window(name, "variant")
        extra.append({"variant": name, "tokens_per_s": b["tokens_per_s"], "minimal": a["tokens_per_s"],
                      "ratio": b["tokens_per_s"] / a["tokens_per_s"]})
    if "tf32" in args.variants:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        for name in ("minimal", "cell"):
            loops[name].warm(2)  # a recompile: dynamo guards on the TF32 flag
        got = {name: window(name, "tf32") for name in ("minimal", "cell")}
        extra.append({"variant": "tf32 (both)", "tokens_per_s": got["cell"]["tokens_per_s"],
                      "minimal": got["minimal"]["tokens_per_s"],
                      "ratio": got["cell"]["tokens_per_s"] / got["minimal"]["tokens_per_s"]})
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    profiles = {}
    if args.profile_steps:
        for name in ("minimal", "cell", *args.profile_also):
            profiles[name] = profile(loops[name], args.profile_steps)
    result = {"size": size, "cell": CELLS[size], "params": params.as_dict(), "warm_s": warm, "rounds": rounds,
              "windows": windows, "pipeline_cell": pipeline, "variants": extra, "profiles": profiles,
              "peak_flops": peak, "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    loops.clear()
    torch.cuda.empty_cache()
    return result


def run_pipeline_cell(size: str, log) -> dict:
    """The cell as the train_cell rule runs it, in a child process (bench/overhead.py's run_cell)."""
    from overhead import run_cell
    from trainbench.study.config import load_config

    cell = load_config(REPO / "config.yaml").study("baseline").cell(CELLS[size])
    started = time.monotonic()
    out = Path(tempfile.mkdtemp(prefix="pipeline-cell-"))
    try:
        figures = run_cell(cell, out, log)
    except Exception as error:  # reported, the rest goes on
        print(f"[{size}] pipeline cell failed: {error}", flush=True)
        return {"error": str(error)[:300]}
    figures["wall_s"] = round(time.monotonic() - started, 1)
    print(f"[{size}] pipeline   cell (run-cell) {figures['tokens_per_s_per_gpu']:>10,.0f} tokens/s  "
          f"MFU {figures['mfu']:.1%}  ({figures['wall_s']:.0f} s)", flush=True)
    return figures


def mean(values):
    return statistics.fmean(values) if values else float("nan")


def rounds_by_loop(item: dict) -> list[str]:
    """Every loop timed in the rounds: its tokens/s over the minimal loop's in the same round (mean and
    95% t-interval over the rounds), what NVML saw during its windows, and its tokens per clock cycle
    over the minimal loop's (tokens/s per SM MHz, the windows' means): on a GPU at its power limit,
    a loop that is slower at the same work per cycle is slower by its clock alone. Last, its loss at the
    end of its last window (how far it has learnt its batches; reports before it have none)."""
    from overhead import mean_interval

    # each round's tokens/s by loop (reports before --round-loops have the minimal loop and the cell)
    rounds = [{"minimal": r["minimal"], "cell": r["cell"], **r.get("others", {})} for r in item["rounds"]]
    names = list(rounds[0]) if rounds else []
    windows = [w for w in item["windows"] if w["tag"].startswith("round")]
    if not names or (len(names) == 2 and not any("sm_clock_mhz" in w for w in windows)):
        return []  # the summary's first lines say all there is
    lines = [f"       {'in every round':<22} {'tokens/s':>10} {'/ minimal':>10} {'95% interval':>18}"
             f" {'SM MHz':>7} {'W':>5} {'J/step':>7} {'/ minimal per MHz':>17} {'last loss':>9}"]
    per_mhz = {name: mean([w["tokens_per_s"] / w["sm_clock_mhz"] for w in windows
                           if w["loop"] == name and w.get("sm_clock_mhz")]) for name in names}
    for name in names:
        mine = [w for w in windows if w["loop"] == name]
        ratio, half = mean_interval([r[name] / r["minimal"] for r in rounds])
        interval = f"[{ratio - half:.3f}, {ratio + half:.3f}]" if half is not None else ""
        gpu = "".join(f" {mean([w[k] for w in mine if w.get(k) is not None]):>{width}.{digits}f}"
                      for k, width, digits in (("sm_clock_mhz", 7, 0), ("power_w", 5, 0),
                                               ("energy_j_per_step", 7, 1)))
        lines.append(f"       {name:<22} {mean([w['tokens_per_s'] for w in mine]):>10,.0f} {ratio:>10.3f}"
                     f" {interval:>18}{gpu} {per_mhz[name] / per_mhz['minimal']:>17.3f}"
                     f" {mine[-1].get('loss', float('nan')):>9.3f}")
    return lines


DRAWS = ("cell", "cell draw2", "minimal pool", "minimal pool draw2")


def draws_lines(item: dict) -> list[str]:
    """With the `draws` loops in the rounds: how far each loop moves with its draw of weights and
    batches alone (its second draw over its first, round by round), and the cell over the minimal loop
    on the same data, the pool, summed over both draws of each (95% t-intervals over the rounds)."""
    from overhead import mean_interval

    rounds = [{"minimal": r["minimal"], "cell": r["cell"], **r.get("others", {})} for r in item["rounds"]]
    if not rounds or any(name not in rounds[0] for name in DRAWS):
        return []

    def line(label: str, ratios: list[float]) -> str:
        ratio, half = mean_interval(ratios)
        interval = f"[{ratio - half:.3f}, {ratio + half:.3f}]" if half is not None else ""
        return f"       {label:<52} {ratio:.3f} {interval}"

    return ["       draws (each loop from a second seed: other random weights and batches):",
            line("minimal pool, its second draw / its first", [r["minimal pool draw2"] / r["minimal pool"]
                                                                for r in rounds]),
            line("cell, its second draw / its first", [r["cell draw2"] / r["cell"] for r in rounds]),
            line("cell / minimal pool, both draws summed", [(r["cell"] + r["cell draw2"])
                                                           / (r["minimal pool"] + r["minimal pool draw2"])
                                                           for r in rounds])]


def summary(report: dict) -> list[str]:
    env = report["environment"]
    lines = [f"bench/minimal_vs_cell.py on {env['gpu']}, torch {env['torch']}, {env['date']}",
             f"command: {env['command']}", "",
             "tokens/s (mean of the rounds' windows), MFU against 989 TFLOP/s bf16 dense (the model's own "
             "FLOPs), cell/minimal per round and its mean",
             f"{'size':<6} {'minimal':>10} {'cell':>10} {'MFU min':>8} {'MFU cell':>8} {'cell/minimal':>13}"
             "  rounds"]
    for item in report["sizes"]:
        mins = [w for w in item["windows"] if w["loop"] == "minimal" and w["tag"].startswith("round")]
        cells = [w for w in item["windows"] if w["loop"] == "cell" and w["tag"].startswith("round")]
        ratios = [r["ratio"] for r in item["rounds"]]
        minimal = mean([w["tokens_per_s"] for w in mins])
        cell = mean([w["tokens_per_s"] for w in cells])
        lines.append(f"{item['size']:<6} {minimal:>10,.0f} {cell:>10,.0f} "
                     f"{mean([w['mfu'] for w in mins]):>8.1%} "
                     f"{mean([w['mfu'] for w in cells]):>8.1%} {mean(ratios):>13.3f}  "
                     + ", ".join(f"{r:.3f}" for r in ratios))
        p = item.get("pipeline_cell")
        if p and "error" not in p:
            lines.append(f"       pipeline cell (trainbench run-cell, mid-rounds): "
                         f"{p['tokens_per_s_per_gpu']:,.0f} tokens/s, MFU {p['mfu']:.1%}, "
                         f"/ minimal {p['tokens_per_s_per_gpu'] / minimal:.3f}")
        elif p:
            lines.append(f"       pipeline cell failed: {p['error'][:150]}")
        for v in item["variants"]:
            lines.append(f"       {v['variant']:<22} {v['tokens_per_s']:>10,.0f} tokens/s, "
                         f"/ minimal window beside it {v['ratio']:.3f}")
        lines += rounds_by_loop(item)
        lines += draws_lines(item)
    for item in report["sizes"]:
        profiles = item["profiles"]
        if not profiles:
            continue
        names = list(profiles)
        lines += ["", f"{item['size']}: GPU time per optimizer step by kernel class, ms (torch.profiler, "
                      f"{profiles[names[0]]['steps']} steps each)",
                  f"  {'class':<18}" + "".join(f"{n[:21]:>22}" for n in names)]
        classes = sorted({c for p in profiles.values() for c in p["classes_ms"]},
                         key=lambda c: -profiles[names[0]]["classes_ms"].get(c, 0))
        for c in classes:
            lines.append(f"  {c:<18}" + "".join(f"{profiles[n]['classes_ms'].get(c, 0):>22.2f}"
                                                for n in names))
        for key, label in (("busy_ms_per_step", "busy (union)"), ("span_ms_per_step", "span"),
                           ("kernels_per_step", "kernels/step")):
            lines.append(f"  {label:<18}" + "".join(f"{profiles[n][key]:>22.2f}" for n in names))
        lines.append(f"  {'idle share':<18}"
                     + "".join(f"{profiles[n]['gpu_idle_share']:>22.1%}" for n in names))
        a = profiles["minimal"]["kernels_ms"]
        for other in (n for n in names if n != "minimal"):
            b = profiles[other]["kernels_ms"]
            diffs = sorted(set(a) | set(b),
                           key=lambda k: -abs(b.get(k, {}).get("ms", 0) - a.get(k, {}).get("ms", 0)))
            lines += [f"  kernels differing most ({other} - minimal, ms per step; calls per step):"]
            for k in diffs[:14]:
                ma, mb = a.get(k, {}).get("ms", 0), b.get(k, {}).get("ms", 0)
                ca, cb = a.get(k, {}).get("calls", 0), b.get(k, {}).get("calls", 0)
                lines.append(f"    {mb - ma:+7.2f}  {ma:7.2f} -> {mb:7.2f}  ({ca:g} -> {cb:g})  "
                             f"{classify(k):<16} {k[:80]}")
        lines += ["  top kernels of the cell (ms per step):"]
        for k, v in list(profiles["cell"]["kernels_ms"].items())[:12]:
            lines.append(f"    {v['ms']:7.2f}  {v['class']:<16} {k[:100]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["124m", "350m"], choices=sorted(CELLS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per timed window")
    parser.add_argument("--pipeline-cell", action="store_true")
    parser.add_argument("--variants", nargs="*", default=[],
                        choices=["nobias", "tf32", "cellfix", "pool", "draws"])
    parser.add_argument("--round-loops", nargs="*", default=[],
                        help="variants (by name) timed in every round beside the minimal loop and the cell")
    parser.add_argument("--fix-builder", nargs="*",
                        help="module:function, each returning a step from the cell's params (a candidate "
                             "fix; the function names the variant)")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--profile-also", nargs="*", default=[], help="variants profiled too (by name)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--render", type=Path, help="print the summary of a saved minimal_vs_cell.json")
    args = parser.parse_args()
    if args.render:
        print("\n".join(summary(json.loads(args.render.read_text()))))
        return 0
    if args.out is None:
        parser.error("--out is required")

    import torch

    from trainbench.execute.launch import cache_environment

    os.environ.update(cache_environment(os.environ))  # the cells' compile cache: run-cell finds it warm
    torch._dynamo.config.automatic_dynamic_shapes = False
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"environment": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                              "python": platform.python_version(), "command": " ".join(sys.argv),
                              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                              "git_commit": os.environ.get("TRAINBENCH_GIT_COMMIT")},
              "sizes": []}
    with open(args.out / "pipeline-cells.log", "a") as log:
        for size in args.sizes:
            report["sizes"].append(compare_size(size, args, log))
            (args.out / "minimal_vs_cell.json").write_text(json.dumps(report, indent=1))
            lines = summary(report)
            (args.out / "minimal_vs_cell.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
