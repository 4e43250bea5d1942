"""The report: each study's page and its part of the front page (trainbench.reporting.report) made from
published results, and `snakemake --report report.html` of a fresh clone and of the smoke study, opened in
a real headless Chromium (Selenium) at 1440 x 900: the front page gives each study's answer, numbers and
first plots; each study's page leads with its answer and the summary of its measured cells, then its
plots in reading order; nothing runs off the side of the screen, no plot is taller than the window, every
image loads; each plot is stored once in its page, and the whole report stays small. Screenshots go to
$TRAINBENCH_ARTIFACTS/report where that is set (CI keeps them)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas
import pytest
from PIL import Image

from trainbench.contract.result import read_search, sanity_problems
from trainbench.reporting.documents import read_cells
from trainbench.reporting.report import (KEY_PLOTS, NOT_LAUNCHED, front_part, headline_numbers, markdown_html,
                                         plots_of, provenance_rows, study_page, verdict_tally)
from trainbench.reporting.plots import with_scaling
from trainbench.reporting.tables import short_of_gpus, with_planned, with_searches, write_tables
from trainbench.study.config import load_config
from trainbench.workflow import Workflow as Flow

from conftest import CPU_MACHINE, PROJECT_CONFIG, REPO

RUNS = REPO / "results" / "runs"
SCREEN = (1440, 900)  # a laptop's: the pages fit its width, the plots its height
LARGEST_REPORT = 15 * 2**20  # bytes: the report of every published study
PYTHON_REPR = r"[\[{(]'|': |\bNone\b"  # ['a', ...], {'key': ...}: a dict or list printed by Python


def _published(study: str) -> list[dict]:
    return read_cells(sorted(RUNS.glob(f"{study}/*/metrics.json")))


def _tables_of(study: str, where: Path) -> dict[str, Path]:
    """The study's markdown, CSVs and findings made afresh from its published results, as rule
    study_table makes them (its measured cells without a result here: not run)."""
    spec = load_config(PROJECT_CONFIG).study(study)
    layout = Flow.table_layout(spec)
    present = [c.target for c in spec.cells if c.measured and (REPO / c.target).exists()]
    docs = with_planned(read_cells([REPO / t for t in present]), spec,
                        short_of_gpus=short_of_gpus(spec, present))
    docs = with_searches(docs, [read_search(REPO / p) for p in spec.search_targets if (REPO / p).exists()])
    docs = with_scaling(docs, layout["id_keys"])
    files = {suffix: where / f"{study}{suffix}"
             for suffix in (".md", ".all.md", ".csv", ".plan.csv", ".findings.csv")}
    write_tables(docs, study=study, description=layout["description"], id_keys=layout["id_keys"],
                 report=layout["report"], csv_path=files[".csv"], md_path=files[".md"],
                 plan_path=files[".plan.csv"], plan_for=spec.plan_for, findings=layout["findings"],
                 references=layout["references"], findings_path=files[".findings.csv"],
                 all_path=files[".all.md"])
    return files


# --- where and with what the cells ran ------------------------------------------------------------

@pytest.mark.parametrize("study", ["megatron", "gpt2_zero"])
def test_provenance_has_one_row_per_set_up_and_counts_every_cell_that_ran(study):
    docs = _published(study)
    ran = [d for d in docs if d["status"] not in NOT_LAUNCHED]
    # gpt2_zero's ORT cells are unsupported: never launched, nothing ran
    assert [d["cell_id"].endswith("ort~true") for d in docs if d not in ran] == (
        [True] * (len(docs) // 2) if study == "gpt2_zero" else [])
    rows = provenance_rows(docs)
    # every cell that ran is in exactly one row, the largest set-up first
    assert sum(int(row["cells"]) for row in rows) == len(ran)
    assert [int(r["cells"]) for r in rows] == sorted((int(r["cells"]) for r in rows), reverse=True)
    # megatron's emulated cells ran on a one-GPU host, at several commits (those that ran out of memory
    # recorded no CUDA and NCCL versions: rows of their own), each row saying they are emulated ranks
    emulated = [r for r in rows if "emulated" in r["GPUs per cell"]]
    assert ({r["commit"] for r in emulated}
            == {d["provenance"]["git_commit"][:12] for d in ran if d.get("emulation")})
    for row in emulated:
        assert row["GPUs per cell"] == "1 (an emulated rank of 8)" and row["host"].startswith("vm: 16 CPUs")
        assert row["torch"] == "2.11.0" and row["ran"].startswith("2026-11-25")
    rows = [r for r in rows if r not in emulated]
    ran = [d for d in ran if not d.get("emulation")]
    # the others ran on hosts of 4 H200s (64 CPUs) and, megatron's 2-GPU cells re-made, of 2 (32 CPUs),
    # at several commits: a row per commit, each run within a day
    assert sorted(row["commit"] for row in rows) == sorted({d["provenance"]["git_commit"][:12] for d in ran})
    for row in rows:
        of_row = [d for d in ran if d["provenance"]["git_commit"][:12] == row["commit"]]
        # the first runs recorded no NCCL version; reruns since (megatron's two-GPU cells) did
        nccl = {d["provenance"].get("nccl") for d in of_row}
        assert len(nccl) == 1
        version = nccl.pop()
        expected = "driver 580.159.04, CUDA 13.0" + (f", NCCL {version}" if version else "")
        assert row["driver, CUDA, NCCL"] == expected
        assert row["GPU"] == "NVIDIA H200 (140.4 GiB)"
        assert row["torch"] == "2.11.0" and row["deepspeed"] == "0.19.8"
        assert row["host"].startswith("vm: 64 CPUs") or (
            row["host"].startswith("vm: 32 CPUs") and row["GPUs per cell"] == "2")
        first, last = row["ran"].removesuffix(" UTC").split(" to ")
        now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
        assert "2026-11-21 00:00" < first <= last <= now and first[:10] == last[:10]
    assert ({int(n) for row in rows for n in row["GPUs per cell"].split(", ")}
            == {d["provenance"]["gpu_count"] for d in ran})


def test_the_page_leads_with_the_answer_then_the_measured_cells_then_its_plots(tmp_path):
    study = "llama"
    files = _tables_of(study, tmp_path)
    table = files[".md"].read_text() + "\n## Notes\n\n- <script>alert(1)</script> DDP scales | not at all\n"
    plots = plots_of(REPO / "results/plots" / study)[::-1]  # an order of the caller's, kept
    page = study_page(study, table, plots, _published(study), files[".all.md"].read_text())
    summary, rest = page.split('<section class="study-table">')[1:3]
    summary, section = summary.split("</section>")[0], rest.split("</section>")[0]
    # title, the answer, the summary of the measured cells; then the plots; then what the study is and
    # its findings
    assert summary.startswith(f"<h1>{study}</h1>\n<h2>Answer</h2>\n<ul>\n<li><strong>llama-7b</strong>")
    assert re.findall(r"<h2>(.*?)</h2>", summary) == ["Answer", "Measured cells"]
    assert re.findall(r"<h2>(.*?)</h2>", section)[:2] == ["The study", "Findings"]
    assert page.index(summary) < page.index('<section class="plots">') < page.index(section)
    measured = summary.split("<table>")[1].split("</table>")[0]
    findings = section.split("<table>")[1].split("</table>")[0]
    assert findings.count("<tr>") == len(load_config(PROJECT_CONFIG).study(study).findings) + 1
    csv = pandas.read_csv(files[".csv"])
    assert measured.count("<tr>") == len(csv) + 1  # a row per cell with a result, and the header
    assert measured.split("</tr>")[0].count("<th>") <= 9  # narrow: the summary's columns
    # every column, folded under its own heading after the study's markdown, figures kept on one line
    every = page.split('<section class="all-columns">')[1].split("</section>")[0]
    assert every.startswith("<h2>All columns</h2><details><summary>")
    assert every.count("<tr>") == len(csv) + 1 and "predicted step (ms)" in every
    value, half = re.search(r"\| ([\d.,]+) ± ([\d.,]+) \|", files[".all.md"].read_text()).groups()
    assert f"{value}\u00a0±\u00a0{half}" in every
    assert page.index('<section class="all-columns">') > page.index("<h2>Planned and not run</h2>")
    # the planned cells as a count, not as rows
    assert "<h2>Planned and not run</h2>" in section and "llama.plan.csv" in section
    # what the markdown file has reaches the page, its markup escaped
    assert "&lt;script&gt;" in page and "<script>" not in page
    # each plot embedded once, in the order given, captioned with what it shows and its file
    figures = re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="([^"]*)"><figcaption>[^<]*'
                         r"<code>([^<]+)</code>", page)
    assert [(file, shows) for _, shows, file in figures] == plots
    for encoded, _, file in figures:  # the same picture, in fewer colours and bytes than the file
        embedded = Image.open(io.BytesIO(base64.b64decode(encoded)))
        assert embedded.size == Image.open(file).size and embedded.mode == "P"
        assert len(base64.b64decode(encoded)) < Path(file).stat().st_size
    # the page kept beside the table links the same plots, by their paths from its folder
    pages = REPO / "results/tables"
    linked = study_page(study, table, plots, _published(study), files[".all.md"].read_text(), page_dir=pages)
    sources = re.findall(r'<img src="([^"]+)"', linked)
    assert [(pages / source).resolve() for source in sources] == [Path(file).resolve() for file, _ in plots]
    assert all(source.startswith(f"../plots/{study}/") for source in sources) and "data:" not in linked
    # its links are its own sections; the CSVs are named where they are, not linked
    links = re.findall(r'href="([^"]*)"', page)
    assert "#all-columns" in links and all(link.startswith("#") for link in links), links
    assert f"<code>results/tables/{study}.csv</code>" in page and 'id="all-columns"' in page
    # where the cells ran, after the results
    assert page.index('<table class="provenance">') > page.index('<section class="all-columns">')


def test_a_studys_front_part_gives_its_answer_its_numbers_and_its_first_plots(tmp_path):
    study = "megatron"
    files = _tables_of(study, tmp_path)
    docs, table = _published(study), files[".md"].read_text()
    plots = plots_of(REPO / "results/plots" / study)
    tally = verdict_tally(files[".findings.csv"])
    part = front_part(study, table, plots, docs, tally)
    # the numbers: every cell with a result counted once, by what it came to
    numbers = dict((what, figure) for figure, what in headline_numbers(docs, tally))
    counted = sum(int(n) for what, n in numbers.items() if what not in ("cells with a result", "ran on",
                                                                         "findings"))
    assert int(numbers["cells with a result"]) == len(docs) == counted
    assert int(numbers["trained"]) == sum(d["status"] == "ok" and not sanity_problems(d) for d in docs)
    assert numbers["out of memory"] == str(sum(d["status"] == "oom" for d in docs))
    assert numbers["ran on"] == "H200" and numbers["findings"] == tally
    assert f"<li>findings: <b>{tally}</b></li>" in part
    # the answer as the markdown gives it, each of its lines
    answer = table.split("## Answer\n")[1].split("\n## ")[0]
    assert markdown_html(answer) in part
    assert part.count("<li>") == len(numbers) + sum(line.startswith("- ") for line in answer.splitlines())
    # the first plots in their reading order, no more
    shown = re.findall(r"<code>([^<]+)</code></figcaption>", part)
    assert shown == [file for file, _ in plots[:KEY_PLOTS]] and len(plots) > KEY_PLOTS
    # nothing measured: the numbers say so, the part has no plot and no answer to give
    empty = front_part(study, f"# {study}\n", [], [], "")
    assert "cells with a result: <b>0</b>" in empty and "<img" not in empty


def test_the_findings_verdicts_are_counted_once_per_finding(tmp_path):
    rows = [(1, "reproduced"), (1, "reproduced"), (2, "partly"), (3, "reproduced"), (4, "not yet measured")]
    pandas.DataFrame(rows, columns=["finding", "verdict"]).to_csv(tmp_path / "f.csv", index=False)
    assert verdict_tally(tmp_path / "f.csv") == "2 reproduced, 1 partly, 1 not yet measured"
    pandas.DataFrame(columns=["finding", "verdict"]).to_csv(tmp_path / "none.csv", index=False)
    assert verdict_tally(tmp_path / "none.csv") == ""
    # a campaign's, from its findings as judged on its published results
    files = _tables_of("lightning", tmp_path)
    tally = verdict_tally(files[".findings.csv"])
    counted = sum(int(n) for n in re.findall(r"(\d+) ", tally))
    assert counted == len(load_config(PROJECT_CONFIG).study("lightning").findings)
    assert tally in files[".md"].read_text().split("## Measured cells")[0]  # the markdown's own tally


def test_markdown_tables_render_with_their_rows():
    text = "# t\n\ntext\n\n| a | b |\n| --- | --- |\n| 1 | 2 \\| 3 |\n| 4 | 5 |\n"
    rendered = markdown_html(text)
    assert "<h1>t</h1>" in rendered and rendered.count("<tr>") == 3 and "<td>2 | 3</td>" in rendered


# --- the report in a real browser -------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
REQUIRED = os.environ.get("TRAINBENCH_REQUIRE_BROWSER") == "1"  # CI: a missing browser is a failure
PAGE = "answer, plots, findings, provenance"
MEASURED_CSV = "measured cells, one row each (CSV, downloads)"
PLAN_CSV = "planned and not-run cells, with predictions (CSV, downloads)"


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: make setup-test"
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    return f"no {', '.join(missing)}: apt-get install chromium chromium-driver" if missing else None


def _without_browser(problem: str, required: bool):
    """No browser: the test fails where one is required (CI), else it is skipped, saying why."""
    if required:
        pytest.fail(f"TRAINBENCH_REQUIRE_BROWSER=1 and {problem}")
    pytest.skip(problem)


def test_a_missing_browser_fails_the_browser_tests_where_one_is_required():
    with pytest.raises(pytest.fail.Exception, match="TRAINBENCH_REQUIRE_BROWSER=1 and no /usr/bin/chromium"):
        _without_browser("no /usr/bin/chromium", required=True)
    with pytest.raises(pytest.skip.Exception, match="no /usr/bin/chromium"):
        _without_browser("no /usr/bin/chromium", required=False)


@pytest.fixture(scope="module")
def browser():
    problem = _browser_missing()
    if problem:
        _without_browser(problem, REQUIRED)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # Debian's: nothing is downloaded
    profile = tempfile.mkdtemp(prefix="trainbench-chromium-")
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={profile}",
                     f"--window-size={SCREEN[0]},{SCREEN[1]}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    # the page's own size, whatever the headless window keeps for itself
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": SCREEN[0], "height": SCREEN[1],
                                                                 "deviceScaleFactor": 1, "mobile": False})
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def published_report(browser, tmp_path_factory) -> tuple:
    """The report of what is published, on a clone where nothing ran (no smoke table), as docs/running.md
    says: the report's copies of the pages made from the tables and plots as published (report_all, no
    other rule), then `snakemake --report`; made once for the tests that read it (after the browser:
    without one they are skipped before it is made)."""
    from conftest import Workflow

    root = tmp_path_factory.mktemp("published")
    clone = Workflow(root / "clone", clone=True)
    report = root / "report.html"
    assert not list(clone.path("results/report").glob("*.html"))  # a clone has only the linked pages
    clone.shell("snakemake -c all report_all --allowed-rules study_page report_all", env=CPU_MACHINE)
    clone.shell(f"snakemake --report {report}", env=CPU_MACHINE)  # (what is on disk, the dataset too)
    return clone, report


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    """Where the browser tests leave what they saw: $TRAINBENCH_ARTIFACTS/report, which CI keeps, or a
    temporary folder."""
    kept = os.environ.get("TRAINBENCH_ARTIFACTS")
    folder = Path(kept) / "report" if kept else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _open(driver, report: Path):
    """The report loaded afresh, once its front page is shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(report.as_uri())
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.XPATH, "//h1[contains(., 'trainbench')]"))


