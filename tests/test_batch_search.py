"""The max-batch search: its logic against fake memory boundaries, its seed from the memory model,
and the Snakemake rules that run it probe by probe, each probe a cached result."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from trainbench.predict.batch_search import largest_fitting, model_bounds, next_probe, walk
from trainbench.study.params import CellParams
from trainbench.predict.memory_model import Hardware, predict
from conftest import tiny_study

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters


@pytest.mark.parametrize("start", [1, 4, 16])
@pytest.mark.parametrize("boundary", [0, 1, 2, 3, 5, 8, 13, 31, 64, 100, 200])
def test_the_search_finds_the_boundary_in_logarithmic_probes(start, boundary):
    upper = 128
    probes = walk(lambda batch: "ok" if batch <= boundary else "oom", start, upper)
    found = largest_fitting({b: ("ok" if b <= boundary else "oom") for b in probes})
    assert found == (min(boundary, upper) or None)
    assert len(probes) == len(set(probes))  # no probe twice
    assert len(probes) <= 2 * math.log2(upper) + 2


@pytest.mark.parametrize("tolerance", [0.1, 0.25])
@pytest.mark.parametrize("boundary", [3, 13, 29, 47, 100])
def test_a_tolerance_brackets_the_boundary_with_fewer_probes(tolerance, boundary):
    def outcomes(probes):
        return {b: ("ok" if b <= boundary else "oom") for b in probes}

    exact = walk(lambda batch: outcomes([batch])[batch], 16, 256)
    probes = walk(lambda batch: outcomes([batch])[batch], 16, 256, tolerance)
    found = largest_fitting(outcomes(probes))
    smallest_failed = min(b for b in probes if b > boundary)
    # the answer trained, the batch above it is known to fail, and the gap is within the tolerance
    assert found <= boundary < smallest_failed
    assert smallest_failed - found <= max(1, int(tolerance * found))
    assert len(probes) <= len(exact)


def test_a_failure_of_any_kind_ends_the_doubling():
    assert next_probe({1: "ok", 2: "ok", 4: "timeout"}, 1, 64) == 3
    assert next_probe({1: "ok", 2: "ok", 3: "ok", 4: "infeasible"}, 1, 64) is None
    assert next_probe({1: "oom"}, 1, 64) is None  # cannot even train one sample
    assert next_probe({64: "ok"}, 64, 64) is None  # the bound


def test_probes_on_disk_finish_a_search_wherever_the_model_would_start_it_now():
    """A search whose probes already bracket the answer runs none more when the memory model, changed,
    would seed it elsewhere: the probes it has are read first."""
    # megatron's ZeRO-1 GPT-2.5B search on 4 GPUs, seeded at 32 when it ran, at 16 by today's model
    on_disk = {32: "ok", 64: "oom", 48: "oom", 40: "oom", 36: "oom", 34: "oom"}
    asked = []

    def status_of(batch):
        asked.append(batch)
        return on_disk.get(batch, "ok" if batch <= 32 else "oom")

    assert sorted(walk(status_of, 16, 128, 0.1, known=on_disk)) == sorted(on_disk)
    assert sorted(asked) == sorted(on_disk)  # nothing but what is on disk
    asked.clear()
    assert walk(status_of, 16, 128, 0.1)[0] == 16  # from nothing, the seed: a probe not on disk


def test_the_memory_model_seeds_and_bounds_the_search():
    params = resolve({"framework": "hf_trainer", "strategy": "fsdp", "model": "llama-7b", "gpus": 2,
                      "seq_len": 2048, "precision": "bf16", "device": "cuda"})
    h200 = Hardware(143771, float("inf"), 8)
    start, upper = model_bounds(params, h200, 256)
    assert start & (start - 1) == 0  # a power of two
    assert predict(params.replace(micro_batch=start), h200).fits
    assert not predict(params.replace(micro_batch=2 * start), h200).fits or 2 * start > upper
    largest_predicted = max(b for b in range(1, 257) if predict(params.replace(micro_batch=b), h200).fits)
    assert upper == 2 * largest_predicted
    assert model_bounds(params, None, 256) == (1, 256)


def test_snakemake_runs_the_search_probe_by_probe_and_resumes(workflow):
    study = {**tiny_study(), "include": [{"strategy": "single", "gpus": 1}],
             "search": {"max_micro_batch": 16, "steps": 2}}
    workflow.write_config({"studies": {"s": study}})
    target = "results/search/s/strategy~single__gpus~1/max_batch.json"
    env = {"TRAINBENCH_OOM_ABOVE_MICRO_BATCH": "5:2"}  # micro batches above 5 run out of memory at step 2

    def search_column():
        out = subprocess.run([sys.executable, "-m", "trainbench", "cells", "s", "--tsv"], cwd=workflow.root,
                             capture_output=True, text=True, check=True).stdout
        return out.splitlines()[1].split("\t")[6]

    assert search_column() == "not started"
    workflow.snakemake(target, env=env)
    assert search_column() == "mb 5 (6: oom)"
    result = json.loads(workflow.path(target).read_text())
    assert result["max_micro_batch"] == 5 and result["max_global_batch"] == 5
    assert result["first_failure"]["micro_batch"] == 6
    assert result["first_failure"]["reason"].startswith("OOM at step 2 (timed)")
    tried = [p["micro_batch"] for p in result["probes"]]
    # this host's memory lets the model seed at the bound (16): then bisect down to 5
    assert sorted(tried) == [4, 5, 6, 8, 16]
    assert result["metrics_at_max"]["steps_timed"] == 6  # six windows of one step
    # the machine the probes ran on is recorded, for the memory model's answer beside the measured one
    assert result["hardware"]["gpu_mem_mib"] is None and result["hardware"]["host_mem_mib"] > 0
    assert result["bound"] == 16
    # an interrupted search resumes: with the result gone, no probe runs again (the run below makes the
    # result again from the probes' results, beside the cell's own run, its table and plots)
    workflow.path(target).unlink()
    ran = workflow.ran("results/tables/s.md", "results/plots/s", env=env)
    assert ran["search_result"] == {target} and "search_probe" not in ran
    assert set(ran) == {"search_result", "train_cell", "study_table", "study_plots"}
    # the study table reports the search next to the cell's own run: the largest batch, the smallest
    # that failed and how, every probe, and the run at the largest batch
    table = workflow.path("results/tables/s.md").read_text()
    section = table.split("## Largest micro batch (search)")[1]
    row = next(line for line in section.splitlines() if line.startswith("| single"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:7] == ["single", "1", "5", "5", "6: OOM at step 2", "≥ 16",
                         "4 ok, 5 ok, 6 OOM at step 2, 8 OOM at step 2, 16 OOM at step 2"]
    step_ms = float(cells[7].split(" ± ")[0].replace(",", ""))
    assert step_ms == pytest.approx(result["metrics_at_max"]["step_time_s"] * 1e3, abs=0.1)
    csv_header = workflow.path("results/tables/s.csv").read_text().splitlines()[0]
    assert "search.max_micro_batch" in csv_header
    # the plots draw the run at the largest batch too: a changed search result redraws them (Snakemake
    # compares checksums as well as times, so the content changes)
    newer = workflow.path("results/plots/s/throughput.png").stat().st_mtime + 10
    workflow.path(target).write_text(json.dumps({**result, "max_micro_batch": 4}))
    os.utime(workflow.path(target), (newer, newer))
    assert set(workflow.planned("results/plots/s", "results/tables/s.md")) == {"study_table", "study_plots"}
