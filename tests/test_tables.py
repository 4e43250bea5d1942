"""Published tables: every column comes from one computation, so each study's CSV, its summary and its
every-column markdown agree; each markdown opens with its answer and a narrow summary, says what its columns
mean and how the time model was fitted only by pointing at the documentation, and stays small; every cell
of a study is in its CSV or its plan."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas
import pytest

from trainbench.study.config import load_config
from trainbench.reporting.documents import read_reported
from trainbench.reporting.answer import SUMMARY, summary_order
from trainbench.reporting.columns import COLUMNS, COMPUTE_ONLY, expand_sets
from trainbench.reporting.tables import cell_text, scalar_columns, with_planned, write_tables

from conftest import REPO, loaded_in

# The two workspaces that publish tables: the benchmarks (config.yaml) and, where it is, the record of
# the models' validation (validation/config.yaml, `snakemake -d validation`)
WORKSPACES = [root for root in (REPO, REPO / "validation") if (root / "config.yaml").exists()]
CONFIGS = {root: load_config(loaded_in(root) / "config.yaml") for root in WORKSPACES}
TABLES = {name: (root / "results" / "tables", config.study(name)) for root, config in CONFIGS.items()
          for name in config.studies if (root / "results" / "tables" / f"{name}.md").exists()}
PUBLISHED = sorted(TABLES)
CONFIG = CONFIGS[REPO]
MEASURED = "## Measured cells"
NOT_RUN = "## Planned and not run"
LARGEST_MARKDOWN = 40_000  # bytes: a table a reader scrolls through, and GitHub renders at once


def table(study: str, suffix: str) -> Path:
    return TABLES[study][0] / f"{study}{suffix}"


def table_rows(text: str) -> list[list[str]]:
    """The first table of a markdown text: its header and rows, cell by cell."""
    table_text = next(block for block in text.split("\n\n") if block.startswith("| "))
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table_text.splitlines()
            if not line.startswith("|---") and not line.startswith("| ---")]


def markdown_rows(text: str) -> list[list[str]]:
    """The summary table of a study's markdown (its measured cells): its header and rows, cell by cell."""
    return table_rows(text.split(MEASURED, 1)[1])


def in_summary_order(study: str, csv: pandas.DataFrame) -> pandas.DataFrame:
    """The CSV's rows (the grid's order) in the order of the markdown tables: model, GPUs, throughput."""
    runs = TABLES[study][0].parent / "runs" / study
    docs = [read_reported(runs / cell / "metrics.json") for cell in csv.cell_id]
    position = {id(d): i for i, d in enumerate(docs)}
    return csv.iloc[[position[id(d)] for d in summary_order(docs)]].reset_index(drop=True)


@pytest.mark.parametrize("study", PUBLISHED)
def test_each_published_summary_is_narrow_and_gives_each_cells_own_figures(study):
    rows = markdown_rows(table(study, ".md").read_text())
    assert rows[0] == list(SUMMARY) and len(rows[0]) <= 9
    csv = in_summary_order(study, pandas.read_csv(table(study, ".csv")))
    runs = TABLES[study][0].parent / "runs" / study
    assert len(rows) - 1 == len(csv)
    for row, cell in zip(rows[1:], csv.cell_id):
        doc = read_reported(runs / cell / "metrics.json")
        assert row[2].startswith("ok") == (doc["status"] == "ok"), (study, cell, row[2])
        tokens, used = doc["metrics"].get("tokens_per_s"), doc["metrics"].get("gpu_mem_used_mib")
        if doc["status"] == "ok" and tokens:
            assert row[3].startswith(f"{tokens / doc['params']['gpus']:,.0f}"), (study, cell, row[3])
        if used:
            assert row[5] == f"{max(used) / 1024:,.2f}", (study, cell, row[5])
        assert row[1].split(" ")[0].rstrip(",") == str(doc["params"]["gpus"])
        assert (", emulated" in row[1]) == bool(doc.get("emulation")), (study, cell)


