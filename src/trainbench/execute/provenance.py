"""Where and with what a cell ran, enough to set it up again: hardware, driver, every installed
package's version, the environment variables that steer NCCL, CUDA and torch, the git commit, the
SLURM job. (The framework's own config as it ran is kept beside metrics.json by the cell runner.)"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from collections.abc import Callable
from typing import Any

from trainbench.execute.gpus import nvml_handle
from trainbench.registry.hardware import host_memory_mib
from trainbench.registry.hardware import MIB

PACKAGES = {"torch": "torch", "deepspeed": "deepspeed", "lightning": "lightning",
            "transformers": "transformers", "snakemake": "snakemake"}


def now_iso() -> str:
    # milliseconds: a test (and a reader) can tell which runs overlapped
    return dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="milliseconds")


def package_versions() -> dict[str, str | None]:
    import importlib.metadata  # 13 ms: imported by the facts' own thread (HostFacts)

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, dist in PACKAGES.items():
        try:
            versions[key] = name_and_version(importlib.metadata.distribution(dist))[1]
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def installed_packages() -> dict[str, str]:
    """Every distribution in the environment the cell ran in, by name: what `pip freeze` would pin."""
    import importlib.metadata

    found = {}
    for dist in importlib.metadata.distributions():
        name, version = name_and_version(dist)
        if name:
            found[name.lower()] = version
    return dict(sorted(found.items()))


def name_and_version(dist) -> tuple[str | None, str | None]:
    """A distribution's Name and Version (what dist.metadata["Name"] and dist.version say), read from
    its metadata's header lines alone. importlib.metadata parses the whole file as an e-mail, README
    and all: 130 ms for an environment of 120 packages, in every cell's run, against 13 ms."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    headers: dict[str, str] = {}
    for line in text.replace("\r\n", "\n").partition("\n\n")[0].split("\n"):
        key, colon, value = line.partition(":")
        if colon and not line[:1].isspace():  # a header, not a folded header's continuation
            headers.setdefault(key.strip().lower(), value.strip())
    return headers.get("name"), headers.get("version")


ENVIRONMENT_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_", "DS_", "TRAINBENCH_")


def steering_environment(environment: dict[str, str] | None = None) -> dict[str, str]:
    """The variables (of the ranks' environment, else this process's) that change how NCCL, CUDA,
    torch, DeepSpeed or trainbench behave."""
    return {k: v for k, v in sorted((environment or os.environ).items())
            if k.startswith(ENVIRONMENT_PREFIXES)}


GIT_COMMIT_ENV = "TRAINBENCH_GIT_COMMIT"


def git_commit(directory: str = ".") -> str | None:
    """HEAD of the workflow's checkout, with '-dirty' when tracked files outside results/ changed;
    TRAINBENCH_GIT_COMMIT where the code was copied without its .git (a GPU host given a tree)."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--untracked-files=no",
                                 "--", ".", ":(exclude)results"], capture_output=True, text=True,
                                timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if status.strip() else "")


def gpu_facts(devices: list[str] | None) -> dict[str, Any]:
    """Name, count, memory and driver of the GPUs a cell was given, from NVML."""
    facts: dict[str, Any] = {"gpu_name": None, "gpu_count": 0, "gpu_memory_mib": None, "driver": None}
    if not devices:
        return facts
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return facts
    try:
        names, memory = [], []
        for device in devices:
            handle = nvml_handle(pynvml, device)
            name = pynvml.nvmlDeviceGetName(handle)
            names.append(name.decode() if isinstance(name, bytes) else name)
            memory.append(pynvml.nvmlDeviceGetMemoryInfo(handle).total / MIB)
        driver = pynvml.nvmlSystemGetDriverVersion()
        facts.update(gpu_name=names[0], gpu_count=len(names), gpu_memory_mib=memory[0],
                     driver=driver.decode() if isinstance(driver, bytes) else driver)
        if len(set(names)) > 1:
            facts["gpu_names"] = names
        facts.update(_power_and_clocks(pynvml, nvml_handle(pynvml, devices[0])))
    finally:
        pynvml.nvmlShutdown()
    return facts


def _power_and_clocks(pynvml, handle) -> dict[str, Any]:
    """What sets a GPU's speed and energy besides its model: the power limit it enforces and its
    clocks (the maximum, and the application clocks it runs at), each left out where NVML cannot say."""
    reads = {
        "gpu_power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "gpu_sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "gpu_mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "gpu_sm_clock_app_mhz": lambda: pynvml.nvmlDeviceGetApplicationsClock(handle, pynvml.NVML_CLOCK_SM),
    }
    facts = {}
    for key, read in reads.items():
        try:
            facts[key] = read()
        except Exception:  # NVML_ERROR_NOT_SUPPORTED and the like: that fact is unknown here
            continue
    return facts


# nvidia-smi underlines the matrix's header with terminal escapes even into a pipe
TERMINAL_STYLE = re.compile(r"\x1b\[[0-9;]*m")


def gpu_topology() -> str | None:
    """How the node's GPUs connect (NVLink, PCIe switch, CPU socket): `nvidia-smi topo -m` as printed."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return TERMINAL_STYLE.sub("", out.stdout).strip() or None


