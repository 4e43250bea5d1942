"""`trainbench compare`: two result trees matched cell by cell, with significance and a gate, on
published metrics.json files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainbench.cli import main
from trainbench.contract.figures import timed_metrics
from trainbench.reporting.compare import compare
from trainbench.study.params import CellParams, with_optional_defaults

from conftest import timed_three_steps

RUNS = Path(__file__).resolve().parent.parent / "results" / "runs"
CELLS = ["megatron/strategy~zero1__model~gpt-345m__gpus~4__tp~1__offload_optimizer~false",
         "megatron/strategy~zero1__model~gpt-2.5b__gpus~4__tp~1__offload_optimizer~false",
         "megatron/strategy~zero3__model~gpt-2.5b__gpus~4__tp~1__offload_optimizer~false",
         "gpt2_zero/strategy~zero2__precision~fp16__offload_optimizer~false__ort~false"]


def _tree(root: Path, cells: list[str]) -> Path:
    for cell in cells:
        (root / cell).mkdir(parents=True)
        shutil.copy(RUNS / cell / "metrics.json", root / cell / "metrics.json")
    return root


def _edit(root: Path, cell: str, change) -> None:
    path = root / cell / "metrics.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _steps_times(factor: float):
    def scale(doc):  # a run whose every timed step took `factor` times as long
        metrics = doc["metrics"]
        metrics["step_times_s"] = [t * factor for t in metrics["step_times_s"]]
        if metrics.get("step_time_s_ci"):  # timed in windows: its figures made again as a run makes them
            params = CellParams.from_dict(with_optional_defaults(doc["params"]))
            metrics.update(timed_metrics(params, metrics["step_times_s"],
                                         steps_per_window=metrics["steps_per_window"],
                                         gpu_name=doc["provenance"].get("gpu_name")))
    return scale


@pytest.fixture
def trees(tmp_path):
    first = _tree(tmp_path / "a", CELLS)
    second = _tree(tmp_path / "b", [CELLS[0], CELLS[1], CELLS[3]])

    def slower_and_heavier(doc):
        _steps_times(1.25)(doc)
        doc["metrics"]["gpu_mem_used_mib"] = [x + 1024 for x in doc["metrics"]["gpu_mem_used_mib"]]

    def other_params(doc):
        doc["params_hash"] = "0" * len(doc["params_hash"])

    _edit(first, CELLS[3], timed_three_steps)
    _edit(second, CELLS[3], timed_three_steps)
    _edit(second, CELLS[0], slower_and_heavier)
    _edit(second, CELLS[1], other_params)
    _edit(second, CELLS[3], _steps_times(1.25))
    return first, second


def test_changes_are_relative_to_the_first_tree_and_only_repeats_count(trees):
    first, second = trees
    result = compare(first, second)
    by_cell = {f"{c.study}/{c.cell_id}": c for c in result.cells}
    assert set(by_cell) == {CELLS[0], CELLS[1], CELLS[3]}
    slower = by_cell[CELLS[0]]
    assert slower.repeated
    assert slower.change_pct["step_time_s"] == pytest.approx(25.0, abs=0.01)
    busiest = max(json.loads((first / CELLS[0] / "metrics.json").read_text())["metrics"]["gpu_mem_used_mib"])
    assert slower.change_pct["gpu_mem_used_mib"] == pytest.approx(100 * 1024 / busiest)
    assert (slower.changes["host_mem_peak_mib"].pct == 0
            and not slower.changes["host_mem_peak_mib"].significant)
    # a cell rerun with other parameters is not a repeat: it does not enter the spread
    assert not by_cell[CELLS[1]].same_params and not by_cell[CELLS[1]].changes
    assert sorted(result.spread("step_time_s")) == [pytest.approx(25.0, abs=0.01)] * 2
    assert result.only_in_first == [CELLS[2]] and result.only_in_second == []


def test_a_change_is_significant_only_beyond_the_noise_and_the_smallest_change(trees, tmp_path):
    first, second = trees
    significant = {(f"{c.study}/{c.cell_id}", ch.figure) for c, ch in compare(first, second).significant()}
    # 25 steps: intervals apart; the memory of the busiest GPU too
    assert {(CELLS[0], "step_time_s"), (CELLS[0], "samples_per_s"),
            (CELLS[0], "gpu_mem_used_mib")} <= significant
    # a cell timed 3 steps has no interval, so its 25% cannot be judged either way
    judged = {c.cell_id: c for c in compare(first, second).cells}
    assert judged[CELLS[3].split("/")[1]].changes["step_time_s"].significant is None
    # 1% slower: within the noise of a per-step timed cell and under the smallest change
    nearly = _tree(tmp_path / "c", [CELLS[0]])
    _edit(nearly, CELLS[0], _steps_times(1.01))
    assert not compare(first, nearly).significant()


def test_cli_gates_on_significant_changes_for_the_worse_and_filters_cells(trees, capsys):
    first, second = trees
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert out.index("significant change(s):") < out.index("+25.0%*")  # the short list comes first
    assert "parameters differ: not a repeat" in out and "only in" in out
    assert main(["compare", str(first), str(second), "--fail-on", "slower:5%"]) == 1
    assert "gate failed: 1 cell(s)" in capsys.readouterr().out
    assert main(["compare", str(first), str(second), "--fail-on", "slower:30%,memory:50%"]) == 0
    assert "gate: passed" in capsys.readouterr().out
    assert main(["compare", str(first), str(second), "--fail-on", "memory:1%", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [f["figure"] for f in report["gate_failures"]] == ["gpu_mem_used_mib"]
    assert main(["compare", str(first), str(second), "--study", "gpt2_zero", "--json"]) == 0
    assert [c["study"] for c in json.loads(capsys.readouterr().out)["cells"]] == ["gpt2_zero"]


def test_study_and_cell_patterns_narrow_together(trees, capsys):
    first, second = trees
    # a pattern that gpt2_zero's cell matches too: with --study megatron it must not come in
    assert main(["compare", str(first), str(second), "--study", "megatron", "--cells", "*gpt-345m*",
                 "--cells", "*fp16*", "--json"]) == 0
    cells = [f"{c['study']}/{c['cell_id']}" for c in json.loads(capsys.readouterr().out)["cells"]]
    assert cells == [CELLS[0]]
    assert main(["compare", str(first), str(second), "--study", "gpt2_zero", "--cells", "*gpt-345m*"]) == 2
    assert "no cell matching gpt2_zero and *gpt-345m* is in both" in capsys.readouterr().err


def test_cli_refuses_bad_input_by_name(trees, tmp_path, capsys):
    first, second = trees
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(first), str(empty)]) == 2
    assert "no cell is in both" in capsys.readouterr().err
    assert main(["compare", str(first), str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["compare", str(first), str(second), "--fail-on", "faster:5%"]) == 2
    assert "--fail-on 'faster:5%'" in capsys.readouterr().err
    assert main(["compare", str(first), str(second), "--cells", "llama/*"]) == 2
    assert "no cell matching llama/*" in capsys.readouterr().err


def test_each_cell_names_its_hosts_pace_and_the_report_says_when_the_host_was_slower(trees, capsys):
    first, second = trees

    def paced(ms):
        def set_pace(doc):
            doc["provenance"]["host_pace_ms"] = ms
        return set_pace

    _edit(first, CELLS[0], paced(2.5))
    _edit(second, CELLS[0], paced(6.0))  # a host that ran Python 2.4 times slower, as on 4 x H200
    by_cell = {f"{c.study}/{c.cell_id}": c for c in compare(first, second).cells}
    assert by_cell[CELLS[0]].host_pace_ratio == pytest.approx(2.4)
    assert by_cell[CELLS[3]].host_pace_ratio is None  # no pace on either side: not a guess
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "x2.40" in out
    assert "at least x1.5 slower in 1, that much faster in 0" in out
    # a pace within the threshold is reported, not flagged
    _edit(second, CELLS[0], paced(3.0))
    assert main(["compare", str(first), str(second), "--json"]) == 0
    cells = {f"{c['study']}/{c['cell_id']}": c for c in json.loads(capsys.readouterr().out)["cells"]}
    assert cells[CELLS[0]]["host_pace_ms"] == [2.5, 3.0]
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "median x1.20 over 1 cells" in out and "slower in" not in out


def test_a_host_bound_cell_changes_only_beyond_its_reruns_spread(tmp_path, capsys):
    """Lightning's one-GPU cell, whose step the time model puts 70% on the host, and the baseline's
    one-GPU GPT-2, 8% on it: the same 15% slowdown or speed-up with intervals far apart is a change of
    the second and not of the first, whose reruns in fresh processes came 23% apart on one host; 30% is
    one of both, in step time and samples/s alike."""
    host_bound, gpu_bound = ("lightning/strategy~single__gpus~1",
                             "baseline/strategy~single__model~gpt2-124m__gpus~1__micro_batch~32")
    first = _tree(tmp_path / "a", [host_bound, gpu_bound])
    steady = _windows_within(0.002)
    for cell in (host_bound, gpu_bound):
        _edit(first, cell, steady)
    for factor, host_bound_changed in ((1.15, False), (1 / 1.15, False), (1.30, True), (1 / 1.30, True)):
        second = tmp_path / f"b{factor:.3f}"
        shutil.copytree(first, second)
        for cell in (host_bound, gpu_bound):
            _edit(second, cell, _steps_times(factor))
        cells = {f"{c.study}/{c.cell_id}": c for c in compare(first, second).cells}
        assert cells[host_bound].host_bound and not cells[gpu_bound].host_bound
        assert cells[gpu_bound].changes["step_time_s"].significant
        assert cells[host_bound].changes["step_time_s"].significant is host_bound_changed
        assert cells[host_bound].changes["samples_per_s"].significant is host_bound_changed
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "host-bound (h): 1 cells" in out and " h\n" in out


def _windows_within(spread: float):
    def steady(doc):  # the cell's windows made as alike as a quiet GPU-bound cell's
        metrics = doc["metrics"]
        median = metrics["step_time_s"]
        metrics["step_times_s"] = [median * (1 + spread * (i - 2.5) / 2.5) for i in range(6)]
        _steps_times(1.0)(doc)
    return steady


def test_a_history_record_is_never_host_bound_and_its_result_is():
    """compare_docs takes results or history records on either side; a record keeps no parameters, so
    the model says nothing of it rather than failing."""
    from trainbench.reporting.compare import host_bound

    cell = "lightning/strategy~single__gpus~1"
    history = RUNS.parent / "history" / f"{cell}.jsonl"
    record = json.loads(history.read_text().splitlines()[-1])
    result = json.loads((RUNS / cell / "metrics.json").read_text())
    assert not host_bound(record) and host_bound(result)


BASELINE_ONE_GPU = "baseline/strategy~single__model~gpt2-124m__gpus~1__micro_batch~32"
H100 = "NVIDIA H100 80GB HBM3"


def _on(gpu_name: str | None):
    def rerun_there(doc):
        doc["provenance"]["gpu_name"] = gpu_name
    return rerun_there


@pytest.fixture
def h200_and_h100(tmp_path):
    """The baseline's one-GPU GPT-2 124M cell as published (an H200), and rerun 30% slower on an H100."""
    first = _tree(tmp_path / "a", [BASELINE_ONE_GPU])
    second = _tree(tmp_path / "b", [BASELINE_ONE_GPU])
    _edit(second, BASELINE_ONE_GPU, _on(H100))
    _edit(second, BASELINE_ONE_GPU, _steps_times(1.30))
    return first, second


