"""Aggregate a study's metrics.json files into its markdown, its every-column markdown, its CSV and its
plan.

The markdown reads top down: the study's title, its answer (reporting.answer), the summary table (one
narrow row per cell that has a result, whatever its status) with the notes that say how to read it,
the study's description, its findings (the verdict of each, reporting.findings), the largest-batch
searches and reference figures, then the cells without a result (planned, or needing more GPUs than the
machine that made the table), counted by reason. The every-column markdown (`<study>.all.md`) has the
same cells with the study's report columns (reporting.columns) in the units its origin used; what each
column means is said once, in the documentation's page of columns (glossary_markdown). The rows of the
cells without a result, with the memory and time models' figures, are the plan (`<study>.plan.csv`);
the CSV has the measured rows. Both CSVs are one row per cell and one scalar per column: series (a loss
curve, a figure per rank or per step) stay in each cell's metrics.json. Every number comes from a
metrics.json or the models; nothing here invents one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas

from trainbench import paths
from trainbench.contract.result import PER_STEP_METHOD, with_intervals
from trainbench.reporting.columns import (COLUMN_SETS, COLUMNS, COMPUTE_ONLY, SUMMARY_COLUMNS, cell_value,
                                          escape, metric, result_text, column_values, with_predictions)
from trainbench.reporting.predictions import Doc, planned_document, with_current_predictions
from trainbench.study.grid import Study
from trainbench.study.params import CellParams


def table_rows(docs: list[Doc], *, id_keys: list[str], report: list[str]) -> list[dict[str, Any]]:
    """Every table column of every cell, computed once: the markdown renders these rows and the CSV
    stores them (table.<column>, and table.<column>_low / _high for an interval)."""
    unknown = [c for c in report if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown report column(s) {unknown}; known: {', '.join(COLUMNS)}")
    rows = []
    for doc in docs:
        row: dict[str, Any] = {key: doc["params"].get(key) for key in id_keys}
        row[COMPUTE_ONLY] = bool(doc.get("emulation"))
        for name in report:
            value, interval = column_values(doc, name)
            row[name] = value
            if COLUMNS[name].interval is not None:
                row[f"{name}_low"], row[f"{name}_high"] = interval or (None, None)
        rows.append(row)
    return rows


def cell_text(row: dict[str, Any], name: str) -> str:
    """A table cell as the markdown shows it: the value, and ± half its interval's width; a timed figure
    of an emulated cell is marked as its rank's compute alone."""
    column, value = COLUMNS[name], row[name]
    if value is None:
        return "—"
    text = column.text(value)
    if row.get(f"{name}_low") is not None:
        text += f" ± {column.text((row[f'{name}_high'] - row[f'{name}_low']) / 2)}"
    if row.get(COMPUTE_ONLY) and column.interval is not None:
        text += " (compute)"
    return text


def markdown_table(docs: list[Doc], *, id_keys: list[str], report: list[str]) -> str:
    rows = table_rows(docs, id_keys=id_keys, report=report)
    headers = [*id_keys, "result", *(COLUMNS[c].header for c in report)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    notes: list[str] = []
    for doc, row in zip(docs, rows):
        cells = [cell_value(row[k]) for k in id_keys] + [result_text(doc, notes)]
        cells += [cell_text(row, name) for name in report]
        lines.append("| " + " | ".join(escape(v) for v in cells) + " |")
    if notes:
        lines.append("")
        lines += [f"[{i}] {escape(note)}" + ("  " if i < len(notes) else "")
                  for i, note in enumerate(notes, 1)]
    return "\n".join(lines)


def _short_commit(commit: str) -> str:
    """A commit as git abbreviates it: a run given the full hash (TRAINBENCH_GIT_COMMIT) and one given the
    short one name the same code."""
    return commit[:7] if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit) else commit


def _probe_outcome(status: str, reason: str | None) -> str:
    """A probe in a few characters: "ok", "OOM at step 3", "OOM at init", "timeout"."""
    if status != "oom":
        return status
    return result_text({"status": status, "reason": reason}).split(" of ")[0].split(" (")[0]


def _model_max(doc: Doc) -> str:
    """The current memory model's largest micro batch for the cell on the GPUs its search ran on (like
    the predicted columns, it follows improvements to the model)."""
    from trainbench.predict.batch_search import model_largest

    found = doc["search"]
    predicted = model_largest(CellParams.from_dict(doc["params"]), found)
    if predicted is None:
        return "—"
    return f"≥ {found['bound']}" if predicted >= found["bound"] else str(predicted)