@pytest.mark.parametrize("study", PUBLISHED)
def test_each_published_tables_csv_and_every_column_markdown_agree_column_by_column(study):
    md = table_rows(table(study, ".all.md").read_text())
    csv = in_summary_order(study, pandas.read_csv(table(study, ".csv")))
    spec = TABLES[study][1]
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
    assert " ± " in baseline and "Timed figures are medians ± half their 95% interval" in baseline
    assert " ± " in (REPO / "results" / "tables" / "baseline.all.md").read_text()
    emulated = (REPO / "results" / "tables" / "zero3_pipeline.md").read_text()
    assert "ok, noisy (2 windows: no interval)" in emulated  # two timed steps give no 95% interval
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
    planned = pandas.read_csv(REPO / "results" / "tables" / "llama.plan.csv")
    assert set(planned.status) == {"planned"}
    measured = csv[(csv.status == "ok") & ~csv["table.emulated"]]
    emulated = csv[(csv.status == "ok") & csv["table.emulated"]]
    assert planned["table.predicted_step_time_ms"].notna().all()
    assert "table.step_time_error_pct" not in planned  # nothing measured to hold the model against
    assert measured["table.step_time_error_pct"].notna().all()
    # an emulated rank's step is its compute alone: set beside the model's whole step, with no error
    assert len(emulated) and emulated["table.predicted_step_time_ms"].notna().all()
    assert emulated["table.step_time_error_pct"].isna().all()
    assert ((measured["table.predicted_step_time_ms"] - 1e3 * measured["predicted_time.step_time_s"]).abs()
            < 1e-3).all()
    every = (REPO / "results" / "tables" / "llama.all.md").read_text()
    assert "predicted step (ms)" in every and "time model error" in every
    assert "in sample" in (REPO / "results" / "tables" / "llama.md").read_text()


def test_a_table_names_a_commit_once_whether_its_runs_were_given_the_full_or_the_short_hash():
    # published tables mix both: TRAINBENCH_GIT_COMMIT set to `git rev-parse HEAD` or to its short form
    text = table("holdout_frameworks", ".md").read_text()
    code = next(line for line in text.splitlines() if line.startswith("Code: "))
    commits = code.removeprefix("Code: ").split(". Generated")[0].split(", ")
    assert commits == ["32041df", "7093f90"]  # nine cells ran at 32041dff... (the full hash), one at 7093f90


@pytest.mark.parametrize("study", PUBLISHED)
def test_published_tables_predict_with_the_committed_time_model(study):
    # a refit changes every table's predicted columns: a table made before it (the refit committed,
    # the tables not made again) would show the old fit's figures beside the new fit's docs
    from trainbench.reporting.predictions import time_prediction

    csv = pandas.read_csv(table(study, ".csv"))
    column = "table.predicted_step_time_ms"
    if column not in csv:
        pytest.skip(f"{study}'s table reports no predicted step")
    checked = 0
    for cell_id, status, shown in zip(csv["cell_id"], csv["status"], csv[column]):
        result = TABLES[study][0].parent / "runs" / study / cell_id / "metrics.json"
        if status != "ok" or math.isnan(shown) or not result.exists():
            continue
        doc = read_reported(result)
        if doc.get("emulation"):  # an emulated row shows the whole step beside the rank's compute
            continue
        predicted = time_prediction(doc)
        assert shown == pytest.approx(predicted["step_time_s"] * 1000, rel=1e-6), (study, cell_id)
        checked += 1
    assert checked or not (csv["status"] == "ok").any()


@pytest.mark.parametrize("study", PUBLISHED)
def test_every_cell_of_a_published_study_is_in_its_csv_or_its_plan_once(study):
    spec = TABLES[study][1]
    csv, plan = pandas.read_csv(table(study, ".csv")), pandas.read_csv(table(study, ".plan.csv"))
    measured, planned = list(csv.cell_id), list(plan.cell_id)
    assert sorted(measured + planned) == sorted(c.cell_id for c in spec.cells)  # each once, none lost
    # the CSV's are the cells with a result on disk, the plan's those without
    results = {c.cell_id for c in spec.cells if (TABLES[study][0].parent.parent / c.target).exists()}
    assert set(measured) == results
    assert not set(plan.status) & {"ok", "oom", "failed", "timeout"}
    # the markdown: a row per measured cell, and the others counted by outcome, adding up to the plan
    text = table(study, ".md").read_text()
    assert len(markdown_rows(text)) - 1 == len(csv)
    assert (NOT_RUN in text) == bool(len(plan))
    summary = text.split(NOT_RUN, 1)[1] if NOT_RUN in text else ""
    counts = re.findall(r"^\| .+ \| (\d+) \|$", summary, flags=re.M)
    assert sum(map(int, counts)) == len(plan)


