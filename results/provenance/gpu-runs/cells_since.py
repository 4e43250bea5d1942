"""What each cell written since a time measured, one line per cell: for a GPU run's log, so that the
log says what ran without unpacking its results.

    python3 tools/gpu-runs/cells_since.py EPOCH_SECONDS PATH...
"""

import json
import sys
from pathlib import Path

since = float(sys.argv[1])
for root in map(Path, sys.argv[2:]):
    if not root.is_dir():
        continue
    for result in sorted(root.glob("*/metrics.json")):
        if result.stat().st_mtime < since:
            continue
        doc = json.loads(result.read_text())
        figures, provenance = doc.get("metrics") or {}, doc.get("provenance") or {}
        step, interval = figures.get("step_time_s"), figures.get("step_time_s_ci")
        parts = [f"{doc['study']}/{doc['cell_id'][:110]}", doc["status"]]
        if step:
            parts.append(f"step {step * 1e3:.1f} ms"
                         + (f" [{interval[0] * 1e3:.1f}, {interval[1] * 1e3:.1f}]" if interval else ""))
        if figures.get("energy_j_per_step"):
            parts.append(f"{figures['energy_j_per_step']:.1f} J/step")
        if provenance.get("host_pace_ms"):
            parts.append(f"host pace {provenance['host_pace_ms']:.2f} ms")
        print("  " + ", ".join(parts))