def _click(driver, text: str):
    """Click the report's menu entry, breadcrumb or button whose text is `text`."""
    from selenium.webdriver.common.by import By

    _click_found(driver, lambda d: d.find_element(By.XPATH, f"//a[normalize-space(.)={_quoted(text)}]"),
                 f"link {text!r}")


def _click_found(driver, find, what: str):
    """Click the element `find(driver)` returns once it has stopped moving: the report's menu slides
    into place for a fraction of a second after a page loads, and a click aimed while it moves lands
    on the entry above. A click that another element would receive, or on one not shown yet, is
    refused (nothing is clicked) and tried again, the element found anew."""
    from selenium.common.exceptions import (ElementClickInterceptedException, ElementNotInteractableException,
                                            StaleElementReferenceException)
    from selenium.webdriver.support.ui import WebDriverWait

    where = "const r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];"

    def clicked(d) -> bool:
        try:
            element = find(d)
            before = d.execute_script(where, element)
            time.sleep(0.1)  # a few frames: a moving element moves in each
            if d.execute_script(where, element) != before:
                return False
            element.click()
        except (ElementClickInterceptedException, ElementNotInteractableException,
                StaleElementReferenceException, IndexError):  # (a row drawn before its buttons)
            return False
        return True

    WebDriverWait(driver, 10).until(clicked, f"no clickable {what}")


