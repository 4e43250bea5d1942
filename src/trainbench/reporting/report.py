"""A study's page: one HTML file a reviewer reads first, and the study page of the Snakemake report
(`snakemake --report report.html`).

The page shows the study's markdown table file as it is (its title, its answer, the summary table of
the cells with a result and the notes under it, its description, its findings and their verdicts, a
count of the cells without a result), then its every-column file (each timed figure with its 95%
interval), folded; names its plots, and says where the cells ran: one row per distinct set-up
(hardware, driver and CUDA/NCCL, package versions, commit), read from the cells' metrics.json files.
Nothing on it is computed or stored twice: the tables are the markdown files rendered, and the plots,
items of the report beside the page, are not embedded in it again.
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from trainbench import paths
from trainbench.contract.result import VERSION_KEYS

Doc = dict[str, Any]

# outcomes of cells that were never launched: their provenance says where the decision was taken, not
# where anything ran
NOT_LAUNCHED = ("unsupported", "infeasible", "planned", "not run")


def _gib(mib: float | None) -> str:
    return f"{mib / 1024:.1f} GiB" if mib else "?"


CPU_RANKS = "none: CPU ranks"


def _machine(provenance: dict[str, Any]) -> str:
    gpu = provenance.get("gpu_name")
    if gpu:
        return f"{gpu} ({_gib(provenance.get('gpu_memory_mib'))})"
    return CPU_RANKS


def _host(provenance: dict[str, Any]) -> str:
    """The host's name, CPUs and memory, as far as the run recorded them (older runs: no memory, no
    CPU model)."""
    cores, memory = provenance.get("cpu_count"), provenance.get("host_mem_total_mib")
    model = provenance.get("cpu_model")
    facts = [f"{cores} CPUs" if cores else "", model or "", _gib(memory) if memory else ""]
    return f"{provenance.get('hostname') or '?'}: {', '.join(f for f in facts if f) or '?'}"


def _stack(provenance: dict[str, Any]) -> str:
    """NVIDIA driver, CUDA and NCCL; for CPU runs, none of them."""
    parts = [(name, provenance.get(key)) for name, key in (("driver", "driver"), ("CUDA", "cuda"),
                                                              ("NCCL", "nccl"))]
    known = [f"{name} {value}" for name, value in parts if value]
    return ", ".join(known) or "—"


def _commit(provenance: dict[str, Any]) -> str:
    commit = provenance.get("git_commit") or "unknown"
    dirty = commit.endswith("-dirty")
    head = commit.removesuffix("-dirty")[:12]
    return head + (" (with uncommitted changes)" if dirty else "")


@dataclass(frozen=True)
class SetUp:
    """What a group of cells ran on and with: two cells with the same set-up differ only in their
    parameters."""

    machine: str
    host: str
    stack: str
    versions: tuple[tuple[str, str], ...]
    commit: str
    emulated: bool = False  # one rank of each cell's world on one GPU (emulation.py)


PROVENANCE_HEADERS = ("cells", "GPU", "GPUs per cell", "host", "driver, CUDA, NCCL", *VERSION_KEYS,
                      "commit", "ran")


def provenance_rows(docs: list[Doc]) -> list[dict[str, str]]:
    """One row per distinct set-up the study's cells ran on, most cells first: how many cells, the GPU
    (or CPU ranks) and how many each cell had, the host, driver/CUDA/NCCL, the main packages' versions,
    the code's commit and when the first of them started and the last ended. Cells never launched
    (unsupported, infeasible) are left out: nothing ran."""
    groups: dict[SetUp, list[Doc]] = {}
    for doc in docs:
        provenance = doc.get("provenance") or {}
        if doc["status"] in NOT_LAUNCHED or not provenance:
            continue
        versions = provenance.get("versions") or {}
        setup = SetUp(_machine(provenance), _host(provenance), _stack(provenance),
                      tuple((key, versions.get(key) or "—") for key in VERSION_KEYS), _commit(provenance),
                      bool(doc.get("emulation")))
        groups.setdefault(setup, []).append(doc)
    rows = []
    for setup, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        per_cell = [str(n) for n in sorted({d["provenance"].get("gpu_count") or 0 for d in members})]
        if setup.emulated:
            worlds = sorted({d["emulation"]["world_size"] for d in members})
            per_cell = [f"{', '.join(per_cell)} (an emulated rank of {', '.join(map(str, worlds))})"]
        started = [_utc(d["provenance"].get("started")) for d in members]
        ended = [_utc(d["provenance"].get("ended")) for d in members]
        started, ended = [t for t in started if t], [t for t in ended if t]
        rows.append({
            "cells": str(len(members)), "GPU": setup.machine,
            "GPUs per cell": "—" if setup.machine == CPU_RANKS else ", ".join(per_cell),
            "host": setup.host, "driver, CUDA, NCCL": setup.stack, **dict(setup.versions),
            "commit": setup.commit,
            "ran": f"{min(started):%Y-%m-%d %H:%M} to {max(ended):%Y-%m-%d %H:%M} UTC" if started and ended
            else "?"})
    return rows


def _utc(stamp: str | None) -> dt.datetime | None:
    """A provenance time (ISO 8601 with the host's offset) in UTC, so hosts in other zones compare."""
    try:
        return dt.datetime.fromisoformat(stamp).astimezone(dt.timezone.utc) if stamp else None
    except ValueError:
        return None


def _html_table(headers: tuple[str, ...] | list[str], rows: list[dict[str, str]], css_class: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(row.get(h, ''))}</td>" for h in headers) + "</tr>"
                   for row in rows)
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def markdown_html(text: str) -> str:
    """The markdown table file as HTML: CommonMark with tables, raw HTML in it escaped (the file is
    data, not markup of ours)."""
    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    # a value and its interval stay on one line in a narrow column: "9.1 ± 0.2", not "9.1 ±" / "0.2"
    return rendered.replace(" ± ", "\u00a0±\u00a0")


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1e293b; background: #fff; }
main { padding: 1.5rem 2rem; max-width: 100%; }
h1 { font-size: 1.6rem; margin: 0 0 .5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
table { border-collapse: collapse; display: block; overflow-x: auto; margin: .75rem 0; font-size: 12px; }
th, td { border: 1px solid #cbd5e1; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f1f5f9; position: sticky; top: 0; }
tbody tr:nth-child(even) { background: #f8fafc; }
code { background: #f1f5f9; padding: 0 .2rem; }
"""


def study_page(study: str, table_markdown: str, plots: list[tuple[str, str]], docs: list[Doc],
               every_column: str = "") -> str:
    """The study's page as one HTML document: its markdown table file rendered (title, answer, the
    summary of the measured cells, description, findings, a count of the others), its every-column
    markdown (`every_column`) folded under "All columns", its plots named (`plots`: each file and what
    it shows), and where its cells ran. The plots are not embedded: in the report each is an item of
    the study's "plots" beside the page, stored once; on disk they are the files named."""
    rows = provenance_rows(docs)
    provenance = (_html_table(PROVENANCE_HEADERS, rows, "provenance") if rows
                  else "<p>No cell of this study has run yet.</p>")
    listed = "".join(f"<li>{html.escape(shows)}: <code>{html.escape(file)}</code></li>"
                     for file, shows in plots)
    figures = (f"<p>In the report, each plot is an item of this study's <b>plots</b>, beside this page, with "
               f"its caption.</p><ul>{listed}</ul>" if plots else "<p>This study has no plot.</p>")
    return "\n".join([
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>trainbench: {html.escape(study)}</title>',
        f"<style>{STYLE}</style></head><body><main>",
        f'<section class="study-table">{markdown_html(table_markdown)}</section>',
        _every_column_section(every_column),
        f'<section class="plots"><h2>Plots</h2>{figures}</section>',
        '<section class="provenance"><h2>Where and with what the cells ran</h2>',
        "<p>One row per set-up, read from the cells' metrics.json files (each has the rest: every installed "
        "package, the environment variables that steer NCCL, CUDA and torch, the launch command).</p>",
        provenance, "</section>",
        "</main></body></html>",
        "",
    ])


def _every_column_section(every_column: str) -> str:
    """The every-column file, folded under its own heading (its title line left out: the page has one)."""
    if not every_column:
        return ""
    body = every_column.split("\n", 1)[1] if every_column.startswith("# ") else every_column
    return ('<section class="all-columns"><h2>All columns</h2><details><summary>every column the study '
            f"reports, for each cell with a result</summary>{markdown_html(body)}</details></section>")


def plots_of(directory: Path | str) -> list[tuple[str, str]]:
    """A study's plots (its plot folder's index, paths.plot_files): each file, and what it shows ("memory:
    gpt-345m, 8 GPUs")."""
    return [(str(plot["path"]), f"{plot['kind']}: {plot['shows']}" if plot["shows"] else plot["kind"])
            for plot in paths.plot_files(directory)]


def write_study_page(path: Path, *, study: str, table_path: Path, plots_dir: Path | str,
                     docs: list[Doc], every_column_path: Path | None = None) -> None:
    every_column = Path(every_column_path).read_text() if every_column_path else ""
    page = study_page(study, Path(table_path).read_text(), plots_of(plots_dir), docs, every_column)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(page)


VERDICTS = ("reproduced", "partly", "not reproduced", "not yet measured")


def verdict_tally(findings_csv: Path | str) -> str:
    """A study's findings as their verdicts counted ("7 reproduced, 2 partly, 1 not reproduced"), from
    its findings CSV (one row per judged pair, each with its finding's verdict); "" for a study that
    declares none."""
    import pandas

    table = pandas.read_csv(findings_csv, usecols=["finding", "verdict"])
    verdicts = table.groupby("finding")["verdict"].first().tolist()
    return ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts)


def page_labels(findings_csv: Path | str) -> dict[str, str]:
    """The labels of a study's page in the report: what it is, and its findings' verdicts (the front
    page lists them beside each study)."""
    return {"shows": "the study page: answer, measured cells, findings, provenance",
            "findings": verdict_tally(findings_csv) or "none declared"}
