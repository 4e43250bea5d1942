"""Per-study plots: panels by the study's plot_panels keys, studies too large for one figure split into
files, labels and legends in words, GiB under the GPU's memory, log axes named, measured apart from
predicted, no plot of nothing, CPU ranks called so, the scaling plot on an axis fitted to its data; and
every figure of the published studies within the size a reader sees at 100% zoom, none taller than a
report shows."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
from pathlib import Path

import matplotlib.image
import matplotlib.text
import matplotlib.pyplot as plt
import pytest

from trainbench import paths
from trainbench.reporting.plots import (DPI, MAX_CELLS, MAX_FLATNESS, MAX_HEIGHT_IN, MAX_PANELS, MAX_WIDTH_IN,
                                        cell_label, memory_figures, panels, parts, save, scalings,
                                        study_figures, throughput_figures, write_plots)
from trainbench.study.params import CellParams, DERIVED

from conftest import REPO, loaded_in, published_results

MAX_PIXELS_WIDE = int(MAX_WIDTH_IN * DPI)
MAX_PIXELS_TALL = 1000  # a report viewer cuts a taller plot off
PARAMETER_NAMES = [f.name for f in dataclasses.fields(CellParams)] + list(DERIVED)
# a parameter's name as code spells it, or as a label that knew no words for it would ("ddp bucket cap mb 1")
RAW_NAME = re.compile("|".join(rf"\b{name}\b|\b{name.replace('_', ' ')} \S" for name in PARAMETER_NAMES
                               if "_" in name))


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
    assert panels([], ["precision"]) == [("", [])]


def test_narrow_panels_stand_side_by_side_and_wide_ones_in_rows():
    def grid(cells):
        [figure] = memory_figures(cells, ["precision", "strategy", "gpus"], "s", ["precision"])
        places = [(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start)
                  for ax in bar_axes(figure.figure)]
        plt.close(figure.figure)
        return places

    # two panels of two cells: side by side; of 14 cells each: one above the other
    assert grid(DOCS) == [(0, 0), (0, 1)]
    wide = [doc(precision, f"zero{i}", 2, 100 + i) for precision in ("fp32", "bf16") for i in range(14)]
    assert grid(wide) == [(0, 0), (1, 0)]


def test_a_study_with_nothing_to_plot_gets_no_plot(tmp_path):
    # no placeholder: no cell, or no profiled cell in a study that profiles, makes no figure
    written = write_plots([], study="s", id_keys=["strategy"], directory=tmp_path, panel_keys=["strategy"],
                          profiled=True)
    assert written == [] and paths.plot_files(tmp_path) == []
    written = write_plots(DOCS, study="s", id_keys=["precision", "strategy", "gpus"], directory=tmp_path,
                          profiled=True)
    assert [p.name for p in written] == ["memory.png", "throughput.png"]
    assert sorted(os.listdir(tmp_path)) == sorted(["memory.png", "throughput.png", paths.PLOTS_INDEX])
    # cells the stack refused, with nothing measured nor predicted: statuses alone make no plot either
    refused = [dict(doc("bf16", "colossalai", 2, 0), status="unsupported", metrics={})]
    assert write_plots(refused, study="s", id_keys=["strategy"], directory=tmp_path / "refused") == []


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
    assert "(FSDP2, 8 GPUs)" in memory.get_suptitle()
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
        assert width <= MAX_PIXELS_WIDE and height <= MAX_PIXELS_TALL and width / height <= MAX_FLATNESS
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
    assert found.reference["cell_id"] == "single-1-m" and list(found.series) == ["DDP", "FSDP2"]
    figure = next(f for f in figures(cells, id_keys=id_keys) if f.kind == "scaling")
    assert figure.name == "scaling.png"
    ax = figure.figure.axes[0]
    measured = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()
                if line.get_linestyle() == "-"}
    # samples/s per GPU over the one GPU's: 180 / (2 x 100), 320 / (4 x 100); each line starts at 100%
    assert measured["DDP"] == pytest.approx([100, 90, 80])
    assert measured["FSDP2"] == pytest.approx([100, 75, 50])
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
    assert [sorted(c) for c in colours] == [["DDP", "FSDP2"], ["FSDP2"]]
    assert colours[1]["FSDP2"] == colours[0]["FSDP2"] != colours[0]["DDP"]
    plt.close(figure.figure)


def test_a_study_that_varies_gpus_beside_one_gpu_has_a_scaling_plot_and_one_without_none():
    one_count = [scaled("single", 1, 100.0), scaled("ddp", 4, 320.0), scaled("fsdp", 4, 300.0)]
    found = figures(one_count, id_keys=["strategy", "gpus"])
    assert [f.kind for f in found] == ["memory", "throughput", "scaling"]
    # its title says its point: each strategy's efficiency at the most GPUs it ran on
    assert found[2].figure.get_suptitle().replace("\n", " ") == (
        "s: at 4 GPUs, DDP keeps 80% and FSDP2 75% of one GPU's throughput per GPU")
    close(found)
    no_reference = [scaled("ddp", 2, 180.0), scaled("ddp", 4, 320.0)]
    assert scalings(no_reference, ["strategy", "gpus"]) == []
    found = figures(no_reference, id_keys=["strategy", "gpus"])
    assert [f.kind for f in found] == ["memory", "throughput"]
    close(found)


def test_a_one_gpu_cell_of_another_gpu_model_is_no_reference():
    cells = [scaled("single", 1, 100.0), scaled("ddp", 2, 180.0), scaled("ddp", 4, 320.0)]
    for cell, gpu in zip(cells, ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H200")):
        cell["provenance"] = {"gpu_name": gpu}
    assert scalings(cells, ["strategy", "gpus"]) == []
    cells[0]["provenance"] = {"gpu_name": "NVIDIA H200"}
    assert len(scalings(cells, ["strategy", "gpus"])) == 1


def scaling_axis(cells: list[dict], id_keys: list[str]):
    figure = next(f for f in figures(cells, id_keys=id_keys) if f.kind == "scaling")
    return figure, [ax for ax in figure.figure.axes if ax.get_visible()]


def test_the_scaling_axis_fits_its_data():
    # 90% to 107% of one GPU's throughput per GPU, measured and predicted: an axis about them, not 0-110%
    cells = [scaled("single", 1, 100.0), scaled("ddp", 2, 180.0), scaled("ddp", 4, 428.0)]
    figure, [ax] = scaling_axis(cells, ["strategy", "gpus"])
    low, high = ax.get_ylim()
    assert 80 <= low <= 90 and 107 <= high <= 115, (low, high)
    assert all(text.get_text().endswith("%") for text in ax.get_yticklabels() if text.get_text())
    plt.close(figure.figure)
    # a strategy that keeps a quarter: the axis reaches down to it
    cells = [scaled("single", 1, 100.0), scaled("zero3", 2, 100.0), scaled("zero3", 4, 100.0)]
    figure, [ax] = scaling_axis(cells, ["strategy", "gpus"])
    assert 15 <= ax.get_ylim()[0] <= 25
    plt.close(figure.figure)


def test_legends_say_strategies_and_their_settings_in_words():
    cells = [scaled("single", 1, 100.0)]
    for gpus, samples in ((2, 190.0), (4, 370.0)):
        ddp = scaled("ddp", gpus, samples)
        ddp["params"].update(ddp_bucket_cap_mb=100, ddp_bucket_view=True)
        fsdp = scaled("fsdp", gpus, samples * 0.9)
        fsdp["params"].update(fsdp_reshard="after_step")
        cells += [ddp, fsdp]
    figure, [ax] = scaling_axis(cells, ["strategy", "gpus"])
    said = legend_texts(figure.figure)
    assert {"DDP (buckets of 100 MiB, gradients as bucket views)",
            "FSDP2 (weights kept across micro batches)", "measured", "the time model's prediction"} <= said
    assert not [text for text in said if RAW_NAME.search(text)], said
    plt.close(figure.figure)


def test_every_parameter_reads_in_words():
    from trainbench.study.words import WORDS

    # one place says how each parameter's values read: a new parameter adds its words there
    assert set(PARAMETER_NAMES) <= set(WORDS)


def legend_texts(figure) -> set[str]:
    return {text.get_text() for legend in figure.legends for text in legend.get_texts()}


def cpu(strategy: str, gpus: int, samples_per_s: float) -> dict:
    """A cell of CPU ranks, as a CPU study's metrics.json has it: resident memory per rank, no GPU."""
    cell = doc("fp32", strategy, gpus, 0, device="cpu", model="gpt2-tiny")
    cell["metrics"] = {"host_rss_peak_mib_per_rank": [900.0] * gpus, "samples_per_s": samples_per_s}
    return dict(cell, cell_id=f"{strategy}-{gpus}")