def _quoted(text: str) -> str:
    return f'"{text}"' if "'" in text else f"'{text}'"


def _row(driver, label: str):
    """The listed result whose first label is `label`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 10).until(lambda d: d.find_element(
        By.XPATH, f"//tr[td[1][normalize-space(.)={_quoted(label)}]]"))


def _view(driver, label: str):
    """Click the eye button of the listed result labelled `label`."""
    from selenium.webdriver.common.by import By

    _click_found(driver, lambda d: _row(d, label).find_elements(By.TAG_NAME, "a")[0], f"view of {label!r}")


def _info(driver, label: str) -> str:
    """The info panel of the listed result labelled `label`: its caption, size, rule and parameters."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _click_found(driver, lambda d: _row(d, label).find_elements(By.TAG_NAME, "a")[1], f"info of {label!r}")
    # (headings are shown in capitals: Selenium's text is what is shown)
    body = (By.TAG_NAME, "body")
    WebDriverWait(driver, 10).until(lambda d: "snakemake rule" in d.find_element(*body).text.lower())
    return driver.find_element(*body).text


def _listed(driver) -> list[str]:
    """The first labels of the results listed now."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.XPATH, "//tbody/tr[td]")
    return [row.find_element(By.TAG_NAME, "td").text for row in rows]


def _loaded_images(driver, images) -> list[int]:
    """Each image's natural width once it has loaded (0: broken)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: all(d.execute_script("return arguments[0].complete", i)
                                                  for i in images))
    return [driver.execute_script("return arguments[0].naturalWidth", image) for image in images]


