"""A study's page: one HTML file a reviewer reads first, and the study page of the Snakemake report
(`snakemake --report report.html`).

The page shows the study's markdown table file as it is (its title, its answer, the summary table of
the cells with a result and the notes under it, its description, its findings and their verdicts, a
count of the cells without a result), then its every-column file (each timed figure with its 95%
interval), folded; shows its plots under the summary, in their reading order (plots.json), and says
where the cells ran: one row per distinct set-up (hardware, driver and CUDA/NCCL, package versions,
commit), read from the cells' metrics.json files. The tables are the markdown files rendered, nothing
computed again. The page is made twice: the one kept beside the table links its plots by relative path,
so that it stays small in the repository; the report's copy (REPORT_PAGE) embeds them, since the report's
viewer cannot follow a path to another file, at 128 colours, a quarter of their files' bytes and no
change a reader sees.

The page fits a 1440-pixel screen: its tables wrap rather than run off to the side, except the
every-column table and the provenance, which scroll inside their own box; no plot is wider than the page
or taller than the window. Its links go to its own sections: the CSV files are named, not linked, since a
browser downloads a CSV rather than showing it.

Each study also has its part of the report's front page (`front_part`, workflow/report/workflow.rst):
its answer, its headline numbers and its first KEY_PLOTS plots.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from trainbench import paths
from trainbench.contract.result import VERSION_KEYS
from trainbench.reporting.answer import gpu_of, trained

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
    return (f'<div class="table-box"><table class="{css_class}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def markdown_html(text: str) -> str:
    """The markdown table file as HTML: CommonMark with tables, raw HTML in it escaped (the file is
    data, not markup of ours)."""
    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    # a value and its interval stay on one line in a narrow column: "9.1 ± 0.2", not "9.1 ±" / "0.2"
    rendered = rendered.replace(" ± ", "\u00a0±\u00a0")
    # a table that cannot wrap to the page's width (a max-batch search's many columns) scrolls in its box
    return rendered.replace("<table>", '<div class="table-box"><table>').replace("</table>", "</table></div>")


# Tables wrap their text to the page's width; one that cannot (every column, provenance, a search's
# columns) scrolls inside its own box. A plot is held to the page's width and the window's height, its
# shape kept.
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1e293b; background: #fff; }
main { padding: 1.5rem 2rem; max-width: 100%; box-sizing: border-box; }
h1 { font-size: 1.6rem; margin: 0 0 .5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .75rem 0; font-size: 12px; width: 100%; }
th, td { border: 1px solid #cbd5e1; padding: .25rem .5rem; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { background: #f1f5f9; }
tbody tr:nth-child(even) { background: #f8fafc; }
.table-box { max-width: 100%; overflow-x: auto; margin: .75rem 0; }
.table-box table { margin: 0; }
code { background: #f1f5f9; padding: 0 .2rem; overflow-wrap: anywhere; }
figure.plot { margin: 1.5rem 0; }
figure.plot img { display: block; max-width: 100%; max-height: calc(100vh - 4rem); width: auto;
                  height: auto; }
figcaption { color: #475569; font-size: 12px; margin-top: .25rem; }
"""

KEY_PLOTS = 2  # a study's first plots, in their reading order, on the report's front page
PLOT_COLOURS = 128  # a plot's colours as embedded: matplotlib's anti-aliasing makes thousands, unseen