def test_a_cpu_study_calls_its_ranks_cpu_ranks():
    cells = [cpu("single", 1, 100.0), cpu("ddp", 2, 150.0), cpu("fsdp", 2, 120.0)]
    found = figures(cells, id_keys=["strategy", "gpus"])
    assert [f.kind for f in found] == ["memory", "throughput", "scaling"]
    for figure in found:
        said = " ".join(texts(figure.figure))
        assert "GPU" not in said.replace("CPU", ""), (figure.kind, said)
    memory, throughput, scaling = (bar_axes(f.figure) for f in found)
    assert memory[0].get_ylabel() == "GiB per CPU rank"
    assert tick_labels(memory[0]) == ["single\n1 CPU rank", "DDP\n2 CPU ranks", "FSDP2\n2 CPU ranks"]
    assert scaling[0].get_xlabel() == "CPU ranks"
    assert "one CPU rank's" in found[2].figure.get_suptitle()
    close(found)


def on_h200(*used_gib: float) -> list[dict]:
    cells = [doc("bf16", f"s{i}", 2, gib * 1024) for i, gib in enumerate(used_gib)]
    for cell in cells:
        cell["metrics"]["gpu_mem_total_mib"] = [143771.0] * 2
        cell["provenance"] = {"gpu_name": "NVIDIA H200"}
    return cells