@pytest.mark.parametrize("study", PUBLISHED)
def test_a_published_markdown_opens_with_its_answer_and_stays_small(study):
    text = table(study, ".md").read_text()
    for suffix in (".md", ".all.md"):
        size = len(table(study, suffix).read_bytes())
        assert size <= LARGEST_MARKDOWN, f"{study}{suffix}: {size:,} bytes"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    # title, the answer, the summary of the measured cells, then what the study is
    assert text.startswith(f"# {study}\n\n## Answer\n\n- ")
    assert headings[:3] == ["Answer", "Measured cells", "The study"]
    if TABLES[study][1].findings:  # then the findings, whose verdicts the answer already counted
        assert headings[3] == "Findings"
        assert re.search(r"^- Findings: \d+ (reproduced|partly|not reproduced|not yet measured)",
                         text.split(MEASURED)[0], flags=re.M)


# What the tables used to repeat under every table, and now say once in the documentation: the glossary of
# their columns (docs/columns.md) and the studies the time model's constants were fitted on
# (docs/time-model.md, "The constants")
REPEATED = ("Columns: ", "Its constants were fitted on measured cells", "by trainbench check-models time")


@pytest.mark.parametrize("study", PUBLISHED)
def test_a_published_table_points_at_the_documentation_instead_of_repeating_it(study):
    for suffix in (".md", ".all.md"):
        text = table(study, suffix).read_text()
        assert not [r for r in REPEATED if r in text], (study, suffix)
        # no column's meaning is spelt out in a table: every one is on the documentation's page of columns
        assert not [c.description for c in COLUMNS.values()
                    if len(c.description) > 40 and c.description in text]
        assert "docs/columns.md" in text
    text = table(study, ".md").read_text()
    if "Predicted step times" in text:  # which GPU, whether in sample; the fit itself: the documentation's
        assert "(docs/time-model.md)" in text and ("in sample" in text or "out of sample" in text)


@pytest.mark.parametrize("study", PUBLISHED)
def test_published_csvs_hold_one_scalar_per_column(study):
    for suffix in (".csv", ".plan.csv"):
        csv = pandas.read_csv(table(study, suffix))
        series = [c for c in csv.columns if re.search(r"\.\d+(\.|$)", c)]  # metrics.loss_curve.0, ...
        assert not series, (suffix, series[:5])
        assert not [c for c in csv.columns if c.startswith(("provenance.packages", "provenance.environment"))]
        assert len(csv.columns) < 400, (suffix, len(csv.columns))


def test_a_document_becomes_scalar_columns_its_series_left_in_metrics_json():
    metrics = {"step_time_s": 0.5, "step_time_s_ci": [0.4, 0.6], "loss_curve": [9, 8, 7],
               "gpu_mem_used_mib": [1000, 1100], "timing": {"method": "windows"}}
    doc = {"cell_id": "c", "metrics": metrics,
           "provenance": {"gpu_name": "H200", "packages": {"torch": "2.11"}, "environment": {"A": "1"}}}
    assert scalar_columns(doc) == {"cell_id": "c", "metrics.step_time_s": 0.5,
                                   "metrics.step_time_s_ci.low": 0.4, "metrics.step_time_s_ci.high": 0.6,
                                   "metrics.timing.method": "windows", "provenance.gpu_name": "H200"}


