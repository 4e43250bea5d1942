"""Per-study plots: panels by the study's plot_panels keys, studies too large for one figure split into
files, labels in words, GiB, log axes, the scaling plot; and every figure of the published studies
within the size a reader sees at 100% zoom."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import matplotlib.image
import matplotlib.text
import matplotlib.pyplot as plt
import pytest

from trainbench import paths
from trainbench.reporting.plots import (DPI, MAX_CELLS, MAX_FLATNESS, MAX_PANELS, MAX_WIDTH_IN, cell_label,
                                        memory_figures, panels, parts, save, scalings, study_figures,
                                        throughput_figures, write_plots)

from conftest import published_results

REPO = Path(__file__).resolve().parents[1]
MAX_PIXELS_WIDE = int(MAX_WIDTH_IN * DPI)


def doc(precision: str, strategy: str, gpus: int, used_mib: float, **params) -> dict:
    return {"cell_id": f"{precision}-{strategy}-{gpus}", "status": "ok",
            "params": {"precision": precision, "strategy": strategy, "gpus": gpus, "gpus_per_node": gpus,
                       "device": "cuda", **params},
            "metrics": {"gpu_mem_used_mib": [used_mib] * gpus, "samples_per_s": used_mib / 100, "mfu": 0.1}}


DOCS = [doc("fp32", "zero1", 2, 900), doc("bf16", "zero1", 2, 500), doc("fp32", "zero2", 4, 800),
        doc("bf16", "zero2", 4, 400)]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels, from the PNG's header."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def figures(docs, **layout) -> list:
    id_keys = layout.pop("id_keys", ["precision", "strategy", "gpus"])
    return list(study_figures(docs, study="s", id_keys=id_keys, **layout))


def texts(figure) -> list[str]:
    return [t.get_text() for t in figure.findobj(matplotlib.text.Text) if t.get_text()]


def bar_axes(figure) -> list:
    return [ax for ax in figure.axes if ax.get_visible()]


def close(found) -> None:
    for figure in found:
        plt.close(figure.figure)


def test_panels_group_cells_by_their_values_in_the_order_cells_come():
    by_precision = panels(DOCS, ["precision"])
    assert [title for title, _ in by_precision] == ["fp32", "bf16"]
    assert ([[d["params"]["strategy"] for d in members] for _, members in by_precision]
            == [["zero1", "zero2"]] * 2)
    # numbers say what they count; several keys make one panel per combination
    assert [title for title, _ in panels(DOCS, ["gpus", "precision"])] == [
        "2 GPUs, fp32", "2 GPUs, bf16", "4 GPUs, fp32", "4 GPUs, bf16"]
    assert panels(DOCS, []) == [("", DOCS)]
    # a study with no measured cell still gets its (empty) plots
    assert panels([], ["precision"]) == [("", [])]


def test_each_panel_is_a_row_of_the_figure(tmp_path):
    def heights(panel_keys):
        written = write_plots(DOCS, study="s", id_keys=["precision", "strategy", "gpus"],
                              directory=tmp_path / str(panel_keys), panel_keys=panel_keys)
        assert [p.name for p in written] == ["memory.png", "throughput.png"]
        return [matplotlib.image.imread(path).shape[0] for path in written]

    one, two = heights([]), heights(["precision"])
    assert all(h2 > 1.5 * h1 for h1, h2 in zip(one, two))


def test_a_study_with_no_measured_cell_gets_empty_plots(tmp_path):
    written = write_plots([], study="s", id_keys=["strategy"], directory=tmp_path, panel_keys=["strategy"],
                          profiled=True)
    assert [p.name for p in written] == ["memory.png", "throughput.png", "breakdown.png"]
    assert all(p.stat().st_size > 0 for p in written)


def test_the_folder_lists_its_plots_in_reading_order(tmp_path):
    cells = [doc("bf16", f"s{i}", 2, 100 + i, model=model) for model in ("m-1b", "m-7b") for i in range(20)]
    written = write_plots(cells, study="s", id_keys=["strategy", "model"], directory=tmp_path)
    listed = paths.plot_files(tmp_path)
    assert [p["path"] for p in listed] == written
    # 40 cells, more than a figure holds: one file a model, named after it, memory before throughput
    assert [(p["path"].name, p["kind"], p["shows"]) for p in listed] == [
        ("memory-m-1b.png", "memory", "m-1b"), ("memory-m-7b.png", "memory", "m-7b"),
        ("throughput-m-1b.png", "throughput", "m-1b"), ("throughput-m-7b.png", "throughput", "m-7b")]
    assert sorted(os.listdir(tmp_path)) == sorted([p.name for p in written] + [paths.PLOTS_INDEX])


def tick_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def test_keys_all_cells_share_leave_the_bar_labels_for_the_titles():
    cells = [doc("fp16", "zero1", 4, 900), doc("fp16", "zero3", 4, 500), doc("bf16", "zero1", 4, 800),
             doc("bf16", "zero3", 8, 400)]
    [memory] = memory_figures(cells, ["strategy", "precision", "gpus"], "s", ["precision"])
    fp16, bf16 = memory.figure.axes
    # the GPU count all the figure's fp16 cells share is in the title of their panel, not under each bar
    assert (fp16.get_title(), tick_labels(fp16)) == ("fp16, 4 GPUs", ["zero1", "zero3"])
    assert (bf16.get_title(), tick_labels(bf16)) == ("bf16", ["zero1\n4 GPUs", "zero3\n8 GPUs"])
    # what every cell of the figure shares is in the figure's title; an unset flag is in no title
    flagged = [dict(c, params=dict(c["params"], offload_optimizer=False)) for c in cells[:2]]
    [memory] = memory_figures(flagged, ["strategy", "precision", "gpus", "offload_optimizer"], "s")
    assert memory.figure.get_suptitle().startswith("s (fp16, 4 GPUs): ")
    assert tick_labels(memory.figure.axes[0]) == ["zero1", "zero3"]
    # one cell: every key labels its bar
    [memory] = memory_figures(cells[:1], ["strategy", "gpus"], "s")
    assert tick_labels(memory.figure.axes[0]) == ["zero1\n4 GPUs"]
    assert cell_label(flagged[0], ["strategy", "offload_optimizer", "gpus"]) == "zero1\n4 GPUs"
    plt.close("all")


def test_labels_say_what_a_cell_is_in_words_never_none_nor_its_id(tmp_path):
    capped = [doc("bf16", "fsdp", 8, 9000, gpu_mem_limit_gib=limit, emulate=limit is not None,
                  offload_optimizer=offload)
              for limit in (None, 80.0) for offload in (False, True)]
    assert [cell_label(d, ["gpu_mem_limit_gib", "emulate", "offload_optimizer"]) for d in capped] == [
        "whole GPU\nnot emulated\nno optim. offload", "optim. offload",
        "80 GiB cap\nemulated", "80 GiB cap\nemulated\noptim. offload"]
    found = figures(capped, id_keys=["strategy", "gpus", "gpu_mem_limit_gib", "emulate", "offload_optimizer"])
    for figure in found:
        for text in texts(figure.figure):
            assert "None" not in text and not re.search(r"\w=", text) and "bf16-fsdp" not in text, text
    memory = found[0].figure
    # the keys every cell shares are in the title once, not under the bars
    assert "(fsdp, 8 GPUs)" in memory.get_suptitle()
    assert [t.get_text() for t in memory.axes[0].get_xticklabels()] == [
        "whole GPU\nnot emulated\nno optim. offload", "optim. offload", "80 GiB cap\nemulated",
        "80 GiB cap\nemulated\noptim. offload"]
    close(found)


def test_memory_is_drawn_in_gib_as_the_tables_give_it():
    [figure] = memory_figures([doc("bf16", "ddp", 2, 3 * 1024)], ["strategy"], "s")
    ax = figure.figure.axes[0]
    assert "GiB" in ax.get_ylabel() and "MiB" not in " ".join(texts(figure.figure))
    assert {bar.get_height() for bar in ax.patches} == {3.0}
    close([figure])


def test_a_panel_whose_values_span_more_than_one_and_a_half_decades_has_a_log_axis():
    near = [doc("bf16", "a", 1, 1000), doc("bf16", "b", 1, 20_000)]  # 20 times: linear
    far = [doc("bf16", "a", 1, 1000), doc("bf16", "b", 1, 40_000)]  # 40 times: log
    for cells, scale in ((near, "linear"), (far, "log")):
        found = [*memory_figures(cells, ["strategy"], "s"), *throughput_figures(cells, ["strategy"], "s")]
        assert [f.figure.axes[0].get_yscale() for f in found] == [scale, scale]
        close(found)


def test_a_study_of_more_cells_than_a_figure_holds_is_split_into_files_that_read():
    # 3 models x 2 GPU counts x 20 strategies: 120 cells, in 6 panels of 20 by model and GPU count
    cells = [doc("bf16", f"zero{i}", gpus, 100 + 10 * i, model=model)
             for model in ("m-1b", "m-7b", "m-70b") for gpus in (2, 4) for i in range(20)]
    split = parts(cells, ["model", "gpus", "strategy"], ["model", "gpus"])
    assert [p.slug for p in split] == [f"{m}-{g}_gpus" for m in ("m-1b", "m-7b", "m-70b") for g in (2, 4)]
    assert sum(len(p.docs) for p in split) == len(cells)
    found = figures(cells, id_keys=["model", "gpus", "strategy"], panel_keys=["model", "gpus"])
    assert len(found) == 12 and len({f.name for f in found}) == 12
    for figure in found:
        axes = bar_axes(figure.figure)
        assert len(axes) <= MAX_PANELS and sum(len(ax.get_xticks()) for ax in axes) <= MAX_CELLS
        width, height = figure.figure.get_size_inches() * DPI
        assert width <= MAX_PIXELS_WIDE and width / height <= MAX_FLATNESS
    close(found)


def test_a_long_title_wraps_within_the_figure(tmp_path):
    def size(title):
        [figure] = memory_figures(DOCS[:2], ["strategy", "precision"], title)
        save(figure.figure, tmp_path / "m.png")
        return png_size(tmp_path / "m.png")

    (short_width, short_height), (long_width, long_height) = size("s"), size("a_study_with_a_long_name_" * 8)
    assert long_width == short_width and long_height > short_height


def test_planned_cells_are_drawn_unless_a_panel_would_hold_too_many():
    from trainbench.reporting.plots import PLANNED_DRAWN_UP_TO, drawn

    planned = [dict(doc("bf16", f"s{i}", 2, 0), status="planned", metrics={}) for i in range(3)]
    assert drawn(DOCS + planned, []) == (DOCS + planned, 0)
    many = planned * (PLANNED_DRAWN_UP_TO // 3 + 1)
    assert drawn(DOCS + many, []) == (DOCS, len(many))


def scaled(strategy: str, gpus: int, samples_per_s: float, model: str = "m", status: str = "ok") -> dict:
    cell = doc("bf16", strategy, gpus, 1000, model=model)
    cell["metrics"]["samples_per_s"] = samples_per_s
    return dict(cell, status=status, cell_id=f"{strategy}-{gpus}-{model}")


def test_a_study_that_scales_strategies_from_one_gpu_has_a_scaling_plot():
    cells = [scaled("single", 1, 100.0), scaled("ddp", 2, 180.0), scaled("ddp", 4, 320.0),
             scaled("fsdp", 2, 150.0), scaled("fsdp", 4, 200.0),
             # another model without a one-GPU cell: nothing to hold its strategies against
             scaled("ddp", 2, 50.0, model="n"), scaled("ddp", 4, 90.0, model="n")]
    id_keys = ["strategy", "model", "gpus"]
    [found] = scalings(cells, id_keys)
    assert found.reference["cell_id"] == "single-1-m" and list(found.series) == ["ddp", "fsdp"]
    figure = next(f for f in figures(cells, id_keys=id_keys) if f.kind == "scaling")
    assert figure.name == "scaling.png"
    ax = figure.figure.axes[0]
    measured = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()
                if line.get_linestyle() == "-"}
    # samples/s per GPU over the one GPU's: 180 / (2 x 100), 320 / (4 x 100); each line starts at 100%
    assert measured["ddp"] == pytest.approx([100, 90, 80])
    assert measured["fsdp"] == pytest.approx([100, 75, 50])
    assert any(list(line.get_ydata()) == [100, 100] for line in ax.get_lines())  # the ideal
    plt.close(figure.figure)


def test_a_strategy_has_one_colour_in_every_panel_of_a_scaling_plot():
    # model n runs fsdp alone: its line must keep fsdp's colour from model m's panel, not take ddp's
    cells = [scaled("single", 1, 100.0), scaled("ddp", 2, 180.0), scaled("ddp", 4, 320.0),
             scaled("fsdp", 2, 150.0), scaled("fsdp", 4, 200.0),
             scaled("single", 1, 100.0, model="n"), scaled("fsdp", 2, 190.0, model="n"),
             scaled("fsdp", 4, 360.0, model="n")]
    figure = next(f for f in figures(cells, id_keys=["strategy", "model", "gpus"]) if f.kind == "scaling")
    colours = [{line.get_label(): line.get_color() for line in ax.get_lines() if line.get_linestyle() == "-"}
               for ax in figure.figure.axes if ax.get_visible() and ax.get_lines()]
    assert [sorted(c) for c in colours] == [["ddp", "fsdp"], ["fsdp"]]
    assert colours[1]["fsdp"] == colours[0]["fsdp"] != colours[0]["ddp"]
    plt.close(figure.figure)


def test_no_scaling_plot_where_no_strategy_is_run_at_two_gpu_counts_beside_one_gpu():
    one_count = [scaled("single", 1, 100.0), scaled("ddp", 4, 320.0), scaled("fsdp", 4, 300.0)]
    no_reference = [scaled("ddp", 2, 180.0), scaled("ddp", 4, 320.0)]
    for cells in (one_count, no_reference):
        assert scalings(cells, ["strategy", "gpus"]) == []
        found = figures(cells, id_keys=["strategy", "gpus"])
        assert [f.kind for f in found] == ["memory", "throughput"]
        close(found)


# --- the published studies --------------------------------------------------------------------------------

def published_studies() -> list[tuple[Path, str]]:
    """(workspace, study) of every study with results in the repository: its own and validation's."""
    from trainbench.workflow import load_checked

    found = []
    for workspace in (REPO, REPO / "validation"):
        if not (workspace / "config.yaml").exists() or not (workspace / "results" / "runs").is_dir():
            continue
        here = os.getcwd()
        os.chdir(workspace)  # study files are found relative to it
        try:
            names = list(load_checked("config.yaml").studies)
        finally:
            os.chdir(here)
        tabled = {p.parent.parent.name for p in published_results(workspace)}  # not smoke's, nor yours
        found += [(workspace, name) for name in names if name in tabled]
    return found