def slurm_facts() -> dict[str, Any]:
    env = os.environ
    facts = {"slurm_job_id": env.get("SLURM_JOB_ID"), "slurm_nodelist": env.get("SLURM_JOB_NODELIST"),
             "slurm_job_gpus": env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")}
    if env.get("SLURM_ARRAY_JOB_ID"):  # a task of a job array: the array's job and its task
        facts.update(slurm_array_job_id=env["SLURM_ARRAY_JOB_ID"],
                     slurm_array_task_id=env.get("SLURM_ARRAY_TASK_ID"))
    if facts["slurm_job_id"]:
        restarts = _slurm_restarts(facts["slurm_job_id"], env)
        if restarts is not None:
            facts["slurm_restart_count"] = restarts
    return facts


def _slurm_restarts(job: str, env) -> int | None:
    """How often SLURM requeued the job (preemption, a node failure): SLURM_RESTART_COUNT where the
    batch script's variables reached this process, else scontrol's Restarts (Snakemake's job step
    passes few of the batch script's SLURM variables to the step it starts: the job's and an array
    task's ids, not SLURM_RESTART_COUNT)."""
    if env.get("SLURM_RESTART_COUNT", "").isdigit():
        return int(env["SLURM_RESTART_COUNT"])
    try:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                               timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\bRestarts=(\d+)", shown)
    return int(found.group(1)) if found else None


def host_id(machine_id: Path = Path("/etc/machine-id"),
            boot_id: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """Which machine, and which boot of it, a cell ran on: hostnames repeat across machines (containers
    and cloud hosts often share one), so scaling efficiency checks that a cell and the one-GPU cell it is
    held against have this in common. A short hash of the machine's id and its boot's, or None."""
    import hashlib

    parts = []
    for path in (machine_id, boot_id):
        try:
            parts.append(path.read_text().strip())
        except OSError:
            parts.append("")
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:12] if any(parts) else None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The host CPU's model name (Linux's /proc/cpuinfo): host-bound steps (launches, DeepSpeed's hooks,
    a CPU optimizer) run at its pace, and what it computes decides what CPU ranks can train."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


# A fixed piece of interpreted work (calls, attribute and dict look-ups, small allocations: what
# DeepSpeed's hooks and a training loop's Python do between launches), timed several times in a child
# interpreter of its own: on a thread of the runner it shared the GIL with the launcher's start-up,
# and one H200 host type read 2.2 to 6.0 ms
HOST_PACE_REPEATS = 7
HOST_PACE_CALLS = 20_000
_PACE_PROGRAM = """
import sys, time
def work(calls):
    table, total = {}, 0
    for i in range(calls):
        table[i & 255] = table.get(i & 255, 0) + len((i, i + 1))
        total += table[i & 255]
    return total
best = float("inf")
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    work(int(sys.argv[2]))
    best = min(best, time.perf_counter() - started)
print(best * 1e3)
"""