SEARCH_METRICS = ["step_time_ms", "samples_per_s", "tflops_per_gpu", "mfu", "gpu_mem_each"]


def search_markdown(docs: list[Doc], *, id_keys: list[str]) -> list[str]:
    """The largest micro batch of every searched cell, and the cell's run at that batch."""
    searched = [d for d in docs if d.get("search")]
    if not searched:
        return []
    headers = [*id_keys, "max micro batch", "max global batch", "smallest that failed", "model's max",
               "probes", *(f"{COLUMNS[c].header} at max" for c in SEARCH_METRICS)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for doc in searched:
        found = doc["search"]
        failure = found["first_failure"]
        at_max = {"status": "ok", "params": doc["params"], "metrics": with_intervals(
            doc["params"], found["metrics_at_max"] or {}, (doc.get("provenance") or {}).get("gpu_name"))}
        row = [cell_value(doc["params"].get(k)) for k in id_keys]
        row += [cell_value(found["max_micro_batch"]) or "none",
                cell_value(found["max_global_batch"]) or "—",
                f"{failure['micro_batch']}: {_probe_outcome(failure['status'], failure['reason'])}" if failure
                else "none up to the bound",
                _model_max(doc),
                ", ".join(f"{p['micro_batch']} {_probe_outcome(p['status'], p['reason'])}"
                          for p in found["probes"])]
        values = (table_rows([at_max], id_keys=[], report=SEARCH_METRICS)[0] if found["metrics_at_max"]
                  else None)
        row += [cell_text(values, name) if values else "—" for name in SEARCH_METRICS]
        lines.append("| " + " | ".join(escape(v) for v in row) + " |")
    tolerance = {d["search"].get("tolerance") or 0 for d in searched}
    within = ("exact" if tolerance == {0}
              else f"bisection stops within {max(tolerance):.0%} of the largest that trained")
    return [
        "## Largest micro batch (search)",
        "",
        "\n".join(lines),
        "",
        f"Each probe trains the cell at one micro batch for the search's steps; probes double, then bisect "
        f"({within}), seeded and bounded by the memory model (its largest fitting micro batch on that "
        f"hardware: \"model's max\"). The columns \"at max\" are the probe at the largest batch: the cell's "
        "run at that batch. Probes: "
        f"{paths.path(paths.PROBE, study='<study>', cell='<cell>', micro_batch='<k>')}.",
        "",
    ]


def _hardware_summary(docs: list[Doc]) -> str:
    machines = Counter()
    for doc in docs:
        prov = doc.get("provenance") or {}
        if doc["status"] in ("unsupported", "infeasible", "planned", "not run"):
            continue
        gpu = prov.get("gpu_name")
        where = f"{prov.get('gpu_count')} x {gpu}" if gpu else f"CPU ({prov.get('cpu_count')} cores)"
        if doc.get("emulation"):
            where += " (emulated ranks)"
        machines[f"{where} on {prov.get('hostname')}, torch {prov.get('versions', {}).get('torch')}"] += 1
    return "; ".join(f"{m} ({n} cells)" for m, n in machines.items()) or "none ran"


def _planning_note(docs: list[Doc], plan_for: dict[str, Any] | None) -> list[str]:
    if not any(d["status"] in ("planned", "not run") for d in docs):
        return []
    where = "no hardware (give measure.plan_for)"
    if plan_for:
        where = (f"{plan_for.get('name') or 'the planning hardware'}: {plan_for['gpus_per_node']} GPUs of "
                 f"{plan_for['gpu_mem_gib']:g} GiB and {plan_for['host_mem_gib']:g} GiB of host memory "
                 "per node")
    notes = []
    if any(d["status"] == "planned" for d in docs):
        notes.append(f"Planned cells are outside the study's `measure` selection: not run; their predicted "
                     f"memory and verdict are the memory model's for {where}.")
    if any(d["status"] == "not run" for d in docs):
        notes.append("Cells marked 'not run' need more GPUs than the machine that made this table has; they "
                     "run on a machine with enough, or through SLURM (`--profile profiles/slurm`). Their "
                     "predicted memory is the memory model's" + (f" for {where}." if plan_for else "."))
    return [" ".join(notes), ""]


def _emulation_note(docs: list[Doc]) -> list[str]:
    rows = [d for d in docs if d.get("emulation")]
    if not rows:
        return []
    # what each result is completed with (its emulation section, as reporting.documents brings it up to date)
    nccl = sorted({round(((d["emulation"].get("modelled") or {}).get("nccl_buffers_mib")) or 0) for d in rows}
                  - {0})
    limits = sorted({d["params"]["gpu_mem_limit_gib"] for d in rows if d["params"].get("gpu_mem_limit_gib")})
    held = (f" A GiB cap ({', '.join(f'{g:g}' for g in limits)} GiB) held the rank to a GPU of that size: an "
            "OOM is that GPU's." if limits else "")
    return [f"Emulated rows ({len(rows)} here) ran one rank of the cell's world alone on one GPU "
            "(docs/emulation.md): their memory is the rank's, measured, with NCCL's buffers modelled ("
            + (", ".join(f"{n:,}" for n in nccl) or "no") + " MiB added); their timed figures, marked "
            "compute, are that rank's compute alone." + held, ""]


def _timing_note(docs: list[Doc]) -> list[str]:
    ran = [d for d in docs if d["status"] == "ok"]
    if not ran:
        return []
    per_step = sum(1 for d in ran if (metric(d, "timing") or {}).get("method") == PER_STEP_METHOD)
    noisy = sum(1 for d in ran if metric(d, "noisy"))
    text = (f"Timed figures are medians ± half their 95% interval (docs/measurement.md); {noisy} of "
            f"{len(ran)} cells here are noisy: their interval stayed wider than the study's target.")
    if per_step:
        text += (f" {per_step} of them ran before timing windows: each of their steps was synchronised and "
                 f"timed alone, and their intervals come from those step times.")
    return [text, ""]


def _time_model_note(docs: list[Doc], study: str) -> list[str]:
    """Which GPU the time model predicts for, and whether its constants saw these cells (the cells they
    were fitted on: docs/time-model.md, "The constants", once for every table)."""
    predicted = [d for d in docs if d.get("predicted_time")]
    if not predicted:
        return []
    from trainbench.predict.time_model import load_constants

    gpus = sorted({d["predicted_time"]["gpu"] for d in predicted})
    text = f"Predicted step times are the time model's on {', '.join(gpus)} (docs/time-model.md)"
    borrowed = sorted({d["predicted_time"]["note"] for d in predicted if d["predicted_time"].get("note")})
    text += "".join(f"; {note}" for note in borrowed)
    if any(d["status"] == "ok" for d in predicted):
        seen = any(study in c.fitted_studies() for c in load_constants().values())
        text += ("; its constants were fitted on cells of this study among others, so a measured cell's "
                 "error here is in sample" if seen else
                 "; its constants were fitted on other studies' cells, so a measured cell's error here is "
                 "out of sample")
    return [text + ".", ""]


def study_markdown(study: str, description: str, docs: list[Doc], *, id_keys: list[str],
                   plan_for: dict[str, Any] | None = None, judged: list | None = None,
                   references: list[dict[str, Any]] | None = None) -> str:
    """The study's markdown: its answer (reporting.answer), the summary table of the cells that have a
    result with its notes, the study's description, its findings as `judged` (findings.evaluate), the
    largest-batch searches, its cells against its references, and the cells without a result counted
    by reason (their rows: the plan). Every column the study reports is in all_columns_markdown."""
    from trainbench.reporting import references as referenced
    from trainbench.reporting.answer import answer_markdown
    from trainbench.reporting.findings import markdown as findings_markdown

    docs = with_current_predictions(docs)
    measured, not_run = split_not_run(docs)
    parts = [
        f"# {study}",
        "",
        *answer_markdown(docs, id_keys, judged, plan_for),
        "## Measured cells",
        "",
        *_measured_section(study, measured, len(docs), id_keys),
        "## The study",
        "",
        description.strip(),
        "",
        *findings_markdown(judged or []),
        *search_markdown(measured, id_keys=id_keys),
        *referenced.markdown(referenced.check(references or [], measured)),
        *not_run_markdown(study, not_run, len(docs), plan_for),
    ]
    return "\n".join(parts)


def _made(study: str) -> str:
    target = paths.path(paths.TABLE_MD, study=study)
    return (f"Generated {dt.date.today().isoformat()} by `snakemake {target}` from "
            f"{paths.path(paths.RUN, study=study, cell='*')}.")


def _measured_section(study: str, measured: list[Doc], cells: int, id_keys: list[str]) -> list[str]:
    """The summary table of the cells with a result, what they are and where they ran, and the notes
    that say how to read their figures; where the rest of their columns are."""
    from trainbench.reporting.answer import summary_markdown

    if not measured:
        return ["No cell of this study has a result yet.", _made(study), ""]
    statuses = Counter(d["status"] for d in measured)
    commits = sorted({_short_commit((d.get("provenance") or {}).get("git_commit") or "unknown")
                      for d in measured})
    every = paths.path(paths.TABLE_ALL, study=study).rsplit("/", 1)[1]
    return [
        *summary_markdown(measured, id_keys),
        "",
        f"{_count(len(measured), 'cell')} with a result"
        + (f" of the study's {cells}" if cells > len(measured) else "") + ": "
        + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + ".",
        f"Ran on: {_hardware_summary(measured)}.",
        f"Code: {', '.join(commits)}. {_made(study)}",
        "",
        *_emulation_note(measured),
        *_timing_note(measured),
        *_time_model_note(measured, study),
        f"Every column the study reports, each timed figure with its interval: [{every}]({every}); every "
        f"figure of every cell: [{study}.csv]({study}.csv); what each column means: docs/columns.md.",
        "",
    ]


def all_columns_markdown(study: str, docs: list[Doc], *, id_keys: list[str], report: list[str]) -> str:
    """The cells with a result, with every column the study reports (and the models' predictions beside
    them), in the summary's order: the wide table a reviewer reads beside the study's markdown."""
    from trainbench.reporting.answer import summary_order

    docs = with_current_predictions(docs)
    measured, _ = split_not_run(docs)
    columns = with_predictions(report, docs)
    intro = (f"The cells of [{study}.md]({study}.md) that have a result, with every column the study reports "
             "and the models' predictions beside them; timed figures ± half their 95% interval. How to read "
             f"them: the notes under {study}.md's summary; what each column means: docs/columns.md.")
    table = (markdown_table(summary_order(measured), id_keys=id_keys, report=columns) if measured
             else "No cell of this study has a result yet.")
    return "\n".join([f"# {study}: every column", "", intro, "", table, ""])


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'}"


def not_run_markdown(study: str, docs: list[Doc], cells: int, plan_for: dict[str, Any] | None) -> list[str]:
    """The cells without a result, as a count by outcome: their rows are the plan file."""
    if not docs:
        return []
    outcomes = Counter(f"{d['status']}: {d['reason']}" if d.get("reason") else d["status"] for d in docs)
    lines = ["| outcome | cells |", "| --- | --- |"]
    lines += [f"| {escape(outcome)} | {n} |" for outcome, n in outcomes.most_common()]
    return [
        "## Planned and not run",
        "",
        f"{len(docs)} of the study's {cells} cells have no result. Their rows, each with the memory and time "
        f"models' figures, are in {paths.path(paths.TABLE_PLAN, study=study)}.",
        "",
        "\n".join(lines),
        "",
        *_planning_note(docs, plan_for),
    ]


# Rows of cells that have no result (outside the study's `measure` selection, or needing more GPUs than
# the machine that made the table had) carry this key: they go to the plan, not the table.
NOT_RUN = "not_run"


def split_not_run(docs: list[Doc]) -> tuple[list[Doc], list[Doc]]:
    """The rows with a result (the table's), and those without (the plan's), each in grid order."""
    return [d for d in docs if not d.get(NOT_RUN)], [d for d in docs if d.get(NOT_RUN)]


# Maps whose keys are whatever a host had (every installed package, every environment variable the run
# recorded): hundreds of columns, read in the cell's metrics.json instead.
OPEN_ENDED = ("provenance.packages", "provenance.environment")


def scalar_columns(value: Any, prefix: str = "") -> dict[str, Any]:
    """A document as scalar columns: nested mappings to dotted names (metrics.timing.method); a 95%
    interval ([low, high] under a `*_ci` key) to `<key>.low` and `<key>.high`. Other lists (a loss curve,
    a figure per rank or per step) are series, not columns: the cell's metrics.json keeps them."""
    if isinstance(value, dict):
        if prefix in OPEN_ENDED:
            return {}
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(scalar_columns(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list):
        if prefix.endswith("_ci") and len(value) == 2:
            return {f"{prefix}.low": value[0], f"{prefix}.high": value[1]}
        return {}
    return {prefix: value}


CSV_FIRST = ["study", "cell_id", "status", "reason", "params_hash"]


def csv_rows(docs: list[Doc], *, id_keys: list[str], report: list[str]) -> list[dict[str, Any]]:
    """One row per cell: the table's columns as table.<column> (table.<column>_low / _high for an
    interval), from the same computation as the markdown (table_rows); then the scalars of its
    metrics.json, the prediction it was launched with as predicted_at_run.*, the current models' as
    predicted_now.* and predicted_time.*. `docs` carry their current predictions
    (with_current_predictions)."""
    rows = []
    for doc, table in zip(docs, table_rows(docs, id_keys=id_keys, report=report)):
        document = {k: v for k, v in doc.items() if k not in ("predicted", "predicted_now", NOT_RUN)}
        document["predicted_at_run"] = doc.get("predicted") if not doc.get(NOT_RUN) else {}
        document["predicted_now"] = doc["predicted_now"]
        row = {f"table.{name}": value for name, value in table.items() if name not in id_keys}
        row.update(scalar_columns(document))
        rows.append(row)
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path, drop_empty: bool = False) -> None:
    """The rows with the cell's identity first, the table's columns next, the rest by name; with
    `drop_empty`, without the columns no row has a value in (the plan: nothing measured)."""
    table = [k for k in dict.fromkeys(k for row in rows for k in row) if k.startswith("table.")]
    rest = sorted({k for row in rows for k in row} - set(CSV_FIRST) - set(table))
    frame = pandas.DataFrame(rows, columns=CSV_FIRST + table + rest)
    if drop_empty:
        frame = frame[[c for c in frame.columns if c in CSV_FIRST or frame[c].notna().any()]]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)


