"""The GPU slot pool on one machine: concurrent cells never share a device; a crash gives slots back."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from trainbench.execute.gpus import NotEnoughGpus, SlotPool, devices_for_cell, machine_devices

from conftest import tiny_study


def _hold(directory: str, count: int, seconds: float, record: str, alone: bool = False) -> None:
    pool = SlotPool([str(i) for i in range(4)], Path(directory), poll_s=0.05)
    with pool.lease(count, alone=alone) as devices:
        start = time.monotonic()
        Path(record + ".held").touch()
        time.sleep(seconds)
        Path(record).write_text(json.dumps({"devices": devices, "start": start, "end": time.monotonic()}))


def max_in_use(intervals) -> int:
    events = sorted([(s, len(d)) for d, s, _ in intervals] + [(e, -len(d)) for d, _, e in intervals],
                    key=lambda x: (x[0], x[1]))
    in_use = peak = 0
    for _, delta in events:
        in_use += delta
        peak = max(peak, in_use)
    return peak


def assert_never_shared(intervals) -> None:
    for i, (devices_a, start_a, end_a) in enumerate(intervals):
        for devices_b, start_b, end_b in intervals[i + 1:]:
            if start_a < end_b and start_b < end_a:
                assert not set(devices_a) & set(devices_b), (devices_a, devices_b)


def test_concurrent_leases_never_share_a_device(tmp_path):
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_hold, args=(str(tmp_path / "pool"), 2, 0.6, str(tmp_path / f"r{i}")))
             for i in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    records = [json.loads((tmp_path / f"r{i}").read_text()) for i in range(6)]
    intervals = [(r["devices"], r["start"], r["end"]) for r in records]
    assert all(len(d) == 2 for d, _, _ in intervals)
    assert_never_shared(intervals)
    assert max_in_use(intervals) == 4  # the pool was full at some point: leases really waited


def test_a_lease_alone_holds_the_machine_while_others_wait_and_waits_for_them(tmp_path):
    """Six 1-GPU leases at once on 4 GPUs, two of them alone (timed cells): an alone lease overlaps no
    other lease, and the others still share the machine among themselves."""
    context = multiprocessing.get_context("spawn")
    alone = {1, 4}
    procs = [context.Process(target=_hold, args=(str(tmp_path / "pool"), 1, 0.5, str(tmp_path / f"r{i}"),
                                                 i in alone)) for i in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    records = {i: json.loads((tmp_path / f"r{i}").read_text()) for i in range(6)}
    for i in alone:
        mine = records[i]
        for j, other in records.items():
            if j != i:
                assert other["end"] <= mine["start"] or mine["end"] <= other["start"], (i, j)
    shared = [(r["devices"], r["start"], r["end"]) for i, r in records.items() if i not in alone]
    assert_never_shared(shared)
    assert max_in_use(shared) > 1  # the shared leases did run side by side


def test_a_crashed_holder_gives_its_slots_back(tmp_path):
    context = multiprocessing.get_context("spawn")
    holder = context.Process(target=_hold, args=(str(tmp_path / "pool"), 4, 600, str(tmp_path / "never")))
    holder.start()
    pool = SlotPool([str(i) for i in range(4)], tmp_path / "pool", poll_s=0.05)
    deadline = time.monotonic() + 30
    while not (tmp_path / "never.held").exists():
        assert time.monotonic() < deadline and holder.is_alive()
        time.sleep(0.05)
    assert pool._try_take(1, alone=False) is None  # all four held
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    with pool.lease(2, alone=True) as devices:  # the host lock came back with the devices
        assert len(devices) == 2


def test_asking_for_more_gpus_than_the_machine_has_is_an_error(tmp_path):
    with pytest.raises(NotEnoughGpus, match="needs 8 GPUs; this machine has 4"):
        with SlotPool([str(i) for i in range(4)], tmp_path).lease(8):
            pass


def test_machine_devices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("TRAINBENCH_FAKE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert machine_devices() == ["2", "3"]
    monkeypatch.setenv("TRAINBENCH_FAKE_GPUS", "4")
    assert machine_devices() == ["0", "1", "2", "3"]


def test_under_slurm_the_allocation_is_used_as_given(monkeypatch, tmp_path):
    monkeypatch.delenv("TRAINBENCH_FAKE_GPUS", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.setenv("TRAINBENCH_GPU_POOL_DIR", str(tmp_path))
    with devices_for_cell(2) as devices:
        assert devices == ["1", "3"]
    assert list(tmp_path.iterdir()) == []  # the pool was not involved


def test_concurrent_gpu_cells_of_a_workflow_get_disjoint_devices(workflow, tmp_path):
    """Four 2-GPU cells started at once on a machine with 4 (faked) GPUs: two wait for slots.

    This machine has no CUDA, so each cell's ranks fail right after their devices are assigned
    (status `failed`); what is checked is which devices each cell was given, and when.
    """
    study = tiny_study(strategy="ddp", device="cuda", gpus=2)
    study["axes"] = {"seed": [0, 1, 2, 3]}
    workflow.write_config({"studies": {"g": study}})
    # timed cells may share the machine: what is checked here is the devices they share it by
    env = {"TRAINBENCH_FAKE_GPUS": "4", "TRAINBENCH_GPU_POOL_DIR": str(tmp_path / "pool"),
           "TRAINBENCH_SHARE_HOST": "1"}
    workflow.snakemake("--cores", "8", "results/tables/g.md", env=env)
    docs = [json.loads(p.read_text()) for p in sorted(workflow.path("results/runs/g").glob("*/metrics.json"))]
    assert len(docs) == 4
    intervals = []
    for doc in docs:
        devices = doc["provenance"]["cuda_visible_devices"].split(",")
        assert len(devices) == 2 and doc["status"] == "failed"
        intervals.append((devices, doc["provenance"]["started"], doc["provenance"]["ended"]))
    assert_never_shared(intervals)
    assert max_in_use(intervals) <= 4
    logs = [p.read_text() for p in workflow.path("results/runs/g").glob("*/log")]
    assert any("waiting for 2 free GPU(s)" in log for log in logs)
    assert all(doc["provenance"]["host_alone"] is False for doc in docs)
    # by default each holds the machine alone: two of the cells again (room for both on the four
    # GPUs), one after the other
    del env["TRAINBENCH_SHARE_HOST"]
    again = sorted(workflow.path("results/runs/g").glob("*/metrics.json"))[:2]
    workflow.snakemake("--cores", "8", "--forcerun", "train_cell",
                       *[str(p.relative_to(workflow.root)) for p in again], env=env)
    docs = [json.loads(p.read_text()) for p in again]
    spans = sorted((doc["provenance"]["started"], doc["provenance"]["ended"]) for doc in docs)
    assert all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:])), spans
    assert all(doc["provenance"]["host_alone"] is True for doc in docs)
    logs = [p.read_text() for p in workflow.path("results/runs/g").glob("*/log")]
    assert any("waiting for 2 free GPU(s) and the machine to itself" in log for log in logs)
