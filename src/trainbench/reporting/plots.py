"""Per-study plots, one folder a study (paths.PLOTS_DIR): peak memory of every GPU (or CPU rank) by cell,
throughput by cell, the scaling efficiency of a study that scales strategies over GPU counts from a
one-GPU cell, and where a profiled cell's step went.

The memory plot draws, for every GPU in rank order, the device memory in use as nvidia-smi shows it
(NVML 'used': the caching allocator's reserve, the CUDA context, NCCL) as the whole bar, and torch's
peak allocated memory (the tensors a strategy controls) as its solid part, in GiB as the tables give it.

Cells that did not run to the end keep their place on the x axis with their status written in, so
a plot shows the same cells as the table. Planned cells (and cells this machine could not run) are
drawn as hatched outlines at the memory and time models' predictions, where there are few enough of
them to read (PLANNED_DRAWN_UP_TO per panel); measured cells carry the predictions as black marks.

A figure holds at most MAX_PANELS panels and MAX_CELLS cells, so that it reads at 100% within
MAX_WIDTH_IN: a study's `plot_panels` keys split a figure into rows, one per combination of their
values, each with its own y axis (a grid's cells differ in throughput and memory by orders of
magnitude across models); a study with more cells than a figure holds is split into several files,
by the values of its panel keys first, then of the keys it varies with the fewest values, as far as
each file needs (`memory-gpt-345m-8_gpus.png`). A panel whose values span more than LOG_ABOVE gets a
log axis. Every label names a cell in short words, by the keys that vary among its neighbours.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from trainbench import paths  # noqa: E402
from trainbench.execute.profiling import PARTS  # noqa: E402
from trainbench.execute.results import with_intervals  # noqa: E402
from trainbench.reporting.columns import said, unset_label, value_label, words  # noqa: E402
from trainbench.reporting.predictions import (MODEL_PARTS, parts_compared, prediction, time_prediction,  # noqa: E402
                                              with_current_predictions)
from trainbench.study.params import PARAMS_BY_NAME  # noqa: E402

Doc = dict[str, Any]

# a study with more planned cells than this in one panel (llama's 509) plots its measured cells only
PLANNED_DRAWN_UP_TO = 40
PREDICTED_STYLE = {"fill": False, "hatch": "///", "edgecolor": "dimgray", "linewidth": 0.8}
MIB_PER_GIB = 1024

# What one figure holds, so that it reads at 100% zoom: 2,400 pixels wide at most, no flatter than 3:1,
# text of at least 8 points (13 pixels at DPI)
DPI = 120
MAX_WIDTH_IN = 20.0
MAX_FLATNESS = 3.0  # width over height
MAX_PANELS = 4
MAX_CELLS = 30
FONT = 9  # tick labels, legends, panel titles
NOTE_FONT = 8  # the figures written over bars
LOG_ABOVE = 10 ** 1.5  # a panel whose largest value is this many times its smallest gets a log axis

# --- cells in words (columns.value_label, words) ------------------------------------------------------

def cell_label(doc: Doc, keys: list[str]) -> str:
    """Short x-axis label, one line per key that says something."""
    return "\n".join(words(doc, keys))


def varying(docs: list[Doc], keys: list[str]) -> list[str]:
    return [k for k in keys if len({repr(d["params"].get(k)) for d in docs}) > 1]


# --- a study split into figures and panels ---------------------------------------------------------------

def is_planned(doc: Doc) -> bool:
    return doc["status"] in ("planned", "not run")


def _grouped(docs: list[Doc], keys: list[str]) -> list[list[Doc]]:
    groups: dict[tuple, list[Doc]] = {}
    for doc in docs:
        groups.setdefault(tuple(repr(doc["params"].get(k)) for k in keys), []).append(doc)
    return list(groups.values())


def panels(docs: list[Doc], keys: list[str]) -> list[tuple[str, list[Doc]]]:
    """The cells split by their values of `keys`, in the order the cells come: (title, cells) each."""
    return [(", ".join(words(members[0], list(keys))), members)
            for members in _grouped(docs, list(keys))] or [("", [])]  # no cells yet: one empty panel


@dataclass
class Part:
    """The cells of one figure: `split` the keys and values that set them apart from the study's other
    figures (none where one figure holds the study), in panels by the values of `rows`."""
    split: list[tuple[str, Any]]
    rows: list[str]
    panels: list[tuple[str, list[Doc]]]

    @property
    def docs(self) -> list[Doc]:
        return [d for _, members in self.panels for d in members]

    @property
    def shows(self) -> str:
        """Which of the study's cells the figure holds, in words ("" for all of them)."""
        return ", ".join(value_label(k, v) or unset_label(k, v) for k, v in self.split)

    @property
    def slug(self) -> str:
        """The figure's file name after its kind: its split in words, lower case ("" for all cells)."""
        def slug(words: str) -> str:  # "8 GPUs": 8_gpus; "optim. offload": optim_offload; gpt-2.5b as it is
            return re.sub(r"[^a-z0-9.+-]+|\.(?!\d)", "_", words.lower()).strip("_").replace("__", "_")

        return "-".join(slug(value_label(k, v) or unset_label(k, v)) for k, v in self.split)

    def file_name(self, kind: str) -> str:
        return f"{kind}-{self.slug}.png" if self.split else f"{kind}.png"


