"""Does float8 train like bf16? Each float8 cell's loss curve against its bf16 twin's.

    python bench/float8_loss.py results/runs/float8 [--json FILE]

For every float8 cell under the folder (metrics.json with a `loss_curve`: the loss at every step,
warm-up included) whose twin (the same parameters, float8 off) is there too: the steps both ran,
each one's first and last loss, the largest relative gap between the curves over those steps, and
the mean gap over their last quarter (where a recipe that trains worse shows it: the curves drift
apart rather than jump), and the first step at which they are more than 1% apart. Both cells start
from the same weights and see the same batches (the seed
is a parameter), so the gap is float8's alone.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from trainbench.execute.results import read_result
from trainbench.reporting.compare import shorten


APART = 0.01  # curves more than 1% apart at a step: where a table's eye would see two lines


def twin_key(params: dict) -> str:
    """What a cell and its bf16 twin share: every parameter but float8."""
    return json.dumps({k: v for k, v in params.items() if k != "float8"}, sort_keys=True, default=str)


def compare(docs: list[dict]) -> list[dict]:
    """One row per float8 cell with a bf16 twin and both loss curves."""
    twins = {twin_key(d["params"]): d for d in docs if not d["params"].get("float8")}
    rows = []
    for doc in docs:
        recipe = doc["params"].get("float8")
        twin = twins.get(twin_key(doc["params"]))
        curve = (doc.get("metrics") or {}).get("loss_curve")
        base = ((twin or {}).get("metrics") or {}).get("loss_curve")
        if not recipe or not curve or not base:
            continue
        steps = min(len(curve), len(base))
        # a step where either loss is not a finite number (a diverged run) is a gap without measure
        diverged = next((i for i, (a, b) in enumerate(zip(curve[:steps], base[:steps]))
                         if not (a is not None and b and math.isfinite(a) and math.isfinite(b))), None)
        gaps = [abs(a - b) / abs(b) for a, b in zip(curve[:diverged], base[:diverged])]
        tail = gaps[len(gaps) - max(1, len(gaps) // 4):]
        rows.append({"cell": doc["cell_id"], "twin": twin["cell_id"], "recipe": recipe, "steps": steps,
                     "model": doc["params"].get("model"), "compile": bool(doc["params"].get("compile")),
                     "apart_from": next((i for i, gap in enumerate(gaps) if gap > APART), None),
                     "bf16_first": base[0], "bf16_last": base[steps - 1],
                     "float8_first": curve[0], "float8_last": curve[steps - 1],
                     "diverged_at": diverged,
                     "max_gap": max(gaps) if gaps else None,
                     "last_quarter_gap": statistics.mean(tail) if tail else None})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    docs = [read_result(p) for p in sorted(args.folder.glob("*/metrics.json"))]
    rows = compare([d for d in docs if d["status"] == "ok"])
    if not rows:
        print(f"no float8 cell with a bf16 twin and both loss curves under {args.folder}", file=sys.stderr)
        return 1
    print(f"{'model':<12} {'compiled':<8} {'recipe':<10} {'steps':>5} {'bf16 first/last':>17} "
          f"{'float8 first/last':>19} {'1% apart at':>11} {'max gap':>8} {'last 1/4':>8}")
    for r in rows:
        gaps = (f"{r['max_gap']:>8.2%} {r['last_quarter_gap']:>8.2%}" if r["max_gap"] is not None else
                f"{'-':>8} {'-':>8}")
        apart = "-" if r["apart_from"] is None else f"step {r['apart_from']}"
        print(f"{shorten(r['model'], 12):<12} {'yes' if r['compile'] else 'no':<8} {r['recipe']:<10} "
              f"{r['steps']:>5} {r['bf16_first']:>8.4f}/{r['bf16_last']:<8.4f} "
              f"{r['float8_first']:>9.4f}/{r['float8_last']:<9.4f} {apart:>11} {gaps}"
              + (f"  not finite from step {r['diverged_at']}" if r["diverged_at"] is not None else ""))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
