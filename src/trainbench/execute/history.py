"""Every run of a cell, kept: a result replaced by a rerun is not lost, it is history.

Each time a cell's result is written (cellrun), one line is appended to
`results/history/<study>/<cell>.jsonl` (config.yaml holds cell ids to lengths where that fits a file
name): the run's key (commit, host, GPU model, when) and the figures a comparison reads (step time and
samples/s with their intervals, peak memory), with the cell's status and parameter hash. `trainbench
compare RUNS --history` sets each cell of a results tree against its last earlier run on the same GPU
model with the same parameters, with the significance `compare` has; `trainbench history STUDY` lists
a study's runs. What a line holds and reading lines back are the contract's (contract.history).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from trainbench.contract.history import history_file, record, runs
from trainbench.contract.result import Result, read_result


def append(written: Result, result: Path) -> None:
    """Add a written result to its cell's history (one line, appended in one write)."""
    path = history_file(result)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record(written), sort_keys=True) + "\n").encode()
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def seed(results: Iterable[Path]) -> int:
    """Add results not yet in their cells' history (a tree made before histories were kept); how many."""
    added = 0
    for result in results:
        path = history_file(result)
        if path is None:
            continue
        written = read_result(result)
        if any(r["provenance"].get("started") == written.provenance.started for r in runs(path)):
            continue
        append(written, result)
        added += 1
    return added
