"""The command and environment that start a cell's ranks on one node.

plain python for one rank; `torchrun --standalone` for several on one node; the DeepSpeed launcher
where the cell asks for it. A multi-node cell starts the same torchrun on every node, joining a
c10d rendezvous on the first node (`multinode_command`), through srun inside its SLURM allocation
(`srun_command`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from trainbench.study.params import CellParams


WORKER_MODULE = "trainbench.execute.worker"

# Settings every launched rank gets, whatever the caller's environment says.
FIXED_ENVIRONMENT = {
    # NVLink SHARP multicast is off on the GPU hosts: NCCL and torch's symmetric memory must not try it.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    # CUDA's default order is "fastest first"; PCI order makes device ids agree with NVML and nvidia-smi.
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of a multi-node cell meet: the first node's address, a port, a job-unique id."""

    host: str
    port: int
    run_id: str
    nodes: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_args(cell_file: Path, work_dir: Path) -> list[str]:
    return ["--cell", str(cell_file), "--work-dir", str(work_dir)]


def node_command(params: CellParams, cell_file: Path, work_dir: Path, *, python: str = sys.executable,
                 devices_given: bool = False, rendezvous: Rendezvous | None = None) -> list[str]:
    """argv that starts this node's ranks of the cell."""
    ranks = params.gpus_per_node
    args = worker_args(cell_file, work_dir)
    launcher = params.launcher
    if launcher == "python":
        return [python, "-m", WORKER_MODULE, *args]
    if launcher == "deepspeed" and rendezvous is None:
        # Given CUDA_VISIBLE_DEVICES, the DeepSpeed launcher takes exactly those devices; naming a count
        # as well would make it ignore them and start from device 0.
        count = [] if devices_given else ["--num_gpus", str(ranks)]
        return [python, "-m", "deepspeed.launcher.runner", *count, "--master_port", str(free_port()),
                "--module", WORKER_MODULE, *args]
    if rendezvous is None:
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                *launcher_logs(work_dir), "-m", WORKER_MODULE, *args]
    return multinode_command(ranks, rendezvous, args, python=python, work_dir=work_dir)


LAUNCHER_LOGS = "launcher"  # torchrun's --log-dir under an attempt's work folder: a folder per rank


def launcher_logs(work_dir: Path | None) -> list[str]:
    """torchrun's copy of each rank's output in a file of its own, as well as on the console (each line
    then prefixed with its local rank): the last lines of a rank that dies say where it was."""
    if work_dir is None:
        return []
    return ["--tee", "3", "--log-dir", str(work_dir / LAUNCHER_LOGS)]


def multinode_command(ranks_per_node: int, rendezvous: Rendezvous, args: list[str], *,
                      python: str = sys.executable, work_dir: Path | None = None,
                      module: str = WORKER_MODULE) -> list[str]:
    """One node's torchrun in a multi-node c10d rendezvous: the same argv on every node. The node
    whose hostname is the endpoint's hosts the rendezvous store; c10d numbers the nodes. `module`: what
    each rank runs (a cell's worker, or commbench's)."""
    return [python, "-m", "torch.distributed.run", f"--nnodes={rendezvous.nodes}",
            f"--nproc-per-node={ranks_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rendezvous.host}:{rendezvous.port}", f"--rdzv-id={rendezvous.run_id}",
            *launcher_logs(work_dir), "-m", module, *args]


def srun_command(params: CellParams, node_argv: list[str], *, cpus_per_task: int) -> list[str]:
    """Start a cell's `node_argv` once on every node of its SLURM allocation (srun_fan_out)."""
    return srun_fan_out(params.nodes, params.gpus_per_node if params.device == "cuda" else 0, node_argv,
                        cpus_per_task=cpus_per_task)


def srun_fan_out(nodes: int, gpus_per_node: int, node_argv: list[str], *, cpus_per_task: int) -> list[str]:
    """Start `node_argv` once on every node of the SLURM allocation (run from the batch host).

    One task per node with the node's GPUs (none for CPU ranks) and cores; --kill-on-bad-exit stops
    every node when one fails, as torchrun does for the ranks of one node.
    """
    gres = [f"--gres=gpu:{gpus_per_node}"] if gpus_per_node else []
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cpus_per_task}", *gres, "--kill-on-bad-exit=1", "--export=ALL", *node_argv]


