"""Against a real SLURM cluster: tools/local-slurm-cluster.sh start (CI does; see .ci/run).

One node with 8 CPUs and 4 GPUs declared as GRES (character devices on a machine without GPUs), and
16 nodes that never come up in partition `far`, where multi-node submissions pend for inspection.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from trainbench.execute.cellrun import classify
from trainbench.study.config import load_config
from trainbench.study.params import CellParams
from trainbench.execute.slurm import probe
from trainbench.execute.launch import (Rendezvous, launch_environment, multinode_command, srun_command,
                                      worker_args)

from conftest import FAST_TIMING, REPO, tiny_study
from test_gpus import assert_never_shared, max_in_use

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters


def _sinfo(*args: str) -> list[str]:
    if not shutil.which("sinfo"):
        return []
    try:
        out = subprocess.run(["sinfo", "-h", *args], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return []
    return out.stdout.split() if out.returncode == 0 else []


def cluster_partition() -> str | None:
    """The partition the tests submit to: TRAINBENCH_SLURM_PARTITION, else the cluster's default."""
    named = os.environ.get("TRAINBENCH_SLURM_PARTITION")
    if named:
        return named
    default = [p for p in _sinfo("-o", "%P") if p.endswith("*")]
    return default[0].rstrip("*") if default else None


def slurm_up() -> bool:
    partition = cluster_partition()
    return partition is not None and any(
        s.startswith(("idle", "mix", "alloc")) for s in _sinfo("-p", partition, "-o", "%t"))


REQUIRED = os.environ.get("TRAINBENCH_REQUIRE_SLURM") == "1"  # CI: a missing cluster is a failure
pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(not REQUIRED and not slurm_up(), reason="no SLURM cluster: "
                                 "sudo tools/local-slurm-cluster.sh install && "
                                 "sudo tools/local-slurm-cluster.sh start "
                                 "(or name a partition of yours in TRAINBENCH_SLURM_PARTITION)")]

# No --slurm-status-command: the workflow checks the one the plugin would use and switches to squeue
# where sacct cannot answer (the test cluster keeps no accounting). 5 s: the profile's default first
# status check (40 s) is for real clusters' sake and would make these tests wait.
PROFILE = ("--profile", "profiles/slurm", "--slurm-init-seconds-before-status-checks", "5")
# the cells' jobs go to the tests' partition (multi-node requests go to PENDING_PARTITION instead)
ON_PARTITION = (("--set-resources", f"train_cell:slurm_partition={cluster_partition()}")
                if cluster_partition() else ())
# a partition whose nodes never come up: multi-node jobs pend there so their requests can be read
PENDING_PARTITION = os.environ.get("TRAINBENCH_SLURM_PENDING_PARTITION", "far")


def test_cluster_is_up():
    assert slurm_up(), "tools/local-slurm-cluster.sh start"


def test_the_smoke_study_through_slurm_is_one_job_per_cell_and_the_local_table_shape(workflow,
                                                                                     smoke_run_locally):
    workflow.write_config((REPO / "config.yaml").read_text())
    started = time.monotonic()
    run = workflow.snakemake("results/tables/smoke.md", *PROFILE, "-j", "8", *ON_PARTITION, timeout=1800)
    if not probe("sacct").works:  # the workflow said so and followed the jobs with squeue
        assert "following jobs with squeue instead" in run.stdout + run.stderr
    print(f"smoke study through SLURM: {time.monotonic() - started:.1f} s; "
          f"locally: {smoke_run_locally[1]:.1f} s")
    smoke = load_config(REPO / "config.yaml").study("smoke")
    jobs = set()
    for cell in smoke.cells:
        doc = json.loads(workflow.path(cell.target).read_text())
        assert doc["status"] == "ok", (cell.cell_id, doc["reason"])
        assert doc["provenance"]["slurm_job_id"] and doc["provenance"]["slurm_nodelist"]
        jobs.add(doc["provenance"]["slurm_job_id"])
    assert len(jobs) == len(smoke.cells)  # every cell its own SLURM job

    def shape(table: str):
        rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
        width = len(smoke.id_keys)  # the cell's keys, then its status (how noisy its timing was may differ)
        return len(rows[0]), rows[0], [row[:width] + [row[width].split(",")[0]] for row in rows[1:]]

    local = smoke_run_locally[0].path("results/tables/smoke.md").read_text()
    assert shape(workflow.path("results/tables/smoke.md").read_text()) == shape(local)


def test_two_gpu_cells_get_two_devices_each_and_never_more_than_four_at_once(workflow):
    """Six cells of 2 GPUs on a node of 4: SLURM runs two at a time with disjoint devices.

    The GPUs are character devices, so each cell's ranks fail once they try CUDA (status
    `failed`); what is checked is what SLURM gave each cell, and when.
    """
    study = tiny_study(strategy="ddp", device="cuda", gpus=2)
    study["axes"] = {"seed": list(range(6))}
    workflow.write_config({"studies": {"g": study}})
    workflow.snakemake("results/tables/g.md", *PROFILE, "-j", "6", *ON_PARTITION, timeout=900)
    intervals, jobs = [], set()
    for path in sorted(workflow.path("results/runs/g").glob("*/metrics.json")):
        doc = json.loads(path.read_text())
        prov = doc["provenance"]
        devices = prov["cuda_visible_devices"].split(",")
        assert len(devices) == 2 and prov["slurm_job_gpus"]
        intervals.append((devices, prov["started"], prov["ended"]))
        jobs.add(prov["slurm_job_id"])
    assert len(intervals) == 6 and len(jobs) == 6
    assert_never_shared(intervals)
    assert max_in_use(intervals) <= 4


