"""`trainbench commbench` and its rule: the collectives timed through torch.distributed on real ranks
(gloo on CPU here; NCCL on GPUs), written as nccl-tests reports them."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from trainbench import commbench
from trainbench.errors import UsageError

from conftest import REPO, Workflow, tiny_study


@pytest.fixture(scope="module")
def cpu_table(tmp_path_factory):
    """What `snakemake results/comm/cpu-x2.json` writes: two gloo ranks, 1 KiB to 4 MiB."""
    flow = Workflow(tmp_path_factory.mktemp("commbench"))
    flow.write_config({"studies": {"t": {**tiny_study(), "include": [{}]}}})  # the rule reads no study
    flow.snakemake("results/comm/cpu-x2.json")
    return flow, json.loads(flow.path("results/comm/cpu-x2.json").read_text())


def test_every_collective_is_timed_at_every_size_with_nccl_tests_bandwidths(cpu_table):
    _, doc = cpu_table
    assert doc["ranks"] == 2 and doc["backend"] == "gloo" and doc["interconnect"] == "cpu-x2"
    sizes = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22]
    measured = {(row["collective"], row["size_bytes"]) for row in doc["rows"]}
    missing = {(c, s) for c in commbench.COLLECTIVES for s in sizes} - measured
    not_measured = {(row["collective"], row["size_bytes"]) for row in doc["not_measured"]}
    assert missing == not_measured, doc["not_measured"]  # nothing left out without a reason
    assert {c for c, _ in measured} >= {"all_reduce", "all_gather", "broadcast", "send_recv"}
    for row in doc["rows"]:
        assert row["time_us_min"] <= row["time_us"] <= row["time_us_max"]
        algbw = row["size_bytes"] / row["time_us"] / 1e3
        assert row["algbw_gb_s"] == pytest.approx(algbw, rel=1e-2, abs=1e-4)
        # two ranks: an all-reduce's bus moves 2(n-1)/n = 1 x the buffer, an all-gather's (n-1)/n = 1/2
        factor = {"all_reduce": 1.0, "broadcast": 1.0, "send_recv": 1.0}.get(row["collective"], 0.5)
        assert row["busbw_gb_s"] == pytest.approx(row["algbw_gb_s"] * factor, rel=1e-2, abs=1e-4)
    assert doc["provenance"]["host_id"] and doc["provenance"]["versions"]["torch"]


def test_the_csv_beside_it_holds_the_same_rows(cpu_table):
    flow, doc = cpu_table
    with open(flow.path("results/comm/cpu-x2.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["collective"], int(r["size_bytes"]), float(r["busbw_gb_s"])) for r in rows] == [
        (r["collective"], r["size_bytes"], r["busbw_gb_s"]) for r in doc["rows"]]
    assert "commbench: 2 ranks on 1 node(s), gloo" in flow.path("results/comm/cpu-x2.log").read_text()


def test_bus_factors_follow_the_number_of_ranks():
    assert commbench.COLLECTIVES["all_reduce"].bus_factor(8) == pytest.approx(1.75)
    assert commbench.COLLECTIVES["reduce_scatter"].bus_factor(8) == pytest.approx(0.875)
    assert commbench.COLLECTIVES["send_recv"].bus_factor(8) == 1.0


def test_bad_input_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(UsageError, match="--nodes 2: ranks on several nodes start through SLURM"):
        commbench.run(ranks=4, device="cpu", out=tmp_path / "x.json", collectives=["all_reduce"], nodes=2)
    with pytest.raises(UsageError, match="no collective all_gether"):
        commbench.run(ranks=2, device="cpu", out=tmp_path / "x.json", collectives=["all_gether"])
    with pytest.raises(UsageError, match="h200-x2 names h200 ranks, and this host's are cpu"):
        commbench.run(ranks=2, device="cpu", out=tmp_path / "x.json", collectives=["all_reduce"],
                      name="h200-x2")
    with pytest.raises(UsageError, match="h100-n2x8 names h100 ranks, and this host's are cpu"):
        monkeypatch.setenv("SLURM_JOB_ID", "1")  # inside an allocation, across nodes: still this hardware's
        commbench.run(ranks=8, device="cpu", out=tmp_path / "x.json", collectives=["all_reduce"],
                      name="h100-n2x8", nodes=2)
    with pytest.raises(UsageError, match="not a size"):
        commbench.parse_bytes("lots")
    assert commbench.parse_bytes("64M") == 64 << 20 and commbench.parse_bytes("1GiB") == 1 << 30
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("table, said", [("h200-x2", "median 0.23%, worst 5.51%"),
                                         ("h200-x4", "median 0.36%, worst 5.71%")])
def test_the_published_repeat_comparison_is_what_its_command_prints_from_the_published_tables(table, said):
    """results/bench/commbench/<table>-repeat.txt: the figures docs/communication.md gives for how
    well a table repeats, made again from the two committed tables by the command it names."""
    published = (REPO / f"results/bench/commbench/{table}-repeat.txt").read_text()
    command = published.splitlines()[0].removeprefix("command: ").split()
    again = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout
    assert again == published
    assert f"16 MiB and more: 24 rows, |difference| {said}" in published
