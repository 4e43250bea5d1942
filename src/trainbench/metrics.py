"""Measurement: throughput, TFLOPS and MFU from step times, and a sampler of device and host memory.

MFU = achieved model FLOPs / peak FLOPs of the GPU at the training precision, where model FLOPs per
token are `ModelSpec.train_flops_per_token` (6N + 12 L H Q T, PaLM appendix B). Peaks are the dense
(not 2:4 sparse) tensor-core figures of the data sheets.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil

MIB = 1024 * 1024

# Dense peak FLOP/s by GPU model (matched in the NVML name) and compute type.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},  # SXM
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
}


def compute_type(precision: str, tf32: bool) -> str:
    if precision in ("bf16", "fp16"):
        return precision
    return "tf32" if tf32 else "fp32"


def peak_flops(gpu_name: str | None, precision: str, tf32: bool) -> float | None:
    """Peak FLOP/s of one GPU for this precision; None for CPUs and unknown GPUs."""
    if not gpu_name:
        return None
    # H100 PCIe has a lower peak than the SXM part the table holds: better no MFU than a wrong one.
    if "H100" in gpu_name and "PCIe" in gpu_name:
        return None
    for model, peaks in PEAK_FLOPS.items():
        if model in gpu_name:
            return peaks[compute_type(precision, tf32)]
    return None


@dataclass
class Throughput:
    step_time_s: float
    samples_per_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float | None


def throughput(step_times_s: list[float], *, global_batch: int, seq_len: int, flops_per_token: float,
               gpus: int, peak: float | None) -> Throughput:
    """Throughput from the median optimizer-step time (robust to a stray slow step)."""
    step = statistics.median(step_times_s)
    samples = global_batch / step
    tokens = samples * seq_len
    flops_per_gpu = tokens * flops_per_token / gpus
    return Throughput(step, samples, tokens, flops_per_gpu / 1e12, flops_per_gpu / peak if peak else None)


def process_peak_rss_mib() -> float:
    """Peak resident set of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def visible_nvml_indices() -> list[int | str]:
    """NVML handles' keys for CUDA_VISIBLE_DEVICES: indices, or UUIDs as given.

    The launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA's numbering is NVML's (and nvidia-smi's).
    """
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return []  # callers treat "unset" as all devices
    items = [v.strip() for v in value.split(",") if v.strip()]
    return [int(v) if v.isdigit() else v for v in items]


@dataclass
class MemorySample:
    gpu_used_mib: list[float] = field(default_factory=list)
    gpu_total_mib: list[float] = field(default_factory=list)
    gpu_names: list[str] = field(default_factory=list)
    host_used_mib: float = 0.0
    host_percent: float = 0.0


class MemorySampler:
    """Background thread keeping the peak NVML 'used' memory of every visible GPU and of the host.

    NVML's 'used' is what nvidia-smi shows: every process's allocations plus CUDA contexts, which is
    more than torch's allocator reports. One sampler per node covers all of that node's GPUs.
    """

    def __init__(self, interval_s: float = 0.05, use_gpus: bool = True):
        self.interval_s = interval_s
        self.peak = MemorySample()
        self._handles = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
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
        wanted = visible_nvml_indices()
        if not wanted and os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            wanted = list(range(pynvml.nvmlDeviceGetCount()))
        for key in wanted:
            if isinstance(key, int):
                handle = pynvml.nvmlDeviceGetHandleByIndex(key)
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(key)
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

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> MemorySample:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        return self.peak


class StepClock:
    """Wall time of one step with the device synchronised at both ends, so queued GPU work is counted."""

    def __init__(self, synchronize):
        self._synchronize = synchronize
        self._start = 0.0
        self.elapsed_s = 0.0

    def start(self) -> None:
        self._synchronize()
        self._start = time.perf_counter()

    def stop(self) -> float:
        self._synchronize()
        self.elapsed_s = time.perf_counter() - self._start
        return self.elapsed_s