def test_planned_cells_go_to_the_plan_and_the_markdown_counts_them(tmp_path):
    plan_for = {"name": "4 x H200", "gpu_mem_gib": 140.4, "gpus_per_node": 4, "host_mem_gib": 560}
    study = load_config({"studies": {"s": {
        "description": "d",
        "settings": {"framework": "hf_trainer", "strategy": "fsdp", "micro_batch": 1, "grad_accum": 8,
                     "activation_checkpointing": True},
        "axes": {"model": ["llama-7b", "llama-65b"], "gpus": [4, 8]},
        "measure": {"cells": [{"model": "llama-7b", "gpus": 4}], "plan_for": plan_for}}}}).study("s")
    ran = study.cell("model~llama-7b__gpus~4")
    result = {"study": "s", "cell_id": ran.cell_id, "params": ran.params.as_dict(), "status": "oom",
              "reason": "OOM at step 1 (warm-up)", "metrics": {"gpu_mem_used_mib": [140_000] * 4},
              "provenance": {"gpu_name": "NVIDIA H200", "gpu_count": 4}}
    docs = with_planned([result], study)
    files = {name: tmp_path / f"s{name}" for name in (".md", ".csv", ".plan.csv")}
    write_tables(docs, study="s", description="d", id_keys=["model", "gpus"], report=["gpu_mem_max_gib"],
                 csv_path=files[".csv"], md_path=files[".md"], plan_path=files[".plan.csv"],
                 plan_for=plan_for)
    text = files[".md"].read_text()
    assert markdown_rows(text)[1][:3] == ["hf_trainer fsdp, llama-7b, fp32, 1 x 8", "4",
                                          "OOM at step 1 (warm-up)"]
    assert len(markdown_rows(text)) == 2 and "| planned" not in text.split(NOT_RUN)[0]
    every = table_rows((tmp_path / "s.all.md").read_text())  # beside the markdown, the same cells
    assert every[1][:3] == ["llama-7b", "4", "OOM at step 1 (warm-up)"] and len(every) == 2
    assert "- No cell of the 1 with a result trained: 1 ran out of memory: OOM at step 1 (warm-up)." in text
    assert "1 cell with a result of the study's 4: 1 oom." in text
    assert "3 of the study's 4 cells have no result" in text and "results/tables/s.plan.csv" in text
    assert "| planned: predicted not to fit: GPUs, GPU memory | 1 |" in text
    assert "4 GPUs of 140.4 GiB and 560 GiB of host memory per node" in text
    assert list(pandas.read_csv(files[".csv"]).cell_id) == [ran.cell_id]
    plan = pandas.read_csv(files[".plan.csv"])
    assert list(plan.cell_id) == [c.cell_id for c in study.cells if c is not ran]
    assert plan["table.predicted_gpu_mem_gib"].notna().all()
    assert "table.gpu_mem_max_gib" not in plan  # nothing measured: the column is left out


def test_scaling_efficiency_is_held_against_the_one_gpu_cell_of_the_same_machine():
    """A study that scales a strategy: each scaled cell's samples/s per GPU over its set-up's one-GPU
    cell, in the table where both ran on one machine (their host ids), not where they did not."""
    from trainbench.reporting.columns import column_values
    from trainbench.reporting.plots import with_scaling

    def cell(strategy, gpus, samples, host):
        params = {"strategy": strategy, "gpus": gpus, "model": "m"}
        return {"cell_id": f"{strategy}-{gpus}", "status": "ok", "params": params,
                "metrics": {"samples_per_s": samples}, "provenance": {"host_id": host}}

    docs = with_scaling([cell("single", 1, 100.0, "a"), cell("ddp", 2, 190.0, "a"),
                         cell("ddp", 4, 360.0, "a"), cell("fsdp", 2, 180.0, "b"),
                         cell("fsdp", 4, 320.0, None)], ["strategy", "gpus"])
    efficiency = {d["cell_id"]: column_values(d, "scaling_efficiency")[0] for d in docs}
    assert efficiency == {"single-1": None, "ddp-2": 0.95, "ddp-4": 0.9, "fsdp-2": None, "fsdp-4": 0.8}
    assert docs[3]["scaling"] == {"efficiency": 0.9, "reference": "single-1", "same_host": False}
