"""Which results were timed while another cell ran on the same machine.

    python3 bench/shared_host.py [FOLDER ...] [--history DIR]   (default: results/runs, results/history)

A timed GPU cell holds its machine alone since the slot pool's host lock (execute/gpus.py; its
provenance says `host_alone`). Results from before it may have run beside other cells on the other
GPUs of one host, sharing its cores, memory bandwidth and PCIe. This finds them from what every result
records: two GPU results of one hostname whose runs (provenance `started` to `ended`) overlap ran side
by side. Hosts that share a hostname and ran at the same time would be taken for one; results of one
hostname that never overlap in time are not affected.

The neighbours also come from the results' histories (results/history/<study>/<cell>.jsonl, one line
per run ever recorded): a result replaced since by a rerun still ran beside the cells that overlapped it
then, and those cells' results still carry its company. `--history ''` leaves the histories out.

Prints, per study, how many of its GPU results were timed beside another and which, with the
overlapping cells; the last line totals them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

# results whose cell never started a process on the GPUs (refused before it ran): no company to keep
NEVER_RAN = ("unsupported", "infeasible")


def runs(folders: list[Path]) -> list[dict]:
    """Every GPU result with a start and an end: (study/cell, hostname, started, ended, host_alone)."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("metrics.json")):
            doc = json.loads(path.read_text())
            provenance = doc.get("provenance") or {}
            if (doc.get("params") or {}).get("device") != "cuda" or doc.get("status") in NEVER_RAN:
                continue
            if not provenance.get("started") or not provenance.get("ended"):
                continue
            found.append({"cell": f"{doc['study']}/{doc['cell_id']}", "study": doc["study"],
                          "host": provenance.get("hostname"),
                          "started": datetime.fromisoformat(provenance["started"]),
                          "ended": datetime.fromisoformat(provenance["ended"]),
                          "alone": provenance.get("host_alone")})
    return found


def history_runs(folder: Path) -> list[dict]:
    """Every GPU run a history records (its line has the GPU's name), for neighbours only: a run since
    replaced by a rerun is no longer in results/runs but was on its host all the same."""
    found = []
    for path in sorted(folder.rglob("*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            provenance = entry.get("provenance") or {}
            if not provenance.get("gpu_name") or not provenance.get("started") or not provenance.get("ended"):
                continue
            if entry.get("status") in NEVER_RAN:
                continue
            found.append({"cell": f"{entry['study']}/{entry['cell_id']}", "study": entry["study"],
                          "host": provenance.get("hostname"),
                          "started": datetime.fromisoformat(provenance["started"]),
                          "ended": datetime.fromisoformat(provenance["ended"]),
                          "alone": None})
    return found


def beside(found: list[dict], earlier: list[dict] = ()) -> dict[str, list[str]]:
    """Each result that overlapped another run on its hostname: the cells it overlapped. `earlier`
    adds runs known from the histories (a result's own run is among them, and counts once)."""
    runs_by_key = {(r["cell"], r["started"]): r for r in earlier}
    runs_by_key.update({(r["cell"], r["started"]): r for r in found})
    current = {(r["cell"], r["started"]) for r in found}
    overlaps: dict[str, list[str]] = defaultdict(list)
    ordered = sorted(runs_by_key.values(), key=lambda r: r["started"])
    for i, run in enumerate(ordered):
        for later in ordered[i + 1:]:
            if later["started"] >= run["ended"]:
                break
            if later["host"] != run["host"] or later["cell"] == run["cell"]:
                continue
            if (run["cell"], run["started"]) in current:
                overlaps[run["cell"]].append(_name(later, current))
            if (later["cell"], later["started"]) in current:
                overlaps[later["cell"]].append(_name(run, current))
    return dict(overlaps)


def _name(run: dict, current: set) -> str:
    if (run["cell"], run["started"]) in current:
        return run["cell"]
    return f"{run['cell']} (its run of {run['started']:%Y-%m-%d}, replaced since)"


def report(found: list[dict], earlier: list[dict] = ()) -> str:
    overlaps = beside(found, earlier)
    by_study: dict[str, list[dict]] = defaultdict(list)
    for run in found:
        by_study[run["study"]].append(run)
    lines = []
    for study in sorted(by_study):
        shared = [r for r in by_study[study] if r["cell"] in overlaps]
        total = len(by_study[study])
        lines.append(f"{study}: {len(shared)} of {total} GPU results timed beside another cell")
        for run in shared:
            others = overlaps[run["cell"]]
            lines.append(f"  {run['cell']} ({run['started']:%Y-%m-%d %H:%M:%S}-{run['ended']:%H:%M:%S}): "
                         f"beside {len(others)}: {', '.join(sorted(others))}")
    total = sum(1 for r in found if r["cell"] in overlaps)
    lines.append(f"all: {total} of {len(found)} GPU results timed beside another cell on their host")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, default=[Path("results/runs")])
    parser.add_argument("--history", default="results/history",
                        help="the histories to take neighbours from as well ('' for none)")
    args = parser.parse_args(argv)
    found = runs(args.folders)
    if not found:
        print("no GPU result with a start and an end", file=sys.stderr)
        return 1
    print(report(found, history_runs(Path(args.history)) if args.history else []))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