def test_a_cell_rerun_on_another_gpu_model_is_a_cross_gpu_comparison_not_a_repeat(h200_and_h100, capsys):
    from trainbench.predict import time_model
    from trainbench.registry.hardware import GPUS

    first, second = h200_and_h100
    result = compare(first, second)
    cell = result.cells[0]
    assert json.loads((first / BASELINE_ONE_GPU / "metrics.json").read_text())["provenance"]["gpu_name"] \
        == "NVIDIA H200"
    assert cell.cross_gpu and cell.gpu_change == "H200 -> H100"
    assert not cell.repeated and not cell.changes and not result.significant()
    assert result.cross_gpu() == {"H200 -> H100": 1}
    # beside the measured ratio, the time model's for the cell on the two GPUs
    params = CellParams.from_dict(with_optional_defaults(
        json.loads((first / BASELINE_ONE_GPU / "metrics.json").read_text())["params"]))
    expected = time_model.predict(params, GPUS["h100"]).step_time_s / time_model.predict(
        params, GPUS["h200"]).step_time_s
    step = cell.ratios["step_time_s"]
    assert step.measured == pytest.approx(1.30, rel=0.01) and step.predicted == pytest.approx(expected)
    assert 1 < step.predicted < 1.5  # an H100 is slower than an H200 at the same cell
    assert cell.ratios["samples_per_s"].predicted == pytest.approx(1 / expected)
    # 30% slower, intervals apart: a regression on one GPU, but not across two, so no gate trips
    assert main(["compare", str(first), str(second), "--fail-on", "slower:5%"]) == 0
    out = capsys.readouterr().out
    assert "cross-GPU comparison: 1 cells pair across GPU models (H200 -> H100: 1)" in out
    assert "0 repeated" in out and "no significant change" in out and "gate: passed" in out
    assert f"H200 -> H100, cross-GPU: step_time_s x1.30 (model x{expected:.2f})" in out
    assert main(["compare", str(first), str(second), "--fail-on", "slower:5%", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    row = report["cells"][0]
    assert row["gpus"] == ["NVIDIA H200", H100] and row["gpu_models"] == ["h200", "h100"] and row["cross_gpu"]
    assert row["ratios"]["step_time_s"]["predicted"] == pytest.approx(expected)
    assert report["cross_gpu"] == {"H200 -> H100": 1}
    assert report["significant"] == [] and report["gate_failures"] == []


def test_the_same_slowdown_on_the_same_gpu_model_is_still_flagged(h200_and_h100, capsys):
    first, second = h200_and_h100
    _edit(first, BASELINE_ONE_GPU, _on(H100))  # both on H100s now: a repeat
    result = compare(first, second)
    assert result.cells[0].repeated and not result.cells[0].cross_gpu and not result.cross_gpu()
    assert {ch.figure for _, ch in result.significant()} >= {"step_time_s", "samples_per_s"}
    assert main(["compare", str(first), str(second), "--fail-on", "slower:5%"]) == 1
    out = capsys.readouterr().out
    assert "cross-GPU comparison" not in out and "gate failed: 1 cell(s)" in out


def test_a_gpu_against_cpu_ranks_or_an_unknown_part_is_other_hardware_without_a_prediction(h200_and_h100):
    first, second = h200_and_h100
    for gpu_name, label in ((None, "H200 -> no GPU"), ("NVIDIA H100 PCIe", "H200 -> H100 PCIe")):
        _edit(second, BASELINE_ONE_GPU, _on(gpu_name))
        cell = compare(first, second).cells[0]
        assert cell.cross_gpu and cell.gpu_change == label and not cell.repeated
        assert cell.ratios["step_time_s"].measured == pytest.approx(1.30, rel=0.01)
        assert cell.ratios["step_time_s"].predicted is None and cell.predicted_note is None
