"""What a reader of the documentation is promised: tables that render, pages that stay readable, words
about the product only, links that lead somewhere, and published figures that are the tables' own.

Fast and offline: it reads the repository's files. The site itself (every link and anchor of docs/) is
built by `make docs`, with every warning an error.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from conftest import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))
# tables a command writes, held to what it finds by their own tests: read as reference, not as prose
GENERATED = ("architectures.md", "columns.md")
RENDERED = [REPO / "README.md", *DOCS, REPO / "results" / "README.md", REPO / "validation" / "README.md"]
DOCS_BUDGET = 163_000  # bytes, every page of docs/ together
PAGE_BUDGET = 25_000  # bytes, one page
CAMPAIGNS = ("gpt2_zero", "lightning", "llama", "megatron", "zero3_pipeline")
VERDICTS = ("reproduced", "partly", "not reproduced", "not yet measured")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


DELIMITER_ROW = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")


def broken_tables(text: str) -> list[int]:
    """Lines that start a run of `|` rows after a blank line without being a table's header: a header
    row followed by a `| --- |` delimiter row. Such rows render as raw pipes (a table split by a blank
    line, or rows that lost their header)."""
    lines = _prose_lines(text)
    broken = []
    for i, (number, line) in enumerate(lines):
        previous = lines[i - 1][1] if i else ""
        if not line.startswith("|") or previous.strip():
            continue
        following = lines[i + 1][1] if i + 1 < len(lines) else ""
        if not DELIMITER_ROW.match(following.strip()):
            broken.append(number)
    return broken


def test_the_table_check_catches_a_table_split_by_a_blank_line():
    split = ("| study | set-up |\n| --- | --- |\n| `smoke` | tiny GPT-2 |\n\n| `holdout` | GPT-2.5B |\n")
    assert broken_tables(split) == [5]
    whole = "Text.\n\n| study | set-up |\n| --- | --- |\n| `smoke` | tiny GPT-2 |\n\nMore text.\n"
    assert broken_tables(whole) == []
    assert broken_tables("\n| a | b |\nno delimiter\n") == [2]
    assert broken_tables("```\n\n| a shell prompt | in a code block |\n```\n") == []


@pytest.mark.parametrize("page", RENDERED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_table_is_broken_by_a_blank_line(page):
    assert page.exists(), f"{page.relative_to(REPO)} is missing"
    broken = broken_tables(page.read_text())
    assert not broken, f"{page.relative_to(REPO)}: rows that render as raw pipes start at lines {broken}"


def test_the_documentation_stays_readable_in_size():
    sizes = {page.name: page.stat().st_size for page in DOCS if page.name not in GENERATED}
    too_long = {name: size for name, size in sizes.items() if size > PAGE_BUDGET}
    assert not too_long, f"pages over {PAGE_BUDGET:,} bytes: {too_long}"
    assert sum(sizes.values()) <= DOCS_BUDGET, (
        f"docs/*.md hold {sum(sizes.values()):,} bytes, over {DOCS_BUDGET:,}: {sorted(sizes.items())}")


# Words about how the project was developed, not about the product: an internal issue's number, a
# working session, which host was lent, the archive of the runs' own scripts.
INTERNAL = [
    re.compile(r"\bissues?\s+#?\d+", re.I),
    re.compile(r"\bsessions?\b", re.I),
    re.compile(r"\blent\b", re.I),
    re.compile(r"tools/gpu-runs"),
]
READER_FACING = [REPO / "README.md", *DOCS, REPO / "config.yaml", *sorted((REPO / "studies").glob("*.yaml")),
                 REPO / "results" / "README.md", *sorted((REPO / "results" / "tables").glob("*.md"))]


def internal_words(text: str) -> list[str]:
    return [match.group(0) for pattern in INTERNAL for match in pattern.finditer(text)]


def test_the_word_check_catches_development_talk_and_spares_ordinary_words():
    assert internal_words("as issue 12 asked, in the session's budget, on the host lent to us; "
                          "tools/gpu-runs/x.log") == ["issue 12", "session", "lent", "tools/gpu-runs"]
    assert internal_words("a silent, excellent run (Lightning-AI/pytorch-lightning#19528)") == []


@pytest.mark.parametrize("page", READER_FACING, ids=lambda p: str(p.relative_to(REPO)))
def test_what_a_user_reads_speaks_of_the_product(page):
    found = internal_words(page.read_text())
    assert not found, f"{page.relative_to(REPO)} speaks of how it was developed: {found}"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as the documentation site makes it (Python-Markdown's toc)."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The relative links of `page` that lead to no file under `root`, or to no heading of a page."""
    broken = []
    for _, line in _prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve()
            if not resolved.is_relative_to(root) or not resolved.exists():
                broken.append(target)
            elif anchor and resolved.suffix == ".md":
                headings = re.findall(r"^#+\s+(.*)$", resolved.read_text(), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(target)
    return broken


@pytest.mark.parametrize("page", [REPO / "README.md", REPO / "results" / "README.md"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file_of_the_repository(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "results.md").write_text("# Published results\n\n## The largest batch, searched\n")
    (tmp_path / "outside.md").write_text("# Not in the repository\n")
    page = root / "README.md"
    page.write_text("[ok](docs/results.md#the-largest-batch-searched) [gone](docs/nowhere.md) "
                    "[anchor](docs/results.md#no-such-part) [out](../outside.md) [web](https://example.org) "
                    "[here](#quick-start)\n")
    assert broken_links(page, root) == ["docs/nowhere.md", "docs/results.md#no-such-part", "../outside.md"]


# --- docs/results.md: figures and verdicts are the committed tables' own ---------------------------------

RESULTS_PAGE = REPO / "docs" / "results.md"
TABLES = REPO / "results" / "tables"
CITED = re.compile(r"results/tables/([A-Za-z0-9_-]+)\.md")
# a figure: a decimal (253.4, 2.38, 44.7%) or a number with thousands separators (517,289)
FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+|\d{1,3}(?:,\d{3})+)(?![\w])")


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each `## ` section; the text before the first under heading ''."""
    parts = re.split(r"^## (.*)$", text, flags=re.M)
    return [("", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def _table_text(study: str) -> str:
    """Everything a study's tables hold: the markdown and the CSVs beside it."""
    return "\n".join(path.read_text() for path in sorted(TABLES.glob(f"{study}.*"))
                     if path.suffix in (".md", ".csv"))


def test_every_figure_of_the_results_page_is_in_the_table_it_cites():
    missing = []
    for heading, body in _sections(RESULTS_PAGE.read_text()):
        studies = set(CITED.findall(body)) or {path.stem for path in TABLES.glob("*.md")}
        source = "\n".join(_table_text(study) for study in sorted(studies))
        for figure in FIGURE.findall(re.sub(r"`[^`]*`", "", body)):
            if figure not in source:
                missing.append(f"{heading or 'introduction'}: {figure} (not in {', '.join(sorted(studies))})")
    assert not missing, "docs/results.md has figures its tables do not hold:\n" + "\n".join(missing)


def verdict_counts(study: str) -> dict[str, int]:
    """Each finding's verdict, counted, from the study's findings CSV (one row per judged pair)."""
    with open(TABLES / f"{study}.findings.csv") as f:
        verdicts = {row["finding"]: row["verdict"] for row in csv.DictReader(f)}
    return {v: sum(verdict == v for verdict in verdicts.values()) for v in VERDICTS}


def test_the_results_page_gives_each_campaign_the_verdicts_its_table_gives():
    text = RESULTS_PAGE.read_text()
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip() in CAMPAIGNS)}
    sections = dict(_sections(text))
    for study in CAMPAIGNS:
        counts = verdict_counts(study)
        assert rows[study] == [str(sum(counts.values()))] + [str(counts[v]) for v in VERDICTS], study
        said = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        assert f"**{said}.**" in " ".join(sections[study].split()), (
            f"docs/results.md, {study}: its tally is not {said}")