def with_searches(docs: list[Doc], searches: list[Doc]) -> list[Doc]:
    """The cells' documents, each searched one carrying its max-batch search's result under "search"."""
    by_cell = {s["cell_id"]: s for s in searches}
    return [{**d, "search": by_cell[d["cell_id"]]} if d["cell_id"] in by_cell else d for d in docs]


def with_planned(docs: list[Doc], study: Study, short_of_gpus: dict[str, str] | None = None) -> list[Doc]:
    """The measured cells' documents and the planned cells' rows, in the grid's order; a measured cell
    the machine that made the table could not run (`short_of_gpus`: id to why) has a row saying so.
    The rows without a result carry NOT_RUN."""
    by_id = {d["cell_id"]: d for d in docs}
    by_id.update({c.cell_id: {**planned_document(c, study.plan_for), NOT_RUN: True} for c in study.planned})
    for cell_id, why in (short_of_gpus or {}).items():
        row = planned_document(study.cell(cell_id), study.plan_for)
        by_id[cell_id] = {**row, "status": "not run", "reason": why, NOT_RUN: True}
    return [by_id[c.cell_id] for c in study.cells if c.cell_id in by_id]


def short_of_gpus(study: Study, results: list[str]) -> dict[str, str]:
    """The measured cells the workflow left out of the table's inputs (`results`, the metrics.json files
    it was given) for want of GPUs on the machine that made it (Workflow.cells_short_of_gpus), and
    why."""
    from trainbench.study.grid import short_of_gpus as needs

    given = {str(Path(r)) for r in results}
    return {c.cell_id: f"{needs(c.params, 0) or 'needs GPUs'}, more than the machine that made this table has"
            for c in study.cells if c.measured and str(Path(c.target)) not in given}