def _front_page(driver) -> str:
    """The front page's text, once checked to start at the top of the screen (a page taller than the
    screen scrolls; its top is not cut off)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.XPATH, "//h1[contains(., 'trainbench')]"))
    # (the description, workflow/report/workflow.rst, is the .prose block; its title the h1.title)
    top, screen = driver.execute_script(
        "const r = document.querySelector('h1.title').closest('.prose').getBoundingClientRect();"
        "return [r.top, window.innerHeight];")
    assert screen == SCREEN[1] and 0 <= top < screen, (top, screen)
    return driver.find_element(By.XPATH, "//h1[contains(., 'trainbench')]/ancestor::*[contains(@class, "
                                         "'prose')]").text


# Where a page's parts are, as the browser laid them out: the window, every scrolling box (the document
# and any element of overflow auto), the summary table of measured cells (a study page's first table, or
# none) and every image
LAYOUT = """
const width = window.innerWidth, height = window.innerHeight;
const boxes = [document.scrollingElement, ...document.querySelectorAll('.overflow-auto, .table-box')];
const summary = document.querySelector('section.study-table table');
const rect = (e) => {
  const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, height: r.height}; };
return {width: width, height: height,
        scrolling: boxes.map(b => ({name: b.className || b.tagName, scroll: b.scrollWidth,
                                    client: b.clientWidth,
                                    summary: b.classList.contains('table-box') && b.contains(summary)})),
        summary: summary && rect(summary),
        images: [...document.images].map(i => ({loaded: i.complete, natural: i.naturalWidth, ...rect(i),
                                                 alt: i.alt}))};