# a figure of more cells than this in one row, where the study names no panel keys, gets panels by a key
# of its own choosing (_split_order's first with 2 to MAX_PANELS values): labels of fewer keys each
ONE_ROW_UP_TO = 12


def _fits(docs: list[Doc], panel_keys: list[str]) -> bool:
    return len(docs) <= MAX_CELLS and len(_grouped(docs, panel_keys)) <= MAX_PANELS


def _split_order(docs: list[Doc], id_keys: list[str], panel_keys: list[str]) -> list[str]:
    """The keys a study's figures are split by, first to last: the panel keys, the study's author's
    choice of what sets cells apart; then the model and the GPU count, which set memory and
    throughput most; then the keys with the fewest values."""
    first = list(panel_keys) + [k for k in ("model", "gpus", "nodes") if k in id_keys and k not in panel_keys]
    rest = sorted((k for k in id_keys if k not in first),
                  key=lambda k: len({repr(d["params"].get(k)) for d in docs}))
    return first + rest


def parts(docs: list[Doc], id_keys: list[str], panel_keys: list[str] = ()) -> list[Part]:
    """The study's figures: all its cells in one where they fit (MAX_CELLS, MAX_PANELS); else split by
    the first key in _split_order that tells them apart, each group split again as far as it must."""
    order = _split_order(docs, list(id_keys), list(panel_keys))

    def split(members: list[Doc], by: list[tuple[str, Any]]) -> list[Part]:
        used = [k for k, _ in by]
        rows = [k for k in panel_keys if k not in used]
        left = [k for k in order if k not in used and varying(members, [k])]
        if _fits(members, rows) or not left:
            if not rows and len(members) > ONE_ROW_UP_TO:
                rows = [k for k in left if 2 <= len(_grouped(members, [k])) <= MAX_PANELS][:1]
            return [Part(by, rows, panels(members, rows))]
        return [part for group in _grouped(members, [left[0]])
                for part in split(group, by + [(left[0], group[0]["params"].get(left[0]))])]

    return split(docs, [])


def drawn(docs: list[Doc], panel_keys: list[str]) -> tuple[list[Doc], int]:
    """The cells to draw: all of them, or, where a panel would hold more than PLANNED_DRAWN_UP_TO planned
    cells, the measured ones only; and how many planned cells were left out."""
    widest = max((sum(map(is_planned, members)) for _, members in panels(docs, list(panel_keys))), default=0)
    if widest <= PLANNED_DRAWN_UP_TO:
        return docs, 0
    kept = [d for d in docs if not is_planned(d)]
    return kept, len(docs) - len(kept)


# --- figures ----------------------------------------------------------------------------------------------

CHAR_IN = 0.58 / 72  # a character's width per point of font size, in inches (DejaVu Sans, about)
LINE_IN = 1.3 / 72  # a line's height per point
TICK_ANGLE = 30


@dataclass
class Ticks:
    """A panel's x-axis labels, and how they are set: one line per key, level, where they fit side by
    side; else one line each, slanted."""
    labels: list[str]
    slanted: bool

    def height_in(self) -> float:
        if self.slanted:
            widest = max(len(label) for label in self.labels)
            return widest * FONT * CHAR_IN * math.sin(math.radians(TICK_ANGLE)) + 2 * FONT * LINE_IN
        return max((label.count("\n") + 1 for label in self.labels), default=1) * FONT * LINE_IN + 0.1


def _ticks(docs: list[Doc], keys: list[str], cell_in: float) -> Ticks:
    labels = [cell_label(d, keys) for d in docs]
    widest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    if widest * FONT * CHAR_IN <= cell_in:
        return Ticks(labels, False)
    return Ticks([label.replace("\n", ", ") for label in labels], True)


def _set_ticks(ax, ticks: Ticks) -> None:
    ax.set_xticks(range(len(ticks.labels)), ticks.labels, fontsize=FONT,
                  rotation=TICK_ANGLE if ticks.slanted else 0, ha="right" if ticks.slanted else "center",
                  rotation_mode="anchor")


@dataclass
class Panel:
    """One row of a figure: its title (what its cells share that the figure's others do not), its
    cells, and the keys under its bars."""
    title: str
    docs: list[Doc]
    keys: list[str]