def write_tables(docs: list[Doc], *, study: str, description: str, id_keys: list[str], report: list[str],
                 csv_path: Path, md_path: Path, plan_path: Path | None = None,
                 plan_for: dict[str, Any] | None = None, findings: list[dict[str, Any]] | None = None,
                 findings_path: Path | None = None, references: list[dict[str, Any]] | None = None,
                 all_path: Path | None = None) -> None:
    """The study's markdown, its every-column markdown (`all_path`, beside the markdown by default), its
    CSV (the cells with a result) and plan (those without), and its findings judged once for the
    markdown, its answer and their CSV."""
    from trainbench.reporting import findings as judging

    current = with_current_predictions(docs)
    judged = judging.evaluate(findings, current, id_keys)
    columns = with_predictions(report, docs)
    measured, not_run = split_not_run(current)
    write_csv(csv_rows(measured, id_keys=id_keys, report=columns), Path(csv_path))
    if plan_path is not None:
        write_csv(csv_rows(not_run, id_keys=id_keys, report=columns), Path(plan_path), drop_empty=True)
    Path(md_path).write_text(study_markdown(study, description, current, id_keys=id_keys, plan_for=plan_for,
                                            judged=judged, references=references))
    all_path = all_path or Path(md_path).with_suffix(".all.md")
    Path(all_path).write_text(all_columns_markdown(study, current, id_keys=id_keys, report=report))
    if findings_path is not None:
        judging.write_csv(judged, Path(findings_path))