"""


def _fits(driver, what: str) -> dict:
    """The page's layout (LAYOUT), once every image has loaded, checked to fit the screen: nothing
    scrolls sideways but a wide table in its own box (never the summary of measured cells), which lies
    within the screen; every image loaded, none wider than the screen or taller than the window."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: d.execute_script(
        "return [...document.images].every(i => i.complete)"), f"{what}: images still loading")
    layout = driver.execute_script(LAYOUT)
    width, height = layout["width"], layout["height"]
    sideways = [b for b in layout["scrolling"] if b["scroll"] > b["client"]]
    assert all(b["name"] == "table-box" and not b["summary"] for b in sideways), (what, sideways)
    summary = layout["summary"]
    if summary:
        assert 0 <= summary["left"] and summary["right"] <= width, (what, summary)
    for image in layout["images"]:
        assert image["loaded"] and image["natural"] > 0, (what, image["alt"])
        assert 0 <= image["left"] and image["right"] <= width, (what, image)
        assert image["height"] <= height, (what, image)
    return layout


def _study_page(driver, report: Path, study: str) -> dict[str, list[str]]:
    """The study's page, opened from the report's menu: its section headings, the rows of its findings
    table and of its table of measured cells."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _open(driver, report)
    _click(driver, study)
    _click(driver, "page")
    _view(driver, PAGE)
    frame = WebDriverWait(driver, 10).until(lambda d: d.find_element(By.TAG_NAME, "iframe"))
    assert frame.is_displayed() and frame.size["height"] > 300
    driver.switch_to.frame(frame)
    try:
        # the frame may still hold the page opened before it while this one loads: wait for its heading
        WebDriverWait(driver, 10).until(lambda d: d.find_element(By.TAG_NAME, "h1").text == study,
                                        f"the page shown is not {study}'s")
        headings = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "section.study-table h2")]
        tables = driver.find_elements(By.CSS_SELECTOR, "section.study-table table")
        rows = [[r.text for r in t.find_elements(By.CSS_SELECTOR, "tbody tr")] for t in tables]
        # the summary of the measured cells is the page's first table, the findings' the next
        return {"headings": headings, "findings": rows[1] if "Findings" in headings else [],
                "measured": rows[0] if rows else []}
    finally:
        driver.switch_to.default_content()


def _stored(report: Path) -> dict[str, dict]:
    """The report's results as it stores them: path to entry (data_uri, mime_type, ...)."""
    text = report.read_text()
    start = text.index("var results = ", text.index('<script id="results">')) + len("var results = ")
    return json.JSONDecoder().raw_decode(text, start)[0]


