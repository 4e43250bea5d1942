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
from pathlib import Path

import pytest

from trainbench.contract import history as history_lines
from trainbench.execute.cellrun import classify
from trainbench.study.config import load_config
from trainbench.study.params import CellParams
from trainbench.execute.slurm import probe
from trainbench.execute.launch import (Rendezvous, launch_environment, multinode_command, srun_command,
                                      worker_args)

from conftest import FAST_TIMING, PROJECT_CONFIG, REPO, tiny_study
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
# CI: a cluster without job accounting is a failure of the tests that read sacct, not a reason to skip
ACCOUNTING_REQUIRED = os.environ.get("TRAINBENCH_REQUIRE_ACCOUNTING") == "1"


def with_accounting() -> bool:
    """Whether sacct answers here; where CI requires it, it must."""
    works = probe("sacct").works
    assert works or not ACCOUNTING_REQUIRED, ("sacct cannot answer: "
                                               "ACCOUNTING=1 tools/local-slurm-cluster.sh start")
    return works
pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(not REQUIRED and not slurm_up(), reason="no SLURM cluster: "
                                 "sudo tools/local-slurm-cluster.sh install && "
                                 "sudo tools/local-slurm-cluster.sh start "
                                 "(or name a partition of yours in TRAINBENCH_SLURM_PARTITION)")]

# No --slurm-status-command: the workflow checks the one the plugin would use and switches to squeue
# where sacct cannot answer (the test cluster keeps no accounting). 1 s, the least the plugin takes: the
# profile's default first status check (40 s) is for real clusters' sake and would make these tests wait.
# It is also the plugin's interval after a check that saw a job finish (each check without one adds
# 10 s), and how long Snakemake waits for its status loop when it ends: 4 s less a run than with 5 s.
PROFILE = ("--profile", "profiles/slurm", "--slurm-init-seconds-before-status-checks", "1")
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
    if not probe("sacct").works:  # the workflow said so and followed the jobs with squeue (and below)
        assert "following jobs with squeue instead" in run.stdout + run.stderr
    print(f"smoke study through SLURM: {time.monotonic() - started:.1f} s; "
          f"locally: {smoke_run_locally[1]:.1f} s")
    smoke = load_config(PROJECT_CONFIG).study("smoke")
    jobs = set()
    for cell in smoke.cells:
        doc = json.loads(workflow.path(cell.target).read_text())
        assert doc["status"] == "ok", (cell.cell_id, doc["reason"])
        assert doc["provenance"]["slurm_job_id"] and doc["provenance"]["slurm_nodelist"]
        jobs.add(doc["provenance"]["slurm_job_id"])
    assert len(jobs) == len(smoke.cells)  # every cell its own SLURM job
    if with_accounting():  # the plugin's efficiency report, summarised by study
        assert len(list(workflow.path(".snakemake/slurm_efficiency").glob("efficiency_report_*.csv"))) == 1
        cost = subprocess.run([sys.executable, "-m", "trainbench", "cost", "smoke"], cwd=workflow.root,
                              capture_output=True, text=True, timeout=120)
        assert cost.returncode == 0, cost.stderr
        assert f"smoke: {len(smoke.cells)} cells; CPU efficiency median" in cost.stdout, cost.stdout

    def shape(table: str):
        rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
        width = len(smoke.id_keys)  # the cell's keys, then its status (how noisy its timing was may differ)
        # the rows in any order: cells of equal size are ordered by their measured throughput
        return len(rows[0]), rows[0], sorted(row[:width] + [row[width].split(",")[0]] for row in rows[2:])

    local = smoke_run_locally[0].path("results/tables/smoke.all.md").read_text()
    assert shape(workflow.path("results/tables/smoke.all.md").read_text()) == shape(local)


