"""A published cell's parameters as `trainbench run-cell --params` takes them, for the GPU-run scripts
that run a cell outside its study (tools/gpu-runs/fsdp-emulated.sh, shared-host.sh).

    python3 tools/gpu-runs/cell_params.py STUDY CELL [--emulate-rank R]

--emulate-rank: the cell's rank R alone, emulated through the fake process group (docs/emulation.md).
--set KEY=VALUE: a parameter changed (VALUE read as JSON where it parses, else as a string); repeatable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainbench.execute.results import read_result
from trainbench.study.params import CellParams


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cell_params(results: Path, study: str, cell: str, emulate_rank: int | None = None,
                changes: dict | None = None) -> CellParams:
    params = CellParams.from_dict(read_result(results / study / cell / "metrics.json")["params"])
    if emulate_rank is not None:
        params = params.replace(emulate=True, emulate_rank=emulate_rank)
    return params.replace(**changes) if changes else params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("cell")
    parser.add_argument("--emulate-rank", type=int, default=None)
    parser.add_argument("--results", type=Path, default=Path("results/runs"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    changes = {key: _value(value) for key, _, value in (item.partition("=") for item in args.set)}
    print(cell_params(args.results, args.study, args.cell, args.emulate_rank, changes).canonical)


if __name__ == "__main__":
    main()