def _each_plot_embedded_once(report: Path, root: Path) -> int:
    """The report stores no plot as an item of its own: each study's page embeds each of its plots once,
    in their reading order, and the front page its first KEY_PLOTS."""
    stored = _stored(report)
    assert not [path for path, entry in stored.items() if entry["mime_type"].startswith("image/")]
    pages = {Path(path).stem: base64.b64decode(entry["data_uri"].split("base64,", 1)[1]).decode()
             for path, entry in stored.items() if entry["mime_type"] == "text/html"}
    text = report.read_text()
    start = text.index("var workflow_desc = ") + len("var workflow_desc = ")
    front = json.JSONDecoder().raw_decode(text, start)[0]
    embedded = 0
    for study, page in pages.items():
        plots = [Path(file).name for file, _ in plots_of(root / "results/plots" / study)]
        assert [Path(f).name for f in re.findall(r"<code>([^<]+)</code></figcaption>", page)] == plots, study
        assert page.count("<img") == page.count("data:image/png") == len(plots), study
        part = front.split(f'data-study="{study}"')[1].split('<div class="tb-study"')[0]
        assert part.count("<img") == min(KEY_PLOTS, len(plots)), study
        embedded += len(plots)
    return embedded


@pytest.mark.slow
def test_the_report_of_the_smoke_study_renders_its_page_table_plots_and_provenance(browser, smoke_run_locally,
                                                                                    tmp_path):
    from selenium.webdriver.common.by import By

    workflow = smoke_run_locally[0]
    started = time.monotonic()
    report = tmp_path / "report.html"
    workflow.shell(f"snakemake --report {report}", env=CPU_MACHINE)
    built = time.monotonic() - started
    smoke = load_config(workflow.path("config.yaml")).study("smoke")
    _open(browser, report)
    try:
        # the front page: what the report is, and the study, its answer and its first plots
        assert "smoke" in _front_page(browser)
        _fits(browser, "the front page")
        assert len(browser.find_elements(By.CSS_SELECTOR, ".tb-study img")) == KEY_PLOTS
        page = _study_page(browser, report, "smoke")
        # no findings: the page opens on its measured cells, every one of them ok
        assert page["headings"][:3] == ["Answer", "Measured cells", "The study"]
        assert len(page["measured"]) == len(smoke.cells)
        assert all(" ok" in f" {row}" for row in page["measured"])
        browser.switch_to.frame(browser.find_element(By.TAG_NAME, "iframe"))
        # its plots, each loaded and whole in the report's viewer
        assert len(_fits(browser, "the smoke page")["images"]) >= 2
        provenance = browser.find_elements(By.CSS_SELECTOR, "table.provenance tbody tr")
        assert provenance and sum(int(r.find_element(By.TAG_NAME, "td").text) for r in provenance) == len(
            smoke.cells)
        assert "none: CPU ranks" in provenance[0].text
        browser.switch_to.default_content()
        # the data as files to download, said so; no markdown (the page renders it)
        _open(browser, report)
        _click(browser, "smoke")
        _click(browser, "data")
        assert set(_listed(browser)) == {MEASURED_CSV, PLAN_CSV}
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        assert _each_plot_embedded_once(report, workflow.root) >= 2
    finally:
        browser.switch_to.default_content()
        browser.save_screenshot(str(tmp_path / "report.png"))  # what it looked like, to look at
    print(f"report built in {built:.1f} s, "
          f"checked in a browser in {time.monotonic() - started - built:.1f} s")


