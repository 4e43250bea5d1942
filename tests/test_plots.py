"""Plots split into panels by the study's plot_panels keys."""

from __future__ import annotations

import matplotlib.image

from trainbench.reporting.plots import cell_label, label_keys, memory_plot, panels, write_plots


def doc(precision: str, strategy: str, gpus: int, used_mib: float) -> dict:
    return {"cell_id": f"{precision}-{strategy}-{gpus}", "status": "ok",
            "params": {"precision": precision, "strategy": strategy, "gpus": gpus, "gpus_per_node": gpus,
                       "device": "cuda"},
            "metrics": {"gpu_mem_used_mib": [used_mib] * gpus, "samples_per_s": used_mib / 100, "mfu": 0.1}}


DOCS = [doc("fp32", "zero1", 2, 900), doc("bf16", "zero1", 2, 500), doc("fp32", "zero2", 4, 800),
        doc("bf16", "zero2", 4, 400)]


def test_panels_group_cells_by_their_values_in_the_order_cells_come():
    by_precision = panels(DOCS, ["precision"])
    assert [title for title, _ in by_precision] == ["fp32", "bf16"]
    assert ([[d["params"]["strategy"] for d in members] for _, members in by_precision]
            == [["zero1", "zero2"]] * 2)
    # numbers keep their key; several keys make one panel per combination
    assert [title for title, _ in panels(DOCS, ["gpus", "precision"])] == [
        "gpus=2, fp32", "gpus=2, bf16", "gpus=4, fp32", "gpus=4, bf16"]
    assert panels(DOCS, []) == [("", DOCS)]
    # a study with no measured cell still gets its (empty) plots
    assert panels([], ["precision"]) == [("", [])]


def test_each_panel_is_a_row_of_the_figure(tmp_path):
    def heights(panel_keys):
        memory, throughput = tmp_path / "m.png", tmp_path / "t.png"
        write_plots(DOCS, study="s", id_keys=["precision", "strategy", "gpus"], memory_path=memory,
                    throughput_path=throughput, panel_keys=panel_keys)
        return [matplotlib.image.imread(path).shape[0] for path in (memory, throughput)]

    one, two = heights([]), heights(["precision"])
    assert all(h2 > 1.5 * h1 for h1, h2 in zip(one, two))


def test_a_study_with_no_measured_cell_gets_empty_plots(tmp_path):
    write_plots([], study="s", id_keys=["strategy"], memory_path=tmp_path / "m.png",
                throughput_path=tmp_path / "t.png", panel_keys=["strategy"])
    assert (tmp_path / "m.png").stat().st_size > 0 and (tmp_path / "t.png").stat().st_size > 0


def test_keys_all_cells_share_leave_the_bar_labels_for_the_title(tmp_path):
    cells = [doc("fp16", "zero1", 4, 900), doc("fp16", "zero3", 4, 500)]
    # strategy tells the cells apart; precision and gpus are the same under every bar
    assert label_keys(cells, ["strategy", "precision", "gpus"], []) == (["strategy"], "fp16, gpus=4")
    assert label_keys(cells, ["strategy", "precision", "gpus"], ["precision"]) == (["strategy"], "gpus=4")
    # one cell: nothing varies, every key labels its bar
    assert label_keys(cells[:1], ["strategy", "gpus"], []) == (["strategy", "gpus"], "")
    # an unset flag shared by all says nothing: not in the title either
    flagged = [dict(c, params=dict(c["params"], offload=False)) for c in cells]
    assert label_keys(flagged, ["strategy", "offload"], []) == (["strategy"], "")
    assert cell_label(flagged[0], ["strategy", "offload", "gpus"]) == "zero1\ngpus=4"


def test_a_long_title_widens_the_figure(tmp_path):
    short, long = tmp_path / "short.png", tmp_path / "long.png"
    memory_plot(DOCS[:2], ["strategy", "precision"], "s", short)
    memory_plot(DOCS[:2], ["strategy", "precision"], "a_study_with_a_long_name_" * 4, long)
    def aspect(path):  # width over height: the figure's inches, whatever resolution it is saved at
        height, width = matplotlib.image.imread(path).shape[:2]
        return width / height
    assert aspect(long) > 1.5 * aspect(short)


def test_planned_cells_are_drawn_unless_a_panel_would_hold_too_many():
    from trainbench.reporting.plots import PLANNED_DRAWN_UP_TO, drawn

    planned = [dict(doc("bf16", f"s{i}", 2, 0), status="planned", metrics={}) for i in range(3)]
    assert drawn(DOCS + planned, []) == (DOCS + planned, 0)
    many = planned * (PLANNED_DRAWN_UP_TO // 3 + 1)
    assert drawn(DOCS + many, []) == (DOCS, len(many))


def test_a_figure_of_many_cells_is_saved_at_most_max_pixels_on_its_longer_side(tmp_path):
    from trainbench.reporting.plots import DPI, MAX_PIXELS

    small, large = tmp_path / "small.png", tmp_path / "large.png"
    memory_plot(DOCS[:2], ["strategy", "precision"], "s", small)
    many = [doc("bf16", f"zero{i}", 2, 100 + i) for i in range(80)]  # 0.9 inch a bar: 74 inches wide
    memory_plot(many, ["strategy"], "s", large)
    height, width = matplotlib.image.imread(large).shape[:2]
    assert max(height, width) <= MAX_PIXELS and width > 0.95 * MAX_PIXELS
    assert matplotlib.image.imread(small).shape[0] == 5 * DPI  # a small figure keeps its resolution
