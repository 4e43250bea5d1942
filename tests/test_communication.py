"""What a cell's step sends (trainbench.predict.communication), and how long it takes on a measured
interconnect: the collectives each strategy makes, the bandwidth table's timing, and the published
comparison with the profiled cells."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainbench.predict.communication import MIB, BandwidthTable, interconnect_of, step_collectives
from trainbench.registry.hardware import GPUS
from trainbench.predict.memory_model import shard_params
from trainbench.registry.models import get_model
from trainbench.study.params import CellParams

from conftest import REPO

BASE = {"model": "gpt2-350m", "precision": "bf16", "seq_len": 1024, "micro_batch": 16, "grad_accum": 4,
        "gpus": 2}


def cell(**settings) -> CellParams:
    return CellParams.resolve({**BASE, **settings})


def test_ddp_all_reduces_its_fp32_gradients_once_a_step_in_its_buckets():
    ddp = cell(strategy="ddp")
    psi = shard_params(ddp, get_model("gpt2-350m"))
    # DDP's own 25 MiB, the 100 MiB of its best practice (tuning's default), and a cell's own 50
    for cells, cap in (({"tuning": "framework"}, 25), ({}, 100), ({"ddp_bucket_cap_mb": 50}, 50)):
        found = step_collectives(cell(strategy="ddp", **cells))
        assert {c.kind for c in found} == {"all_reduce"} and {c.ranks for c in found} == {2}
        assert sum(c.size_bytes * c.count for c in found) == pytest.approx(4 * psi)
        assert max(c.size_bytes for c in found) == cap * MIB


def test_fsdp2_gathers_each_block_as_its_reshard_policy_says_and_reduces_its_gradients_once():
    gathers = {}
    for policy in (None, "after_backward", "after_step"):
        found = {c.what: c for c in step_collectives(cell(strategy="fsdp", fsdp_reshard=policy))}
        gathers[policy] = found["FSDP2: a block's weights"].count
        assert found["FSDP2: a block's gradients"].count == 24  # once a block, a step
        block = found["FSDP2: a block's weights"].size_bytes
        assert found["FSDP2: a block's gradients"].size_bytes == 2 * block  # fp32 gradients, bf16 weights
    assert gathers == {None: 2 * 4 * 24, "after_backward": 4 * 24, "after_step": 24}


def test_tensor_parallelism_all_reduces_activations_and_one_rank_sends_nothing():
    split = {c.kind: c for c in step_collectives(cell(strategy="fsdp", gpus=2, tp=2))}
    assert list(split) == ["all_reduce"]  # dp 1: nothing to gather; tp 2: the activations
    assert split["all_reduce"].size_bytes == 16 * 1024 * 1024 * 2
    assert step_collectives(cell(strategy="single", gpus=1)) == []


@pytest.fixture(scope="module")
def table():
    return BandwidthTable.read(REPO / "results/comm/h200-x2.json")


def test_the_table_times_a_measured_size_as_measured_and_the_rest_between_them(table):
    sizes, times = table.times["all_gather"]
    assert table.seconds("all_gather", sizes[3]) == times[3]
    assert table.seconds("all_gather", 1) == times[0]  # below the smallest: an operation's issue time
    # above the largest size: its bandwidth
    assert table.seconds("all_gather", 2 * sizes[-1]) == pytest.approx(2 * times[-1])
    middle = table.seconds("all_gather", (sizes[5] * sizes[6]) ** 0.5)
    assert times[5] < middle < times[6]
    four_gpus = step_collectives(cell(strategy="ddp", gpus=4))
    assert table.step_seconds(four_gpus) is None  # a table of 2 ranks says nothing of 4


def test_a_table_measured_in_the_project_joins_the_published_ones_and_replaces_one_of_its_ranks(
        tmp_path, monkeypatch):
    published = interconnect_of(GPUS["h200"])
    assert sorted(published.tables) == [2, 4, 8]
    document = json.loads((REPO / "results/comm/h200-x4.json").read_text())
    comm = tmp_path / "results/comm"
    comm.mkdir(parents=True)
    # a host of 8 whose collectives take twice the 4-GPU host's time, and one of 2 at half its time
    for ranks, factor in ((8, 2.0), (2, 0.5)):
        rows = [{**row, "ranks": ranks, "time_us": row["time_us"] * factor} for row in document["rows"]]
        (comm / f"h200-x{ranks}.json").write_text(json.dumps({**document, "ranks": ranks, "rows": rows}))
    (comm / "a100-80g-x8.json").write_text(json.dumps(document))  # another GPU's: not read for H200s
    monkeypatch.chdir(tmp_path)
    mine = interconnect_of(GPUS["h200"])
    assert sorted(mine.tables) == [2, 4, 8]
    assert mine.tables[4].times == published.tables[4].times
    assert mine.tables[2].seconds("all_reduce", MIB) == pytest.approx(
        0.5 * published.tables[4].seconds("all_reduce", MIB))
    eight = step_collectives(cell(strategy="ddp", gpus=8))
    assert mine.seconds(eight, 450, False) == pytest.approx(mine.tables[8].step_seconds(eight))


def test_the_published_comparison_is_what_its_command_prints_from_the_published_cells():
    published = (REPO / "results/bench/communication/h200-x2.txt").read_text()
    command = published.splitlines()[0].removeprefix("command: ").split()
    again = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout
    assert again == published
    assert "torch ddp" in published and "torch fsdp" in published
