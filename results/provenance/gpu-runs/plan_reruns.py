"""Cells to run again on a GPU host, packed into commands that each end within the device tool's limit,
from what each cell took last time: a command the limit stops loses the cells it was running.

    python3 tools/gpu-runs/plan_reruns.py 'megatron/*gpus~2__*' ... [--limit 545] [--commit SHA]
                                          [--also results/bench/rerun/megatron-fbc3ff2/runs ...]
                                          [--without-energy]

Each argument is a STUDY/CELL glob, as energy-rerun.sh takes them. A cell's time is estimated from
its latest result (results/runs, and the trees --also names, e.g. earlier reruns kept aside):
  - a result timed under the study's timing now (same time cap; since windows): its wall time;
  - otherwise its fixed costs (launch to the first step, teardown: the wall time less its steps)
    plus the warm-up's steps and the timed windows the study asks for now: at least `min_windows`
    windows of max(timed_steps / min_windows, min_window_s / step) steps, and up to `max_timed_s`
    where the interval stays wide. The upper end is planned for.
--without-energy chooses the published cells that trained and whose latest result has no energy yet
(issue 33's reruns): real GPU cells only, as emulated ranks and CPU ranks publish none.
Prints one energy-rerun.sh line per command (cells by exact name, longest first, within the device
tool's 2,000 characters) with its estimate. Checked against energy-rerun-16..18 (megatron's 4-GPU
cells, first run of 25 fixed steps -> windows of 15 s at most): docs/results.md.
"""

from __future__ import annotations

import argparse
import fnmatch
from dataclasses import dataclass
from pathlib import Path

from trainbench.execute.results import publishes_energy, read_result
from trainbench.predict import time_model
from trainbench.registry.hardware import gpu_type_of
from trainbench.study.timing import steps_per_window
from trainbench.workflow import load_checked

SNAKEMAKE_START_S = 15  # Snakemake's start and the wheelhouse check, before the first cell
COMMAND_CHARS = 2000  # the device tool's limit on a command line
COMMAND = ("TRAINBENCH_GIT_COMMIT={commit} LIMIT={limit} OUT=$OUT bash tools/gpu-runs/energy-rerun.sh "
           "{cells} 2>&1 | tee $OUT/energy-rerun-N.log")


@dataclass
class Estimate:
    key: str  # study/cell
    seconds: float
    basis: str  # what the estimate stands on


def latest_result(key: str, trees: list[Path]) -> dict | None:
    """The cell's newest metrics.json among the trees (by the time its run ended)."""
    docs = [read_result(p) for tree in trees if (p := tree / key / "metrics.json").exists()]
    docs = [d for d in docs if d.get("status") == "ok" and d.get("metrics", {}).get("wall_time_s")]
    return max(docs, key=lambda d: d["provenance"].get("ended") or "", default=None)


def step_now(cell, doc: dict, step: float) -> tuple[float, str]:
    """The last run's step at the CPU threads the cell's ranks get now, and a note where that differs:
    the step times the time model's ratio of its predictions at the two thread counts (a cell without
    a CPU optimizer predicts the same at both)."""
    then, now = time_model.threads_of_run(doc), int(cell.resources()["cpus_per_rank"])
    gpu = gpu_type_of((doc.get("provenance") or {}).get("gpu_name"))
    ratio = time_model.thread_ratio(cell.params, gpu, then, now) if then != now else None
    if ratio is None or abs(ratio - 1) < 0.01:
        return step, ""
    return step * ratio, f"; its step at {then} threads x {ratio:.2f}, the time model's ratio at {now}"