def _panel_layout(part: Part, id_keys: list[str]) -> tuple[str, list[Panel]]:
    """What the figure's title says of all its cells, and each panel's title and label keys: the keys
    every cell of the figure shares go to the figure's title, those every cell of a panel shares to
    the panel's, and those that vary within a panel under its bars."""
    keys = [k for k in id_keys if k not in part.rows and k not in {k for k, _ in part.split}]
    docs = part.docs
    in_figure = [k for k in keys if k not in varying(docs, keys)]
    laid: list[Panel] = []
    for name, members in part.panels:
        differ = varying(members, keys)
        if not differ:  # one cell (or cells alike but for a panel key): the keys that set it apart
            differ = [k for k in keys if k not in in_figure] or keys
        in_panel = [k for k in keys if k not in differ and k not in in_figure]
        title = ", ".join(filter(None, [name, ", ".join(said(members[0], in_panel) if members else [])]))
        laid.append(Panel(title, members, differ))
    shared = ", ".join(said(docs[0], in_figure)) if docs else ""
    return ", ".join(filter(None, [part.shows, shared])), laid


def _figure(n_panels: int, most_cells: int, cell_in: float, tick_heights: list[float], title: str,
            legend: list[str]):
    """A figure of one row per panel, as wide as its widest panel needs (within MAX_WIDTH_IN, the cells
    narrower where they must be) and at least a third as high as it is wide; `legend` the labels its
    legend will have, for the room it takes."""
    width = min(MAX_WIDTH_IN, max(7.0, 1.6 + cell_in * most_cells))
    title_lines = textwrap.wrap(title, _chars_in(width, 12))
    legend_rows = math.ceil(len(legend) / _legend_columns(legend, width)) if legend else 0
    top = len(title_lines) * 12 * LINE_IN + legend_rows * FONT * 1.6 / 72 + 0.3
    height = top + sum(3.0 + 0.35 + ticks for ticks in tick_heights)
    height = max(height, width / MAX_FLATNESS + 0.05)
    fig, axes = plt.subplots(n_panels, 1, squeeze=False, layout="constrained", figsize=(width, height))
    for ax in axes[:, 0]:
        ax.set_xlim(-0.6, max(most_cells, 1) - 0.4)  # equal bar widths in every panel
        ax.tick_params(labelsize=FONT)
    fig.suptitle("\n".join(title_lines), fontsize=12)
    return fig, list(axes[:, 0])


def _titled(study: str, shared: str) -> str:
    return f"{study} ({shared})" if shared else study


def _chars_in(width_in: float, points: float) -> int:
    return max(20, int((width_in - 0.4) / (points * CHAR_IN)))


def _cell_inches(panels: list[Panel], wanted: float) -> float:
    """How wide a cell is drawn: `wanted`, or as wide as its label's longest line needs to stand level
    (labels of several keys read better level than slanted), but narrower where the widest panel would
    pass MAX_WIDTH_IN."""
    most = max(len(p.docs) for p in panels)
    widest = max((len(line) for p in panels for d in p.docs for line in words(d, p.keys)), default=0)
    return min(max(wanted, widest * FONT * CHAR_IN + 0.1), (MAX_WIDTH_IN - 1.6) / max(most, 1))


def _legend_columns(labels: list[str], width_in: float) -> int:
    """As many columns as a legend of these labels fits across a figure this wide."""
    column_in = max(map(len, labels)) * FONT * CHAR_IN + 0.7  # the text and its key
    return max(1, min(len(labels), int((width_in - 0.3) / column_in)))


def _legend(fig, axes, extra: list = ()) -> None:
    """One legend under the panels, of every panel's entries once."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    for handle in extra:
        handles.setdefault(handle.get_label(), handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", frameon=False,
                   ncols=_legend_columns(list(handles), fig.get_figwidth()), fontsize=FONT)


def _scale(ax, values: list[float], room: float) -> None:
    """A log axis where the panel's values span more than LOG_ABOVE; and `room` (a share of the axis'
    height) above the tallest value for what is written over the bars."""
    positive = [v for v in values if v is not None and v > 0]
    if not positive:
        return
    low, high = min(positive), max(positive)
    if high / low > LOG_ABOVE:
        ax.set_yscale("log")
        bottom = low / 2
        top = 10 ** (math.log10(bottom) + (math.log10(high) - math.log10(bottom)) / (1 - room))
    else:
        bottom, top = 0, high / (1 - room)
    ax.set_ylim(bottom, top)


def _status_mark(ax, x: float, doc: Doc) -> None:
    """A cell without a bar: its status, upright at the axis' foot (in axes units, so on a log axis too)."""
    text = "OOM" if doc["status"] == "oom" else doc["status"]
    ax.text(x, 0.02, text, rotation=90, ha="center", va="bottom", fontsize=NOTE_FONT, color="firebrick",
            transform=ax.get_xaxis_transform())


