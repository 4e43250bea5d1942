"""Which kernels a profiled step spends its device time in: cells' traces set side by side.

    python bench/top_kernels.py TRACE [TRACE ...] [--top N] [--json FILE]

For each trace (a cell's profile/rank<r>.json.gz, written by `trainbench profile` or a study's
profile_steps), the GPU kernels of its profiled steps grouped by name: milliseconds per step, launches
per step and the class the breakdown gives them (execute/profiling.py's KERNEL_CLASSES), the N
longest first, then the device's time per class per step. Where two or more traces are given, a last
table sets each class's milliseconds per step side by side, so a slower cell names the kernels that
made it slower (float8's casts and scales, a collective, a copy) rather than only its step.
`--host N`: also the host's side, per thread that ran torch ops (the main one, autograd's backward
thread): the N ops it spent most time in, each op's own time outside the ops it calls, and its
kernel launches per step. Where the device idles, these name what the host was doing instead.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from trainbench.execute.profiling import COLLECTIVE, classify, profiled_steps, read_trace, self_spans

HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def profiled(path: Path) -> tuple[list[dict], list[dict]]:
    """A trace's complete events and its profiled steps' ranges (read once: a trace runs to 100 MB)."""
    events = [e for e in read_trace(path) if e.get("ph") == "X" and "dur" in e]
    try:
        return events, profiled_steps(events)
    except ValueError as error:
        raise SystemExit(f"{path}: {error}") from None


def kernel_table(events: list[dict], steps: list[dict]) -> dict:
    """Kernels by name: ms per profiled step and launches per step, with their class."""
    count = len(steps)
    total: collections.Counter = collections.Counter()
    launches: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        name = str(e.get("name", ""))
        total[name] += float(e["dur"])
        launches[name] += 1
    rows = [{"kernel": name, "class": kernel_class(name), "ms_per_step": us / count / 1e3,
             "launches_per_step": launches[name] / count} for name, us in total.most_common()]
    by_class: collections.Counter = collections.Counter()
    for row in rows:
        by_class[row["class"]] += row["ms_per_step"]
    step_ms = sum(float(e["dur"]) for e in steps) / count / 1e3
    return {"steps": count, "step_ms": step_ms, "kernels": rows, "ms_per_step_by_class": dict(by_class)}


def host_table(events: list[dict], steps: list[dict]) -> list[dict]:
    """The host threads that ran ops: each op's own time per profiled step, by name, and the kernels
    the thread launched per step; the busiest thread first."""
    count, main = len(steps), steps[0].get("tid")
    threads: dict = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_CATEGORIES:
            threads[e.get("tid")].append(e)
    out = []
    for tid, spans in threads.items():
        own: collections.Counter = collections.Counter()
        calls: collections.Counter = collections.Counter()
        for event, begins, ends in self_spans(spans):
            if not str(event["name"]).startswith("ProfilerStep#"):  # the step's own time is its waiting
                own[event["name"]] += ends - begins
        for event in spans:
            calls[event["name"]] += 1
        out.append({"thread": "main" if tid == main else str(tid),
                    "ms_per_step": sum(own.values()) / count / 1e3,
                    "launches_per_step": sum(calls[n] for n in LAUNCH) / count,
                    "ops": [{"op": n, "ms_per_step": us / count / 1e3, "calls_per_step": calls[n] / count}
                            for n, us in own.most_common()]})
    return sorted(out, key=lambda t: -t["ms_per_step"])


def kernel_class(name: str) -> str:
    return "collective" if COLLECTIVE.search(name) else classify(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15, help="kernels listed per trace (default 15)")
    parser.add_argument("--host", type=int, default=0, metavar="N",
                        help="also the host's N busiest ops per thread (default: none)")
    parser.add_argument("--json", type=Path, help="also write every kernel of every trace here")
    args = parser.parse_args(argv)
    tables = []
    for path in args.traces:
        events, steps = profiled(path)
        tables.append({"trace": str(path), **kernel_table(events, steps),
                       **({"host": host_table(events, steps)} if args.host else {})})
    for table in tables:
        busy = sum(table["ms_per_step_by_class"].values())
        print(f"{table['trace']}: {table['steps']} profiled steps, step {table['step_ms']:.1f} ms, "
              f"kernels {busy:.1f} ms per step")
        print(f"  {'ms/step':>8} {'launches':>8}  {'class':<17} kernel")
        for row in table["kernels"][:args.top]:
            print(f"  {row['ms_per_step']:8.2f} {row['launches_per_step']:8.0f}  {row['class']:<17} "
                  f"{row['kernel'][:110]}")
        for thread in table.get("host", [])[:2]:  # the two busiest (all of them in --json)
            print(f"  host thread {thread['thread']}: ops' own time {thread['ms_per_step']:.1f} ms per step, "
                  f"{thread['launches_per_step']:.0f} kernel launches per step")
            for op in thread["ops"][:args.host]:
                print(f"    {op['ms_per_step']:8.2f} ms {op['calls_per_step']:6.0f} calls  {op['op'][:100]}")
        print()
    if len(tables) > 1:
        classes = sorted({c for t in tables for c in t["ms_per_step_by_class"]},
                         key=lambda c: -max(t["ms_per_step_by_class"].get(c, 0.0) for t in tables))
        print("ms per step by class: " + " | ".join(f"[{i + 1}] {Path(t['trace']).parent.parent.name}"
                                                    for i, t in enumerate(tables)))
        print(f"  {'class':<17}" + "".join(f"{f'[{i + 1}]':>10}" for i in range(len(tables))))
        for c in classes + ["(step)"]:
            values = [t["step_ms"] if c == "(step)" else t["ms_per_step_by_class"].get(c, 0.0)
                      for t in tables]
            print(f"  {c:<17}" + "".join(f"{v:10.1f}" for v in values))
    if args.json:
        args.json.write_text(json.dumps(tables, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