# what a layout (Workflow.table_layout, .plot_layout) holds, counted in the line made_with gives
LAYOUT_WORDS = {"report": "column", "findings": "finding", "references": "reference",
                "plot_panels": "panel key"}


def made_with(layout: dict[str, Any], planning: dict[str, Any], missing: list[str], short: dict[str, str],
              models: str) -> str:
    """What a study's table or plots are made from besides their input files (Workflow.table_layout or
    .plot_layout, .planning, .missing_cells, .cells_short_of_gpus, .prediction_models), as one line that
    changes with any of them: the job's parameter, so that a change reruns it, and what the report's
    info panel shows of it (words and counts, not the study's configuration)."""
    digest = hashlib.sha256(json.dumps([layout, planning, sorted(missing), short, models], sort_keys=True,
                                       default=str).encode()).hexdigest()[:12]
    plan_for = (planning.get("plan_for") or {}).get("name")
    facts = [
        ", ".join(_count(len(layout[k] or []), word) for k, word in LAYOUT_WORDS.items() if k in layout),
        _count(len(planning["planned"]), "planned cell") + (f" for {plan_for}" if plan_for else ""),
        f"{_count(len(missing), 'measured cell')} without a result",
        f"{_count(len(short), 'cell')} short of GPUs here",
        f"prediction models {models}",
        f"digest {digest}",
    ]
    return "; ".join(facts)


