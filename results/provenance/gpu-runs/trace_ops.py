"""What the host and the GPU did in one profiled step of each trace given (a cell's
profile/rank<r>.json.gz): the step's length under the profiler, the GPU's busy time, kernels launched,
and among them the fills torch makes of uninitialised memory under deterministic algorithms, with the
host time of their `aten::fill_` calls. The step is the second profiled one (the first can hold the
profiler's start-up).

    python3 results/provenance/gpu-runs/trace_ops.py TRACE...
"""

from __future__ import annotations

import argparse
import gzip
import json


def step_figures(path: str) -> dict:
    events = json.load(gzip.open(path))["traceEvents"]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e.get("name", "").startswith("ProfilerStep")), key=lambda e: e["ts"])
    step = steps[1] if len(steps) > 1 else steps[0]
    start, end = step["ts"], step["ts"] + step["dur"]
    inside = [e for e in events if e.get("ph") == "X" and start <= e["ts"] < end]
    kernels = [e for e in inside if e.get("cat") == "kernel"]
    fills = [e for e in kernels if "FillFunctor" in e["name"] or "FillFunc" in e["name"]]
    fill_calls = [e for e in inside if e.get("cat") == "cpu_op" and e["name"] == "aten::fill_"]
    busy = [e for e in inside if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return {"step_ms": step["dur"] / 1e3, "gpu_busy_ms": sum(e["dur"] for e in busy) / 1e3,
            "kernels": len(kernels), "fill_kernels": len(fills),
            "fill_gpu_ms": sum(e["dur"] for e in fills) / 1e3, "fill_calls": len(fill_calls),
            "fill_host_ms": sum(e["dur"] for e in fill_calls) / 1e3,
            "cpu_ops": sum(e.get("cat") == "cpu_op" for e in inside)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    print(f"{'step ms':>8} {'GPU busy':>8} {'kernels':>7} {'fills':>5} {'fill GPU ms':>11} "
          f"{'fill host ms':>12} {'cpu ops':>7}  trace")
    for path in args.traces:
        f = step_figures(path)
        print(f"{f['step_ms']:8.1f} {f['gpu_busy_ms']:8.1f} {f['kernels']:7d} {f['fill_kernels']:5d} "
              f"{f['fill_gpu_ms']:11.2f} {f['fill_host_ms']:12.2f} {f['cpu_ops']:7d}  {path}")


if __name__ == "__main__":
    main()
