"""What each profiled multi-GPU cell's step sends, timed on the measured interconnect, against the time its
profile spent in collectives.

    python bench/communication.py [--table results/comm/h200-x2.json] [RUNS ...]

For every real (not emulated) cell of several GPUs with a profile (timing's profile_steps) that ran on
the table's GPU type with the table's number of ranks: the collectives trainbench.predict.communication
derives from its strategy, their time alone on the link by the table, and the profile's figures per
step: the time its ranks spent in collective kernels (communication_s, which counts a collective from
its launch, waiting for the other rank included) and what of it no compute overlapped. The ratio says
how far the kernels' time is from what the bytes cost on the link alone. Beside the exposed time, the
time model's communication part for the cell (its overlap model: the collectives timed on the measured
links, less what the strategy's compute budget hides), to hold that model against the profiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from trainbench.predict import time_model
from trainbench.predict.communication import BandwidthTable, step_collectives
from trainbench.registry.hardware import gpu_type, gpu_type_named_in
from trainbench.study.params import CellParams
from trainbench.training.user_models import register_from_params

RUNS = ("results/runs", "validation/results/runs")


def profiled_cells(roots: list[str], gpu: str, ranks: int) -> list[tuple[dict, Path]]:
    """metrics.json documents of profiled real cells of `ranks` GPUs on GPU type `gpu`, each with the
    folder its workspace keeps its models' facts in."""
    found = []
    for root in roots:
        for path in sorted(Path(root).glob("*/*/metrics.json")):
            doc = json.loads(path.read_text())
            params, breakdown = doc["params"], (doc.get("metrics") or {}).get("breakdown")
            named = gpu_type_named_in(doc["provenance"].get("gpu_name") or "")
            if (doc["status"] == "ok" and breakdown and not params.get("emulate") and params["gpus"] == ranks
                    and named is not None and named.key == gpu):
                found.append((doc, Path(root).parent / "models"))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", default="results/comm/h200-x2.json")
    p.add_argument("runs", nargs="*", default=list(RUNS))
    args = p.parse_args(argv)
    table = BandwidthTable.read(Path(args.table))
    gpu = table.name.rsplit("-x", 1)[0]
    print(f"command: python bench/communication.py --table {args.table} {' '.join(args.runs)}")
    print(f"table: {table.name} ({table.ranks} ranks)\n")
    # the cell's id last and whole: ids differ at their ends (a bucket size, an offload)
    header = (f"{'study':<24} {'link ms':>8} {'profiled ms':>12} {'exposed ms':>11} {'ratio':>6} "
              f"{'modelled ms':>12}  cell")
    print(header)
    constants, _ = time_model.constants_for(gpu_type(gpu))
    ratios: dict[str, list[float]] = {}
    misses: list[float] = []
    skipped = 0
    for doc, facts_dir in profiled_cells(args.runs, gpu, table.ranks):
        params = CellParams.from_dict(doc["params"])
        if params.model_definition:  # a model of a config's `models`: counted where its results are
            register_from_params(params.model, params.model_definition, facts_dir)
        collectives = step_collectives(params)
        link = table.step_seconds(collectives)
        if link is None or not link:
            skipped += 1
            continue
        breakdown = doc["metrics"]["breakdown"]
        measured, exposed = breakdown["communication_s"], breakdown["parts_s"]["exposed_communication"]
        ratio = measured / link
        strategy = f"{doc['params']['framework']} {doc['params']['strategy']}"
        ratios.setdefault(strategy, []).append(ratio)
        threads = time_model.threads_of_run(doc)
        work = time_model.work(params, gpu_type(gpu), threads)
        modelled = time_model.parts(work, constants)["communication"]
        misses.append(abs(modelled - exposed))
        print(f"{doc['study']:<24} {link * 1e3:>8.1f} {measured * 1e3:>12.1f} {exposed * 1e3:>11.1f} "
              f"{ratio:>6.2f} {float(modelled) * 1e3:>12.1f}  {doc['cell_id']}")
    print("\nprofiled collective time over the link's time, by strategy (median, cells):")
    for strategy, values in sorted(ratios.items()):
        print(f"  {strategy:<20} {statistics.median(values):6.2f}  ({len(values)})")
    if misses:
        print(f"\nthe time model's exposed communication against the profiles': off by a median of "
              f"{statistics.median(misses) * 1e3:.1f} ms, at worst {max(misses) * 1e3:.1f} ms "
              f"({len(misses)} cells)")
    if skipped:
        print(f"({skipped} cells split over other numbers of ranks than the table's, or sending nothing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