@contextlib.contextmanager
def pending_requests(workflow, snakemake_args: list[str], jobs: int):
    """Run Snakemake with `snakemake_args` until `jobs` jobs pend in PENDING_PARTITION, and give each
    job's request as `scontrol show job` has it, by node count; then stop Snakemake and cancel them."""
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *snakemake_args], cwd=workflow.root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            queued = subprocess.run(["squeue", "-h", "-p", PENDING_PARTITION, "-o", "%i"],
                                    capture_output=True, text=True).stdout.split()
            if len(queued) == jobs:
                break
            assert time.monotonic() < deadline and proc.poll() is None, (
                proc.communicate()[0] if proc.poll() else "")
            time.sleep(1)
        requests = {}
        for job in queued:
            text = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
            fields = dict(item.split("=", 1) for item in text.split() if "=" in item)
            requests[int(fields["NumNodes"].split("-")[0])] = fields
        yield requests
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run(["scancel", "-p", PENDING_PARTITION], check=False)


def test_multi_node_cells_reach_slurm_as_one_task_per_node_with_their_gpus(workflow):
    if not _sinfo("-p", PENDING_PARTITION, "-o", "%P"):
        pytest.skip(f"no partition {PENDING_PARTITION!r} of nodes that never come up "
                    f"(tools/local-slurm-cluster.sh "
                    f"makes one; or name one in TRAINBENCH_SLURM_PENDING_PARTITION)")
    workflow.write_config((REPO / "config.yaml").read_text())
    study = load_config(REPO / "config.yaml").study("zero3_pipeline")
    eight = next(c for c in study.cells if c.params.nodes == 8)
    sixteen = next(c for c in study.cells if c.params.nodes == 16)
    # targets before --default-resources, which takes every word after it
    with pending_requests(workflow, [eight.target, sixteen.target, *PROFILE, "-j", "4", "--default-resources",
                                     f"slurm_partition={PENDING_PARTITION}"], jobs=2) as requests:
        for nodes, cell in ((8, eight), (16, sixteen)):
            r = requests[nodes]
            assert r["NumTasks"] == str(nodes) and r["CPUs/Task"] == "64"
            assert r["TresPerNode"] == "gres:gpu:8"
            assert r["MinMemoryNode"] == f"{cell.resources()['mem_mb']}M"
            assert r["TimeLimit"] == "02:00:00" and r["Partition"] == PENDING_PARTITION


def test_the_srun_fan_out_starts_a_node_that_joins_its_rendezvous(tmp_path):
    # A one-node allocation, so it runs here; with N nodes srun starts the same argv on each.
    params = resolve({"model": "gpt2-tiny", "device": "cpu", "strategy": "ddp", "gpus": 2, "seq_len": 16,
                      "warmup_steps": 1, "timed_steps": 2})
    work = tmp_path / ".work"
    work.mkdir()
    cell_file = work / "cell.json"
    cell_file.write_text(json.dumps({"study": "t", "cell_id": "c", "params": params.as_dict(),
                                     "timing": FAST_TIMING}))
    rendezvous = Rendezvous(socket.gethostname(), 29555, "srun-test", 1)
    argv = srun_command(params, multinode_command(2, rendezvous, worker_args(cell_file, work)),
                        cpus_per_task=2)
    env = launch_environment(params, cpus_per_rank=1, devices=None)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outcome = classify(work, result.returncode, False, 300, warmup_steps=1)
    assert outcome.status == "ok"
    assert len(outcome.result["ranks"]) == 2


def test_a_study_names_partition_account_gpu_model_and_constraint_and_sbatch_gets_them(workflow):
    """execution's slurm_partition, slurm_account, gpu_model and constraint reach each cell's job: a
    one-node cell's GPUs by model per job, a multi-node cell's per node (pending in the partition of
    nodes that never come up, whose GPUs are h100s with the nvlink feature)."""
    if not _sinfo("-p", PENDING_PARTITION, "-o", "%P"):
        pytest.skip(f"no partition {PENDING_PARTITION!r} of nodes that never come up")
    study = tiny_study(strategy="ddp", device="cuda")
    study["include"] = [{"gpus": 2}, {"gpus": 16, "nodes": 2}]
    study["execution"].update(slurm_partition=PENDING_PARTITION, slurm_account="bench",
                              gpu_model="h100", constraint="nvlink")
    workflow.write_config({"studies": {"c": study}})
    cells = load_config(workflow.path("config.yaml")).study("c").cells
    with pending_requests(workflow, [*(c.target for c in cells), *PROFILE, "-j", "4"], jobs=2) as requests:
        for fields in requests.values():
            assert fields["Partition"] == PENDING_PARTITION and fields["Account"] == "bench"
            assert fields["Features"] == "nvlink"
        assert requests[1]["TresPerJob"] == "gres:gpu:h100:2"
        assert requests[2]["TresPerNode"] == "gres:gpu:h100:8"
