"""Launch commands and environments, and the sbatch request each kind of cell makes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainbench.study.grid import Cell
from trainbench.study.params import CellParams
from trainbench.execute.launch import (FIXED_ENVIRONMENT, Rendezvous, launch_environment, multinode_command,
                               node_command, srun_command)

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters


def params(**kw):
    return resolve({"model": "gpt2-tiny", "device": "cuda", **kw})


def test_one_rank_runs_plain_python():
    argv = node_command(params(), Path("c.json"), Path("w"), python="py")
    assert argv == ["py", "-m", "trainbench.execute.worker", "--cell", "c.json", "--work-dir", "w"]


def test_several_ranks_on_one_node_use_torchrun_standalone():
    argv = node_command(params(strategy="ddp", gpus=4), Path("c.json"), Path("w"), python="py")
    assert argv[:5] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]


def test_the_deepspeed_launcher_takes_given_devices_or_a_count():
    p = params(framework="deepspeed", strategy="zero2", gpus=4, launcher="deepspeed")
    given = node_command(p, Path("c.json"), Path("w"), python="py", devices_given=True)
    counted = node_command(p, Path("c.json"), Path("w"), python="py", devices_given=False)
    assert "--num_gpus" not in given  # it would make the launcher ignore CUDA_VISIBLE_DEVICES
    assert counted[3:5] == ["--num_gpus", "4"]
    assert given[-5:] == ["trainbench.execute.worker", "--cell", "c.json", "--work-dir", "w"]


def test_a_multi_node_cell_starts_one_torchrun_per_node_through_srun():
    p = params(framework="deepspeed", strategy="zero3", nodes=8, gpus=64)
    node_argv = multinode_command(p.gpus_per_node, Rendezvous("node001", 29400, "run-1", 8),
                                  ["--cell", "c"], python="py")
    assert node_argv == ["py", "-m", "torch.distributed.run", "--nnodes=8", "--nproc-per-node=8",
                         "--rdzv-backend=c10d", "--rdzv-endpoint=node001:29400", "--rdzv-id=run-1",
                         "-m", "trainbench.execute.worker", "--cell", "c"]
    argv = srun_command(p, node_argv, cpus_per_task=64)
    assert argv[:8] == ["srun", "--nodes=8", "--ntasks=8", "--ntasks-per-node=1", "--cpus-per-task=64",
                        "--gres=gpu:8", "--kill-on-bad-exit=1", "--export=ALL"]
    assert argv[8:] == node_argv


def test_launch_environment_keeps_multicast_off_and_hides_gpus_from_cpu_cells():
    env = launch_environment(params(), cpus_per_rank=4, devices=["2", "3"],
                             base={"TORCH_CUDA_ARCH_LIST": "9.0a"})
    assert {k: env[k] for k in FIXED_ENVIRONMENT} == FIXED_ENVIRONMENT
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["OMP_NUM_THREADS"] == "4"
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0"  # DeepSpeed's op builder cannot parse "9.0a"
    # Snakemake exports the job's threads (one per GPU rank) as OMP_NUM_THREADS: the rank gets its own
    mine = launch_environment(params(), cpus_per_rank=16, devices=["0"],
                              base={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert mine["OMP_NUM_THREADS"] == mine["MKL_NUM_THREADS"] == mine["OPENBLAS_NUM_THREADS"] == "16"
    cpu = launch_environment(params(device="cpu"), cpus_per_rank=1, devices=None, base={})
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["DS_ACCELERATOR"] == "cpu"


def resources(**kw):
    return Cell("s", "c", params(**kw), execution={"cpus_per_rank": 8, "mem_mb_per_rank": 32000,
                                                   "runtime_min": 60, "retries": 1}).resources()


def test_one_node_cells_ask_for_gpus_in_the_plugins_own_job_step():
    r = resources(strategy="ddp", gpus=4)
    assert (r["gpu"], r["nodes"], r["cpus_per_task"], r["mem_mb"], r["runtime"]) == (4, 1, 32, 128000, 60)
    assert r["mpi"] is None and r["tasks"] is None and r["gres"] is None


def test_multi_node_cells_ask_per_node_and_launch_their_own_steps():
    r = resources(framework="deepspeed", strategy="zero3", nodes=8, gpus=64)
    assert r["gpu"] is None and r["gres"] == "gpu:8"
    assert (r["nodes"], r["tasks"], r["cpus_per_task"], r["mem_mb"]) == (8, 8, 64, 256000)
    assert r["mpi"] == "srun" and r["tasks_per_gpu"] == 0


def test_compiled_graphs_are_cached_per_environment_where_the_user_did_not_say(tmp_path):
    env = launch_environment(params(), cpus_per_rank=1, devices=None,
                             base={"TRAINBENCH_CACHE_DIR": str(tmp_path)})
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert cache.parent.parent == tmp_path and cache.name == "inductor"
    assert cache.parent.name.startswith(Path(sys.prefix).name + "-")  # this environment's own
    home = launch_environment(params(), cpus_per_rank=1, devices=None, base={"XDG_CACHE_HOME": str(tmp_path)})
    assert Path(home["TORCHINDUCTOR_CACHE_DIR"]).is_relative_to(tmp_path / "trainbench")
    mine = launch_environment(params(), cpus_per_rank=1, devices=None,
                              base={"TRAINBENCH_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "/x"})
    assert mine["TORCHINDUCTOR_CACHE_DIR"] == "/x"
    # DeepSpeed's op builds too: torch's default folder is shared by every environment, which then
    # rebuild each other's ops
    assert Path(env["TORCH_EXTENSIONS_DIR"]) == cache.parent / "torch_extensions"
    assert launch_environment(params(), cpus_per_rank=1, devices=None,
                              base={"TORCH_EXTENSIONS_DIR": "/ops"})["TORCH_EXTENSIONS_DIR"] == "/ops"


def test_ranks_cache_bytecode_where_the_environment_says_not_to_write_it(tmp_path):
    """The GPU hosts' images set PYTHONDONTWRITEBYTECODE and ship torch without .pyc files, so every
    rank compiled torch's sources again; the ranks keep bytecode in the cache folder instead."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "probe_module.py").write_text("VALUE = 1\n")
    base = {"TRAINBENCH_CACHE_DIR": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1",
            "PATH": os.environ["PATH"]}
    env = launch_environment(params(), cpus_per_rank=1, devices=None, base=base)
    prefix = Path(env["PYTHONPYCACHEPREFIX"])
    assert prefix.parent == Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent and prefix.name == "bytecode"
    subprocess.run([sys.executable, "-c", "import probe_module"], cwd=source, env=env, check=True)
    assert list(prefix.rglob("probe_module.*.pyc")), "the rank wrote no bytecode into the cache"
    assert not (source / "__pycache__").exists()  # the environment's own folders stay as they were
    # nothing changes where bytecode is written anyway, or where the caller chose its folder
    assert "PYTHONPYCACHEPREFIX" not in launch_environment(params(), cpus_per_rank=1, devices=None,
                                                          base={"TRAINBENCH_CACHE_DIR": str(tmp_path)})
    chosen = launch_environment(params(), cpus_per_rank=1, devices=None,
                                base={**base, "PYTHONPYCACHEPREFIX": "/mine"})
    assert chosen["PYTHONPYCACHEPREFIX"] == "/mine" and chosen["PYTHONDONTWRITEBYTECODE"] == "1"
