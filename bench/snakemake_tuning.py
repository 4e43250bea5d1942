"""What trainbench.workflow.tune_snakemake saves: dry runs of one large study's table, tuned and untuned
(TRAINBENCH_UNTUNED=1, as on a Snakemake it was not checked against), alternated in one run.

    python bench/snakemake_tuning.py [--cells 10000] [--repeats 3] [--out DIR]

The study is a grid of CPU cells (two axes) with no results: every cell job is planned, each asking
for its params, grid stamp and resources through the workflow's input functions. Prints the wall time
of each dry run and the untuned/tuned ratio per pair (median [lowest, highest]).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def workflow_copy(work: Path, cells: int, per_cell: bool) -> None:
    """The workflow's files beside a config of one study of `cells` cells: seeds x learning rates (every
    cell asks for the same resources, which the workflow hands Snakemake as values), or with
    `per_cell` seeds x rank counts (cores and memory differ by cell: functions of the job's cell)."""
    for name in ("Snakefile", "workflow", "profiles", "envs"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, work / name)
    side = math.isqrt(cells)
    study = {"description": "planning benchmark",
             "settings": {"model": "gpt2-tiny", "device": "cpu", "strategy": "ddp", "seq_len": 16,
                          **({} if per_cell else {"gpus": 2})},
             "axes": ({"seed": list(range(cells // 2)), "gpus": [2, 4]} if per_cell else
                      {"seed": list(range(side)),
                       "lr": [round(1e-4 * (i + 1), 6) for i in range(cells // side)]}),
             "execution": {"runtime_min": 5, "cpus_per_rank": 1, "mem_mb_per_rank": 1000}}
    (work / "config.yaml").write_text(yaml.safe_dump({"studies": {"scale": study}}))


def dry_run(work: Path, untuned: bool) -> float:
    env = {**os.environ, "TRAINBENCH_UNTUNED": "1" if untuned else "0"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", "-n", "-q", "-c1", "results/tables/scale.md"],
                   cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-cell-resources", action="store_true",
                        help="cells that differ in their resources (seeds x rank counts)")
    parser.add_argument("--out", type=Path, help="write the summary to DIR/snakemake_tuning.txt too")
    args = parser.parse_args()
    import snakemake

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        workflow_copy(work, args.cells, args.per_cell_resources)
        dry_run(work, untuned=False)  # a first plan writes the grid stamp: not timed
        kind = ("resources differing by cell" if args.per_cell_resources
                else "resources shared by every cell")
        lines = [f"bench/snakemake_tuning.py: `snakemake -n -q` of a {args.cells:,}-cell study ({kind}); "
                 f"snakemake {snakemake.__version__}, python {sys.version.split()[0]}, "
                 f"{os.cpu_count()} cores",
                 f"command: python bench/snakemake_tuning.py --cells {args.cells} --repeats {args.repeats}"
                 + (" --per-cell-resources" if args.per_cell_resources else "")]
        ratios = []
        for repeat in range(args.repeats):
            # alternate which goes first: drift in a shared machine's speed falls on both alike
            order = (False, True) if repeat % 2 == 0 else (True, False)
            times = {untuned: dry_run(work, untuned) for untuned in order}
            ratios.append(times[True] / times[False])
            lines.append(f"  pair {repeat + 1}: tuned {times[False]:.2f} s, untuned {times[True]:.2f} s, "
                         f"untuned/tuned {ratios[-1]:.3f}")
        lines.append(f"untuned/tuned: {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "per_cell" if args.per_cell_resources else "shared"
        (args.out / f"snakemake_tuning_{name}.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