def estimate(cell, doc: dict | None, scale_threads: bool = True) -> Estimate:
    """The cell's wall time on its next run from its latest result (`scale_threads`: its step at the
    threads its ranks get now, where the result's had others)."""
    key = f"{cell.study}/{cell.cell_id}"
    timing = cell.timing
    if doc is None:
        return Estimate(key, timing.max_timed_s + 120, "no earlier result: the time cap and 2 minutes")
    metrics = doc["metrics"]
    wall, step = metrics["wall_time_s"], metrics["step_time_s"]
    windowed = metrics.get("windows") is not None and metrics.get("timing")
    if windowed and metrics["timing"].get("max_timed_s") == timing.max_timed_s:
        return Estimate(key, wall, "its last run, timed as now")
    warmup = cell.params.warmup_steps
    ran_steps = warmup + metrics["steps_timed"]  # steps_timed counts every timed step, in all windows
    fixed = max(0.0, wall - ran_steps * step)
    step, threads = step_now(cell, doc, step) if scale_threads else (step, "")
    per_window = steps_per_window(cell.params.timed_steps, timing.min_windows, step, timing.min_window_s)
    timed = max(timing.min_windows * per_window * step, timing.max_timed_s)
    return Estimate(key, fixed + warmup * step + timed,
                    f"fixed {fixed:.0f} s + {warmup} warm-up steps + the longer of {timing.min_windows} "
                    f"windows of {per_window} x {step:.2f} s and the {timing.max_timed_s:g} s cap{threads}")


def pack(estimates: list[Estimate], limit: float, command_chars: int = COMMAND_CHARS,
         prefix_chars: int = 0) -> list[list[Estimate]]:
    """First fit, longest first: each command's cells within `limit` seconds (a cell longer than the
    limit alone) and its line within the device tool's characters."""
    commands: list[list[Estimate]] = []
    for est in sorted(estimates, key=lambda e: -e.seconds):
        for command in commands:
            seconds = SNAKEMAKE_START_S + sum(e.seconds for e in command) + est.seconds
            chars = prefix_chars + sum(len(e.key) + 3 for e in command) + len(est.key) + 3
            if seconds <= limit and chars <= command_chars:
                command.append(est)
                break
        else:
            commands.append([est])
    return commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cells", nargs="+", help="STUDY/CELL globs")
    parser.add_argument("--limit", type=float, default=545, help="seconds a command may run (LIMIT)")
    parser.add_argument("--commit", default="$(git rev-parse --short HEAD)")
    parser.add_argument("--also", type=Path, action="append", default=[],
                        help="another results/runs tree whose results count as earlier runs")
    parser.add_argument("--without-energy", action="store_true",
                        help="only the real GPU cells that trained and whose latest result has no energy")
    parser.add_argument("--config", default="config.yaml")
    args = parser.parse_args()
    config = load_checked(args.config)
    trees = [Path("results/runs"), *args.also]
    chosen = []
    for pattern in args.cells:
        study = pattern.split("/", 1)[0]
        matched = [c for c in config.study(study).cells
                   if c.measured and fnmatch.fnmatchcase(f"{study}/{c.cell_id}", pattern)]
        if not matched:
            raise SystemExit(f"{pattern}: no measured cell of {study} matches")
        chosen += [c for c in matched if c not in chosen]
    latest = [(c, latest_result(f"{c.study}/{c.cell_id}", trees)) for c in chosen]
    if args.without_energy:
        latest = [(c, doc) for c, doc in latest
                  if c.unsupported is None and c.params.device == "cuda" and publishes_energy(c.params)
                  and doc is not None
                  and doc["metrics"].get("energy_j_per_step") is None]
    estimates = [estimate(c, doc) for c, doc in latest]
    if not estimates:  # an answer, not a failure: the reruns are done
        print("# nothing to run: every chosen cell's latest result has its energy")
        return
    prefix = len(COMMAND.format(commit=args.commit, limit=int(args.limit), cells=""))
    commands = pack(estimates, args.limit, prefix_chars=prefix)
    total = sum(e.seconds for e in estimates)
    print(f"# {len(estimates)} cells, about {total:.0f} s of cells, in {len(commands)} command(s) of "
          f"{args.limit:g} s at most")
    for n, command in enumerate(commands, 1):
        seconds = SNAKEMAKE_START_S + sum(e.seconds for e in command)
        print(f"\n# command {n}: {len(command)} cells, about {seconds:.0f} s")
        for e in command:
            print(f"#   {e.seconds:6.0f} s  {e.key}  ({e.basis})")
        print(COMMAND.format(commit=args.commit, limit=int(args.limit),
                             cells=" ".join(f"'{e.key}'" for e in command)))
    if too_long := sum(e.seconds > args.limit for e in estimates):
        print(f"\n# {too_long} cell(s) alone exceed the limit: they need a longer LIMIT (the device tool "
              "allows 600 s a command)")


if __name__ == "__main__":
    main()