GLOSSARY_INTRO = """\
# Columns of the tables

What each column of a study's tables means, once for every table. A study's markdown
(`results/tables/<study>.md`) opens with its answer and the summary table below;
`results/tables/<study>.all.md` has every column the study reports, and `<study>.csv` every figure of
every cell. Written by `trainbench columns --markdown` from the column registry
(`src/trainbench/reporting/columns.py`).

**Reading the figures.** A timed figure is the median over timed windows ± half its 95% interval
([How a cell is measured](measurement.md)); a cell whose interval stayed wider than its study's target
is *noisy*, and one timed in fewer than 6 windows has no interval. *(compute)* marks an emulated rank's
timed figure: one rank of a larger world measured alone, its compute without the world's collectives;
its memory is the rank's, measured, with NCCL's buffers modelled ([Emulated ranks](emulation.md)).
*Predicted* figures are the [memory](memory-model.md) and [time](time-model.md) models' as they are now:
for a measured cell on the GPU it ran on, for a planned one on the study's planning hardware. Which cells
the time model's constants were fitted on, and so whether a table's errors are in sample:
[The time model](time-model.md#the-constants).
"""


def glossary_markdown() -> str:
    """The documentation's page of columns (docs/columns.md): the summary table's, every column a study
    can report, the column sets, and what findings compare besides."""
    from trainbench.reporting.findings import metrics

    cell = escape
    lines = [GLOSSARY_INTRO, "## The summary table", "", "| column | meaning |", "| --- | --- |"]
    lines += [f"| {name} | {cell(meaning)} |" for name, meaning in SUMMARY_COLUMNS.items()]
    lines += ["", "## Every column", "",
              "A study's `report` names these (`trainbench columns`); every table adds the models' "
              "predictions beside what was measured.", "",
              "| name | header | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {cell(c.header)} | {cell(c.description)} |" for name, c in COLUMNS.items()]
    lines += [f"| `{name}` | (a set) | {', '.join(f'`{m}`' for m in members)} |"
              for name, members in COLUMN_SETS.items()]
    searched = [m for name, m in metrics().items() if name not in COLUMNS]
    lines += ["", "Findings also compare " + ", ".join(f"`{m.name}` ({m.header})" for m in searched) + "."]
    return "\n".join(lines) + "\n"