def test_a_fresh_clone_reports_the_published_studies_with_nothing_trained_first(browser, published_report):
    """`snakemake --report` on a clone where nothing trained (no smoke table), its pages made: the report
    of what is published. Its front page gives each study's answer and each campaign's verdicts; each
    study's page leads with its answer and the summary of its measured cells; each plot is stored once;
    the info panel says what a table was made with in words; the whole is at most LARGEST_REPORT."""
    from selenium.webdriver.common.by import By

    clone, report = published_report
    assert not clone.path("results/tables/smoke.md").exists()  # nothing was run to make it
    assert report.stat().st_size <= LARGEST_REPORT, f"{report.stat().st_size:,} bytes"
    assert _each_plot_embedded_once(report, clone.root) > 0
    for path, entry in _stored(report).items():  # each item's job parameters, as its info panel shows them
        assert not re.search(PYTHON_REPR, entry["job_properties"]["params"]), (path, entry["job_properties"])
    config = load_config(clone.path("config.yaml"))
    tabled = [name for name in config.studies if clone.path(f"results/tables/{name}.md").exists()]
    _open(browser, report)
    _front_page(browser)
    parts = {part.get_attribute("data-study"): " ".join(part.text.split())
             for part in browser.find_elements(By.CSS_SELECTOR, ".tb-study")}
    assert sorted(parts) == sorted(tabled)
    for study in tabled:
        markdown = clone.path(f"results/tables/{study}.md").read_text()
        first_line = markdown.split("## Answer\n\n- ")[1].split("\n")[0].replace("**", "")
        assert first_line in parts[study], study  # its answer, as its markdown says it
        findings = config.study(study).findings
        tally = verdict_tally(clone.path(f"results/tables/{study}.findings.csv"))
        assert (f"findings: {tally}" in parts[study]) == bool(findings), study
        page = _study_page(browser, report, study)
        if findings:  # the answer and what was measured first, then the findings' verdicts
            assert page["headings"][:4] == ["Answer", "Measured cells", "The study", "Findings"], study
            assert len(page["findings"]) == len(findings), study
        else:
            assert page["headings"][:3] == ["Answer", "Measured cells", "The study"], study
        measured = pandas.read_csv(clone.path(f"results/tables/{study}.csv"))
        assert len(page["measured"]) == len(measured), study
    # what a table was made with, in words: no Python repr of the study's configuration
    _open(browser, report)
    _click(browser, "llama")
    _click(browser, "data")
    panel = _info(browser, MEASURED_CSV)
    parameters = panel[panel.lower().index("job parameters"):]
    assert "made_with=" in parameters and "findings" in parameters
    assert not re.search(PYTHON_REPR, parameters), parameters
    # the dataset of every cell, to download
    _open(browser, report)
    _click(browser, "dataset")
    listed = browser.find_element(By.TAG_NAME, "body").text
    assert "every cell of every study, one row per figure (parquet)" in listed
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_the_front_page_and_every_study_page_fit_a_1440_screen(browser, published_report, screenshots):
    """At 1440 x 900: the report's front page, each published study's page as a clone has it (its plots
    linked, loaded from their files) and as the report has it (embedded), and one page in the report's
    viewer. Nothing runs off the side (the summary of measured cells wraps within the screen), every image
    loads, no plot is taller than the window, the plots come in their reading order, and a page's links
    stay in the page."""
    from selenium.webdriver.common.by import By

    clone, report = published_report
    studies = sorted(p.name.removesuffix(".front.html")
                     for p in clone.path("results/report").glob("*.front.html"))
    assert studies, "no study page to look at"
    _open(browser, report)
    _front_page(browser)
    _fits(browser, "the front page")
    for part in browser.find_elements(By.CSS_SELECTOR, ".tb-study"):  # its first plots, in reading order
        study = part.get_attribute("data-study")
        shown = [e.text for e in part.find_elements(By.CSS_SELECTOR, "figure code")]
        plots = plots_of(clone.path(f"results/plots/{study}"))[:KEY_PLOTS]
        assert shown == [str(Path(file).relative_to(clone.root)) for file, _ in plots], study
    browser.save_screenshot(str(screenshots / "front.png"))
    for study in studies:
        plots = plots_of(clone.path(f"results/plots/{study}"))
        for page, linked in ((f"results/tables/{study}.html", True), (f"results/report/{study}.html", False)):
            browser.get(clone.path(page).as_uri())
            layout = _fits(browser, page)  # (every image loaded: a linked one from its file)
            assert layout["summary"], page
            images = browser.find_elements(By.CSS_SELECTOR, "figure.plot img")
            sources = [image.get_attribute("src") for image in images]
            expected = ([clone.path(file).as_uri() for file, _ in plots] if linked
                        else [s for s in sources if s.startswith("data:image/png;base64,")])
            assert sources == expected and len(sources) == len(plots), page
            captions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "figure.plot code")]
            assert captions == [str(Path(file).relative_to(clone.root)) for file, _ in plots], page
            links = browser.execute_script("return [...document.links].map(a => a.getAttribute('href'))")
            for link in links:  # each to a part of the page
                assert link.startswith("#") and browser.find_elements(By.ID, link[1:]), (page, link)
        browser.save_screenshot(str(screenshots / f"{study}.png"))
    # in the report's viewer, the page of the tallest plot: each plot whole inside the page's frame
    tallest = max(studies, key=lambda study: max((Image.open(file).height for file, _ in
                                                  plots_of(clone.path(f"results/plots/{study}"))), default=0))
    _study_page(browser, report, tallest)
    browser.switch_to.frame(browser.find_element(By.TAG_NAME, "iframe"))
    try:
        _fits(browser, f"{tallest} in the report's viewer")
    finally:
        browser.switch_to.default_content()
    browser.save_screenshot(str(screenshots / f"{tallest}-in-the-report.png"))