def published_docs(workspace: Path, name: str):
    """The study and its documents as rule study_plots reads them on a machine without GPUs."""
    from trainbench.execute.gpus import short_of_gpus
    from trainbench.execute.results import read_cells, read_search
    from trainbench.reporting.tables import with_planned, with_searches
    from trainbench.workflow import load_checked

    study = load_checked("config.yaml").study(name)
    short = {c.cell_id: why for c in study.cells if c.measured and not c.unsupported
             and not os.path.exists(c.target) and (why := short_of_gpus(c.params, 0))}
    measured = [c.target for c in study.cells if c.measured and os.path.exists(c.target)]
    docs = with_planned(read_cells(measured), study, short)
    return study, with_searches(docs, [read_search(p) for p in study.search_targets if os.path.exists(p)])


PUBLISHED = published_studies()


@pytest.mark.skipif(not PUBLISHED, reason="no published results in this checkout")
@pytest.mark.parametrize("workspace,name", PUBLISHED, ids=[name for _, name in PUBLISHED])
def test_every_figure_of_a_published_study_reads_at_full_size(workspace, name, tmp_path, monkeypatch):
    monkeypatch.chdir(workspace)
    study, docs = published_docs(workspace, name)
    ids = [d["cell_id"] for d in docs]
    kinds, sizes = [], {}
    for figure in study_figures(docs, study=name, id_keys=study.id_keys, panel_keys=list(study.plot_panels),
                                profiled=study.profiled):
        kinds.append(figure.kind)
        axes = bar_axes(figure.figure)
        assert len(axes) <= MAX_PANELS, figure.name
        if figure.kind != "scaling":
            assert sum(len(ax.get_xticks()) for ax in axes) <= MAX_CELLS, figure.name
        for text in texts(figure.figure):
            assert "None" not in text and not re.search(r"\w=", text), (figure.name, text)
            assert not any(cell_id in text for cell_id in ids), (figure.name, text)
        if figure.kind == "memory":
            assert all("GiB" in ax.get_ylabel() for ax in axes), figure.name
        save(figure.figure, tmp_path / figure.name)
        sizes[figure.name] = png_size(tmp_path / figure.name)
    assert len(sizes) == len(kinds)  # no two figures of one name
    assert all(width <= MAX_PIXELS_WIDE and width / height <= MAX_FLATNESS
               for width, height in sizes.values()), sizes
    assert kinds.count("scaling") == (1 if scalings(docs, study.id_keys) else 0)
    assert ("breakdown" in kinds) == study.profiled
    if name == "baseline":  # one GPU, then DDP and FSDP2 on 2, 4 and 8
        assert "scaling" in kinds
