"""A study's answer and summary table (trainbench.reporting.answer), on result sets built from the
published metrics.json files, copied and edited: ties within intervals, a noisy cell, a cell without an
interval, every cell out of memory, cells on two GPU models, nothing measured; the summary's columns and
order; the README's headline as its command writes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainbench.reporting.documents import read_cells
from trainbench.reporting.answer import (HEADLINE_END, HEADLINE_START, NAMED_TIES, SUMMARY, answer_lines,
                                         headline_markdown, headline_of, summary_markdown, summary_order,
                                         tokens_per_gpu, with_headline)
from trainbench.reporting.columns import SUMMARY_COLUMNS
from trainbench.reporting.findings import evaluate
from trainbench.reporting.plots import with_scaling
from trainbench.reporting.predictions import with_current_predictions
from trainbench.study.config import load_config
from trainbench.workflow import load_checked

from conftest import PROJECT_CONFIG, REPO

CONFIG = load_config(PROJECT_CONFIG)
BASELINE = CONFIG.study("baseline")
SINGLE_124M = "strategy~single__model~gpt2-124m__gpus~1__micro_batch~32"
SINGLE_350M = "strategy~single__model~gpt2-350m__gpus~1__micro_batch~16"
FSDP_124M = "strategy~fsdp__model~gpt2-124m__gpus~{}__micro_batch~32"
DDP_124M = "strategy~ddp__model~gpt2-124m__gpus~{}__micro_batch~32"


def published(study: str) -> list[dict]:
    return read_cells(sorted((REPO / "results/runs" / study).glob("*/metrics.json")))


def edited(tmp_path: Path, study: str, edit=None) -> list[dict]:
    """The study's published metrics.json files, copied into tmp_path, each passed through `edit` (the
    document as JSON, and its cell id) first, and read back as the tables read them."""
    paths = []
    for source in sorted((REPO / "results/runs" / study).glob("*/metrics.json")):
        doc = json.loads(source.read_text())
        if edit:
            edit(doc, doc["cell_id"])
        target = tmp_path / study / doc["cell_id"] / "metrics.json"
        target.parent.mkdir(parents=True)
        target.write_text(json.dumps(doc))
        paths.append(target)
    return read_cells(paths)


def answer(docs: list[dict], study=BASELINE, judged=None) -> list[str]:
    docs = with_current_predictions(with_scaling(docs, study.id_keys))
    return answer_lines(docs, study.id_keys, judged, study.plan_for)


def line_of(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


# --- the fastest, ties, noise -------------------------------------------------------------------------

def test_the_answer_names_each_models_fastest_with_its_interval_its_ties_and_its_least_memory():
    docs = published("baseline")
    lines = answer(docs)
    small = line_of(lines, "**gpt2-124m** on H200: ")
    by_id = {d["cell_id"]: d for d in docs}
    fastest = max((d for d in docs if d["params"]["model"] == "gpt2-124m"),
                  key=lambda d: tokens_per_gpu(d).value)
    rate = tokens_per_gpu(fastest)
    assert fastest["cell_id"] == FSDP_124M.format(2)
    assert f"fastest: torch fsdp on 2 GPUs, {rate.text()} tokens/s per GPU, MFU 44.3%" in small
    assert re.fullmatch(r"[\d,]+ ± [\d,]+", rate.text())  # the figure and half its 95% interval
    # fsdp on 4 GPUs and one GPU alone overlap it: tied, each with its own figure; DDP's do not
    single = tokens_per_gpu(by_id[SINGLE_124M])
    four = tokens_per_gpu(by_id[FSDP_124M.format(4)])
    assert (f"tied within their 95% intervals with torch fsdp on 4 GPUs ({four.text()}) "
            f"and torch single on 1 GPU ({single.text()})") in small
    assert "ddp" not in small.split("; least")[0]
    assert small.endswith("least GPU memory: torch single on 1 GPU, 19.31 GiB (peak of its busiest GPU).")
    assert "Scaling on H200" in line_of(lines, "Scaling")
    assert "gpt2-350m: torch ddp keeps 97.4% on 4 GPUs; torch fsdp keeps 90.2% on 4 GPUs (noisy)" in \
        line_of(lines, "Scaling")


def test_cells_whose_intervals_do_not_overlap_are_not_tied(tmp_path):
    def narrow(doc, cell):  # every 124M interval shrunk to its median: nothing overlaps any more
        for key in ("tokens_per_s", "samples_per_s", "step_time_s", "mfu", "tflops_per_gpu"):
            value = doc["metrics"][key]
            doc["metrics"][f"{key}_ci"] = [value * 0.9999, value * 1.0001]

    small = line_of(answer(edited(tmp_path, "baseline", narrow)), "**gpt2-124m**")
    assert "fastest: torch fsdp on 2 GPUs" in small and "tied" not in small


def test_ties_past_the_named_ones_are_counted_and_a_tie_for_least_memory_is_named(tmp_path):
    def wide(doc, cell):  # every 124M interval widened to ±40%: all five overlap the fastest
        if doc["params"]["model"] == "gpt2-124m":
            value = doc["metrics"]["tokens_per_s"]
            doc["metrics"]["tokens_per_s_ci"] = [value * 0.6, value * 1.4]
        if cell == DDP_124M.format(2):  # as little memory as the single GPU's, the least
            doc["metrics"]["gpu_mem_used_mib"] = [19769.9, 19769.9]

    small = line_of(answer(edited(tmp_path, "baseline", wide)), "**gpt2-124m**")
    fastest, memory = small.split("; least GPU memory: ")
    tied = fastest.split("; tied within their 95% intervals with ")[1]
    assert fastest.startswith("**gpt2-124m** on H200: fastest: torch fsdp on 2 GPUs")
    assert len(re.findall(r"\(\d[\d,]* ± [\d,]+\)", tied)) == NAMED_TIES and tied.endswith(" and 1 more")
    least, other = re.fullmatch(r"(.+), 19\.31 GiB \(peak of its busiest GPU\), tied with (.+)\.",
                                memory).groups()
    assert {least, other} == {"torch single on 1 GPU", "torch ddp on 2 GPUs"}


def test_noisy_cells_slower_than_the_fastest_are_counted_not_named():
    # gpt2-350m's two FSDP cells are noisy, both below the single GPU's median per GPU
    large = line_of(answer(published("baseline")), "**gpt2-350m**")
    assert large.startswith("**gpt2-350m** on H200: fastest: torch single on 1 GPU, ")
    assert "; 2 noisy cells not ranked; least GPU memory" in large and "highest median" not in large


def test_noisy_cells_and_cells_without_an_interval_are_said_so_rather_than_ranked(tmp_path):
    def noisy(doc, cell):
        if cell == FSDP_124M.format(2):  # wider than the study's target: an interval, but a noisy one
            doc["metrics"].update(noisy=True, ci_half_width=0.052)
        if cell == SINGLE_124M:  # timed in too few windows: no interval at all
            doc["metrics"].update({k: None for k in doc["metrics"] if k.endswith("_ci")})
            doc["metrics"].update(noisy=True, ci_half_width=None, windows=2)

    docs = edited(tmp_path, "baseline", noisy)
    small = line_of(answer(docs), "**gpt2-124m**")
    # the fastest of the steady cells; the noisy fsdp on 2 GPUs has the highest median, and is named as such
    steady = tokens_per_gpu(next(d for d in docs if d["cell_id"] == FSDP_124M.format(4)))
    assert small.startswith(f"**gpt2-124m** on H200: fastest: torch fsdp on 4 GPUs, {steady.text()} tokens/s "
                            "per GPU, MFU 44.2%; 2 noisy cells not ranked (highest median: torch fsdp on 2 "
                            "GPUs, 512,468 ± 2,063 tokens/s per GPU, noisy: ±5.2%)")
    assert "torch single on 1 GPU (" not in small and "tied" not in small  # not tied: not ranked at all

    def all_without(doc, cell):
        doc["metrics"].update({k: None for k in doc["metrics"] if k.endswith("_ci")})
        doc["metrics"].update(noisy=True, ci_half_width=None, windows=2)

    small = line_of(answer(edited(tmp_path / "none", "baseline", all_without)), "**gpt2-124m**")
    assert "fastest" not in small
    assert small.startswith("**gpt2-124m** on H200: 5 timed cells, all noisy: not ranked for speed (highest "
                            "median: torch fsdp on 2 GPUs, 512,468 tokens/s per GPU, noisy: 2 windows: no "
                            "interval)")


# --- nothing trained, nothing measured, two GPU models -------------------------------------------------

def test_when_every_cell_ran_out_of_memory_the_answer_says_so_and_ranks_nothing(tmp_path):
    def oom(doc, cell):
        doc.update(status="oom", reason="OOM at step 1 (warm-up) on rank 0: OutOfMemoryError: CUDA out of "
                                        "memory. Tried to allocate 1.51 GiB.")

    lines = answer(edited(tmp_path, "baseline", oom))
    assert lines[0] == ("No cell of the 10 with a result trained: 10 ran out of memory: OOM at step 1 "
                        "(warm-up).")
    text = "\n".join(lines)
    assert "fastest" not in text and "least GPU memory" not in text and "Scaling" not in text
    assert "Without a result" not in text  # every cell of the copies has one


def test_cells_on_two_gpu_models_are_ranked_apart_and_never_scaled_against_each_other(tmp_path):
    def on_a100(doc, cell):
        if doc["params"]["strategy"] == "fsdp" or cell == SINGLE_350M:
            doc["provenance"]["gpu_name"] = "NVIDIA A100-SXM4-80GB"

    lines = answer(edited(tmp_path, "baseline", on_a100))
    h200 = line_of(lines, "**gpt2-124m** on H200")
    a100 = line_of(lines, "**gpt2-124m** on A100")
    assert "fsdp" not in h200 and "fastest: torch single on 1 GPU" in h200  # its fsdp cells ran on A100s
    assert "fastest: torch fsdp on 2 GPUs" in a100 and "single" not in a100
    assert line_of(lines, "Cells ran on") == ("Cells ran on A100-80G and H200: each is ranked among its own "
                                              "GPU model's, never against another's.")
    # a scaled cell is held against its one-GPU cell only on the same GPU model: 124M's DDP (H200s against
    # an H200) and 350M's FSDP (A100s against an A100), not 124M's FSDP nor 350M's DDP
    scaling = line_of(lines, "Scaling")
    parts = scaling.split(". ")[1:]
    assert [p.split(" keeps")[0] for p in parts] == ["gpt2-124m (H200): torch ddp",
                                                     "gpt2-350m (A100-80G): torch fsdp"]


def test_with_nothing_measured_the_answer_gives_what_is_planned_and_predicted_labelled_so():
    from trainbench.reporting.tables import with_planned

    plan_for = {"name": "4 x H200", "gpu_mem_gib": 140.4, "gpus_per_node": 4, "host_mem_gib": 560}
    study = load_config({"studies": {"s": {
        "description": "d",
        "settings": {"framework": "torch", "strategy": "ddp", "micro_batch": 8},
        "axes": {"gpus": [2, 4], "model": ["gpt2-124m", "gpt2-350m"]},
        "measure": {"cells": [], "plan_for": plan_for}}}}).study("s")
    docs = with_current_predictions(with_planned([], study))
    lines = answer_lines(docs, study.id_keys, [], plan_for)
    assert lines[0] == "Nothing measured yet: the study's 4 cells have no result."
    for model in ("gpt2-124m", "gpt2-350m"):
        line = line_of(lines, f"**{model}**, predicted on H200: fastest torch ddp on ")
        assert "tokens/s per GPU" in line and line.endswith("(predicted: the time model's).")
    assert line_of(lines, "Without a result").startswith(
        "Without a result: 4 planned, not measured: the memory model predicts all 4 fit for 4 x H200 "
        "(predicted)")
    assert not any("fastest:" in line for line in lines)  # no measured figure


# --- emulated ranks, findings ------------------------------------------------------------------------------

def test_emulated_ranks_are_named_as_such_and_never_ranked_for_speed():
    megatron = CONFIG.study("megatron")
    lines = answer(published("megatron"), megatron)
    largest = line_of(lines, "**gpt-5.8b**")
    assert ("only emulated ranks trained: their timed figures are one rank's compute, not ranked for "
            "speed") in largest
    assert "(emulated rank 0 of 8)" in largest.split("least GPU memory")[1]
    assert "(all emulated ranks)" in line_of(lines, "Did not train")


def test_the_findings_line_reuses_the_verdicts_as_judged():
    study = CONFIG.study("lightning")
    docs = with_current_predictions(published("lightning"))
    judged = evaluate(study.findings, docs, study.id_keys)
    line = line_of(answer(published("lightning"), study, judged), "Findings: ")
    verdicts = [r.verdict for r in judged]
    said = ", ".join(f"{verdicts.count(v)} {v}" for v in ("reproduced", "partly", "not reproduced")
                     if v in verdicts)
    assert line.startswith(f"Findings: {said}.")
    failed = next(r for r in judged if r.verdict == "not reproduced")
    assert f"(#{failed.index})" in line.split("Not reproduced: ")[1]
    # a verdict is taken as given, not judged again: flipping one changes the line accordingly
    failed.verdict = "reproduced"
    assert "Not reproduced" not in line_of(answer(published("lightning"), study, judged), "Findings: ")


# --- the summary table --------------------------------------------------------------------------------

def summary_table(lines: list[str]) -> list[list[str]]:
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| ---")]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def test_the_summary_has_at_most_nine_columns_ordered_by_model_then_gpus_then_throughput():
    docs = with_current_predictions(published("megatron"))
    megatron = CONFIG.study("megatron")
    rows = summary_table(summary_markdown(docs, megatron.id_keys))
    assert rows[0] == list(SUMMARY) and len(SUMMARY) <= 9 and list(SUMMARY_COLUMNS) == list(SUMMARY)
    assert len(rows) - 1 == len(docs)
    order = summary_order(docs)
    models = list(dict.fromkeys(d["params"]["model"] for d in docs))  # the grid's order
    keys = [(models.index(d["params"]["model"]), d["params"]["gpus"]) for d in order]
    assert keys == sorted(keys)
    for group in set(keys):  # within a model and a GPU count: the real cells by throughput, highest first
        real = [tokens_per_gpu(d).value for d, key in zip(order, keys)
                if key == group and not d.get("emulation") and tokens_per_gpu(d)]
        assert real == sorted(real, reverse=True), group
    # each row: the set-up in words, the GPUs, emulated where so, and the step against its prediction
    emulated = [(row, doc) for row, doc in zip(rows[1:], order) if doc.get("emulation")]
    assert emulated and all(", emulated" in row[1] for row, _ in emulated)
    assert all(row[3].endswith("(compute)") == bool(tokens_per_gpu(doc)) for row, doc in emulated)
    first = rows[1]
    assert first[0].startswith("deepspeed ") and first[0].endswith(f", {models[0]}, fp16, 4 x 1")
    assert re.fullmatch(r"[\d,.]+ \(pred\. [\d,.]+\)", first[6])


def test_every_published_markdown_opens_with_its_answer_and_its_summary():
    tables = REPO / "results" / "tables"
    for md in sorted(tables.glob("*.md")):
        if md.name.endswith(".all.md"):
            continue
        text = md.read_text()
        headings = re.findall(r"^## (.+)$", text, flags=re.M)
        assert text.startswith(f"# {md.stem}\n\n## Answer\n\n- "), md.name
        assert headings[:3] == ["Answer", "Measured cells", "The study"], md.name
        header = next(line for line in text.split("## Measured cells", 1)[1].splitlines()
                      if line.startswith("| "))
        assert header == "| " + " | ".join(SUMMARY) + " |", md.name


def test_the_published_answer_is_what_the_pipeline_makes_of_the_published_results(tmp_path):
    """A page-is-current check of one study: its answer made again from its metrics.json files."""
    from trainbench.reporting.tables import short_of_gpus, with_planned, write_tables
    from trainbench.workflow import Workflow

    layout = Workflow.table_layout(BASELINE)
    present = [c.target for c in BASELINE.cells if c.measured and (REPO / c.target).exists()]
    docs = with_scaling(with_planned(read_cells([REPO / p for p in present]), BASELINE,
                                     short_of_gpus=short_of_gpus(BASELINE, present)), BASELINE.id_keys)
    write_tables(docs, study="baseline", description=layout["description"], id_keys=layout["id_keys"],
                 report=layout["report"], csv_path=tmp_path / "b.csv", md_path=tmp_path / "b.md",
                 plan_for=BASELINE.plan_for, findings=layout["findings"], references=layout["references"])

    def section(text: str) -> str:
        return text.split("## Answer", 1)[1].split("## Measured cells", 1)[0]

    made = (tmp_path / "b.md").read_text()
    assert section(made) == section((REPO / "results/tables/baseline.md").read_text())
    assert (tmp_path / "b.all.md").exists()  # beside the markdown, with every column


# --- the README's headline ------------------------------------------------------------------------------

def test_the_readmes_headline_is_what_trainbench_headline_makes_of_the_published_results():
    readme = (REPO / "README.md").read_text()
    made = headline_markdown(REPO, load_checked(PROJECT_CONFIG))
    assert headline_of(readme) == made, (
        "README.md's results are stale: run `trainbench headline --write README.md`")
    figures = re.findall(r"^- ", made, flags=re.M)
    assert 3 <= len(figures) <= 5 and made.count("](results/plots/") == 1  # a few figures, one plot
    for line in made.splitlines():
        if line.startswith("- "):
            assert re.search(r"\]\((results/tables/\w+\.md|docs/results\.md#[\w-]+)\)", line), line
    assert len(readme) <= 15_000


def test_the_headline_section_is_replaced_in_place(tmp_path):
    page = f"# t\n\nbefore\n\n{HEADLINE_START}\nold\n{HEADLINE_END}\n\nafter\n"
    assert with_headline(page, f"{HEADLINE_START}\nnew\n{HEADLINE_END}") == (
        f"# t\n\nbefore\n\n{HEADLINE_START}\nnew\n{HEADLINE_END}\n\nafter\n")
    with pytest.raises(ValueError, match="no headline section"):
        with_headline("# t\n", "x")


def test_trainbench_headline_writes_a_pages_section_and_refuses_a_page_without_one(tmp_path, capsys):
    from trainbench.cli import main

    page = tmp_path / "README.md"
    page.write_text(f"# mine\n\n{HEADLINE_START}\nstale\n{HEADLINE_END}\n\n## Next\n")
    assert main(["headline", "--write", str(page), "--root", str(REPO)]) == 0
    assert headline_of(page.read_text()) == headline_of((REPO / "README.md").read_text())
    assert page.read_text().startswith("# mine\n\n") and page.read_text().endswith("\n\n## Next\n")
    page.write_text("# no section\n")
    assert main(["headline", "--write", str(page), "--root", str(REPO)]) == 1
    assert "no headline section" in capsys.readouterr().err and page.read_text() == "# no section\n"
