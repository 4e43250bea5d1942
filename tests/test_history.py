"""Every run of a cell kept (execute/history.py), and a rerun set against its cell's last earlier run."""

from __future__ import annotations

import json
import shutil

import pytest

from trainbench.cli import main
from trainbench.contract.result import Result, read_json, read_result
from trainbench.contract import history as history_lines
from trainbench.execute import history
from trainbench.reporting.compare import compare_with_history

from conftest import REPO, published_results
from test_cellrun import make_cell, run


def test_each_run_of_a_cell_is_kept_and_a_rerun_is_set_against_the_last(tmp_path, capsys):
    cell = make_cell(strategy="single", gpus=1)
    first = run(cell, tmp_path)
    second = run(cell, tmp_path)  # the rerun replaces the result; the history keeps both
    kept = history_lines.runs(tmp_path / "results/history/t/c.jsonl")
    assert [r["provenance"]["started"] for r in kept] == [first["provenance"]["started"],
                                                           second["provenance"]["started"]]
    assert kept[0]["metrics"]["step_time_s"] == first["metrics"]["step_time_s"]
    comparison = compare_with_history(tmp_path / "results/runs")
    [row] = comparison.cells
    assert row.repeated and row.changes["step_time_s"].first == first["metrics"]["step_time_s"]
    assert row.changes["step_time_s"].second == second["metrics"]["step_time_s"]
    assert main(["compare", str(tmp_path / "results/runs"), "--history"]) == 0
    assert "t/c" in capsys.readouterr().out
    assert main(["history", "t", "--results", str(tmp_path / "results")]) == 0
    assert capsys.readouterr().out.count("ok") == 2


def test_a_record_keeps_the_runs_energy_and_its_hosts_pace():
    """A rerun kept out of its table lives on in its history only: its energy and host pace with it."""
    doc = read_json(published_results()[0])
    doc["metrics"].update(step_time_s=0.03, energy_j_per_step=48.2, energy_j_per_token=0.00196)
    doc["provenance"].update(git_commit="a0f10be", host_pace_ms=2.56)
    kept = history_lines.record(Result.from_document(doc))
    assert kept["metrics"]["energy_j_per_step"] == 48.2 and kept["metrics"]["energy_j_per_token"] == 0.00196
    assert kept["provenance"]["host_pace_ms"] == 2.56


def test_only_a_run_with_the_same_parameters_on_the_same_gpu_model_is_comparable(tmp_path):
    published = REPO / "validation/results/runs/holdout_frameworks"
    cell = next(published.iterdir()).name
    runs = tmp_path / "results/runs/holdout_frameworks"
    shutil.copytree(published / cell, runs / cell)
    result = runs / cell / "metrics.json"
    doc = read_json(result)
    mine = (doc["params_hash"], doc["provenance"]["gpu_name"], doc["provenance"]["started"], result)
    assert doc["provenance"]["gpu_name"] == "NVIDIA H200"
    assert history_lines.last_comparable(*mine) is None  # no history yet
    for gpu, started, params_hash in (("NVIDIA H100 80GB HBM3", "2026-01-01", doc["params_hash"]),
                                      ("NVIDIA H200", "2026-01-02", "0" * 12),
                                      ("NVIDIA H200", "2026-01-03", doc["params_hash"]),
                                      ("NVIDIA H200", "2099-01-01", doc["params_hash"])):  # later: not before
        earlier = json.loads(json.dumps(doc))
        earlier["provenance"].update(gpu_name=gpu, started=started)
        earlier["params_hash"] = params_hash
        history.append(Result.from_document(earlier), result)
    assert history_lines.last_comparable(*mine)["provenance"]["started"] == "2026-01-03"
    # a line a crash cut short is skipped, not fatal
    with open(history_lines.history_file(result), "a") as f:
        f.write('{"study": "holdout_frame')
    assert len(history_lines.runs(history_lines.history_file(result))) == 4


def test_results_made_before_histories_are_added_once(tmp_path):
    runs = tmp_path / "results/runs"
    shutil.copytree(REPO / "validation/results/runs/holdout_mix", runs / "holdout_mix")
    results = sorted(runs.glob("*/*/metrics.json"))
    assert history.seed(results) == len(results)
    assert history.seed(results) == 0
    probe = tmp_path / "results/search/s/c/mb~4/metrics.json"
    assert history_lines.history_file(probe) is None  # probes: none


def test_every_published_result_is_in_its_history():
    for result in published_results() + published_results(REPO / "validation"):
        started = read_result(result).provenance.started
        kept = history_lines.runs(history_lines.history_file(result))
        assert started in {r["provenance"]["started"] for r in kept}, result


@pytest.mark.parametrize("argv", [["compare", "results/runs"], ["compare", "a", "b", "--history"]])
def test_compare_takes_two_trees_or_one_and_its_history(argv, capsys):
    assert main(argv) != 0
    assert "or one and --history" in capsys.readouterr().err
