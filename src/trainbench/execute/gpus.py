"""Which GPUs a cell may use.

Under SLURM the allocation's devices are used as given (SLURM sets CUDA_VISIBLE_DEVICES). On one
machine Snakemake counts GPUs (`--resources gpu=N`) but does not say which, so concurrent cells take
disjoint devices from a slot pool: one lock file per device, held with flock(2) for the life of the
cell. The kernel drops a dead process's locks, so a crashed cell's slots come back by themselves.

A timed GPU cell also holds the machine alone (the pool's host lock, exclusive): cells beside it on
other GPUs would share its host's cores, memory bandwidth and PCIe, a confound a benchmark's timings
should not carry by default (how much it moves a step depends on the cell and the host;
docs/measurement.md). Every other lease holds the host lock shared, so a timed cell waits for them
and they wait for it. TRAINBENCH_SHARE_HOST=1 lets timed cells share the machine (faster grids, their
timings not alone); the result's provenance says which it was (`host_alone`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path


POOL_DIR_ENV = "TRAINBENCH_GPU_POOL_DIR"
SHARE_HOST_ENV = "TRAINBENCH_SHARE_HOST"  # 1: timed GPU cells may run beside other cells
FAKE_GPUS_ENV = "TRAINBENCH_FAKE_GPUS"  # tests: pretend this many devices exist


class NotEnoughGpus(Exception):
    pass


def under_slurm() -> bool:
    return "SLURM_JOB_ID" in os.environ


def nvml_device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver
        return 0


def machine_devices() -> list[str]:
    """Device ids this process may hand out: CUDA_VISIBLE_DEVICES if set, else every GPU NVML sees."""
    if FAKE_GPUS_ENV in os.environ:
        return [str(i) for i in range(int(os.environ[FAKE_GPUS_ENV]))]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(nvml_device_count())]


def nvml_handle(pynvml, device: str):
    """NVML's handle of a device as CUDA_VISIBLE_DEVICES names it: an index, or a UUID."""
    return (pynvml.nvmlDeviceGetHandleByIndex(int(device)) if device.isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(device))


def local_gpu_count() -> int:
    return len(machine_devices())


def default_pool_dir() -> Path:
    # Per host: a shared home directory must not make two machines share one pool.
    return (Path(os.environ.get(POOL_DIR_ENV, f"/tmp/trainbench-gpu-slots-{os.getuid()}"))
            / socket.gethostname())


class SlotPool:
    def __init__(self, devices: list[str], directory: Path | None = None, poll_s: float = 0.5):
        self.devices = devices
        self.directory = directory or default_pool_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s

    def _lock_path(self, device: str) -> Path:
        return self.directory / f"gpu{device}.lock"

    def _try_take(self, count: int, alone: bool) -> list[tuple[str, int]] | None:
        """Take the host lock (exclusive where `alone`, else shared) and `count` free devices, or
        nothing: all-or-nothing under a pool-wide lock. The host lock's descriptor comes first."""
        with open(self.directory / "pool.lock", "w") as pool_lock:
            fcntl.flock(pool_lock, fcntl.LOCK_EX)
            host = os.open(self.directory / "host.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(host, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(host)
                return None
            taken: list[tuple[str, int]] = [("host", host)]
            for device in self.devices:
                fd = os.open(self._lock_path(device), os.O_CREAT | os.O_RDWR, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                taken.append((device, fd))
                if len(taken) == count + 1:
                    return taken
            for _, fd in taken:
                os.close(fd)  # closing releases the flock
            return None

    @contextlib.contextmanager
    def lease(self, count: int, on_wait=None, alone: bool = False):
        """Hold `count` devices for the duration of the block; wait while fewer are free. `alone`: hold
        the machine too, waiting until no other lease is held (and keeping others waiting)."""
        if count > len(self.devices):
            raise NotEnoughGpus(f"needs {count} GPUs; this machine has {len(self.devices)} "
                                f"({', '.join(self.devices) or 'none'})")
        waited = False
        while (taken := self._try_take(count, alone)) is None:
            if not waited and on_wait:
                on_wait()
            waited = True
            time.sleep(self.poll_s)
        try:
            yield [device for device, _ in taken[1:]]
        finally:
            for _, fd in taken:
                os.close(fd)


def timed_alone(search_probe: bool = False) -> bool:
    """Whether a GPU cell run here holds the machine alone (see the module's docstring): every timed
    cell, unless TRAINBENCH_SHARE_HOST=1; never a max-batch probe, which measures memory only."""
    return not search_probe and os.environ.get(SHARE_HOST_ENV) != "1"


@contextlib.contextmanager
def devices_for_cell(count: int, on_wait=None, alone: bool = False):
    """CUDA_VISIBLE_DEVICES for a cell on this node: SLURM's allocation, or a lease from the pool
    (`alone`: with the machine to itself)."""
    if under_slurm() and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        given = machine_devices()
        if len(given) < count:
            raise NotEnoughGpus(f"needs {count} GPUs per node; the SLURM allocation gives {given}")
        yield given[:count]
        return
    with SlotPool(machine_devices()).lease(count, on_wait=on_wait, alone=alone) as devices:
        yield devices


class EnergyCounter:
    """One GPU's energy counter (NVML's total energy since the driver loaded, in millijoules; Volta and
    later), read at the two ends of every timed window: its sum is the energy the timed steps took.

    `read` returns the counter in millijoules; `for_device` builds one for a rank's CUDA device (its
    index among the visible devices), None on CPU ranks or where NVML or the counter is missing. A read
    that fails mid-run leaves the rank without energy figures, never stops its training."""

    def __init__(self, read):
        self._read = read
        self._window_start: int | None = None
        self.energy_mj = 0
        self.windows = 0
        self.failed = False

    @classmethod
    def for_device(cls, device_type: str, index: int | None) -> EnergyCounter | None:
        if device_type != "cuda":
            return None
        devices = machine_devices()
        if (index or 0) >= len(devices):
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = nvml_handle(pynvml, devices[index or 0])
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # raises where the GPU has no counter
        except Exception:
            return None
        return cls(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def _reading(self) -> int | None:
        if self.failed:
            return None
        try:
            return self._read()
        except Exception:  # NVML gone or the GPU lost: no energy for this run, nothing else lost
            self.failed = True
            return None

    def window_started(self) -> None:
        """At a timed window's start, the device synchronised."""
        self._window_start = self._reading()

    def window_ended(self) -> None:
        """At its end, the device synchronised again."""
        start, self._window_start = self._window_start, None
        end = None if start is None else self._reading()
        if end is not None:
            self.energy_mj += end - start
            self.windows += 1

    @property
    def energy_j(self) -> float | None:
        return self.energy_mj / 1e3 if self.windows and not self.failed else None