def host_pace_ms(repeats: int = HOST_PACE_REPEATS, calls: int = HOST_PACE_CALLS) -> float | None:
    """Milliseconds one CPU core of this host takes for a fixed piece of Python work, the fastest of
    `repeats` (the least disturbed), in a child interpreter. Host-bound cells (small ZeRO-3 models, a
    loop's fixed costs) run at their host's pace, which a VM's CPU model name ("Intel(R) Xeon(R)
    Processor") does not tell: the same one-GPU ZeRO-3 cell of GPT-5.8B took 795, 1,020 and 829 ms
    on three H200 hosts. Lower is faster; None where the child could not run."""
    try:
        # isolated (-I: no PYTHON* variables, no user site) and without site (-S): the same work anywhere
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _PACE_PROGRAM, str(repeats), str(calls)],
                              capture_output=True, text=True, timeout=30, check=True)
        pace = float(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return round(pace, 3) if 0 < pace < float("inf") else None


def host_facts() -> dict[str, Any]:
    """What a run's provenance says of the host and the environment, the same for every run here:
    the host, its CPUs and memory, how its GPUs connect (where it has any), every package's version,
    the git commit."""
    topology = gpu_topology()  # a process of nvidia-smi: read here, beside the ranks' start-up
    return {
        "hostname": socket.gethostname(),
        "host_id": host_id(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "host_pace_ms": host_pace_ms(),
        "host_mem_total_mib": round(host_memory_mib(), 1),
        "versions": package_versions(),
        "packages": installed_packages(),
        "git_commit": git_commit(),
        **({"gpu_topology": topology} if topology else {}),
    }


class HostFacts:
    """host_facts(), read on a thread of its own once started: a cell runner starts it as its ranks
    start and takes it when it writes the result, so that reading 150-300 packages' metadata and
    asking git (35-50 ms of every cell) overlaps the launcher's start-up (1.5 s and more) instead of
    adding to it. A runner that writes a result without launching anything reads the facts then."""

    def __init__(self, read: Callable[[], dict[str, Any]] = host_facts):
        self._read = read
        self._thread: threading.Thread | None = None
        self._facts: dict[str, Any] | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="host-facts", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._facts = self._read()
        except BaseException as error:  # raised again where the facts are taken, not lost on the thread
            self._error = error

    def get(self) -> dict[str, Any]:
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._facts is not None
        return self._facts


def collect(*, gpu: dict[str, Any], devices: list[str] | None, nodes: int, gpus_total: int, cuda: str | None,
            nccl: str | None, started: str, ended: str, command: str,
            run_gpus: dict[str, list] | None = None,
            environment: dict[str, str] | None = None, host: dict[str, Any] | None = None) -> dict[str, Any]:
    """Provenance of a run. GPU facts (`gpu`, gpu_facts' answer, read once per run) come from NVML
    here for the devices this node gave the cell, else from what the run's own samplers saw on every
    node (multi-node cells under SLURM). `host`: host_facts(), read now if not given."""
    facts = dict(gpu)
    if not facts["gpu_name"] and run_gpus and run_gpus.get("names"):
        facts.update(gpu_name=run_gpus["names"][0], gpu_memory_mib=run_gpus["total"][0])
    facts["gpu_count"] = gpus_total if (facts["gpu_name"] or gpus_total) else 0
    visible = ",".join(devices) if devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    return {
        **facts,
        "nodes": nodes,
        "cuda": cuda,
        "nccl": nccl,
        **(host if host is not None else host_facts()),
        "environment": steering_environment(environment),
        **slurm_facts(),
        "cuda_visible_devices": visible,
        "started": started,
        "ended": ended,
        "command": command,
    }