# The variables by which OpenMP and the math libraries size their thread pools (Snakemake sets each
# to the job's threads)
CPU_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# Where compiled work is kept between cells (see cache_environment); the default is under ~/.cache.
CACHE_DIR_ENV = "TRAINBENCH_CACHE_DIR"


def cache_environment(base: Mapping[str, str]) -> dict[str, str]:
    """Where the ranks keep work that every cell would otherwise redo: one folder per Python
    environment, shared by every cell and rank that runs in it.

    - torch.compile's compiled graphs and kernels (inductor's FX-graph and autograd caches).
      Inductor's default is /tmp, which a compute node or a freshly started host does not keep, so each
      cell there compiles again (20-35 s of a GPT-2 cell's 40-60 s on an H200). The cache writes
      atomically and locks while compiling: concurrent ranks share it safely. A
      TORCHINDUCTOR_CACHE_DIR the caller set is left alone.
    - Python's bytecode, where the environment says not to write it (PYTHONDONTWRITEBYTECODE, as
      the GPU hosts' images do, whose torch has no .pyc files): every rank then compiles torch's
      sources again, 6-7 s of each GPT-2 cell's set-up on an H200 (trainbench/calibration.yaml).
      The bytecode goes to the cache folder (PYTHONPYCACHEPREFIX), not into the environment, which
      is what not writing it was for; Python writes each file atomically. A PYTHONPYCACHEPREFIX the
      caller set is left alone.

    - DeepSpeed's op builds (CPU Adam; on CPU ranks its shared-memory collectives). torch's default,
      ~/.cache/torch_extensions, is one folder per op name and Python version for every environment:
      two environments (two clones' venvs) rebuild each other's op whenever they alternate, since
      the build names the environment's headers (deepspeed_shm_comm: 27 s each time on a 2-core
      box). A TORCH_EXTENSIONS_DIR the caller set is left alone (tools/gpu-host-run.sh sets one).

    Triton's kernels (~/.triton) already persist by default."""
    root = base.get(CACHE_DIR_ENV) or str(Path(base.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                          / "trainbench")
    prefix = sys.prefix  # one per environment: its torch and Triton versions
    folder = Path(root) / f"{Path(prefix).name}-{hashlib.sha256(prefix.encode()).hexdigest()[:8]}"
    env = {}
    if not base.get("TORCHINDUCTOR_CACHE_DIR"):
        env["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    if not base.get("TORCH_EXTENSIONS_DIR"):
        env["TORCH_EXTENSIONS_DIR"] = str(folder / "torch_extensions")
    if base.get("PYTHONDONTWRITEBYTECODE") and not base.get("PYTHONPYCACHEPREFIX"):
        env["PYTHONDONTWRITEBYTECODE"] = ""  # empty is unset to Python
        env["PYTHONPYCACHEPREFIX"] = str(folder / "bytecode")
    return env


def launch_environment(params: CellParams, *, cpus_per_rank: int, devices: list[str] | None,
                       base: Mapping[str, str] = os.environ) -> dict[str, str]:
    env = dict(base)
    env.update(FIXED_ENVIRONMENT)
    env.update(cache_environment(base))
    # The ranks use the tools of the environment they run in (ninja for DeepSpeed's op builds, its
    # console scripts) whatever PATH the caller had: a build made with another ninja is rebuilt.
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep)
                                              if p and p != bin_dir)])
    # Each rank's CPU threads (torch's intra-op pool, DeepSpeed's CPU Adam, OpenMP) are the cell's
    # cpus_per_rank, whatever the caller's environment says: Snakemake exports OMP_NUM_THREADS as the
    # job's threads, which for a GPU cell is one per rank, so an offloaded optimizer stepped on one
    # thread where it was given 8-16 (docs/measurement.md, "CPU threads of a rank").
    for variable in CPU_THREAD_VARIABLES:
        env[variable] = str(cpus_per_rank)
    if params.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU cell must not touch (or be measured on) a GPU
        env["DS_ACCELERATOR"] = "cpu"
    elif devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if params.deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for deterministic results
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    if arch and "a" in arch:
        # DeepSpeed's op builder parses arch numbers with int(): "9.0a" breaks FusedAdam's compile.
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(a.rstrip("a") for a in arch.replace(" ", ";").split(";") if a)
    return env
