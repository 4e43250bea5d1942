"""What bounds the baseline cells' MFU: arithmetic on a profile already taken, no GPU needed.

    python bench/mfu_bound.py results/provenance/gpu-runs/minimal-loop-3-124m.json results/provenance/gpu-runs/minimal-loop-2.json \
        [--goal 124m=0.50 350m=0.53]

Reads the per-class GPU time of the baseline cell's profiled steps, as bench/minimal_vs_cell.py
writes it (`sizes[].profiles.cell.classes_ms`: matrix multiplies, attention, the compiler's fused
kernels, the loss, ...), and sets the model's FLOPs against it:

- the rate each of the two classes that do the model's FLOPs reaches: the matmuls (6N per token,
  N counting the tied LM head) and attention (12 L H Q T per token, PaLM's count: a causal kernel
  does about half of it, so its rate here is what the MFU formula credits);
- the step's MFU (profiled: the profiler adds a little to every step), and the MFU the step would
  have with every other class of kernels and the idle time gone: the ceiling that the matmul and
  attention kernels' own efficiency sets;
- for a goal, how many ms of the rest a step would have to lose to reach it, at today's matmul and
  attention kernels, and which classes hold that many.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainbench.registry.models import get_model

FLOP_CLASSES = ("matmul", "attention")


def bound(size: dict, goal: float | None) -> list[str]:
    profile = size["profiles"]["cell"]
    params = size["params"]
    spec = get_model(params["model"])
    seq = params["seq_len"]
    tokens = params["micro_batch"] * params["grad_accum"] * seq
    peak = size["peak_flops"]
    flops = spec.train_flops_per_token(seq)  # the MFU numerator of every cell
    attention_flops = 12 * spec.n_layer * spec.d_model * seq
    matmul_flops = flops - attention_flops
    classes = profile["classes_ms"]
    span = profile["span_ms_per_step"]  # the GPU's timeline per step, idle included
    idle = span * profile["gpu_idle_share"]
    rest = {name: ms for name, ms in classes.items() if name not in FLOP_CLASSES}
    rest["idle (GPU waiting)"] = idle

    def mfu(ms: float) -> float:
        return flops * tokens / (ms / 1e3) / peak

    lines = [f"{size['size']}: {params['model']}, "
             f"micro batch {params['micro_batch']} x {params['grad_accum']}, sequence {seq}, "
             f"vocabulary padded to a multiple of {params.get('vocab_multiple', 1)}; "
             f"{span:.1f} ms per profiled step",
             f"  MFU of the profiled step {mfu(span):.1%} (against {peak / 1e12:,.0f} TFLOPS)"]
    for name, share_flops in (("matmul", matmul_flops), ("attention", attention_flops)):
        rate = share_flops * tokens / (classes[name] / 1e3)
        lines.append(f"  {name:<10} {classes[name]:7.1f} ms  {share_flops / flops:5.1%} of the FLOPs at "
                     f"{rate / 1e12:5.0f} TFLOPS ({rate / peak:.0%} of peak)")
    flop_ms = sum(classes[name] for name in FLOP_CLASSES)
    lines.append(f"  the rest {span - flop_ms:7.1f} ms ({(span - flop_ms) / span:.0%} of the step):")
    for name, ms in sorted(rest.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {name:<22} {ms:6.1f} ms  {ms / span:5.1%}")
    lines.append(f"  ceiling: MFU {mfu(flop_ms):.1%} with nothing but the matmul and attention kernels")
    if goal is not None:
        allowed = flops * tokens / (goal * peak) * 1e3  # ms per step at the goal
        cut = span - allowed
        share = cut / (span - flop_ms)
        lines.append(f"  goal {goal:.0%}: a step of {allowed:.1f} ms, {cut:.1f} ms ({share:.0%} of the rest) "
                     "to lose at today's matmul and attention kernels" if cut > 0 else
                     f"  goal {goal:.0%}: reached")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="bench/minimal_vs_cell.py JSON outputs")
    parser.add_argument("--goal", nargs="*", default=["124m=0.50", "350m=0.53"],
                        help="SIZE=MFU goals (issue 34's by default)")
    args = parser.parse_args(argv)
    goals = {k: float(v) for k, v in (g.split("=") for g in args.goal)}
    found = 0
    for report in args.reports:
        data = json.loads(report.read_text())
        env = data["environment"]
        for size in data["sizes"]:
            if "cell" not in size.get("profiles", {}):
                continue
            found += 1
            print(f"{report}: {env['gpu']}, torch {env['torch']}, {env['date']}")
            print("\n".join(bound(size, goals.get(size["size"]))))
    if not found:
        print("no profile of a cell in these reports (bench/minimal_vs_cell.py --profile-steps N)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
