"""Which results were timed while another cell ran on the same machine.

    python3 bench/shared_host.py [FOLDER ...]        (default: results/runs)

A timed GPU cell holds its machine alone since the slot pool's host lock (execute/gpus.py; its
provenance says `host_alone`). Results from before it may have run beside other cells on the other
GPUs of one host, sharing its cores, memory bandwidth and PCIe. This finds them from what every result
records: two GPU results of one hostname whose runs (provenance `started` to `ended`) overlap ran side
by side. Hosts that share a hostname and ran at the same time would be taken for one; results of one
hostname that never overlap in time are not affected.

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


def runs(folders: list[Path]) -> list[dict]:
    """Every GPU result with a start and an end: (study/cell, hostname, started, ended, host_alone)."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("metrics.json")):
            doc = json.loads(path.read_text())
            provenance = doc.get("provenance") or {}
            if (doc.get("params") or {}).get("device") != "cuda":
                continue
            if not provenance.get("started") or not provenance.get("ended"):
                continue
            found.append({"cell": f"{doc['study']}/{doc['cell_id']}", "study": doc["study"],
                          "host": provenance.get("hostname"),
                          "started": datetime.fromisoformat(provenance["started"]),
                          "ended": datetime.fromisoformat(provenance["ended"]),
                          "alone": provenance.get("host_alone")})
    return found


def beside(found: list[dict]) -> dict[str, list[str]]:
    """Each result that overlapped another on its hostname: the cells it overlapped."""
    overlaps: dict[str, list[str]] = defaultdict(list)
    ordered = sorted(found, key=lambda r: r["started"])
    for i, run in enumerate(ordered):
        for later in ordered[i + 1:]:
            if later["started"] >= run["ended"]:
                break
            if later["host"] == run["host"]:
                overlaps[run["cell"]].append(later["cell"])
                overlaps[later["cell"]].append(run["cell"])
    return dict(overlaps)


def report(found: list[dict]) -> str:
    overlaps = beside(found)
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
    args = parser.parse_args(argv)
    found = runs(args.folders)
    if not found:
        print("no GPU result with a start and an end", file=sys.stderr)
        return 1
    print(report(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