def test_the_memory_plot_holds_the_gpus_memory():
    [figure] = memory_figures(on_h200(60, 90), ["strategy"], "s")
    ax = figure.figure.axes[0]
    [line] = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert line.get_ydata()[0] == pytest.approx(143771.0 / 1024) and ax.get_ylim()[1] > 140
    assert "H200 memory (140 GiB)" in legend_texts(figure.figure)
    assert "2 set-ups peak at 60-90 GiB per GPU of the H200's 140 GiB" in figure.figure.get_suptitle()
    # a GPU many times what the cells use: written at the axis' top, the bars left their height
    [figure] = memory_figures(on_h200(5, 6), ["strategy"], "s")
    ax = figure.figure.axes[0]
    assert ax.get_ylim()[1] < 10 and not [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert "↑ H200 memory (140 GiB), above the axis" in texts(figure.figure)
    plt.close("all")


def planned(strategy: str, gpus: int, predicted_gib: float, samples_per_s: float) -> dict:
    """A cell not measured, at the models' predictions."""
    cell = dict(doc("bf16", strategy, gpus, 0), status="planned", metrics={}, cell_id=f"{strategy}-{gpus}-p")
    return dict(cell, predicted={"gpu_mem_mib": predicted_gib * 1024},
                predicted_time={"samples_per_s": samples_per_s})


def test_predictions_stand_apart_and_never_alone_unless_the_title_says_predicted():
    measured = [doc("bf16", "ddp", 2, 10 * 1024), doc("bf16", "ddp", 4, 12 * 1024)]
    unmeasured = [planned("ddp", 8, 60, 4000.0), planned("fsdp", 8, 50, 3000.0)]
    # beside measured cells: hatched outlines, the axis fitted to the measured, the tallest cut and written
    found = figures(measured + unmeasured[:1], id_keys=["strategy", "gpus"])
    memory, throughput = (bar_axes(f.figure)[0] for f in found[:2])
    hatched = [bar for bar in memory.patches if bar.get_hatch()]
    assert len(hatched) == 1 and not hatched[0].get_fill()
    assert memory.get_ylim()[1] < 60 and any("↑" in text for text in texts(found[0].figure))
    assert "predicted (not measured)" in legend_texts(found[1].figure)
    close(found)
    # a figure (here a panel key's) of predictions alone, in a study that measured cells, is not made
    found = figures(measured + unmeasured, id_keys=["strategy", "gpus"], panel_keys=["strategy"])
    assert [len(bar_axes(f.figure)) for f in found if f.kind != "scaling"] == [1, 1]
    close(found)
    # a study that measured nothing yet: its plots of predictions say so
    found = figures(unmeasured, id_keys=["strategy", "gpus"])
    assert [f.kind for f in found] == ["memory", "throughput"]
    assert all("predicted" in f.figure.get_suptitle() for f in found)
    close(found)


def test_a_log_axis_says_so():
    far = [doc("bf16", "a", 1, 1000), doc("bf16", "b", 1, 40_000)]
    found = [*memory_figures(far, ["strategy"], "s"), *throughput_figures(far, ["strategy"], "s")]
    assert [f.figure.axes[0].get_ylabel() for f in found] == ["GiB per GPU (log scale)",
                                                             "samples / s (all ranks) (log scale)"]
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
        os.chdir(loaded_in(workspace))  # study files are found relative to it
        try:
            names = list(load_checked("config.yaml").studies)
        finally:
            os.chdir(here)
        tabled = {p.parent.parent.name for p in published_results(workspace)}  # not smoke's, nor yours
        found += [(workspace, name) for name in names if name in tabled]
    return found


def published_docs(workspace: Path, name: str):
    """The study and its documents as rule study_plots reads them on a machine without GPUs."""
    from trainbench.study.grid import short_of_gpus
    from trainbench.contract.result import read_search
    from trainbench.reporting.documents import read_cells
    from trainbench.reporting.tables import with_planned, with_searches
    from trainbench.workflow import load_checked

    study = load_checked("config.yaml").study(name)
    short = {c.cell_id: why for c in study.cells if c.measured and not c.unsupported
             and not os.path.exists(c.target) and (why := short_of_gpus(c.params, 0))}
    measured = [c.target for c in study.cells if c.measured and os.path.exists(c.target)]
    docs = with_planned(read_cells(measured), study, short)
    return study, with_searches(docs, [read_search(p) for p in study.search_targets if os.path.exists(p)])


PUBLISHED = published_studies()


def held_to_what_a_reader_sees(figure, ids: list[str]) -> None:
    """What every figure of a study must be: few enough panels and cells, text in words (no None, no
    key=value, no cell id, no parameter's name in a legend or under a bar), GiB on memory axes, a log
    axis named, and predictions alone only under a title that says "predicted"."""
    axes = bar_axes(figure.figure)
    assert len(axes) <= MAX_PANELS, figure.name
    if figure.kind != "scaling":
        assert sum(len(ax.get_xticks()) for ax in axes) <= MAX_CELLS, figure.name
    for text in texts(figure.figure):
        assert "None" not in text and not re.search(r"\w=", text), (figure.name, text)
        assert not any(cell_id in text for cell_id in ids), (figure.name, text)
    for text in legend_texts(figure.figure) | {label for ax in axes for label in tick_labels(ax)}:
        assert not RAW_NAME.search(text), (figure.name, text)
    for ax in axes:
        assert (ax.get_yscale() == "log") == ("log scale" in ax.get_ylabel()), (figure.name, ax.get_ylabel())
        if figure.kind == "memory":
            assert "GiB" in ax.get_ylabel(), figure.name
    if figure.kind == "scaling":  # one axis about the panels' data, not from 0 to 110% whatever they are
        drawn = [y for ax in axes for line in ax.get_lines() for y in line.get_ydata()]
        for ax in axes:
            assert ax.get_ylim()[0] >= min(drawn) - 15 and ax.get_ylim()[1] <= max(drawn) + 15, figure.name
    measured = any(bar.get_fill() for ax in axes for bar in ax.patches)
    if figure.kind in ("memory", "throughput") and not measured:
        assert "predicted" in figure.figure.get_suptitle(), figure.name


@pytest.mark.skipif(not PUBLISHED, reason="no published results in this checkout")
@pytest.mark.parametrize("workspace,name", PUBLISHED, ids=[name for _, name in PUBLISHED])
def test_every_figure_of_a_published_study_reads_at_full_size(workspace, name, tmp_path, monkeypatch):
    monkeypatch.chdir(loaded_in(workspace))
    study, docs = published_docs(workspace, name)
    ids = [d["cell_id"] for d in docs]
    kinds, sizes = [], {}
    for figure in study_figures(docs, study=name, id_keys=study.id_keys, panel_keys=list(study.plot_panels),
                                profiled=study.profiled):
        kinds.append(figure.kind)
        held_to_what_a_reader_sees(figure, ids)
        save(figure.figure, tmp_path / figure.name)
        sizes[figure.name] = png_size(tmp_path / figure.name)
    assert len(sizes) == len(kinds)  # no two figures of one name
    assert all(width <= MAX_PIXELS_WIDE and height <= MAX_PIXELS_TALL and width / height <= MAX_FLATNESS
               for width, height in sizes.values()), sizes
    assert MAX_HEIGHT_IN * DPI <= MAX_PIXELS_TALL
    assert kinds.count("scaling") == (1 if scalings(docs, study.id_keys) else 0)
    assert ("breakdown" in kinds) == (study.profiled and any(d["metrics"].get("breakdown") for d in docs
                                                             if d["status"] == "ok"))
    if name == "baseline":  # one GPU, then DDP and FSDP2 on 2, 4 and 8
        assert "scaling" in kinds


def test_a_published_study_copied_elsewhere_plots_as_the_rule_does(tmp_path, monkeypatch):
    """The baseline study's published metrics.json, copied to a folder of their own, through the rule's
    own script (workflow/scripts/make_plots.py): every PNG it writes within what a report shows, in
    reading order, its scaling plot among them."""
    import runpy
    import types

    import yaml

    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    published = (REPO / "results/runs/baseline").glob("*/metrics.json")
    metrics = sorted(str(p.relative_to(REPO)) for p in published)
    for path in metrics:
        (tmp_path / path).parent.mkdir(parents=True)
        shutil.copy(REPO / path, tmp_path / path)
    monkeypatch.chdir(tmp_path)
    snakemake = types.SimpleNamespace(
        config=yaml.safe_load((tmp_path / "config.yaml").read_text()),
        wildcards=types.SimpleNamespace(study="baseline"),
        input=types.SimpleNamespace(metrics=metrics, searches=[]), output=["results/plots/baseline"],
        log=[str(tmp_path / "plots.log")])
    runpy.run_path(str(REPO / "workflow/scripts/make_plots.py"), init_globals={"snakemake": snakemake})
    listed = paths.plot_files("results/plots/baseline")
    assert [p["kind"] for p in listed] == ["memory", "throughput", "scaling", "breakdown"]
    for plot in listed:
        width, height = png_size(plot["path"])
        assert width <= MAX_PIXELS_WIDE and height <= MAX_PIXELS_TALL, (plot["path"].name, width, height)
    assert sorted(os.listdir("results/plots/baseline")) == sorted([p["path"].name for p in listed]
                                                                  + [paths.PLOTS_INDEX])
