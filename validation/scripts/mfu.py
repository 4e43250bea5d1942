"""How far MFU goes on one GPU: where a baseline cell's step time goes, and what the usual tunings buy.

    python3 bench/mfu.py [--steps 20] [--out results/bench/mfu] [--only NAME ...]      (on a GPU host)

First a profile of the baseline cell's configuration (bench/bare_loop.py: trainbench's GPT, fused
AdamW, bf16 autocast, torch.compile): two optimizer steps under torch.profiler, every GPU kernel
put in one of a few classes (matrix multiplies, attention, the compiler's fused kernels, the
optimizer, ...), with the share of the step each takes and the time the GPU sat idle.

Then variants, each the same bare loop with one change or a combination: the attention kernel (the
cell parameter `attention`), the vocabulary padded to a multiple of 64 (`vocab_multiple: 64`,
nanoGPT's 50304: the LM head's matmul tiles evenly), a larger micro batch at the same global batch,
and the compiler's autotuning. Each variant runs in a fresh process (its own compilation, nothing carried
over), one after another; a variant that fails or runs past --variant-timeout is reported as such. MFU counts
the model's own FLOPs (the unpadded vocabulary: padding is waste, not model FLOPs), against the
GPU's dense bf16 peak (src/trainbench/execute/metrics.py). One window of --steps steps per variant,
synchronised at its two ends: differences under about 1% are within run-to-run noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from trainbench.execute.profiling import classify, union_length  # noqa: E402  (kernel classes: one list, the cells' too)
CELLS = {"124m": "strategy~single__model~gpt2-124m__gpus~1__micro_batch~32",
         "350m": "strategy~single__model~gpt2-350m__gpus~1__micro_batch~16"}
MAX_AUTOTUNE = {"mode": "max-autotune-no-cudagraphs"}
COORDINATE_DESCENT = {"coordinate_descent_tuning": True}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    cell: str  # a key of CELLS
    params: dict = dataclasses.field(default_factory=dict)  # changes to the cell's parameters
    compile_options: dict = dataclasses.field(default_factory=dict)  # torch.compile(..., **these)
    inductor: dict = dataclasses.field(default_factory=dict)  # torch._inductor.config settings


PADDED = {"vocab_multiple": 64}
VARIANTS = [
    Variant("124m", "124m", {"vocab_multiple": 1}),
    Variant("124m attention=flash", "124m", {"vocab_multiple": 1, "attention": "flash"}),
    Variant("124m attention=cudnn", "124m", {"vocab_multiple": 1, "attention": "cudnn"}),
    Variant("124m vocab 50304", "124m", PADDED),
    Variant("124m micro batch 64 x 2", "124m", {"vocab_multiple": 1, "micro_batch": 64, "grad_accum": 2}),
    Variant("124m coordinate-descent tuning", "124m", {"vocab_multiple": 1}, inductor=COORDINATE_DESCENT),
    Variant("124m vocab + micro batch 64 x 2", "124m", {**PADDED, "micro_batch": 64, "grad_accum": 2}),
    Variant("350m", "350m", {"vocab_multiple": 1}),
    Variant("350m vocab 50304", "350m", PADDED),
    Variant("350m vocab + micro batch 32 x 2", "350m", {**PADDED, "micro_batch": 32, "grad_accum": 2}),
    Variant("124m vocab + max-autotune (no CUDA graphs)", "124m", PADDED, compile_options=MAX_AUTOTUNE),
    Variant("350m vocab + max-autotune (no CUDA graphs)", "350m", PADDED, compile_options=MAX_AUTOTUNE),
]

def cell_params(variant: Variant):
    from trainbench.study.config import load_config

    study = load_config(REPO / "config.yaml").study("baseline")
    return study.cell(CELLS[variant.cell]).params.replace(**variant.params)


def build(variant: Variant):
    import torch

    from bare_loop import build_step

    for key, value in variant.inductor.items():
        setattr(torch._inductor.config, key, value)
    params = cell_params(variant)
    return params, build_step(params, compile_options=variant.compile_options)


def measure(variant: Variant, steps: int) -> dict:
    """One variant, in this process: warm-up (compilation), then one window of `steps` steps."""
    import torch

    from trainbench.execute.metrics import peak_flops
    from trainbench.registry.models import get_model

    started = time.perf_counter()
    params, step = build(variant)
    for _ in range(params.warmup_steps):
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - started
    began = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - began) / steps
    tokens = params.micro_batch * params.grad_accum * params.seq_len / seconds
    flops = tokens * get_model(params.model).train_flops_per_token(params.seq_len)  # the model's own
    peak = peak_flops(torch.cuda.get_device_name(0), params.precision, params.tf32)
    return {"variant": variant.name, "micro_batch": params.micro_batch, "grad_accum": params.grad_accum,
            "step_time_s": seconds, "tokens_per_s": tokens, "tflops": flops / 1e12, "mfu": flops / peak,
            "build_and_warmup_s": warm, "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}


def profile(variant: Variant) -> dict:
    """Two optimizer steps under torch.profiler: GPU time by kernel class, and the GPU's idle time."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    params, step = build(variant)
    for _ in range(params.warmup_steps):
        step()
    torch.cuda.synchronize()
    steps = 2
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    begin = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    # the union of kernel intervals: when the GPU was doing anything
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in kernels], begin, end)
    by_class: dict[str, float] = {}
    by_kernel: dict[str, float] = {}
    for e in kernels:
        by_class[classify(e["name"])] = by_class.get(classify(e["name"]), 0.0) + e["dur"]
        by_kernel[e["name"]] = by_kernel.get(e["name"], 0.0) + e["dur"]
    span = end - begin
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]
    return {"variant": variant.name, "steps": steps, "span_ms_per_step": span / 1e3 / steps,
            "gpu_idle_share": 1 - busy / span,
            "classes": {k: v / span for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": name[:120], "class": classify(name), "share": t / span}
                            for name, t in top]}


