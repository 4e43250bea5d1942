"""Does a bandwidth table repeat? Two `trainbench commbench` tables of one host set side by side.

    python bench/commbench_repeat.py FIRST.json SECOND.json

For every collective and size both measured: the second run's bus bandwidth against the first's, in
percent. Then, for messages of 16 MiB and more (bandwidth-bound) and for smaller ones (bound by the
time an operation takes to issue), the median and worst |difference|.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

LARGE = 16 << 20  # bytes: from here on a message's time is its bandwidth's, not its issue's


def differences(first: dict, second: dict) -> list[tuple[str, int, float, float, float]]:
    """(collective, size, first busbw, second busbw, difference %) for each row both tables have."""
    before = {(r["collective"], r["size_bytes"]): r["busbw_gb_s"] for r in first["rows"]}
    rows = []
    for row in second["rows"]:
        key = (row["collective"], row["size_bytes"])
        if key in before and before[key] > 0:
            rows.append((*key, before[key], row["busbw_gb_s"], 100 * (row["busbw_gb_s"] / before[key] - 1)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first")
    p.add_argument("second")
    args = p.parse_args(argv)
    first, second = (json.loads(Path(path).read_text()) for path in (args.first, args.second))
    print(f"command: python bench/commbench_repeat.py {args.first} {args.second}")
    for name, doc in (("first", first), ("second", second)):
        prov = doc["provenance"]
        print(f"{name}: {doc['interconnect']}, {doc['ranks']} x {prov.get('gpu_name') or doc['device']}, "
              f"NCCL {prov.get('nccl')}, host {prov.get('host_id')}, {prov.get('finished_at')}")
    rows = differences(first, second)
    print(f"\n{'collective':>14} {'bytes':>11} {'first GB/s':>11} {'second GB/s':>12} {'diff %':>8}")
    for collective, size, a, b, diff in rows:
        print(f"{collective:>14} {size:>11} {a:>11.2f} {b:>12.2f} {diff:>+8.1f}")
    print()
    for label, chosen in (("16 MiB and more", [r for r in rows if r[1] >= LARGE]),
                          ("under 16 MiB", [r for r in rows if r[1] < LARGE])):
        if chosen:
            apart = [abs(r[4]) for r in chosen]
            print(f"{label}: {len(chosen)} rows, |difference| median {statistics.median(apart):.2f}%, "
                  f"worst {max(apart):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
