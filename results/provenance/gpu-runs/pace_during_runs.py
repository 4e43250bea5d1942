"""Each run's step time beside the host's pace while its timed windows ran (pace-during-runs.sh's
samples: "<unix time> <ms>" lines) and beside its start-of-cell provenance.host_pace_ms, with the
rank correlation of step time with each over the runs.

    python3 results/provenance/gpu-runs/pace_during_runs.py SAMPLES METRICS...
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime


def timed_span(doc: dict) -> tuple[float, float]:
    """The unix times the run's timed windows began and ended: its end less teardown and profiled steps."""
    phases = doc["metrics"]["phases_s"]
    end = datetime.fromisoformat(doc["provenance"]["ended"]).timestamp()
    end -= phases.get("teardown", 0.0) + phases.get("profiled", 0.0)
    return end - phases["timed"], end


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    for rank, i in enumerate(order):
        out[i] = float(rank)
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples")
    parser.add_argument("metrics", nargs="+")
    args = parser.parse_args()
    samples = [tuple(map(float, line.split())) for line in open(args.samples) if line.strip()]
    rows = []
    for path in args.metrics:
        doc = json.load(open(path))
        start, end = timed_span(doc)
        during = [ms for t, ms in samples if start <= t <= end]
        if not during:
            continue
        rows.append((doc["metrics"]["step_time_s"] * 1e3, statistics.median(during),
                     sum(ms > 4.0 for ms in during) / len(during), len(during),
                     doc["provenance"].get("host_pace_ms"), path))
    print(f"{'step ms':>8} {'pace during (median ms)':>24} {'share over 4 ms':>15} {'samples':>7} "
          f"{'pace at start':>13}  run")
    for step, median, slow, n, start_pace, path in sorted(rows):
        print(f"{step:8.1f} {median:24.2f} {slow:15.2f} {n:7d} {start_pace or float('nan'):13.2f}  {path}")
    if len(rows) >= 3:
        steps = [r[0] for r in rows]
        print(f"rank correlation of step time with the pace during the timed windows: "
              f"{spearman(steps, [r[1] for r in rows]):+.2f}, with its share over 4 ms: "
              f"{spearman(steps, [r[2] for r in rows]):+.2f}, with the pace at the cell's start: "
              f"{spearman(steps, [r[4] or 0.0 for r in rows]):+.2f} ({len(rows)} runs)")


if __name__ == "__main__":
    main()
