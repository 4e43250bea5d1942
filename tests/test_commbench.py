"""`trainbench commbench` and its rule: the collectives timed through torch.distributed on real ranks
(gloo on CPU here; NCCL on GPUs), written as nccl-tests reports them."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from trainbench import commbench
from trainbench.cli import main
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


def _nccl_tests_output(binary: str, hosts: list[str], rows: list[tuple[int, float, float, float]],
                       redop: str = "sum") -> str:
    """An nccl-tests run's output as it prints one (2.x: out-of-place then in-place figures)."""
    lines = ["# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 "
             "iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {1000 + rank:6d} on {host:>10} device {rank % 8:2d} "
              f"[0x{rank:02x}] NVIDIA H200" for rank, host in enumerate(hosts)]
    lines += ["#", "#                                                              out-of-place"
              "                       in-place",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time"
              "   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)"
              "  (GB/s)  (GB/s)"]
    lines += [f"{size:12d}  {size // 4:12d}     float  {redop:>6}      -1  {t:7.2f}  {a:6.2f}  {b:6.2f}"
              f"      0  {t:7.2f}  {a:6.2f}  {b:6.2f}      0" for size, t, a, b in rows]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 123.4", "#", f"# ran {binary}"]
    return "\n".join(lines) + "\n"


def test_a_table_is_made_from_nccl_tests_outputs_and_times_the_models_collectives(tmp_path, monkeypatch):
    """Users with nccl-tests figures of their cluster (or a vendor's) make the table the time model reads
    from them, without measuring: its ranks, nodes and GPU type from the outputs, each row as printed."""
    from trainbench.predict.communication import interconnect_of, step_collectives
    from trainbench.registry.hardware import GPUS
    from trainbench.study.params import CellParams

    host = ["gpu-node-1"] * 8
    reduce = [(1 << 20, 40.0, 26.21, 45.87), (64 << 20, 260.0, 258.1, 451.7), (1 << 30, 3600.0, 298.3, 522.0)]
    # (a size too small for each rank to get an element reads 0 bytes, taking no time)
    gather = [(0, 0.25, 0.0, 0.0), (1 << 20, 30.0, 34.95, 30.58), (1 << 30, 2700.0, 397.7, 348.0)]
    (tmp_path / "ar.txt").write_text(_nccl_tests_output("all_reduce_perf", host, reduce))
    (tmp_path / "ag.txt").write_text(_nccl_tests_output("all_gather_perf", host, gather, redop="none"))
    monkeypatch.chdir(tmp_path)
    assert main(["commbench", "--from-nccl-tests", "ar.txt", "ag.txt", "--source", "a vendor's page"]) == 0
    doc = json.loads((tmp_path / "results/comm/h200-x8.json").read_text())
    assert (doc["interconnect"], doc["ranks"], doc["nodes"], doc["dtype"]) == ("h200-x8", 8, 1, "float32")
    assert doc["provenance"]["source"] == "a vendor's page"
    got = {(r["collective"], r["size_bytes"]): (r["time_us"], r["busbw_gb_s"]) for r in doc["rows"]}
    assert got[("all_reduce", 1 << 30)] == (3600.0, 522.0) and got[("all_gather", 1 << 20)] == (30.0, 30.58)
    assert len(got) == 5 and {r["iters"] for r in doc["rows"]} == {20}
    # the time model times an 8-GPU group's collectives by it, in this project
    links = interconnect_of(GPUS["h200"])
    assert 8 in links.tables
    ddp = step_collectives(CellParams.resolve({"framework": "torch", "model": "gpt2-124m", "strategy": "ddp",
                                               "device": "cuda", "gpus": 8, "micro_batch": 8}))
    assert links.seconds(ddp, 450, False) == pytest.approx(links.tables[8].step_seconds(ddp))
    # across nodes: named by nodes and ranks on each
    two_nodes = host + ["gpu-node-2"] * 8
    (tmp_path / "two.txt").write_text(_nccl_tests_output("all_reduce_perf", two_nodes, reduce))
    assert main(["commbench", "--from-nccl-tests", "two.txt"]) == 0
    assert json.loads((tmp_path / "results/comm/h200-n2x8.json").read_text())["nodes"] == 2


def test_outputs_that_are_not_nccl_tests_runs_are_refused_by_file(tmp_path):
    (tmp_path / "notes.txt").write_text("all_reduce took 3 ms\n")
    with pytest.raises(UsageError, match="notes.txt: no nccl-tests binary named"):
        commbench.import_nccl_tests([tmp_path / "notes.txt"])
    (tmp_path / "1_1_LOG_all_reduce_env1_args1_job7_iter1.txt").write_text("# no rows\n")  # named by its file
    with pytest.raises(UsageError, match="iter1.txt: no rows of nccl-tests' output"):
        commbench.import_nccl_tests([tmp_path / "1_1_LOG_all_reduce_env1_args1_job7_iter1.txt"])
    (tmp_path / "empty.txt").write_text("# ran all_reduce_perf\n")
    with pytest.raises(UsageError, match="empty.txt: no rows of nccl-tests' output"):
        commbench.import_nccl_tests([tmp_path / "empty.txt"])
    (tmp_path / "anon.txt").write_text(_nccl_tests_output("all_reduce_perf", [], [(1024, 10.0, 0.1, 0.2)]))
    with pytest.raises(UsageError, match="do not say how many ranks"):
        commbench.import_nccl_tests([tmp_path / "anon.txt"])
    with pytest.raises(UsageError, match="--name a-b-c"):
        commbench.import_nccl_tests([tmp_path / "anon.txt"], ranks=8, name="a-b-c")
