"""A rank of a 2-GPU cell killed, then one stopped, mid-cell: how soon the cell ends, what its result says,
and when nvidia-smi last shows a process of it (the GPU run behind docs/troubleshooting.md's figures).

    python3 validation/scripts/rank_failures_gpu.py WORKSPACE [--model gpt2-124m]   (a host of 2+ GPUs)

In WORKSPACE (created): a study of one torch DDP cell on 2 GPUs, timed until its cap, run by
`snakemake -s <repo>/Snakefile`; once rank 1 reaches step 20 it gets SIGKILL (then, in a second run,
SIGSTOP). Prints, for each: seconds from the signal to Snakemake's exit, the result's status and
reason, and nvidia-smi's compute processes each second for 20 s after the cell ended.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from trainbench.execute import watch  # noqa: E402


def gpu_processes() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def one(workspace: Path, sig: signal.Signals, model: str) -> None:
    study = {"description": "a 2-GPU DDP cell whose rank 1 is signalled mid-cell",
             "settings": {"model": model, "strategy": "ddp", "gpus": 2, "micro_batch": 8, "seq_len": 1024,
                          "precision": "bf16", "warmup_steps": 3, "timed_steps": 600},
             "include": [{}], "timing": {"target_ci": 0.0001, "max_timed_s": 300},
             "execution": {"runtime_min": 10, "retries": 0}}
    (workspace / "config.yaml").write_text(yaml.safe_dump({"studies": {"failures": study}}))
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores",
                             "all", "results/tables/failures.md"], cwd=workspace, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    runs = workspace / "results/runs/failures"
    deadline = time.monotonic() + 400
    seen = None
    while seen is None or seen.step < 20:
        for progress in runs.glob("*/.work/progress/rank1"):
            seen = watch.Progress.read(progress)
        if time.monotonic() > deadline or proc.poll() is not None:
            print(proc.communicate()[0][-3000:])
            raise SystemExit(f"{sig.name}: rank 1 never reached step 20")
        time.sleep(0.2)
    print(f"== {sig.name}: rank 1 (pid {seen.pid}) at step {seen.step}; GPU processes: {gpu_processes()}")
    os.kill(seen.pid, sig)
    signalled = time.monotonic()
    output = proc.communicate(timeout=600)[0]
    ended = time.monotonic()
    print(f"snakemake exited {proc.returncode} {ended - signalled:.1f} s after the signal")
    target = next(runs.glob("*/metrics.json"))
    doc = json.loads(target.read_text())
    print(f"result: {doc['status']} ({doc.get('failure')}): {doc['reason']}")
    print("\n".join(line for line in output.splitlines() if "[trainbench" in line)[-2000:])
    for second in range(21):
        apps = gpu_processes()
        print(f"  {time.monotonic() - ended:5.1f} s after the cell ended: {len(apps)} GPU process(es) {apps}")
        if not apps and second >= 2:
            break
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--model", default="gpt2-124m")
    args = parser.parse_args()
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        workspace = args.workspace / sig.name
        workspace.mkdir(parents=True, exist_ok=True)
        one(workspace, sig, args.model)


if __name__ == "__main__":
    main()
