"""Published tables: every column comes from one computation, so each study's CSV and markdown agree."""

from __future__ import annotations

import math

import pandas
import pytest

from trainbench.study.config import load_config
from trainbench.reporting.columns import COLUMNS, COMPUTE_ONLY, expand_sets
from trainbench.reporting.tables import cell_text

from conftest import REPO

CONFIG = load_config(REPO / "config.yaml")
PUBLISHED = [name for name in CONFIG.studies if (REPO / "results" / "tables" / f"{name}.md").exists()]


def markdown_rows(text: str) -> list[list[str]]:
    """The first table of a study's markdown: its header and rows, cell by cell."""
    lines = text.split("\n\n")
    table = next(block for block in lines if block.startswith("| "))
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()
            if not line.startswith("|---") and not line.startswith("| ---")]


@pytest.mark.parametrize("study", PUBLISHED)
def test_each_published_tables_csv_and_markdown_agree_column_by_column(study):
    md = markdown_rows((REPO / "results" / "tables" / f"{study}.md").read_text())
    csv = pandas.read_csv(REPO / "results" / "tables" / f"{study}.csv")
    spec = CONFIG.study(study)
    header, rows = md[0], md[1:]
    assert len(rows) == len(csv), "the markdown and the CSV hold different cells"
    report = [name for name in COLUMNS if COLUMNS[name].header in header]
    assert set(report) >= set(expand_sets(spec.report))  # a column set (breakdown) by its columns
    checked = 0
    for i, row in enumerate(rows):
        values = {}
        for name in report:
            for key in (name, f"{name}_low", f"{name}_high"):
                column = f"table.{key}"
                if column in csv:
                    value = csv[column][i]
                    values[key] = None if isinstance(value, float) and math.isnan(value) else value
        # an emulated row's timed figures say so (tables made before emulated ranks have no such column)
        values[COMPUTE_ONLY] = "table.emulated" in csv and bool(csv["table.emulated"][i])
        for name in report:
            assert row[header.index(COLUMNS[name].header)] == cell_text(values, name), (study, i, name)
            checked += 1
    assert checked >= len(rows)


def test_tables_show_intervals_and_say_which_cells_are_noisy():
    baseline = (REPO / "results" / "tables" / "baseline.md").read_text()
    assert " ± " in baseline and "medians over timed windows ± half their 95% interval" in baseline
    gpt2 = (REPO / "results" / "tables" / "gpt2_zero.md").read_text()
    assert "ok, noisy (3 windows: no interval)" in gpt2  # three timed steps give no 95% interval
    megatron = (REPO / "results" / "tables" / "megatron.md").read_text()
    assert "ok, noisy (±" in megatron and "ran before timing windows" in megatron


def test_run_time_and_current_predictions_are_named_apart_in_the_csv():
    csv = pandas.read_csv(REPO / "results" / "tables" / "llama.csv")
    assert "predicted_at_run.gpu_mem_mib" in csv and "predicted_now.gpu_mem_mib" in csv
    assert "table.predicted_gpu_mem_gib" in csv
    measured = csv[csv.status == "ok"]
    assert (measured["table.predicted_gpu_mem_gib"] * 1024).round(0).tolist() == \
        measured["predicted_now.gpu_mem_mib"].round(0).tolist()


def test_tables_give_the_time_model_for_planned_cells_and_its_error_for_measured_ones():
    csv = pandas.read_csv(REPO / "results" / "tables" / "llama.csv")
    planned, measured = csv[csv.status == "planned"], csv[(csv.status == "ok") & ~csv["table.emulated"]]
    emulated = csv[(csv.status == "ok") & csv["table.emulated"]]
    assert planned["table.predicted_step_time_ms"].notna().all()
    assert planned["table.step_time_error_pct"].isna().all()  # nothing measured to hold it against
    assert measured["table.step_time_error_pct"].notna().all()
    # an emulated rank's step is its compute alone: set beside the model's whole step, with no error
    assert len(emulated) and emulated["table.predicted_step_time_ms"].notna().all()
    assert emulated["table.step_time_error_pct"].isna().all()
    assert ((measured["table.predicted_step_time_ms"] - 1e3 * measured["predicted_time.step_time_s"]).abs()
            < 1e-3).all()
    md = (REPO / "results" / "tables" / "llama.md").read_text()
    assert "predicted step (ms)" in md and "time model error" in md and "in sample" in md


def test_a_table_names_a_commit_once_whether_its_runs_were_given_the_full_or_the_short_hash():
    # published tables mix both: TRAINBENCH_GIT_COMMIT set to `git rev-parse HEAD` or to its short form
    text = (REPO / "results/tables/holdout_frameworks.md").read_text()
    code = next(line for line in text.splitlines() if line.startswith("Code: "))
    commits = code.removeprefix("Code: ").split(". Generated")[0].split(", ")
    assert commits == ["32041df", "7093f90"]  # nine cells ran at 32041dff... (the full hash), one at 7093f90


@pytest.mark.parametrize("study", PUBLISHED)
def test_published_tables_predict_with_the_committed_time_model(study):
    # a refit changes every table's predicted columns: a table made before it (the refit committed,
    # the tables not made again) would show the old fit's figures beside the new fit's docs
    from trainbench.execute.results import read_result
    from trainbench.reporting.predictions import time_prediction

    csv = pandas.read_csv(REPO / "results" / "tables" / f"{study}.csv")
    column = "table.predicted_step_time_ms"
    if column not in csv:
        pytest.skip(f"{study}'s table reports no predicted step")
    checked = 0
    for cell_id, status, shown in zip(csv["cell_id"], csv["status"], csv[column]):
        result = REPO / "results" / "runs" / study / cell_id / "metrics.json"
        if status != "ok" or math.isnan(shown) or not result.exists():
            continue
        doc = read_result(result)
        if doc.get("emulation"):  # an emulated row shows the whole step beside the rank's compute
            continue
        predicted = time_prediction(doc)
        assert shown == pytest.approx(predicted["step_time_s"] * 1000, rel=1e-6), (study, cell_id)
        checked += 1
    assert checked or not (csv["status"] == "ok").any()