def run_variant(variant: Variant, steps: int, timeout_s: float, mode: str) -> dict:
    """A variant in a fresh process: its own compilation, no state left from the one before."""
    command = [sys.executable, __file__, f"--{mode}", json.dumps(dataclasses.asdict(variant)),
               "--steps", str(steps)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"variant": variant.name, "error": f"ran past {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"variant": variant.name, "error": f"exit {done.returncode}: {tail[0][:200]}"}
    return json.loads(lines[-1])


def row_text(row: dict) -> str:
    if "error" in row:
        return f"{row['variant']:<44} failed: {row['error']}"
    return (f"{row['variant']:<44} {row['micro_batch']:>3} x {row['grad_accum']}  "
            f"{row['step_time_s'] * 1e3:7.1f} ms"
            f"  {row['tokens_per_s']:>9,.0f} tok/s  {row['tflops']:6.1f} TFLOPS  MFU {row['mfu']:6.1%}"
            f"  ({row['build_and_warmup_s']:.0f} s to warm, {row['peak_allocated_gib']:.1f} GiB)")


def profile_text(result: dict) -> list[str]:
    if "error" in result:
        return [f"profile of {result['variant']} failed: {result['error']}"]
    lines = [f"profile of {result['variant']}: {result['span_ms_per_step']:.1f} ms per step on the GPU's "
             f"timeline, idle {result['gpu_idle_share']:.1%} of it",
             "  " + ", ".join(f"{name} {share:.1%}" for name, share in result["classes"].items()),
             "  largest kernels:"]
    lines += [f"    {k['share']:6.1%}  {k['class']:<17} {k['name'][:90]}" for k in result["top_kernels"]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "mfu")
    parser.add_argument("--only", nargs="*", help="variants to run (names as listed; default: all)")
    parser.add_argument("--variant-timeout", type=float, default=240)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one variant, in this process
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure or args.profile:
        variant = Variant(**json.loads(args.measure or args.profile))
        print(json.dumps(measure(variant, args.steps) if args.measure else profile(variant)), flush=True)
        return 0

    import torch

    variants = [v for v in VARIANTS if not args.only or v.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    header = (f"bench/mfu.py on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
              f"{args.steps} timed steps per variant")
    print(header, flush=True)
    report = {"header": header, "command": " ".join(sys.argv), "profile": None, "variants": []}
    lines = [header, ""]
    if not args.no_profile:
        report["profile"] = run_variant(VARIANTS[0], args.steps, args.variant_timeout, "profile")
        lines += profile_text(report["profile"]) + [""]
        print("\n".join(profile_text(report["profile"])), flush=True)
    for variant in variants:
        row = run_variant(variant, args.steps, args.variant_timeout, "measure")
        report["variants"].append(row)
        lines.append(row_text(row))
        print(row_text(row), flush=True)
        (args.out / "mfu.json").write_text(json.dumps(report, indent=1))
    (args.out / "mfu.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
