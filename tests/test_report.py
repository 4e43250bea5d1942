"""The report: each study's page (trainbench.reporting.report) on published results, and `snakemake --report
report.html` built from the smoke study and opened in a real headless Chromium (Selenium), where
each of the study's items must render: the page with its table rows and images, each plot loaded."""

from __future__ import annotations

import re

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from trainbench.study.config import load_config
from trainbench.reporting.report import NOT_LAUNCHED, markdown_html, provenance_rows, study_page, Plot
from trainbench.execute.results import read_cells

from conftest import CPU_MACHINE, REPO

RUNS = REPO / "results" / "runs"


def _published(study: str) -> list[dict]:
    return read_cells(sorted(RUNS.glob(f"{study}/*/metrics.json")))


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
    # the others ran on one kind of host at several commits: a row per commit, each run within a day
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
        assert row["host"].startswith("vm: 64 CPUs")
        first, last = row["ran"].removesuffix(" UTC").split(" to ")
        assert "2026-11-21 00:00" < first <= last < "2026-11-28 00:00" and first[:10] == last[:10]
    assert ({int(n) for row in rows for n in row["GPUs per cell"].split(", ")}
            == {d["provenance"]["gpu_count"] for d in ran})


def test_the_page_shows_the_markdown_table_file_as_it_is_with_its_plots_embedded(tmp_path):
    study = "baseline"
    table = (REPO / "results" / "tables" / f"{study}.md").read_text()
    findings = table + "\n## Findings\n\n- <script>alert(1)</script> DDP scales | not at all\n"
    plots = [Plot(REPO / "results" / "plots" / f"{study}_{kind}.png", kind)
             for kind in ("memory", "throughput")]
    page = study_page(study, findings, plots, _published(study))
    cells = load_config(REPO / "config.yaml").study(study).cells
    # the table: a row per cell, every cell's interval (±) as the markdown has it
    table_html = page.split('<section class="study-table">')[1].split("</table>")[0]
    assert table_html.count("<tr>") == len(cells) + 1  # and the header
    value, half = re.search(r"\| ([\d.,]+) ± ([\d.,]+) \|", table).groups()  # the first figure with one
    assert f"{value}\u00a0±\u00a0{half}" in table_html  # kept on one line
    # what the markdown file has under the table reaches the page, its markup escaped
    assert "<h2>Findings</h2>" in page and "&lt;script&gt;" in page and "<script>" not in page
    for plot in plots:
        assert f'alt="{plot.caption}"' in page
    assert page.count('src="data:image/png;base64,') == 2
    # where the cells ran: baseline's two one-GPU cells on one host at one commit, its four two-GPU
    # cells on another at another, three four-GPU cells on a third
    provenance = page.split('<table class="provenance">')[1]
    assert (provenance.count("<tr>") == 4
            and "<td>2</td><td>NVIDIA H200 (140.4 GiB)</td><td>1</td>" in provenance
            and "<td>4</td><td>NVIDIA H200 (140.4 GiB)</td><td>2</td>" in provenance
            and "<td>3</td><td>NVIDIA H200 (140.4 GiB)</td><td>4</td>" in provenance)


def test_markdown_tables_render_with_their_rows():
    text = "# t\n\ntext\n\n| a | b |\n| --- | --- |\n| 1 | 2 \\| 3 |\n| 4 | 5 |\n"
    rendered = markdown_html(text)
    assert "<h1>t</h1>" in rendered and rendered.count("<tr>") == 3 and "<td>2 | 3</td>" in rendered


# --- the report in a real browser -------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
REQUIRED = os.environ.get("TRAINBENCH_REQUIRE_BROWSER") == "1"  # CI: a missing browser is a failure


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: make setup-test"
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    return f"no {', '.join(missing)}: apt-get install chromium chromium-driver" if missing else None


