"""Peak device and host memory of a node while a cell runs, sampled from a process of its own.

NVML's 'used' is what nvidia-smi shows: every process's allocations plus CUDA contexts, which is
more than torch's allocator reports. One sampler per node covers all of that node's GPUs.

The sampling runs in a child process, not a thread of the training process: a thread would take
the training process's GIL every interval, delaying the thread that launches the GPU's work (the
overhead benchmark, bench/overhead.py, measures both). The child imports neither torch nor
trainbench's training code, starts in a fraction of a second, and stops when told to or when its
parent goes away (its stdin closes), so it never outlives a killed rank.

    python -m trainbench.execute.memory_sampler [--interval S] [--no-gpus]
    (stdin: "stop" or end of file; stdout: one JSON line of peaks, then exit)
"""

from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
from dataclasses import asdict, dataclass, field

import psutil

from trainbench.execute.gpus import machine_devices, nvml_handle
from trainbench.registry.hardware import MIB


@dataclass
class MemorySample:
    gpu_used_mib: list[float] = field(default_factory=list)
    gpu_total_mib: list[float] = field(default_factory=list)
    gpu_names: list[str] = field(default_factory=list)
    host_used_mib: float = 0.0
    host_percent: float = 0.0


class PeakTracker:
    """The sampling itself: NVML's 'used' of every visible GPU and the host's memory, peaks kept."""

    def __init__(self, use_gpus: bool = True):
        self.peak = MemorySample()
        self._handles = []
        self._nvml = None
        if use_gpus:
            self._open_nvml()

    def _open_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no driver: a CPU machine
            return
        self._nvml = pynvml
        for device in machine_devices():  # the visible devices (the launcher orders CUDA's ids as NVML's)
            handle = nvml_handle(pynvml, device)
            self._handles.append(handle)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            self.peak.gpu_names.append(name.decode() if isinstance(name, bytes) else name)
            self.peak.gpu_total_mib.append(info.total / MIB)
            self.peak.gpu_used_mib.append(info.used / MIB)

    def sample(self) -> None:
        for i, handle in enumerate(self._handles):
            used = self._nvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
            self.peak.gpu_used_mib[i] = max(self.peak.gpu_used_mib[i], used)
        vm = psutil.virtual_memory()
        self.peak.host_used_mib = max(self.peak.host_used_mib, (vm.total - vm.available) / MIB)
        self.peak.host_percent = max(self.peak.host_percent, vm.percent)


class MemorySampler:
    """The training process's handle on its node's sampler process."""

    def __init__(self, interval_s: float = 0.05, use_gpus: bool = True):
        argv = [sys.executable, "-m", "trainbench.execute.memory_sampler", "--interval", str(interval_s)]
        self._argv = argv + ([] if use_gpus else ["--no-gpus"])
        self._child: subprocess.Popen | None = None
        self._result: MemorySample | None = None

    def start(self) -> "MemorySampler":
        self._child = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._child.stdout.readline()  # the first sample is taken: nothing runs unsampled
        if ready.strip() != "ready":
            raise RuntimeError(f"the memory sampler did not start: {ready!r}")
        return self

    def stop(self) -> MemorySample:
        """The peaks so far (the sampler takes a last sample first); idempotent."""
        if self._result is None and self._child is not None:
            output, _ = self._child.communicate("stop\n", timeout=60)
            self._result = MemorySample(**json.loads(output.strip().splitlines()[-1]))
        return self._result or MemorySample()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainbench.execute.memory_sampler", description=__doc__)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--no-gpus", action="store_true", help="the host's memory only")
    args = parser.parse_args(argv)
    tracker = PeakTracker(use_gpus=not args.no_gpus)
    tracker.sample()
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], args.interval)
        if readable:
            sys.stdin.readline()  # "stop", or "" at end of file: the parent is done or gone
            break
        tracker.sample()
    tracker.sample()
    print(json.dumps(asdict(tracker.peak)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