def test_two_gpu_cells_get_two_devices_each_and_never_more_than_four_at_once(workflow):
    """Four cells of 2 GPUs, all submitted at once, on a node of 4: SLURM runs two at a time with
    disjoint devices.

    The GPUs are character devices, so each cell's ranks fail once they try CUDA (status
    `failed`); what is checked is what SLURM gave each cell, and when.
    """
    study = tiny_study(strategy="ddp", device="cuda", gpus=2)
    study["axes"] = {"seed": list(range(4))}
    workflow.write_config({"studies": {"g": study}})
    workflow.snakemake("results/tables/g.md", *PROFILE, "-j", "4", *ON_PARTITION, timeout=900)
    intervals, jobs = [], set()
    for path in sorted(workflow.path("results/runs/g").glob("*/metrics.json")):
        doc = json.loads(path.read_text())
        prov = doc["provenance"]
        devices = prov["cuda_visible_devices"].split(",")
        assert len(devices) == 2 and prov["slurm_job_gpus"]
        intervals.append((devices, prov["started"], prov["ended"]))
        jobs.add(prov["slurm_job_id"])
    assert len(intervals) == 4 and len(jobs) == 4
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
    study = load_config(PROJECT_CONFIG).study("zero3_pipeline")
    eight = next(c for c in study.cells if c.params.nodes == 8)
    sixteen = next(c for c in study.cells if c.params.nodes == 16)
    # targets before --default-resources, which takes every word after it
    # and a bandwidth table across 2 nodes of 8 GPUs (rule commbench_nodes), asked for as such a cell
    targets = [eight.target, sixteen.target, "results/comm/h200-n2x8.json"]
    with pending_requests(workflow, [*targets, *PROFILE, "-j", "4", "--default-resources",
                                     f"slurm_partition={PENDING_PARTITION}"], jobs=3) as requests:
        for nodes, cell in ((8, eight), (16, sixteen)):
            r = requests[nodes]
            assert r["NumTasks"] == str(nodes) and r["CPUs/Task"] == "64"
            assert r["TresPerNode"] == "gres:gpu:8"
            assert r["MinMemoryNode"] == f"{cell.resources()['mem_mb']}M"
            assert r["TimeLimit"] == "02:00:00" and r["Partition"] == PENDING_PARTITION
        table = requests[2]
        assert table["NumTasks"] == "2" and table["TresPerNode"] == "gres:gpu:8"
        assert table["CPUs/Task"] == "32"


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