# --- docs/communication.md: its bandwidth table is the published commbench table's own ---------------------

def test_the_bandwidth_table_of_the_communication_page_is_the_published_one():
    text = (REPO / "docs" / "communication.md").read_text()
    sizes = {"1 MiB": 1 << 20, "16 MiB": 1 << 24, "64 MiB": 1 << 26, "1 GiB": 1 << 30}
    header = next(line for line in text.splitlines() if line.startswith("| collective |"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    with open(REPO / "results" / "comm" / "h200-x2.csv") as f:
        published = {(row["collective"], int(row["size_bytes"])): float(row["busbw_gb_s"])
                     for row in csv.DictReader(f)}
    shown = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("| ") and line.split("|")[1].strip() in {c for c, _ in published}]
    assert len(shown) == 6 and columns == list(sizes)
    for collective, *figures in shown:
        for column, figure in zip(columns, figures):
            assert figure == f"{published[collective, sizes[column]]:.1f}", (collective, column)


# --- docs/columns.md: what the tables' columns mean, said once, as the column registry has it -----------

def test_the_columns_page_is_what_trainbench_columns_writes():
    from trainbench.reporting.tables import glossary_markdown

    assert (REPO / "docs" / "columns.md").read_text() == glossary_markdown(), (
        "docs/columns.md is stale: write it again with `trainbench columns --markdown`")


def test_each_columns_meaning_and_the_time_models_fit_are_stated_once_in_the_documentation():
    from trainbench.reporting.columns import COLUMNS, SUMMARY_COLUMNS

    pages = {page.name: page.read_text() for page in DOCS}
    meanings = [c.description for c in COLUMNS.values() if len(c.description) > 40]
    for meaning in meanings + list(SUMMARY_COLUMNS.values()):
        assert [name for name, text in pages.items() if meaning in text] == ["columns.md"], meaning
    # the cells the time model was fitted on: its page's "The constants", which the columns page links to
    assert "[The time model](time-model.md#the-constants)" in pages["columns.md"]
    assert "## The constants" in pages["time-model.md"] and "every real cell measured on H200" in pages[
        "time-model.md"]