def save(fig, path: Path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


@dataclass
class StudyFigure:
    """One plot of a study: its kind (KINDS), which cells it shows, in words, and its file's name."""
    kind: str
    shows: str
    name: str
    figure: Any  # matplotlib's Figure


# --- memory -----------------------------------------------------------------------------------------------

def _memory_series(doc: Doc) -> tuple[list[float], str]:
    """GiB per GPU, or per CPU rank, and which."""
    metrics = doc.get("metrics") or {}
    if metrics.get("gpu_mem_used_mib"):
        return [v / MIB_PER_GIB for v in metrics["gpu_mem_used_mib"]], "GPU"
    if metrics.get("host_rss_peak_mib_per_rank"):
        return [v / MIB_PER_GIB for v in metrics["host_rss_peak_mib_per_rank"]], "CPU rank"
    return [], ""


def _predicted_per_device(doc: Doc, kind: str) -> float | None:
    """The memory model's figure comparable to the bars, in GiB: per GPU, or per CPU rank."""
    predicted = prediction(doc)
    if kind == "GPU":
        mib = predicted.get("gpu_mem_mib")
    else:
        host = predicted.get("host_mem_mib")
        mib = host / doc["params"]["gpus_per_node"] if host is not None else None
    return mib / MIB_PER_GIB if mib is not None else None


def _memory_kind(docs: list[Doc]) -> str:
    return next((k for _, k in map(_memory_series, docs) if k),
                "GPU" if any(d["params"].get("device") == "cuda" for d in docs) else "CPU rank")


def _draw_memory(ax, panel: Panel, kind: str, ticks: Ticks) -> None:
    series = [_memory_series(d)[0] for d in panel.docs]
    ranks = max(map(len, series), default=0) or 1
    bar = 0.8 / ranks
    heights: list[float] = []
    for x, (doc, values) in enumerate(zip(panel.docs, series)):
        predicted = _predicted_per_device(doc, kind)
        if is_planned(doc):
            if predicted is None:
                _status_mark(ax, x, doc)
            else:
                ax.bar(x, predicted, width=0.8, **PREDICTED_STYLE,
                       label=f"not measured: predicted {kind} memory")
                heights.append(predicted)
            continue
        if predicted is not None:
            ax.hlines(predicted, x - 0.45, x + 0.45, colors="black", linewidths=2,
                      label="memory model's prediction")
            heights.append(predicted)
        if not values:
            _status_mark(ax, x, doc)
            continue
        allocated = (doc.get("metrics") or {}).get("torch_peak_allocated_mib") if kind == "GPU" else None
        for i, value in enumerate(values):
            where = x - 0.4 + bar * (i + 0.5)
            # the whole bar: what nvidia-smi shows; its solid part: the tensors torch allocated
            ax.bar(where, value, width=bar, color=f"C{i % 10}", alpha=0.4 if allocated else 1.0,
                   label=f"{kind} {i}")
            if allocated and i < len(allocated) and allocated[i] is not None:
                ax.bar(where, allocated[i] / MIB_PER_GIB, width=bar, color=f"C{i % 10}")
                heights.append(allocated[i] / MIB_PER_GIB)
        heights += values
        if doc["status"] != "ok":
            ax.text(x, max(values), doc["status"], ha="center", va="bottom", fontsize=NOTE_FONT,
                    color="firebrick")
    _set_ticks(ax, ticks)
    ax.set_ylabel(f"GiB per {kind}", fontsize=FONT)
    _scale(ax, heights, 0.08)


def memory_figures(docs: list[Doc], id_keys: list[str], title: str, panel_keys: list[str] = (),
                   note: str = "") -> Iterator[StudyFigure]:
    """Peak memory of every GPU (CPU rank) of every cell, one figure a part of the study."""
    kind = _memory_kind(docs)
    what = ("peak memory per GPU in rank order: nvidia-smi 'used' (whole bar), torch peak allocated (solid)"
            if kind == "GPU" else "peak resident memory per CPU rank")
    for part in parts(docs, id_keys, panel_keys):
        shared, laid = _panel_layout(part, id_keys)
        most = max(len(p.docs) for p in laid)
        cell_in = _cell_inches(laid, 0.75)
        ticks = [_ticks(p.docs, p.keys, cell_in) for p in laid]
        ranks = max((len(_memory_series(d)[0]) for d in part.docs), default=0)
        fig, axes = _figure(len(laid), most, cell_in, [t.height_in() for t in ticks],
                            f"{_titled(title, shared)}: {what}{note}",
                            [f"{kind} {i}" for i in range(ranks)]
                            + ["memory model's prediction", f"not measured: predicted {kind} memory"])
        for ax, panel, tick in zip(axes, laid, ticks):
            _draw_memory(ax, panel, kind, tick)
            if panel.title:
                ax.set_title(panel.title, fontsize=FONT)
        _legend(fig, axes)
        yield StudyFigure("memory", part.shows, part.file_name("memory"), fig)


# --- throughput -------------------------------------------------------------------------------------------

def _throughput_note(value: float, mfu: float | None, batch: int | None, level: bool) -> str:
    parts = [f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"]
    if mfu is not None:
        parts.append(f"{mfu:.0%} MFU")
    if batch is not None:
        parts.append(f"batch {batch}")
    return ("\n" if level else " · ").join(parts)


def _note_height(note: str, level: bool) -> float:
    """How high a note over a bar stands, in inches: its lines, or its length upright."""
    if level:
        return (note.count("\n") + 1) * NOTE_FONT * LINE_IN
    return len(note) * NOTE_FONT * CHAR_IN


def _draw_throughput(ax, panel: Panel, searched: bool, ticks: Ticks, cell_in: float) -> None:
    width = 0.4 if searched else 0.8
    # notes level over the bars where their lines ("1,234.5", "43% MFU", "batch 128") fit a bar's room
    level = cell_in * (0.5 if searched else 1.0) >= 9 * NOTE_FONT * CHAR_IN
    labels = {"configured": "at the study's batch", "largest": "at the largest batch that trains",
              "planned": "not measured: the time model's prediction", "mark": "the time model's prediction"}
    heights: list[float] = []
    need = 0.0
    for x, doc in enumerate(panel.docs):
        predicted = time_prediction(doc).get("samples_per_s")
        if is_planned(doc):
            if predicted is None:
                _status_mark(ax, x, doc)
                continue
            ax.bar(x, predicted, width=width, **PREDICTED_STYLE, label=labels["planned"])
            note = _throughput_note(predicted, None, None, level) + ("\npredicted" if level else " predicted")
            _note(ax, x, predicted, note, level, color="dimgray")
            need = max(need, _note_height(note, level))
            heights.append(predicted)
            continue
        if predicted is not None and doc["status"] == "ok":
            offset = -width / 2 if searched else 0
            ax.hlines(predicted, x + offset - width / 2, x + offset + width / 2, colors="black", linewidths=2,
                      label=labels["mark"])
            heights.append(predicted)
        bars = []
        if doc["status"] == "ok" and (doc.get("metrics") or {}).get("samples_per_s") is not None:
            bars.append(("configured", doc["metrics"], doc["params"].get("global_batch")))
        found = doc.get("search") or {}
        if found.get("metrics_at_max"):
            at_max = with_intervals(doc["params"], found["metrics_at_max"],
                                    (doc.get("provenance") or {}).get("gpu_name"))
            bars.append(("largest", at_max, found["max_global_batch"]))
        if not bars:
            _status_mark(ax, x, doc)
            continue
        for which, metrics, batch in bars:
            offset = 0 if not searched else (-width / 2 if which == "configured" else width / 2)
            value, mfu = metrics["samples_per_s"], metrics.get("mfu")
            interval = metrics.get("samples_per_s_ci")  # the 95% interval, as the table's ±
            error = [[value - interval[0]], [interval[1] - value]] if interval else None
            ax.bar(x + offset, value, width=width, color="C0" if which == "configured" else "C1",
                   yerr=error, capsize=3, ecolor="black", label=labels[which] if searched else None)
            note = _throughput_note(value, mfu, batch if searched else None, level)
            _note(ax, x + offset, interval[1] if interval else value, note, level)
            need = max(need, _note_height(note, level))
            heights += [value] + (list(interval) if interval else [])
    _set_ticks(ax, ticks)
    ax.set_ylabel("samples / s (all ranks)", fontsize=FONT)
    # room over the bars for the notes, against an axis about 3 inches high
    _scale(ax, heights, min(0.5, (need + 0.1) / 3.0))


def _note(ax, x: float, y: float, text: str, level: bool, color: str = "black") -> None:
    ax.annotate(text, (x, y), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                fontsize=NOTE_FONT, color=color, rotation=0 if level else 90)


def throughput_figures(docs: list[Doc], id_keys: list[str], title: str, panel_keys: list[str] = (),
                       note: str = "") -> Iterator[StudyFigure]:
    """Samples/s of every cell at its configured batch; next to it, for a cell whose largest batch was
    searched, the run at that batch (labelled with the global batch)."""
    for part in parts(docs, id_keys, panel_keys):
        searched = any(d.get("search") for d in part.docs)
        shared, laid = _panel_layout(part, id_keys)
        most = max(len(p.docs) for p in laid)
        cell_in = _cell_inches(laid, 1.1 if searched else 0.8)
        ticks = [_ticks(p.docs, p.keys, cell_in) for p in laid]
        fig, axes = _figure(len(laid), most, cell_in, [t.height_in() for t in ticks],
                            f"{_titled(title, shared)}: training throughput (median step, 95% interval; "
                            f"black and hatched: predicted){note}",
                            ["the time model's prediction", "not measured: the time model's prediction"]
                            + (["at the study's batch", "at the largest batch that trains"] * searched))
        for ax, panel, tick in zip(axes, laid, ticks):
            _draw_throughput(ax, panel, searched, tick, cell_in)
            if panel.title:
                ax.set_title(panel.title, fontsize=FONT)
        _legend(fig, axes)
        yield StudyFigure("throughput", part.shows, part.file_name("throughput"), fig)


# --- scaling ----------------------------------------------------------------------------------------------

# settings of a strategy that a one-GPU cell has none of: they name a series of their own
STRATEGY_SETTINGS = ("fsdp_reshard", "ddp_compile", "ddp_bucket_cap_mb", "ddp_bucket_view",
                     "ddp_static_graph", "overlap_comm", "contiguous_gradients", "reduce_bucket_size",
                     "allgather_bucket_size", "prefetch_bucket_size")
# what sets a scaling series apart from its neighbours at other GPU counts: the rest are the same set-up
SCALED = ("strategy", "framework", "gpus", "nodes", *STRATEGY_SETTINGS)


@dataclass
class Scaling:
    """Cells of one set-up (`words`: what sets it apart from the study's others) at several GPU counts:
    each strategy's cells beside the one-GPU cell they are held against."""
    words: str
    reference: Doc
    series: dict[str, list[Doc]]  # a strategy's cells, by GPU count


def _samples(doc: Doc, measured: bool) -> float | None:
    if measured:
        return (doc.get("metrics") or {}).get("samples_per_s") if doc["status"] == "ok" else None
    return time_prediction(doc).get("samples_per_s")


def _set(params: dict[str, Any], key: str) -> bool:
    """Whether a cell chose a strategy setting: a switch turned on, or a value where unset is null (a
    setting unset by null, such as overlap_comm, says something when false)."""
    value = params.get(key)
    return value is not None and (value is not False or PARAMS_BY_NAME[key].default is None)


def _series_name(doc: Doc) -> str:
    name = value_label("strategy", doc["params"].get("strategy"))
    settings = [f"{key} {doc['params'][key]}" for key in STRATEGY_SETTINGS if _set(doc["params"], key)]
    return f"{name} ({', '.join(settings)})" if settings else name


def scalings(docs: list[Doc], id_keys: list[str], counts: int = 2) -> list[Scaling]:
    """The study's strategies scaled over GPU counts from a one-GPU cell of the same set-up (the same
    values of every key but SCALED): a strategy needs `counts` GPU counts or more, above one, and the
    set-up a one-GPU cell that did not emulate a larger world (the plain one-GPU run where several
    strategies ran on one GPU). None for a study that scales nothing so."""
    same = [k for k in id_keys if k not in SCALED]
    found = []
    for group in _grouped([d for d in docs if not d["params"].get("emulate")], same):
        alone = [d for d in group if d["params"].get("gpus") == 1]
        several = [d for d in group if (d["params"].get("gpus") or 1) > 1]
        series: dict[str, list[Doc]] = {}
        for doc in several:
            series.setdefault(_series_name(doc), []).append(doc)
        series = {name: sorted(cells, key=lambda d: d["params"]["gpus"]) for name, cells in series.items()
                  if len({d["params"]["gpus"] for d in cells}) >= counts}
        plain = [d for d in alone if d["params"].get("strategy") not in {c["params"].get("strategy")
                                                                          for c in several}] or alone
        if series and len(plain) == 1:
            found.append(Scaling("", plain[0], series))
    keys = varying([s.reference for s in found], same)
    for scaling in found:
        scaling.words = ", ".join(words(scaling.reference, keys))
    return found


def with_scaling(docs: list[Doc], id_keys: list[str]) -> list[Doc]:
    """Each scaled cell with its efficiency against the one-GPU cell of its set-up (`scaling`: the
    figure, the reference cell, and whether both ran on one machine by their host ids: None where a
    result predates the id), for the table's `scaling_efficiency` column: a cell of one GPU count has
    one too, where a plot needs two."""
    found = {}
    for scaling in scalings(docs, id_keys, counts=1):
        ref = scaling.reference
        for cells in scaling.series.values():
            for doc in cells:
                efficiency = _efficiency(doc, ref, measured=True)
                if efficiency is None:
                    continue
                hosts = [(d.get("provenance") or {}).get("host_id") for d in (doc, ref)]
                found[doc["cell_id"]] = {"efficiency": efficiency, "reference": ref["cell_id"],
                                         "same_host": None if None in hosts else hosts[0] == hosts[1]}
    return [{**doc, "scaling": found[doc["cell_id"]]} if doc["cell_id"] in found else doc for doc in docs]


def _efficiency(doc: Doc, reference: Doc, measured: bool) -> float | None:
    """Samples/s per GPU over the one-GPU cell's (1.0: linear scaling)."""
    value, alone = _samples(doc, measured), _samples(reference, measured)
    return value / (doc["params"]["gpus"] * alone) if value and alone else None


def scaling_figures(docs: list[Doc], id_keys: list[str], title: str) -> Iterator[StudyFigure]:
    """Each scaled strategy's efficiency against its GPU count, measured (solid) and as the time model
    predicts it (dashed), beside the ideal: N GPUs giving N times one GPU's samples/s. One panel a
    set-up, up to MAX_PANELS a figure."""
    found = scalings(docs, id_keys)
    chunks = [found[i:i + MAX_PANELS] for i in range(0, len(found), MAX_PANELS)]
    for number, chunk in enumerate(chunks):
        columns = min(2, len(chunk))
        rows = math.ceil(len(chunk) / columns)
        fig, axes = plt.subplots(rows, columns, squeeze=False, layout="constrained",
                                 figsize=(6.0 * columns + 0.5, 4.4 * rows + 1.0))
        fig.suptitle("\n".join(textwrap.wrap(
            f"{title}: scaling efficiency, samples/s per GPU over the one-GPU cell's (100%: linear scaling); "
            f"solid: measured, dashed: the time model's prediction", _chars_in(6.0 * columns + 0.5, 12))),
            fontsize=12)
        # a series keeps its colour in every panel, whichever others a panel has (the legend is the figure's)
        colours: dict[str, str] = {}
        for scaling in chunk:
            for series in scaling.series:
                colours.setdefault(series, f"C{len(colours) % 10}")
        for ax, scaling in zip(axes.flat, chunk):
            _draw_scaling(ax, scaling, colours)
        for ax in list(axes.flat)[len(chunk):]:
            ax.set_visible(False)
        _legend(fig, list(axes.flat), [Line2D([], [], color="gray", linestyle=":", label="ideal (linear)")])
        name = "scaling.png" if len(chunks) == 1 else f"scaling-{number + 1}.png"
        yield StudyFigure("scaling", ", ".join(s.words for s in chunk) if len(chunks) > 1 else "", name, fig)


def _draw_scaling(ax, scaling: Scaling, colours: dict[str, str]) -> None:
    counts = sorted({1} | {d["params"]["gpus"] for cells in scaling.series.values() for d in cells})
    ax.axhline(100, color="gray", linestyle=":", linewidth=1.5)
    top = 110.0
    for i, (strategy, cells) in enumerate(scaling.series.items()):
        colour = colours[strategy]
        for measured in (True, False):
            points = [(1, 1.0)] + [(d["params"]["gpus"], _efficiency(d, scaling.reference, measured))
                                   for d in cells]
            points = [(n, e) for n, e in points if e is not None]
            if len(points) < 2:
                continue
            ax.plot([n for n, _ in points], [100 * e for _, e in points], color=colour, marker="o",
                    linestyle="-" if measured else "--", markerfacecolor=colour if measured else "white",
                    label=strategy if measured else None)
            top = max(top, 100 * max(e for _, e in points) + 10)
            if measured:
                for n, e in points[1:]:
                    ax.annotate(f"{e:.0%}", (n, 100 * e), textcoords="offset points",
                                xytext=(6, -3 - 9 * (i % 2)), fontsize=NOTE_FONT, color=colour)
        for doc in cells:
            if doc["status"] not in ("ok", "planned", "not run"):
                ax.annotate(doc["status"], (doc["params"]["gpus"], 0), textcoords="offset points",
                            xytext=(0, 4), fontsize=NOTE_FONT, color="firebrick", ha="center", rotation=90)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.minorticks_off()
    ax.set_xlim(counts[0] / 1.3, counts[-1] * 1.3)
    ax.set_ylim(0, top)
    ax.set_xlabel("GPUs", fontsize=FONT)
    ax.set_ylabel("scaling efficiency (%)", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.grid(axis="y", alpha=0.3)
    reference = scaling.reference["params"].get("strategy")
    ax.set_title("; ".join(filter(None, [scaling.words, f"against {reference} on 1 GPU"])), fontsize=FONT)


# --- where a step went ------------------------------------------------------------------------------------

# one colour family per part of the time model's step: compute blue, communication red, the optimizer
# green, the host's time grey (copies, which offload adds to the optimizer's part, orange)
PART_COLOURS = {"matmul": "#08519c", "attention": "#4292c6", "other_kernels": "#9ecae1",
                "optimizer_kernels": "#238b45", "optimizer_host": "#a1d99b",
                "exposed_copies": "#fd8d3c", "exposed_communication": "#cb181d", "idle": "#bdbdbd"}
MODEL_COLOURS = {"compute": "#4292c6", "communication": "#cb181d", "optimizer": "#41ab5d",
                 "framework": "#bdbdbd"}


def is_profiled(doc: Doc) -> bool:
    return doc["status"] == "ok" and bool((doc.get("metrics") or {}).get("breakdown"))


def breakdown_figures(docs: list[Doc], id_keys: list[str], title: str,
                      panel_keys: list[str] = ()) -> Iterator[StudyFigure]:
    """Where each profiled cell's step went (execute/profiling.py), its parts stacked in ms per step at
    the timed median; beside it, hatched, the time model's parts of the same step (a GPU cell's)."""
    profiled = [d for d in docs if is_profiled(d)]
    for part in parts(profiled, id_keys, panel_keys):
        shared, laid = _panel_layout(part, id_keys)
        most = max(len(p.docs) for p in laid)
        compared = any(parts_compared(d) for d in part.docs)
        cell_in = _cell_inches(laid, 0.9)
        ticks = [_ticks(p.docs, p.keys, cell_in) for p in laid]
        fig, axes = _figure(len(laid), most, cell_in, [t.height_in() for t in ticks],
                            f"{_titled(title, shared)}: where a step's time went (profiled steps, scaled to "
                            f"the median step){'; hatched: the time model' if compared else ''}",
                            [p.replace("_", " ") for p in PARTS]
                            + ([f"model: {p}" for p in MODEL_PARTS] if compared else []))
        for ax, panel, tick in zip(axes, laid, ticks):
            _draw_breakdown(ax, panel, compared, tick)
            if panel.title:
                ax.set_title(panel.title, fontsize=FONT)
        _legend(fig, axes)
        yield StudyFigure("breakdown", part.shows, part.file_name("breakdown"), fig)


def _draw_breakdown(ax, panel: Panel, compared: bool, ticks: Ticks) -> None:
    """Stacked parts on a linear axis, which a log axis would misdraw; a panel whose steps span more
    than LOG_ABOVE draws each cell's parts as shares of its step instead, its step's ms written over it."""
    width = 0.4 if compared else 0.8
    steps = [d["metrics"]["step_time_s"] for d in panel.docs]
    shares = bool(steps) and max(steps) / min(steps) > LOG_ABOVE
    for x, doc in enumerate(panel.docs):
        found = doc["metrics"]["breakdown"]
        step_ms = doc["metrics"]["step_time_s"] * 1e3
        scale = (100 / found["step_s"]) if shares else step_ms / found["step_s"]
        bottom = 0.0
        offset = -width / 2 if compared else 0
        for part in PARTS:
            height = found["parts_s"][part] * scale
            ax.bar(x + offset, height, width=width, bottom=bottom, color=PART_COLOURS[part],
                   label=part.replace("_", " "))
            bottom += height
        model = parts_compared(doc)
        if model:
            top = 0.0
            for part in MODEL_PARTS:
                height = model[part][1] * (100 / (step_ms / 1e3) if shares else 1e3)
                ax.bar(x + width / 2, height, width=width, bottom=top, color=MODEL_COLOURS[part],
                       hatch="///", edgecolor="white", linewidth=0.5, label=f"model: {part}")
                top += height
        note = [f"{step_ms:,.0f} ms"] if shares else []
        if found.get("communication_hidden") is not None:
            note.append(f"comm {found['communication_hidden']:.0%} hidden")
        if note:
            ax.text(x + offset, bottom, "\n".join(note), ha="center", va="bottom", fontsize=NOTE_FONT)
    if not panel.docs:
        ax.text(0.5, 0.5, "no profiled cells yet (timing: profile_steps)", transform=ax.transAxes,
                ha="center", va="center", fontsize=FONT)
    _set_ticks(ax, ticks)
    ax.set_ylabel("% of the step" if shares else "ms per optimizer step", fontsize=FONT)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.18)


# --- a study's folder -------------------------------------------------------------------------------------

def study_figures(docs: list[Doc], *, study: str, id_keys: list[str], panel_keys: list[str] = (),
                  profiled: bool = False) -> Iterator[StudyFigure]:
    """Every plot of a study, in reading order (memory, throughput, scaling, breakdown), one figure at a
    time: each is drawn when asked for, so that the caller saves and closes it before the next
    (megatron's make two dozen)."""
    docs, left_out = drawn(with_current_predictions(docs), list(panel_keys))
    note = f"; {left_out} planned cells not drawn (see the table)" if left_out else ""
    yield from memory_figures(docs, id_keys, study, panel_keys, note)
    yield from throughput_figures(docs, id_keys, study, panel_keys, note)
    yield from scaling_figures(docs, id_keys, study)
    if profiled:
        yield from breakdown_figures(docs, id_keys, study, panel_keys)


def write_plots(docs: list[Doc], *, study: str, id_keys: list[str], directory: Path,
                panel_keys: list[str] = (), profiled: bool = False) -> list[Path]:
    """The study's plots in `directory` (paths.PLOTS_DIR), and their index (paths.PLOTS_INDEX) that
    lists them in reading order with their kind and the cells each shows (paths.plot_files reads it)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    index = []
    for figure in study_figures(docs, study=study, id_keys=id_keys, panel_keys=panel_keys, profiled=profiled):
        save(figure.figure, directory / figure.name)
        index.append({"file": figure.name, "kind": figure.kind, "shows": figure.shows})
    (directory / paths.PLOTS_INDEX).write_text(json.dumps({"study": study, "plots": index}, indent=1) + "\n")
    return [directory / entry["file"] for entry in index]