@pytest.fixture
def browser():
    problem = _browser_missing()
    if problem:
        if REQUIRED:
            pytest.fail(f"TRAINBENCH_REQUIRE_BROWSER=1 and {problem}")
        pytest.skip(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # Debian's: nothing is downloaded
    profile = tempfile.mkdtemp(prefix="trainbench-chromium-")
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={profile}", "--window-size=1600,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _click(driver, text: str):
    """Click the report's menu entry, breadcrumb or button whose text is `text`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    link = WebDriverWait(driver, 10).until(shown.element_to_be_clickable(
        (By.XPATH, f"//a[normalize-space(.)={_quoted(text)}]")))
    link.click()


def _quoted(text: str) -> str:
    return f'"{text}"' if "'" in text else f"'{text}'"


def _view(driver, shows: str):
    """Click the eye button of the listed result labelled `shows`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    row = WebDriverWait(driver, 10).until(lambda d: d.find_element(
        By.XPATH, f"//tr[td[normalize-space(.)={_quoted(shows)}]]"))
    row.find_elements(By.TAG_NAME, "a")[0].click()


def _loaded_images(driver, images) -> list[int]:
    """Each image's natural width once it has loaded (0: broken)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: all(d.execute_script("return arguments[0].complete", i)
                                                  for i in images))
    return [driver.execute_script("return arguments[0].naturalWidth", image) for image in images]


@pytest.mark.slow
def test_the_report_of_the_smoke_study_renders_its_page_table_plots_and_provenance(browser, smoke_run_locally,
                                                                                    tmp_path):
    # (the browser first: without one the test is skipped before the smoke study runs)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    workflow = smoke_run_locally[0]
    started = time.monotonic()
    report = tmp_path / "report.html"
    workflow.shell(f"snakemake --report {report}", env=CPU_MACHINE)
    built = time.monotonic() - started
    smoke = load_config(workflow.path("config.yaml")).study("smoke")
    browser.get(report.as_uri())
    try:
        # the front page: what the report is, and the study's description from config.yaml
        WebDriverWait(browser, 10).until(
            lambda d: d.find_element(By.XPATH, "//h1[contains(., 'trainbench')]"))
        front = browser.find_element(By.TAG_NAME, "body").text
        assert " ".join(smoke.description.split()) in " ".join(front.split())
        # one study here: the menu names its category "Results" (several: by their names)
        _click(browser, "Results")
        _click(browser, "page")
        _view(browser, "the study page: table, plots, provenance")
        frame = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.TAG_NAME, "iframe"))
        assert frame.is_displayed() and frame.size["height"] > 300
        browser.switch_to.frame(frame)
        assert browser.find_element(By.TAG_NAME, "h1").text == "smoke"
        rows = browser.find_elements(By.CSS_SELECTOR, "section.study-table table tbody tr")
        assert len(rows) == len(smoke.cells) and all(r.is_displayed() for r in rows)
        assert all(" ok" in f" {r.text}" for r in rows)
        widths = _loaded_images(browser, browser.find_elements(By.CSS_SELECTOR, "section.plots img"))
        assert len(widths) == 2 and all(w > 0 for w in widths), widths
        provenance = browser.find_elements(By.CSS_SELECTOR, "table.provenance tbody tr")
        assert provenance and sum(int(r.find_element(By.TAG_NAME, "td").text) for r in provenance) == len(
            smoke.cells)
        assert "none: CPU ranks" in provenance[0].text
        browser.switch_to.default_content()
        # each plot on its own, loaded
        for shows in ("peak memory: measured and predicted", "throughput with 95% intervals"):
            _click(browser, "smoke")
            _click(browser, "plots")
            _view(browser, shows)
            image = WebDriverWait(browser, 10).until(lambda d: d.find_element(
                By.CSS_SELECTOR, "img[src^='data:image/png']"))
            assert image.is_displayed() and _loaded_images(browser, [image])[0] > 0, shows
            assert image.size["width"] > 300
        # the tables as files to download
        _click(browser, "smoke")
        _click(browser, "tables")
        listed = browser.find_element(By.TAG_NAME, "body").text
        assert "table (markdown)" in listed and "table, every field of every cell (CSV)" in listed
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        browser.save_screenshot(str(tmp_path / "report.png"))  # what it looked like, to look at
    print(f"report built in {built:.1f} s, "
          f"checked in a browser in {time.monotonic() - started - built:.1f} s")


def test_a_fresh_clone_reports_the_published_studies_with_nothing_run_first(browser, tmp_path):
    """`snakemake --report` on a clone where nothing ran (no smoke table, no study pages): the report of
    what is published, every tabled study with its plots, each plot loading, and the dataset."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from conftest import Workflow

    clone = Workflow(tmp_path / "clone", clone=True)
    report = tmp_path / "report.html"
    clone.shell(f"snakemake --report {report}", env=CPU_MACHINE)
    assert not clone.path("results/tables/smoke.md").exists()  # nothing was run to make it
    browser.get(report.as_uri())
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.XPATH, "//h1[contains(., 'trainbench')]"))
    for study, shows in (("baseline", "throughput with 95% intervals"),
                         ("holdout_frameworks", "where a step's time went: profiled and predicted")):
        _click(browser, study)
        _click(browser, "plots")
        _view(browser, shows)
        image = WebDriverWait(browser, 10).until(lambda d: d.find_element(
            By.CSS_SELECTOR, "img[src^='data:image/png']"))
        assert image.is_displayed() and _loaded_images(browser, [image])[0] > 0, (study, shows)
        browser.get(report.as_uri())
    # the dataset of every cell, to download
    _click(browser, "dataset")
    listed = browser.find_element(By.TAG_NAME, "body").text
    assert "every cell of every study, one row per figure (parquet)" in listed
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
