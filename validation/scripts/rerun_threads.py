"""Cells run again with other CPU threads a rank than their first run: how far their steps moved, what
the time model's thread ratio said they would, and what the rerun planner made of their first runs.

    python bench/rerun_threads.py --first REV|FOLDER FOLDER ...

Every result under the folders (a rerun's results trees) whose ranks had other CPU threads than the
same cell's first run is set against it. The first runs are the results at git revision REV
(results/runs/<study>/<cell>/metrics.json there), or under FOLDER (a results/runs tree); threads are
as time_model.threads_of_run reads them.
  - the step, rerun / first, and the first run's step as a guess of the rerun's ((first - rerun) / rerun);
  - the time model's ratio of its predictions at the two thread counts, against the measured ratio;
  - results/provenance/gpu-runs/plan_reruns.py's estimate of the rerun's wall time from the first run, with and
    without that ratio, against the wall time the rerun took.
Grouped by whether the optimizer was offloaded and by GPUs a cell.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from trainbench.execute.results import read_result
from trainbench.predict import time_model
from trainbench.registry.hardware import gpu_type_of
from trainbench.study.params import CellParams
from trainbench.workflow import load_checked

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "gpu-runs"))
import plan_reruns  # noqa: E402  (a script's module, beside its command line)


def first_run(first: str, study: str, cell_id: str) -> dict | None:
    """The cell's result under the folder `first`, or as committed at revision `first`, read as
    read_result reads any result."""
    if Path(first).is_dir():
        path = Path(first) / study / cell_id / "metrics.json"
        return read_result(path) if path.exists() else None
    rev = first
    shown = subprocess.run(["git", "show", f"{rev}:results/runs/{study}/{cell_id}/metrics.json"],
                           cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "metrics.json"
        path.write_text(shown.stdout)
        return read_result(path)


def step_of(doc: dict) -> float:
    step = doc["metrics"]["step_time_s"]
    return step["value"] if isinstance(step, dict) else step


def rows(first_runs: str, folders: list[Path], config) -> list[dict]:
    found = []
    for path in sorted(p for folder in folders for p in folder.glob("**/metrics.json")):
        rerun = read_result(path)
        if rerun["status"] != "ok" or rerun["params"].get("emulate"):
            continue
        first = first_run(first_runs, rerun["study"], rerun["cell_id"])
        if first is None or first["status"] != "ok":
            continue
        then, now = time_model.threads_of_run(first), time_model.threads_of_run(rerun)
        if then == now:
            continue
        params = CellParams.from_dict(rerun["params"])
        gpu = gpu_type_of(rerun["provenance"].get("gpu_name"))
        cell = next(c for c in config.study(rerun["study"]).cells if c.cell_id == rerun["cell_id"])
        found.append({
            "cell": f"{rerun['study']}/{rerun['cell_id']}", "gpus": params.gpus,
            "offloaded": bool(params.offload_optimizer or params.offload_param), "threads": (then, now),
            "ratio": step_of(rerun) / step_of(first),
            "model_ratio": time_model.thread_ratio(params, gpu, then, now),
            "wall_s": rerun["metrics"]["wall_time_s"],
            "planned_s": plan_reruns.estimate(cell, first).seconds,
            "planned_unscaled_s": plan_reruns.estimate(cell, first, scale_threads=False).seconds})
    return found


def summary(label: str, group: list[dict]) -> str:
    guess = [abs(1 / r["ratio"] - 1) for r in group]
    ran = sum(r["wall_s"] for r in group)
    planned = sum(r["planned_s"] for r in group)
    unscaled = sum(r["planned_unscaled_s"] for r in group)
    per_cell = [r["planned_s"] / r["wall_s"] - 1 for r in group]
    ratios = [r["ratio"] for r in group]
    return (f"{label}: {len(group)} cells; rerun / first step median {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}); the first step as the guess off by median "
            f"{statistics.median(guess):.0%}, worst {max(guess):.0%}; ran {ran:.0f} s, planned "
            f"{unscaled:.0f} s ({unscaled / ran - 1:+.0%}) without the thread ratio, {planned:.0f} s "
            f"({planned / ran - 1:+.0%}; a cell {min(per_cell):+.0%} to {max(per_cell):+.0%}) with it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="the rerun's results trees")
    parser.add_argument("--first", required=True,
                        help="the git revision whose results/runs held the first runs, or a folder of them")
    parser.add_argument("--config", default=str(REPO / "config.yaml"))
    args = parser.parse_args(argv)
    found = rows(args.first, args.folders, load_checked(args.config))
    if not found:
        print(f"no result under {', '.join(map(str, args.folders))} ran at other threads than its first run "
              f"({args.first})", file=sys.stderr)
        return 1
    print(f"{'cell':72} threads  rerun/first  model  wall s  planned (unscaled)")
    for r in found:
        model = f"{r['model_ratio']:.2f}" if r["model_ratio"] is not None else "-"
        print(f"{short(r['cell']):72} {r['threads'][0]:>2} -> {r['threads'][1]:<2} {r['ratio']:8.2f}"
              f"  {model:>5}  {r['wall_s']:6.0f}  {r['planned_s']:5.0f} ({r['planned_unscaled_s']:.0f})")
    print()
    for offloaded in (True, False):
        for gpus in sorted({r["gpus"] for r in found}):
            group = [r for r in found if r["offloaded"] == offloaded and r["gpus"] == gpus]
            if group:
                print(summary(f"{'offloaded' if offloaded else 'not offloaded'}, {gpus} GPUs", group))
    offloaded = [r for r in found if r["offloaded"] and r["model_ratio"] is not None]
    if offloaded:
        print(f"offloaded: the model's thread ratio / the measured one, median "
              f"{statistics.median(r['model_ratio'] / r['ratio'] for r in offloaded):.2f} "
              f"({min(r['model_ratio'] / r['ratio'] for r in offloaded):.2f}-"
              f"{max(r['model_ratio'] / r['ratio'] for r in offloaded):.2f}; below 1: the model expects more "
              f"from the threads than they gave)")
    return 0


def short(cell: str) -> str:
    return cell if len(cell) <= 72 else cell[:71] + "…"


if __name__ == "__main__":
    raise SystemExit(main())
