"""What is live at an allocator snapshot's peak, by where it was allocated: the blocks live when the
most memory was allocated (trainbench.execute.profiling._live_at_peak), each matched to its allocation
in the recorded history and grouped by the first Python frame of the repository's code (and the
innermost Python frame), the largest groups first. Blocks allocated before the history's window
(the parameters and optimizer states of a long run) are one group.

    python3 memory_peaks.py SNAPSHOT.pickle... [--top 25]
"""

from __future__ import annotations

import argparse
import pickle
from collections import defaultdict
from pathlib import Path

from trainbench.execute.profiling import _live_at_peak

MIB = 1 << 20


def _site(frames: list[dict]) -> str:
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    ours = next((f for f in python if "/trainbench/" in f["filename"]), None)
    inner = python[0] if python else None

    def name(frame):
        return f"{Path(frame['filename']).name}:{frame['line']} {frame['name']}" if frame else "-"

    return f"{name(ours)} | {name(inner)}"


def peaks(path: Path, top: int) -> None:
    snapshot = pickle.loads(path.read_bytes())
    live, peak, at_peak = _live_at_peak(snapshot)
    events = [e for trace in snapshot.get("device_traces", []) for e in trace]
    # each live block's allocation: the last of its address before the peak (addresses are reused)
    allocated_by: dict[int, list[dict]] = {}
    for event in events[:at_peak]:
        if event.get("action") == "alloc" and event["addr"] in live:
            allocated_by[event["addr"]] = event.get("frames") or []
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for address, size in live.items():
        site = _site(allocated_by[address]) if address in allocated_by else "(before the history's window)"
        groups[site][0] += size
        groups[site][1] += 1
    reserved = sum(s.get("total_size", 0) for s in snapshot.get("segments", []))
    print(f"== {path}: peak allocated {peak / MIB:,.0f} MiB, reserved at the end {reserved / MIB:,.0f} MiB, "
          f"{len(events):,} events")
    if 0 < at_peak <= len(events):  # the last event at the peak (an allocation, or one that frees
        last = events[at_peak - 1]  # nothing yet), and the code it came from: where in the step it is
        frames = [f for f in last.get("frames") or [] if str(f.get("filename", "")).endswith(".py")]
        print(f"  last event at the peak ({last.get('action')}, {last.get('size', 0) / MIB:,.0f} MiB) at: "
              + " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames[:12]))
    for site, (size, count) in sorted(groups.items(), key=lambda item: -item[1][0])[:top]:
        print(f"  {size / MIB:9,.0f} MiB {count:6} blocks  {site}")
    # by the innermost file alone: a compiled graph's buffers together (inductor names a file a graph)
    files: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for site, (size, count) in groups.items():
        inner = site.split(" | ")[-1].split(":")[0]
        files[inner][0] += size
        files[inner][1] += count
    print("  by file:")
    for name, (size, count) in sorted(files.items(), key=lambda item: -item[1][0])[:top]:
        print(f"  {size / MIB:9,.0f} MiB {count:6} blocks  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshots", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for path in args.snapshots:
        peaks(path, args.top)


if __name__ == "__main__":
    main()
