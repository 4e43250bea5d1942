"""How fast `trainbench advise` searches: set-ups judged per second on one core, for registry models.

    python3 bench/advise.py [--repeats 5] [--core 0] [--host TEXT] [--out DIR] [--profile]

Each search (LLaMA-7B on nodes of 8 H100, 1 and 4 of them, micro batches 1-64; GPT-5.8B on 128 such
nodes, micro batches 1-256: over 10,000 set-ups) runs pinned to one core (sched_setaffinity), repeated:
each repeat's set-ups over its CPU time (process_time: on a machine others share, steadier than the wall
clock) and over its wall time, as the median and the range of the repeats. The goal: a search of 10,000
set-ups in under a minute on one core. Each is timed again with every framework lookup reading the
environment (frameworks.settled_plugins off), as the registry does outside a search: what that saves.
--profile adds the functions that took the most time in one search of the largest (cProfile).

Writes DIR/advise.json (every time measured) and DIR/advise.txt (what it prints, headed by the command,
the machine and the versions).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from trainbench.predict import advise  # noqa: E402
from trainbench.registry import frameworks  # noqa: E402
from trainbench.registry.hardware import gpu_type  # noqa: E402

SEARCHES = (("llama-7b", 1, 64), ("llama-7b", 4, 64), ("gpt-5.8b", 128, 256))
GOAL_SETUPS, GOAL_S = 10_000, 60.0


def request(model: str, nodes: int, largest_batch: int) -> advise.Request:
    return advise.Request(model, advise.Cluster(gpu_type("h100"), 8, nodes, 1024),
                          micro_batches=advise.powers_of_two(1, largest_batch))


def timed(search: advise.Request, repeats: int, settled: bool) -> dict:
    """Set-ups a second over the repeats' CPU and wall times, with or without settled plugins."""
    original = frameworks.settled_plugins
    if not settled:
        frameworks.settled_plugins = contextlib.nullcontext
    try:
        cpu, wall = [], []
        for _ in range(repeats):
            started, clock = time.process_time(), time.perf_counter()
            found = advise.advise(search)
            cpu.append(time.process_time() - started)
            wall.append(time.perf_counter() - clock)
    finally:
        frameworks.settled_plugins = original
    setups = found.counts["considered"]
    return {"setups": setups, "fit": found.counts[advise.FITS], "cpu_s": cpu, "wall_s": wall,
            "per_cpu_s": summary([setups / s for s in cpu]),
            "per_wall_s": summary([setups / s for s in wall])}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def profile(search: advise.Request, top: int = 12) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(advise.advise, search)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue().replace(f"{REPO}/", "")  # the package's files as the repository names them


def machine(name: str) -> str:
    """The host as `name` calls it, and what it is."""
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    load = os.getloadavg()[0]
    return (f"{name} ({os.cpu_count()} cores, {cpu}), {platform.system()} {platform.release()}, load "
            f"average {load:.1f} at the start; python {platform.python_version()}")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def rate(figures: dict) -> str:
    s = figures
    return f"{s['median']:>9,.0f} [{s['low']:,.0f}, {s['high']:,.0f}]"


def report(results: list[dict], host: str) -> list[str]:
    lines = [f"command: {' '.join(map(shlex.quote, ['python3', 'bench/advise.py', *sys.argv[1:]]))}",
             f"{host}; commit {commit()}", "",
             "set-ups judged a second (median [lowest, highest] of the repeats), by CPU time and by wall "
             "time, and with every framework lookup reading the environment again (settled_plugins off)",
             f"{'search':<40} {'set-ups':>8} {'fit':>6} {'per CPU s':>30} {'per wall s':>30} "
             f"{'per CPU s, unsettled':>30}"]
    for r in results:
        lines.append(f"{r['search']:<40} {r['settled']['setups']:>8,} {r['settled']['fit']:>6,} "
                     f"{rate(r['settled']['per_cpu_s']):>30} {rate(r['settled']['per_wall_s']):>30} "
                     f"{rate(r['unsettled']['per_cpu_s']):>30}")
    largest = max(results, key=lambda r: r["settled"]["setups"])["settled"]
    worst = max(largest["wall_s"])
    lines += ["", f"goal: {GOAL_SETUPS:,} set-ups in under {GOAL_S:.0f} s on one core; the largest search, "
                  f"{largest['setups']:,} set-ups, took {worst:.1f} s at most (wall)"]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--core", type=int, default=0, help="the core to pin the process to")
    parser.add_argument("--host", default="one core of this machine", help="what to call the host")
    parser.add_argument("--out", type=Path, default=REPO / "results/bench/advise")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--searches", nargs="+", metavar="MODEL:NODES:LARGEST_MICRO_BATCH",
                        help="searches other than the default ones (e.g. gpt2-tiny:1:4)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})
    host = machine(args.host)
    searches = ([(m, int(n), int(b)) for m, n, b in (s.split(":") for s in args.searches)] if args.searches
                else SEARCHES)
    results = []
    for model, nodes, largest in searches:
        search = request(model, nodes, largest)
        advise.advise(search)  # warm: imports, the interconnect's tables, a model's facts
        results.append({"search": f"{model} on {nodes} x 8 h100, micro batch 1-{largest}",
                        "settled": timed(search, args.repeats, True),
                        "unsettled": timed(search, args.repeats, False)})
    lines = report(results, host)
    if args.profile:
        model, nodes, largest = max(searches, key=lambda s: len(advise.candidates(request(*s))))
        lines += ["", f"profile of one search of {model} on {nodes} x 8 h100 (cProfile: it slows each call)",
                  profile(request(model, nodes, largest))]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "advise.json").write_text(json.dumps({"host": host, "commit": commit(), "results": results},
                                                     indent=1))
    (args.out / "advise.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
