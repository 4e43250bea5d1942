"""Pack a GPU run's results for the device tool's return limits: at most 8 files of 16 MiB, 64 MiB in
all. Everything but the profiles' traces goes into OUT/results.tgz; the traces (already gzipped) into
one tar split in 15 MiB parts, leaving out the largest traces (named in OUT/left-out.txt) where all of
them would not fit. Joined here with: cat traces.tar.part-* | tar x

    python3 tools/gpu-runs/pack_out.py OUT PATH...
"""

import subprocess
import sys
import tarfile
from pathlib import Path

PART = 15 << 20
BUDGET = 62 << 20  # all files together, under the tool's 64 MiB
MAX_PARTS = 6      # beside results.tgz and left-out.txt

out, paths = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:] if Path(p).exists()]
traces = sorted((f for p in paths for f in ([p] if p.is_file() else p.rglob("*"))
                 if f.is_file() and f.parent.name == "profile"), key=lambda f: f.stat().st_size)
with tarfile.open(out / "results.tgz", "w:gz") as tar:
    for p in paths:
        tar.add(p, filter=lambda info: None if "/profile/" in f"/{info.name}" and info.isfile() else info)
room = min(BUDGET - (out / "results.tgz").stat().st_size, MAX_PARTS * PART)
kept, used = [], 0
for trace in traces:  # smallest first: as many cells' traces as fit
    if used + trace.stat().st_size + 4096 > room:
        break
    kept.append(trace)
    used += trace.stat().st_size + 4096
left = [t for t in traces if t not in kept]
(out / "left-out.txt").write_text("".join(f"{t} {t.stat().st_size}\n" for t in left))
if kept:
    with tarfile.open(out / "traces.tar", "w") as tar:
        for trace in kept:
            tar.add(trace)
    subprocess.run(["split", "-b", str(PART), str(out / "traces.tar"), str(out / "traces.tar.part-")],
                   check=True)
    (out / "traces.tar").unlink()
print(f"packed: results.tgz {(out / 'results.tgz').stat().st_size >> 20} MiB, {len(kept)} traces "
      f"({used >> 20} MiB), {len(left)} left out")