def test_commbench_across_nodes_starts_its_ranks_with_srun_in_its_allocation(tmp_path):
    """`trainbench commbench --nodes` inside an allocation (one node here, the cluster's): srun starts a
    launcher on each node of it, whose gloo ranks meet in the rendezvous on the batch host, as a
    multi-node cell's do. (The rule's request for nodes: the test above.)"""
    out = tmp_path / "cpu-n1x2.json"
    partition = ["-p", cluster_partition()] if cluster_partition() else []
    done = subprocess.run(["salloc", "--nodes=1", "--cpus-per-task=2", *partition, sys.executable, "-m",
                           "trainbench", "commbench", "--nodes", "1", "--ranks", "2", "--device", "cpu",
                           "--out", str(out), "--max-bytes", "64K", "--repeats", "2", "--iters", "5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["interconnect"] == "cpu-n1x2" and doc["ranks"] == 2 and doc["nodes"] == 1
    assert {row["collective"] for row in doc["rows"]} >= {"all_reduce", "all_gather", "send_recv"}
    said = doc["provenance"]
    assert said["slurm_job_id"] and said["slurm_step_id"].isdigit(), said  # srun's step, not the batch
    assert said["hosts"] == [socket.gethostname()]


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


def _sacct_records(job: str) -> list[str]:
    """Every start of a job as accounting kept it (a requeued job has one per start), as 'STATE'."""
    out = subprocess.run(["sacct", "-j", job, "-X", "--duplicates", "-n", "-P", "-o", "State"],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.split() if out.returncode == 0 else []


def test_a_preempted_cell_is_requeued_by_slurm_and_writes_one_result(workflow):
    """The profile submits requeueable jobs: a cell's job requeued while its cell trains (what a
    preemption or a node failure does) starts again under its job id; the stopped run writes
    nothing, the requeued one writes the cell's only result and history line."""
    if not with_accounting():
        pytest.skip("the cluster keeps no accounting: sacct cannot show the requeue")
    study = tiny_study(strategy="single")
    study["include"] = [{}]
    # timed until the time cap: long enough to be caught training (the interval never reaches 0.01%)
    study["timing"] = {"target_ci": 0.0001, "max_timed_s": 6, "min_window_s": 0.2}
    workflow.write_config({"studies": {"r": study}})
    cell = load_config(workflow.path("config.yaml")).study("r").cells[0]
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", cell.target, *PROFILE, "-j", "1",
                             *ON_PARTITION], cwd=workflow.root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        started = workflow.path(cell.target).parent / ".work" / "cell.json"  # the cell runner is at work
        deadline = time.monotonic() + 300
        while not started.exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.5)
        queued = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], capture_output=True,
                                text=True).stdout.splitlines()
        job = [line.split()[0] for line in queued if "rule_train_cell" in line]  # its comment: the rule
        assert len(job) == 1, queued
        requeue = subprocess.run(["scontrol", "requeue", job[0]], capture_output=True, text=True)
        assert requeue.returncode == 0, requeue.stderr
        # SLURM holds a requeued job for two minutes before it may start again (once back in the
        # queue, pending); the test does not wait for that
        while subprocess.run(["squeue", "-h", "-j", job[0], "-o", "%T"], capture_output=True,
                             text=True).stdout.strip() != "PENDING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        subprocess.run(["scontrol", "update", f"jobid={job[0]}", "StartTime=now"], check=True)
        output = proc.communicate(timeout=600)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    doc = json.loads(workflow.path(cell.target).read_text())
    assert doc["status"] == "ok"
    assert doc["provenance"]["slurm_job_id"] == job[0] and doc["provenance"]["slurm_restart_count"] == 1
    kept = history_lines.runs(history_lines.history_file(workflow.path(cell.target)))
    assert len(kept) == 1 and kept[0]["provenance"]["slurm_restart_count"] == 1
    assert output.count("has been submitted with SLURM jobid") == 1  # Snakemake did not resubmit it
    assert _sacct_records(job[0]) == ["REQUEUED", "COMPLETED"]


def test_on_a_cluster_without_accounting_the_jobs_are_followed_with_squeue(workflow, tmp_path):
    """The cluster's configuration as a site without job accounting has it (a copy, read by the client
    commands through SLURM_CONF): sacct fails for real, and the workflow follows its job with squeue."""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    lines = [line for line in conf.read_text().splitlines()
             if not line.startswith(("AccountingStorage", "JobAcctGather"))]
    (tmp_path / "conf").mkdir()
    lines.append("AccountingStorageType=accounting_storage/none")
    (tmp_path / "conf/slurm.conf").write_text("\n".join(lines) + "\n")
    shutil.copy(conf.parent / "gres.conf", tmp_path / "conf/gres.conf")
    env = {"SLURM_CONF": str(tmp_path / "conf/slurm.conf")}
    assert "accounting storage is disabled" in subprocess.run(
        ["sacct", "-n"], capture_output=True, text=True, env={**os.environ, **env}).stderr.lower()
    study = tiny_study(strategy="single")
    study["include"] = [{}]
    workflow.write_config({"studies": {"n": study}})
    cell = load_config(workflow.path("config.yaml")).study("n").cells[0]
    run = workflow.snakemake(cell.target, *PROFILE, "-j", "1", *ON_PARTITION, env=env, timeout=600)
    assert "following jobs with squeue instead" in run.stdout + run.stderr
    assert json.loads(workflow.path(cell.target).read_text())["status"] == "ok"