def plot_uri(path: Path | str) -> str:
    """A plot as a data URI, on white, its colours reduced to PLOT_COLOURS without dithering: the same
    picture to the eye, a quarter of the file's bytes."""
    from PIL import Image

    with Image.open(path) as image:
        rgba = image.convert("RGBA")
    flat = Image.new("RGB", rgba.size, "white")
    flat.paste(rgba, mask=rgba.getchannel("A"))
    reduced = flat.quantize(colors=PLOT_COLOURS, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    reduced.save(buffer, "PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figures_html(plots: list[tuple[str, str]], page_dir: Path | str | None = None) -> str:
    """Each plot (its file, what it shows) as a figure, in the order given, captioned with both: linked by
    its path relative to `page_dir`, the folder of the page that shows it, or embedded where there is none
    (the report's copy)."""
    def source(file: str) -> str:
        return plot_uri(file) if page_dir is None else html.escape(os.path.relpath(file, page_dir))

    return "".join(f'<figure class="plot"><img src="{source(file)}" alt="{html.escape(shows)}">'
                   f"<figcaption>{html.escape(shows)}: <code>{html.escape(str(file))}</code></figcaption>"
                   "</figure>" for file, shows in plots)


def _section_of(markdown: str, heading: str) -> str:
    """The body of the markdown's `## heading` section, up to the next heading of that level."""
    start = markdown.find(f"\n## {heading}\n")
    if start < 0:
        return ""
    body = markdown[start + len(heading) + 5:]
    return body.split("\n## ", 1)[0]


def _own_links(rendered: str, study: str) -> str:
    """The markdown's links to the study's files made the page's own: its markdown and every-column files
    are sections of this page; a CSV file is named where it is, not linked (a browser downloads a CSV
    rather than show it, and in the report's viewer a path leads nowhere)."""
    rendered = rendered.replace(f'href="{study}.all.md"', 'href="#all-columns"')
    rendered = rendered.replace(f'href="{study}.md"', 'href="#top"')
    folder = html.escape(str(Path(paths.TABLE_CSV).parent))
    return re.sub(r'<a href="([^"#/:]+\.csv)">[^<]*</a>', lambda m: f"<code>{folder}/{m.group(1)}</code>",
                  rendered)


def study_page(study: str, table_markdown: str, plots: list[tuple[str, str]], docs: list[Doc],
               every_column: str = "", page_dir: Path | str | None = None) -> str:
    """The study's page as one HTML document: its markdown table file rendered (title, answer, the
    summary of the measured cells, description, findings, a count of the others) with its plots (`plots`:
    each file and what it shows, in reading order) under the summary, its every-column markdown
    (`every_column`) folded under "All columns", and where its cells ran. The plots are linked relative to
    `page_dir`, the page's folder, or embedded where it is None (figures_html)."""
    rows = provenance_rows(docs)
    provenance = (_html_table(PROVENANCE_HEADERS, rows, "provenance") if rows
                  else "<p>No cell of this study has run yet.</p>")
    summary, sep, rest = table_markdown.partition("\n## The study\n")
    figures = figures_html(plots, page_dir) if plots else "<p>This study has no plot.</p>"
    return "\n".join([
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>trainbench: {html.escape(study)}</title>',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<style>{STYLE}</style></head><body><main id="top">',
        f'<section class="study-table">{_own_links(markdown_html(summary), study)}</section>',
        f'<section class="plots"><h2>Plots</h2>{figures}</section>',
        f'<section class="study-table">{_own_links(markdown_html(sep.lstrip() + rest), study)}</section>'
        if sep else "",
        _own_links(_every_column_section(every_column), study),
        '<section class="provenance"><h2>Where and with what the cells ran</h2>',
        "<p>One row per set-up, read from the cells' metrics.json files (each has the rest: every installed "
        "package, the environment variables that steer NCCL, CUDA and torch, the launch command).</p>",
        provenance, "</section>",
        "</main></body></html>",
        "",
    ])


def _every_column_section(every_column: str) -> str:
    """The every-column file, folded under its own heading (its title line left out: the page has one);
    a link to #all-columns unfolds it."""
    if not every_column:
        return ""
    body = every_column.split("\n", 1)[1] if every_column.startswith("# ") else every_column
    return ('<section class="all-columns"><h2>All columns</h2><details><summary>every column the study '
            f'reports, for each cell with a result</summary><div id="all-columns">{markdown_html(body)}</div>'
            "</details></section>")


def plots_of(directory: Path | str) -> list[tuple[str, str]]:
    """A study's plots (its plot folder's index, paths.plot_files): each file, and what it shows ("memory:
    gpt-345m, 8 GPUs")."""
    return [(str(plot["path"]), f"{plot['kind']}: {plot['shows']}" if plot["shows"] else plot["kind"])
            for plot in paths.plot_files(directory)]


# what a cell that did not train came to, in the front page's words
OUTCOME_WORDS = {"ok": "ran, but failed its sanity checks", "oom": "out of memory", "failed": "failed",
                 "timeout": "timed out", "unsupported": "unsupported", "infeasible": "predicted not to fit"}


def headline_numbers(docs: list[Doc], tally: str = "") -> list[tuple[str, str]]:
    """A study's numbers at a glance, each a figure and what it counts: its cells with a result, those
    that trained, the others by outcome, the GPU models they ran on and its findings' verdicts
    (`tally`, verdict_tally's)."""
    statuses = [d["status"] for d in docs]
    untrained = Counter(OUTCOME_WORDS.get(s, s) for d, s in zip(docs, statuses) if not trained(d))
    numbers = [(str(len(docs)), "cells with a result"), (str(len(docs) - sum(untrained.values())), "trained")]
    numbers += [(str(n), words) for words, n in untrained.most_common()]
    gpus = sorted({gpu_of(d) for d, s in zip(docs, statuses) if s not in NOT_LAUNCHED})
    if gpus:
        numbers.append((", ".join(gpus), "ran on"))
    if tally:
        numbers.append((tally, "findings"))
    return numbers


def front_part(study: str, table_markdown: str, plots: list[tuple[str, str]], docs: list[Doc],
               tally: str = "") -> str:
    """A study's part of the report's front page (an HTML fragment; workflow/report/workflow.rst puts
    each study's under its name): its headline numbers, its answer as its markdown says it, and its
    first KEY_PLOTS plots in their reading order."""
    numbers = "".join(f"<li>{html.escape(what)}: <b>{html.escape(figure)}</b></li>"
                      for figure, what in headline_numbers(docs, tally))
    answer = markdown_html(_section_of(table_markdown, "Answer")) or "<p>No answer yet.</p>"
    return (f'<div class="tb-study" data-study="{html.escape(study)}"><ul class="tb-numbers">{numbers}</ul>'
            f'<div class="tb-answer">{answer}</div>'
            f'<div class="tb-plots">{figures_html(plots[:KEY_PLOTS])}</div></div>\n')


def write_study_page(path: Path, *, study: str, table_path: Path, plots_dir: Path | str,
                     docs: list[Doc], every_column_path: Path | None = None, report_path: Path | None = None,
                     front_path: Path | None = None, findings_path: Path | None = None) -> None:
    """The study's page at `path`, its plots linked; given `report_path`, the report's copy there, its
    plots embedded; given `front_path`, its part of the report's front page there (embedded too: only
    the report shows it)."""
    every_column = Path(every_column_path).read_text() if every_column_path else ""
    table, plots = Path(table_path).read_text(), plots_of(plots_dir)
    pages = {Path(path): Path(path).parent}
    if report_path:
        pages[Path(report_path)] = None
    for page, page_dir in pages.items():
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(study_page(study, table, plots, docs, every_column, page_dir))
    if front_path:
        tally = verdict_tally(findings_path) if findings_path else ""
        Path(front_path).parent.mkdir(parents=True, exist_ok=True)
        Path(front_path).write_text(front_part(study, table, plots, docs, tally))


VERDICTS = ("reproduced", "partly", "not reproduced", "not yet measured")


def verdict_tally(findings_csv: Path | str) -> str:
    """A study's findings as their verdicts counted ("7 reproduced, 2 partly, 1 not reproduced"), from
    its findings CSV (one row per judged pair, each with its finding's verdict); "" for a study that
    declares none."""
    import pandas

    table = pandas.read_csv(findings_csv, usecols=["finding", "verdict"])
    verdicts = table.groupby("finding")["verdict"].first().tolist()
    return ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts)