def test_a_study_submitted_as_job_arrays_takes_one_sbatch_for_its_cells(workflow):
    """execution.slurm_array: the study's cells go through a rule of its own, which the SLURM plugin
    submits as one job array (--slurm-array-jobs train_<study>): three cells, one sbatch, three tasks,
    each with the largest memory any cell asks for."""
    study = tiny_study(strategy="single")
    study["axes"] = {"seed": [0, 1, 2]}
    study["execution"].update(slurm_array=True)
    study["execution_overrides"] = [{"when": {"seed": 2}, "set": {"mem_mb_per_rank": 1500}}]
    workflow.write_config({"studies": {"a": study}})
    partition = ("--set-resources", f"train_a:slurm_partition={cluster_partition()}") if ON_PARTITION else ()
    run = workflow.snakemake("results/tables/a.md", *PROFILE, "-j", "3", "--slurm-array-jobs", "train_a",
                             *partition, timeout=900)
    docs = [json.loads(p.read_text()) for p in sorted(workflow.path("results/runs/a").glob("*/metrics.json"))]
    assert len(docs) == 3 and all(d["status"] == "ok" for d in docs)
    arrays = {d["provenance"]["slurm_array_job_id"] for d in docs}
    assert len(arrays) == 1, run.stdout[-3000:]  # one sbatch for the three cells
    assert sorted(int(d["provenance"]["slurm_array_task_id"]) for d in docs) == [1, 2, 3]
    if with_accounting():  # every task asks for what the largest cell asks (the others, 1000 MB)
        asked = subprocess.run(["sacct", "-j", arrays.pop(), "-X", "-n", "-P", "-o", "ReqMem"],
                               capture_output=True, text=True).stdout.split()
        assert len(asked) == 3 and len(set(asked)) == 1 and 1500 <= int(asked[0].rstrip("M")) < 1600


def test_a_rank_killed_in_a_slurm_job_ends_the_job_and_the_next_run_makes_one_result(workflow):
    """A rank of a cell's SLURM job killed while it trains: the job ends within seconds with the cell's
    result saying which rank and how (the infrastructure's failure), no process of it is left on the
    node, and the next run runs the cell again: one result remains, the failure in its history."""
    from trainbench.execute import watch

    # windows of 100 steps (a tenth of a second or so), timed until the cap: 300 s, 1 s in the rerun
    study = tiny_study(strategy="ddp", gpus=2, timed_steps=600)
    study["include"] = [{}]
    study["timing"] = {"target_ci": 0.0001, "max_timed_s": 300, "min_window_s": 0.05}
    workflow.write_config({"studies": {"k": study}})
    cell = load_config(workflow.path("config.yaml")).study("k").cells[0]
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", cell.target, *PROFILE, "-j", "1",
                             *ON_PARTITION], cwd=workflow.root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    progress = workflow.path(cell.target).parent / ".work" / watch.PROGRESS_DIR / "rank1"
    try:
        deadline = time.monotonic() + 300
        while (seen := watch.Progress.read(progress)) is None or seen.step < 5:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        os.kill(seen.pid, signal.SIGKILL)
        killed = time.monotonic()
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(workflow.path(cell.target).read_text())
    assert doc["status"] == "failed" and doc.get("failure") == "infrastructure", (doc["reason"],
                                                                                  output[-3000:])
    assert "rank 1 on" in doc["reason"] and "SIGKILL" in doc["reason"] and doc["provenance"]["slurm_job_id"]
    assert time.monotonic() - killed < 120  # the job's end included: not its time limit
    assert not [p for p in psutil_worker_processes(workflow.root)]
    study["timing"] = {**study["timing"], "max_timed_s": 1}  # the rerun need not train for long
    workflow.write_config({"studies": {"k": study}})
    workflow.snakemake(cell.target, *PROFILE, "-j", "1", *ON_PARTITION, timeout=600)
    doc = json.loads(workflow.path(cell.target).read_text())
    assert doc["status"] == "ok"
    assert sorted(workflow.path(cell.target).parent.glob("metrics.json*")) == [
        workflow.path(cell.target), workflow.path(cell.target + ".retried")]
    kept = history_lines.runs(history_lines.history_file(workflow.path(cell.target)))
    assert [run["status"] for run in kept] == ["failed", "ok"]


def psutil_worker_processes(root: Path) -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if "trainbench.execute.worker" in " ".join(p.info["cmdline"] or [])
            and str(root) in " ".join(p.info["cmdline"] or [])]
