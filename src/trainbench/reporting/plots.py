"""Per-study plots, one folder a study (paths.PLOTS_DIR): peak memory of every GPU (or CPU rank) by cell
against the GPU's memory, throughput by cell, the scaling efficiency of a study that varies GPU counts
from a one-GPU cell, and where a profiled cell's step went. Each plot makes one point, and its title
says it, generated from the data where they support a sentence ("at 4 GPUs, FSDP2 keeps 93% of one
GPU's throughput per GPU").

The memory plot draws, for every GPU in rank order, the device memory in use as nvidia-smi shows it
(NVML 'used': the caching allocator's reserve, the CUDA context, NCCL) as the whole bar, and torch's
peak allocated memory (the tensors a strategy controls) as its solid part, in GiB as the tables give it,
under a dashed line at the memory the GPU gives a rank (its own, or the cell's gpu_mem_limit_gib).

Measured figures are solid; predictions never are: a measured cell carries the models' predictions as
black marks, and a cell not measured (planned, or one this machine could not run) is a hatched outline at
the prediction, where there are few enough to read (PLANNED_DRAWN_UP_TO per panel). Axes fit the
measured figures: a prediction taller than them is cut at the top, its figure written there. A plot
that would hold predictions alone is not made, unless the study has no measured cell at all: its plots then
say "predicted" in their titles. A plot that would hold nothing (no profiled cell) is not made.

A figure holds at most MAX_PANELS panels in at most MAX_ROWS rows (two side by side where they are
narrow) and MAX_CELLS cells, within MAX_WIDTH_IN x MAX_HEIGHT_IN at DPI (1,000 pixels tall at most: a
report viewer cuts taller plots off): a study's `plot_panels` keys split a figure into panels, one per
combination of their values, each with its own y axis (a grid's cells differ in throughput and memory
by orders of magnitude across models); a study with more cells than a figure holds is split into
several files, by the values of its panel keys first, then of the keys it varies with the fewest values,
as far as each file needs (`memory-gpt-345m-8_gpus.png`). A panel whose values span more than
LOG_ABOVE gets a log axis, and its label says so. Every label names a cell in words (study/words.py),
by the keys that vary among its neighbours; every figure is drawn in one style (trainbench.mplstyle).
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator, PercentFormatter  # noqa: E402

from trainbench import paths  # noqa: E402
from trainbench.contract.result import PARTS  # noqa: E402
from trainbench.contract.result import with_intervals  # noqa: E402
from trainbench.registry.hardware import GPUS, gpu_label, gpu_model_of  # noqa: E402
from trainbench.reporting.predictions import (MODEL_PARTS, parts_compared, prediction, time_prediction,  # noqa: E402
                                              with_current_predictions)
from trainbench.study.params import PARAMS_BY_NAME  # noqa: E402
from trainbench.study.words import on_cpu, said, unset_label, value_label, words  # noqa: E402

Doc = dict[str, Any]

STYLE = Path(__file__).with_name("trainbench.mplstyle")

# a study with more planned cells than this in one panel (llama's 509) plots its measured cells only
PLANNED_DRAWN_UP_TO = 40
PREDICTED_STYLE = {"fill": False, "hatch": "///", "edgecolor": "dimgray", "linewidth": 0.8}
CAPACITY_STYLE = {"color": "firebrick", "linestyle": "--", "linewidth": 1.2}
MIB_PER_GIB = 1024

# What one figure holds, so that it reads at 100% zoom and a report shows it whole: 1,600 pixels wide and
# 1,000 tall at most, no flatter than 3:1, text of at least 8 points (11 pixels at DPI)
DPI = 100
MAX_WIDTH_IN = 16.0
MAX_HEIGHT_IN = 10.0
MAX_FLATNESS = 3.0  # width over height
MAX_PANELS = 4
MAX_ROWS = 2
MAX_CELLS = 30
PANEL_IN = 2.6  # an axis' height, down to MIN_PANEL_IN where a figure would pass MAX_HEIGHT_IN
MIN_PANEL_IN = 1.6
FONT = 9  # tick labels, legends, panel titles
TITLE_FONT = 11
NOTE_FONT = 8  # the figures written over bars
LOG_ABOVE = 10 ** 1.5  # a panel whose largest value is this many times its smallest gets a log axis


# --- cells in words (study/words.py says how each parameter's values read) -------------------------------

def cell_label(doc: Doc, keys: list[str]) -> str:
    """Short x-axis label, one line per key that says something."""
    return "\n".join(words(doc["params"], keys))


def varying(docs: list[Doc], keys: list[str]) -> list[str]:
    return [k for k in keys if len({repr(d["params"].get(k)) for d in docs}) > 1]


def _split_words(key: str, value: Any, context: dict[str, Any]) -> str:
    return value_label(key, value, context) or unset_label(key, value)


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
    return [(", ".join(words(members[0]["params"], list(keys))), members)
            for members in _grouped(docs, list(keys))] or [("", [])]  # no cells: one empty panel


@dataclass
class Part:
    """The cells of one figure: `split` the keys and values that set them apart from the study's other
    figures (none where one figure holds the study), in panels by the values of `rows`; `context` a
    cell's parameters, which say what the split's values are (a GPU count on CPU: CPU ranks)."""
    split: list[tuple[str, Any]]
    rows: list[str]
    panels: list[tuple[str, list[Doc]]]
    context: dict[str, Any]

    @property
    def docs(self) -> list[Doc]:
        return [d for _, members in self.panels for d in members]

    @property
    def shows(self) -> str:
        """Which of the study's cells the figure holds, in words ("" for all of them)."""
        return ", ".join(_split_words(k, v, self.context) for k, v in self.split)

    @property
    def slug(self) -> str:
        """The figure's file name after its kind: its split in words, lower case ("" for all cells)."""
        def slug(words: str) -> str:  # "8 GPUs": 8_gpus; "optim. offload": optim_offload; gpt-2.5b as it is
            return re.sub(r"[^a-z0-9.+-]+|\.(?!\d)", "_", words.lower()).strip("_").replace("__", "_")

        return "-".join(slug(_split_words(k, v, self.context)) for k, v in self.split)

    def file_name(self, kind: str) -> str:
        return f"{kind}-{self.slug}.png" if self.split else f"{kind}.png"


# a figure of more cells than this in one panel, where the study names no panel keys, gets panels by a key
# of its own choosing (_split_order's first that gives few enough panels): labels of fewer keys each
ONE_ROW_UP_TO = 12


def _fits(part: Part, id_keys: list[str]) -> bool:
    """Whether a figure holds these cells: MAX_CELLS, and MAX_PANELS in MAX_ROWS rows."""
    if len(part.docs) > MAX_CELLS or len(part.panels) > MAX_PANELS:
        return False
    laid = _panel_layout(part, id_keys)[1]
    return math.ceil(len(laid) / _columns(laid)) <= MAX_ROWS


def _split_order(docs: list[Doc], id_keys: list[str], panel_keys: list[str]) -> list[str]:
    """The keys a study's figures are split by, first to last: the panel keys, the study's author's
    choice of what sets cells apart; then the model and the GPU count, which set memory and
    throughput most; then the keys with the fewest values."""
    first = list(panel_keys) + [k for k in ("model", "gpus", "nodes") if k in id_keys and k not in panel_keys]
    rest = sorted((k for k in id_keys if k not in first),
                  key=lambda k: len({repr(d["params"].get(k)) for d in docs}))
    return first + rest


def parts(docs: list[Doc], id_keys: list[str], panel_keys: list[str] = ()) -> list[Part]:
    """The study's figures: all its cells in one where they fit (MAX_CELLS, MAX_PANELS in MAX_ROWS); else
    split by the first key in _split_order that tells them apart, each group split again as far as it
    must."""
    order = _split_order(docs, list(id_keys), list(panel_keys))

    def split(members: list[Doc], by: list[tuple[str, Any]]) -> list[Part]:
        used = [k for k, _ in by]
        context = members[0]["params"] if members else {}
        rows = [k for k in panel_keys if k not in used]
        left = [k for k in order if k not in used and varying(members, [k])]
        whole = Part(by, rows, panels(members, rows), context)
        if _fits(whole, id_keys) or not left:
            if not rows and len(members) > ONE_ROW_UP_TO:
                chosen = (Part(by, [k], panels(members, [k]), context) for k in left)
                return [next((p for p in chosen if len(p.panels) >= 2 and _fits(p, id_keys)), whole)]
            return [whole]
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


def measured(doc: Doc) -> bool:
    """Whether a cell has measured figures to draw: it ran to the end, or until it ran out of memory."""
    return doc["status"] in ("ok", "oom")


def measured_none(docs: list[Doc]) -> bool:
    """Whether a study has no measured cell yet: its plots are of predictions, and say so."""
    return not any(map(measured, docs))


def _drawn_parts(docs: list[Doc], id_keys: list[str], panel_keys: list[str]) -> Iterator[Part]:
    """The study's figures that show something, each with the panels that do: a panel that holds a
    measured cell (not one of statuses alone: unsupported, failed); in a study that measured none, one
    that holds a planned cell's prediction."""
    predicted_only = measured_none(docs)
    for part in parts(docs, id_keys, panel_keys):
        kept = [(title, members) for title, members in part.panels
                if any(is_planned(d) and bool(prediction(d) or time_prediction(d)) if predicted_only
                       else measured(d) for d in members)]
        if kept:
            yield Part(part.split, part.rows, kept, part.context)


# --- figures ----------------------------------------------------------------------------------------------

CHAR_IN = 0.58 / 72  # a character's width per point of font size, in inches (DejaVu Sans, about)
LINE_IN = 1.3 / 72  # a line's height per point
TICK_ANGLE = 30
PANEL_TITLE_IN = 0.2  # and its lines


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
    """Level labels, a line a key, each wrapped to its cell's width, where every word fits it and they
    stand no higher than slanted ones would; else one slanted line each."""
    chars = max(1, int(cell_in / (FONT * CHAR_IN)))
    lines = [[line for said in words(d["params"], keys) for line in textwrap.wrap(said, chars)] for d in docs]
    level = Ticks(["\n".join(label) for label in lines], False)
    slanted = Ticks([", ".join(words(d["params"], keys)) for d in docs], True)
    fits = all(len(line) <= chars for label in lines for line in label)
    return level if fits and level.height_in() <= slanted.height_in() else slanted


def _set_ticks(ax, ticks: Ticks) -> None:
    ax.set_xticks(range(len(ticks.labels)), ticks.labels, fontsize=FONT,
                  rotation=TICK_ANGLE if ticks.slanted else 0, ha="right" if ticks.slanted else "center",
                  rotation_mode="anchor")
    ax.grid(axis="x", visible=False)


@dataclass
class Panel:
    """One panel of a figure: its title (what its cells share that the figure's others do not), its
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
        shared = ", ".join(said(members[0]["params"], in_panel)) if members else ""
        laid.append(Panel(", ".join(filter(None, [name, shared])), members, differ))
    shared = ", ".join(said(docs[0]["params"], in_figure)) if docs else ""
    return ", ".join(filter(None, [part.shows, shared])), laid


@dataclass
class Grid:
    """How a figure's panels are laid: in `columns` (1 or 2), each cell `cell_in` inches wide."""
    columns: int
    most: int  # cells of its widest panel
    cell_in: float

    @property
    def panel_in(self) -> float:
        return 1.0 + self.cell_in * max(self.most, 1)


WRAPPED_IN = 1.2  # a cell this wide takes a label's long lines wrapped (_ticks)


def _level_in(panels: list[Panel]) -> float:
    """How wide a cell must be for its label's lines to stand level (labels of several keys read
    better level than slanted)."""
    widest = max((len(line) for p in panels for d in p.docs for line in words(d["params"], p.keys)),
                 default=0)
    return widest * FONT * CHAR_IN + 0.1


def _cell_room(columns: int, most: int) -> float:
    """The widest a cell can be, its panel one of `columns` across MAX_WIDTH_IN (Grid.panel_in)."""
    return ((MAX_WIDTH_IN - 0.4) / columns - 1.0) / max(most, 1)


def _columns(panels: list[Panel]) -> int:
    """Two panels side by side where each is narrow enough for its labels to stand level in half the
    figure's width (lines longer than WRAPPED_IN wrapped); else one a row."""
    most = max(len(p.docs) for p in panels)
    need = max(0.75, min(_level_in(panels), WRAPPED_IN))
    return 2 if len(panels) > 1 and need <= _cell_room(2, most) else 1


def _grid(panels: list[Panel], wanted: float) -> Grid:
    """A cell is drawn `wanted` inches wide, or as wide as its label's lines need to stand level, but
    narrower where the widest panel would pass its share of MAX_WIDTH_IN."""
    columns = _columns(panels)
    most = max(len(p.docs) for p in panels)
    return Grid(columns, most, min(max(wanted, _level_in(panels)), _cell_room(columns, most)))


def _figure(grid: Grid, tick_heights: list[float], title: str, legend: list[str], panel_titles: list[str]):
    """A figure of its panels in rows of `grid.columns`, as wide as its widest panel needs (within
    MAX_WIDTH_IN) and at most MAX_HEIGHT_IN high, its axes shorter where the rows need it; `legend` the
    labels its legend will have, for the room it takes; each panel titled, wrapped to its width.
    Returns the figure and its panels' axes, in reading order (the grid's spare axis hidden)."""
    rows = math.ceil(len(tick_heights) / grid.columns)
    width = min(MAX_WIDTH_IN, max(7.0, 0.4 + grid.columns * grid.panel_in))
    title_lines = textwrap.wrap(title, _chars_in(width, TITLE_FONT))
    legend_rows = math.ceil(len(legend) / _legend_columns(legend, width)) if legend else 0
    top = len(title_lines) * TITLE_FONT * LINE_IN + legend_rows * FONT * 1.6 / 72 + 0.35
    wrapped = ["\n".join(textwrap.wrap(t, _chars_in(width / grid.columns, FONT))) for t in panel_titles]
    row = [slice(r * grid.columns, (r + 1) * grid.columns) for r in range(rows)]
    under = sum(max(tick_heights[r]) + max(t.count("\n") + 1 for t in wrapped[r]) * FONT * LINE_IN
                + PANEL_TITLE_IN for r in row)
    axis_in = max(MIN_PANEL_IN, min(PANEL_IN, (MAX_HEIGHT_IN - top - under) / rows))
    height = min(MAX_HEIGHT_IN, max(top + under + rows * axis_in, width / MAX_FLATNESS + 0.05))
    fig, axes = plt.subplots(rows, grid.columns, squeeze=False, layout="constrained", figsize=(width, height))
    used = list(axes.flat)[:len(tick_heights)]
    for ax in list(axes.flat)[len(tick_heights):]:
        ax.set_visible(False)
    for ax, panel_title in zip(used, wrapped):
        ax.set_xlim(-0.6, max(grid.most, 1) - 0.4)  # equal bar widths in every panel
        ax.set_title(panel_title, fontsize=FONT)
    fig.suptitle("\n".join(title_lines), fontsize=TITLE_FONT)
    return fig, used


def _titled(study: str, shared: str) -> str:
    return f"{study} ({shared})" if shared else study


def _chars_in(width_in: float, points: float) -> int:
    return max(20, int((width_in - 0.4) / (points * CHAR_IN)))


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


def _scale(ax, values: list[float], room: float, also: list[float] = ()) -> bool:
    """Fit the y axis to the panel's `values`: a log axis where they span more than LOG_ABOVE (True
    then), and `room` (a share of the axis' height) above the tallest for what is written over the
    bars; `also` (a capacity line) stays within the axis without choosing its scale."""
    positive = [v for v in values if v is not None and v > 0] or [v for v in also if v and v > 0]
    if not positive:
        return False
    low, high = min(positive), max([*positive, *(v for v in also if v)])
    log = max(positive) / low > LOG_ABOVE
    if log:
        ax.set_yscale("log")
        bottom = low / 2
        top = 10 ** (math.log10(bottom) + (math.log10(high) - math.log10(bottom)) / (1 - room))
    else:
        bottom, top = 0, high / (1 - room)
    ax.set_ylim(bottom, top)
    return log


def _axis_label(what: str, log: bool) -> str:
    return f"{what} (log scale)" if log else what


def _status_mark(ax, x: float, doc: Doc) -> None:
    """A cell without a bar: its status, upright at the axis' foot (in axes units, so on a log axis too)."""
    text = "OOM" if doc["status"] == "oom" else doc["status"]
    ax.text(x, 0.02, text, rotation=90, ha="center", va="bottom", fontsize=NOTE_FONT, color="firebrick",
            transform=ax.get_xaxis_transform())


def _predicted_bar(ax, x: float, value: float, width: float, label: str, note: str = "") -> None:
    """A cell not measured: a hatched outline at its prediction, with `note` over it; where the axis
    (fitted to the measured cells) stops short of it, cut at the top with the figure written there."""
    ax.bar(x, value, width=width, **PREDICTED_STYLE, label=label)
    top = ax.get_ylim()[1]
    if value > top:
        ax.annotate(f"{_figure_text(value)} ↑", (x, top), xytext=(0, -2), textcoords="offset points",
                    ha="center", va="top", fontsize=NOTE_FONT, color="dimgray",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    elif note:
        _note(ax, x, value, note, True, color="dimgray")


def _figure_text(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _note(ax, x: float, y: float, text: str, level: bool, color: str = "black") -> None:
    ax.annotate(text, (x, y), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                fontsize=NOTE_FONT, color=color, rotation=0 if level else 90)


def _gpu_name(docs: list[Doc]) -> str:
    """The GPU most of the cells ran on (or are planned for), as reports name it: "H200"; "" for none."""
    names = Counter(gpu_label(d["provenance"]["gpu_name"]) for d in docs
                    if not is_planned(d) and (d.get("provenance") or {}).get("gpu_name"))
    names.update(d["planned_for_gpu"].upper() for d in docs if is_planned(d) and d.get("planned_for_gpu"))
    return names.most_common(1)[0][0] if names else ""


def _unit(docs: list[Doc]) -> str:
    """What a rank of these cells is: a GPU, or a CPU rank where the cells' device is cpu."""
    return "CPU rank" if docs and all(on_cpu(d["params"]) for d in docs) else "GPU"


def _on(docs: list[Doc]) -> str:
    """Where the cells ran, for a title: " on H200s", " on CPU ranks" ("" where no GPU is known)."""
    if _unit(docs) == "CPU rank":
        return " on CPU ranks"
    name = _gpu_name(docs)
    return f" on {name}s" if name else ""


def _range(values: list[float], fmt, unit: str = "") -> str:
    """The values' range in words: "19-27 GiB", or "27 GiB" where they round alike."""
    low, high = fmt(min(values)), fmt(max(values))
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def save(fig, path: Path) -> None:
    """The figure as a PNG of its size at DPI (no tight box: a figure is as large as it was made),
    compressed as far as PNG goes."""
    with plt.style.context(STYLE):
        fig.savefig(path, dpi=DPI, pil_kwargs={"optimize": True})
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
    return next((k for _, k in map(_memory_series, docs) if k), _unit(docs))


def capacity_gib(doc: Doc) -> float | None:
    """The memory a cell's rank had on its GPU, in GiB: the GPU's as NVML gave it (a planned cell: its
    planning GPU's), or the cell's gpu_mem_limit_gib where that is less; None where no GPU is known."""
    metrics, provenance = doc.get("metrics") or {}, doc.get("provenance") or {}
    totals = metrics.get("gpu_mem_total_mib") or [provenance.get("gpu_memory_mib")]
    mib = min(totals) if all(totals) else None
    if mib is None and doc.get("planned_for_gpu") in GPUS:
        mib = GPUS[doc["planned_for_gpu"]].memory_mib
    limit = doc["params"].get("gpu_mem_limit_gib")
    if limit:
        mib = min(mib, limit * MIB_PER_GIB) if mib else limit * MIB_PER_GIB
    return mib / MIB_PER_GIB if mib else None


# a GPU's memory more than this many times a panel's tallest figure is written at the axis' top instead of
# drawn: a line that far up would flatten the bars it is there to measure (GPT-2 124M's 5 GiB of 140)
CAPACITY_DRAWN_UP_TO = 4.0


def _capacity_label(known: list[float], gpu: str, capped: bool) -> str:
    gib = f"{_range(known, lambda v: f'{v:,.0f}')} GiB"
    if max(known) - min(known) > 0.01 * max(known):
        return f"the GPU's memory, or the cell's cap ({gib})"
    return f"the cells' {gib} cap" if capped else f"{gpu or 'GPU'} memory ({gib})"


def _draw_capacity(ax, capacities: list[float | None], gpu: str, capped: bool, above: bool) -> None:
    """A dashed line at the memory a rank has: across the panel where its cells share one, else over
    each cell (a cell held to a smaller GPU has its own); where it is `above` the axis, written at its
    top."""
    known = [c for c in capacities if c]
    if not known:
        return
    label = _capacity_label(known, gpu, capped)
    if above:
        ax.text(0.995, 0.99, f"↑ {label}, above the axis", transform=ax.transAxes, ha="right", va="top",
                fontsize=NOTE_FONT, color=CAPACITY_STYLE["color"])
        return
    if max(known) - min(known) <= 0.01 * max(known):
        ax.axhline(known[0], **CAPACITY_STYLE, label=label)
        return
    for x, capacity in enumerate(capacities):
        if capacity:
            ax.hlines(capacity, x - 0.45, x + 0.45, colors=CAPACITY_STYLE["color"], linestyles="--",
                      linewidths=CAPACITY_STYLE["linewidth"], label="the GPU's memory, or the cell's cap")


def _draw_measured_memory(ax, x: int, doc: Doc, values: list[float], predicted: float | None, kind: str,
                          bar: float) -> list[float]:
    """A measured cell's bars, one per GPU (rank), under the memory model's mark; the heights drawn."""
    heights = []
    if predicted is not None:
        ax.hlines(predicted, x - 0.45, x + 0.45, colors="black", linewidths=2,
                  label="memory model's prediction")
        heights.append(predicted)
    if not values:
        _status_mark(ax, x, doc)
        return heights
    allocated = (doc.get("metrics") or {}).get("torch_peak_allocated_mib") if kind == "GPU" else None
    for i, value in enumerate(values):
        where = x - 0.4 + bar * (i + 0.5)
        # the whole bar: what nvidia-smi shows; its solid part: the tensors torch allocated
        ax.bar(where, value, width=bar, color=f"C{i % 10}", alpha=0.4 if allocated else 1.0,
               label=f"{kind} {i}")
        if allocated and i < len(allocated) and allocated[i] is not None:
            ax.bar(where, allocated[i] / MIB_PER_GIB, width=bar, color=f"C{i % 10}")
            heights.append(allocated[i] / MIB_PER_GIB)
    if doc["status"] != "ok":
        ax.text(x, max(values), doc["status"], ha="center", va="bottom", fontsize=NOTE_FONT,
                color="firebrick")
    return heights + values


def _draw_memory(ax, panel: Panel, kind: str, ticks: Ticks, gpu: str) -> None:
    series = [_memory_series(d)[0] for d in panel.docs]
    bar = 0.8 / (max(map(len, series), default=0) or 1)
    heights: list[float] = []
    planned: list[tuple[int, float]] = []
    for x, (doc, values) in enumerate(zip(panel.docs, series)):
        predicted = _predicted_per_device(doc, kind)
        if not is_planned(doc):
            heights += _draw_measured_memory(ax, x, doc, values, predicted, kind, bar)
        elif predicted is None:
            _status_mark(ax, x, doc)
        else:
            planned.append((x, predicted))
    shown = heights or [v for _, v in planned]
    capacities = [capacity_gib(d) for d in panel.docs] if kind == "GPU" else []
    known = [c for c in capacities if c]
    above = bool(shown and known) and max(known) > CAPACITY_DRAWN_UP_TO * max(shown)
    log = _scale(ax, shown, 0.14 if above else 0.08, also=[] if above else known)
    for x, value in planned:
        _predicted_bar(ax, x, value, 0.8, f"predicted {kind} memory (not measured)")
    _draw_capacity(ax, capacities, gpu, any(d["params"].get("gpu_mem_limit_gib") for d in panel.docs), above)
    _set_ticks(ax, ticks)
    ax.set_ylabel(_axis_label(f"GiB per {kind}", log), fontsize=FONT)


def _gib_text(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def _memory_point(docs: list[Doc], kind: str, predicted_only: bool) -> str:
    """What a memory figure shows, in one sentence: how many set-ups ran out of memory, and the range
    the others peaked in, against the GPU's memory (a study not measured yet: its predictions')."""
    of = _held_in([d for d in docs if predicted_only or d["status"] == "ok"]) if kind == "GPU" else ""
    if predicted_only:
        figures = [v for v in (_predicted_per_device(d, kind) for d in docs) if v is not None]
        return (f"predicted peak memory per {kind} (not measured yet): {len(figures)} set-ups at "
                f"{_range(figures, _gib_text, ' GiB')}{of}")
    measured = [d for d in docs if d["status"] in ("ok", "oom")]
    peaks = [max(v) for v in (_memory_series(d)[0] for d in measured if d["status"] == "ok") if v]
    oom = sum(d["status"] == "oom" for d in measured)
    sentence = [f"{oom} of {len(measured)} set-ups run out of memory"] if oom else []
    if peaks:
        sentence.append(f"{len(peaks)}{'' if oom else ' set-ups'} peak at {_range(peaks, _gib_text, ' GiB')} "
                        f"per {kind}{of}")
    return "; ".join(sentence) or f"peak memory per {kind}"


def _held_in(docs: list[Doc]) -> str:
    """The memory the cells' GPUs gave them, where they share it: " of the H200's 140 GiB", " of their
    40 GiB cap" ("" where they differ or none is known)."""
    held = {round(c) for c in map(capacity_gib, docs) if c}
    if len(held) != 1:
        return ""
    if any(d["params"].get("gpu_mem_limit_gib") for d in docs):
        return f" of their {held.pop()} GiB cap"
    return f" of the {_gpu_name(docs) or 'GPU'}'s {held.pop()} GiB"


def memory_figures(docs: list[Doc], id_keys: list[str], title: str, panel_keys: list[str] = (),
                   note: str = "") -> Iterator[StudyFigure]:
    """Peak memory of every GPU (CPU rank) of every cell, one figure a part of the study."""
    kind = _memory_kind(docs)
    predicted_only = measured_none(docs)
    # what a measured bar's shades are: one colour a GPU, in rank order
    shades = ([Patch(facecolor="gray", alpha=0.4, label="measured: nvidia-smi 'used' (whole bar)"),
               Patch(facecolor="gray", label="measured: torch peak allocated (dark part)")]
              if any((d.get("metrics") or {}).get("torch_peak_allocated_mib") for d in docs) and kind == "GPU"
              else [Patch(facecolor="gray", label=f"measured: peak {'resident ' * (kind != 'GPU')}memory")])
    for part in _drawn_parts(docs, id_keys, panel_keys):
        with plt.style.context(STYLE):
            shared, laid = _panel_layout(part, id_keys)
            grid = _grid(laid, 0.75)
            ticks = [_ticks(p.docs, p.keys, grid.cell_in) for p in laid]
            ranks = max((len(_memory_series(d)[0]) for d in part.docs), default=0)
            gpu = _gpu_name(part.docs)
            point = _memory_point(part.docs, kind, predicted_only)
            fig, axes = _figure(grid, [t.height_in() for t in ticks],
                                f"{_titled(title, shared)}: {point}{note}",
                                [f"{kind} {i}" for i in range(ranks)] + [h.get_label() for h in shades]
                                + ["memory model's prediction", f"predicted {kind} memory (not measured)",
                                   f"{gpu or 'GPU'} memory (000 GiB)"], [p.title for p in laid])
            for ax, panel, tick in zip(axes, laid, ticks):
                _draw_memory(ax, panel, kind, tick, gpu)
            _legend(fig, axes, shades if not predicted_only else [])
        yield StudyFigure("memory", part.shows, part.file_name("memory"), fig)


# --- throughput -------------------------------------------------------------------------------------------

THROUGHPUT_LABELS = {"measured": "measured", "configured": "measured, at the study's batch",
                     "largest": "measured, at the largest batch", "planned": "predicted (not measured)",
                     "mark": "the time model's prediction"}


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


def _measured_bars(doc: Doc) -> list[tuple[str, dict, int | None]]:
    """A measured cell's throughput bars: at its configured batch, and at the largest batch a search found
    (which, its metrics, its global batch)."""
    bars = []
    if doc["status"] == "ok" and (doc.get("metrics") or {}).get("samples_per_s") is not None:
        bars.append(("configured", doc["metrics"], doc["params"].get("global_batch")))
    found = doc.get("search") or {}
    if found.get("metrics_at_max"):
        at_max = with_intervals(doc["params"], found["metrics_at_max"],
                                (doc.get("provenance") or {}).get("gpu_name"))
        bars.append(("largest", at_max, found["max_global_batch"]))
    return bars


def _draw_throughput(ax, panel: Panel, searched: bool, ticks: Ticks, cell_in: float) -> None:
    width = 0.4 if searched else 0.8
    # notes level over the bars where their lines ("1,234.5", "43% MFU", "batch 128") fit a bar's room
    level = cell_in * (0.5 if searched else 1.0) >= 9 * NOTE_FONT * CHAR_IN
    heights: list[float] = []
    planned: list[tuple[int, float]] = []
    need = 0.0
    for x, doc in enumerate(panel.docs):
        predicted = time_prediction(doc).get("samples_per_s")
        if is_planned(doc):
            if predicted is None:
                _status_mark(ax, x, doc)
            else:
                planned.append((x, predicted))
            continue
        if predicted is not None and doc["status"] == "ok":
            offset = -width / 2 if searched else 0
            ax.hlines(predicted, x + offset - width / 2, x + offset + width / 2, colors="black", linewidths=2,
                      label=THROUGHPUT_LABELS["mark"])
            heights.append(predicted)
        bars = _measured_bars(doc)
        if not bars:
            _status_mark(ax, x, doc)
        for which, metrics, batch in bars:
            offset = 0 if not searched else (-width / 2 if which == "configured" else width / 2)
            value, mfu = metrics["samples_per_s"], metrics.get("mfu")
            interval = metrics.get("samples_per_s_ci")  # the 95% interval, as the table's ±
            error = [[value - interval[0]], [interval[1] - value]] if interval else None
            ax.bar(x + offset, value, width=width, color="C0" if which == "configured" else "C1",
                   yerr=error, capsize=3, ecolor="black",
                   label=THROUGHPUT_LABELS[which if searched else "measured"])
            note = _throughput_note(value, mfu, batch if searched else None, level)
            _note(ax, x + offset, interval[1] if interval else value, note, level)
            need = max(need, _note_height(note, level))
            heights += [value] + (list(interval) if interval else [])
    if planned:
        need = max(need, 2 * NOTE_FONT * LINE_IN)
    # room over the bars for the notes, against an axis about 2.5 inches high
    log = _scale(ax, heights or [v for _, v in planned], min(0.5, (need + 0.1) / 2.5))
    for x, value in planned:
        _predicted_bar(ax, x, value, width, THROUGHPUT_LABELS["planned"],
                       _throughput_note(value, None, None, True) + "\npredicted")
    _set_ticks(ax, ticks)
    ax.set_ylabel(_axis_label("samples / s (all ranks)", log), fontsize=FONT)


def _fastest(panel: Panel) -> str:
    """The panel's fastest measured cell, in words, for its title ("" for fewer than two measured): at
    its configured batch, or at the largest batch its search found."""
    measured = [(metrics["samples_per_s"], which, batch, d) for d in panel.docs
                for which, metrics, batch in _measured_bars(d)]
    if len({id(m[3]) for m in measured}) < 2:
        return ""
    value, which, batch, doc = max(measured, key=lambda m: m[0])
    at = f" at batch {batch}" if which == "largest" else ""
    return (f"fastest: {', '.join(words(doc['params'], panel.keys))} "
            f"({_throughput_note(value, None, None, True)} samples/s{at})")


def throughput_figures(docs: list[Doc], id_keys: list[str], title: str, panel_keys: list[str] = (),
                       note: str = "") -> Iterator[StudyFigure]:
    """Samples/s of every cell at its configured batch; next to it, for a cell whose largest batch was
    searched, the run at that batch (labelled with the global batch). Each panel's title names its
    fastest cell."""
    predicted_only = measured_none(docs)
    for part in _drawn_parts(docs, id_keys, panel_keys):
        with plt.style.context(STYLE):
            searched = any(d.get("search") for d in part.docs)
            shared, laid = _panel_layout(part, id_keys)
            grid = _grid(laid, 1.1 if searched else 0.8)
            ticks = [_ticks(p.docs, p.keys, grid.cell_in) for p in laid]
            on = _on(part.docs)
            what = (f"predicted training throughput{on} (not measured yet)" if predicted_only else
                    f"training throughput of each set-up{on}, measured (median step, 95% "
                    "interval) beside the time model's prediction (black)")
            fig, axes = _figure(grid, [t.height_in() for t in ticks],
                                f"{_titled(title, shared)}: {what}{note}",
                                [THROUGHPUT_LABELS[k] for k in ("mark", "planned", "configured")]
                                + [THROUGHPUT_LABELS["largest"]] * searched,  # the longest it can hold
                                ["; ".join(filter(None, [p.title, _fastest(p)])) for p in laid])
            for ax, panel, tick in zip(axes, laid, ticks):
                _draw_throughput(ax, panel, searched, tick, grid.cell_in)
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
    """A scaled strategy in words, with the settings it chose: "DDP (buckets of 100 MiB)"."""
    params = doc["params"]
    name = value_label("strategy", params.get("strategy"), params)
    settings = [_split_words(key, params[key], params) for key in STRATEGY_SETTINGS if _set(params, key)]
    settings = [s for s in settings if s]
    return f"{name} ({', '.join(settings)})" if settings else name


def _gpu_model(doc: Doc) -> str | None:
    """The GPU model a cell ran on (a planned cell: its planning GPU); None where unknown."""
    if is_planned(doc):
        return doc.get("planned_for_gpu")
    return gpu_model_of((doc.get("provenance") or {}).get("gpu_name"))


def _held_against(reference: Doc, doc: Doc) -> bool:
    """Whether a cell's throughput compares with the one-GPU cell's: both of one GPU model where known."""
    models = _gpu_model(reference), _gpu_model(doc)
    return None in models or models[0] == models[1]


def scalings(docs: list[Doc], id_keys: list[str], counts: int = 1) -> list[Scaling]:
    """The study's strategies scaled over GPU counts from a one-GPU cell of the same set-up (the same
    values of every key but SCALED, on the same GPU model): a strategy needs `counts` GPU counts or more,
    above one, and the set-up a one-GPU cell that did not emulate a larger world (the plain one-GPU run
    where several strategies ran on one GPU). None for a study that varies no GPU count so."""
    same = [k for k in id_keys if k not in SCALED]
    found = []
    for group in _grouped([d for d in docs if not d["params"].get("emulate")], same):
        alone = [d for d in group if d["params"].get("gpus") == 1]
        several = [d for d in group if (d["params"].get("gpus") or 1) > 1]
        plain = [d for d in alone if d["params"].get("strategy") not in {c["params"].get("strategy")
                                                                          for c in several}] or alone
        if len(plain) != 1:
            continue
        series: dict[str, list[Doc]] = {}
        for doc in several:
            if _held_against(plain[0], doc):
                series.setdefault(_series_name(doc), []).append(doc)
        series = {name: sorted(cells, key=lambda d: d["params"]["gpus"]) for name, cells in series.items()
                  if len({d["params"]["gpus"] for d in cells}) >= counts}
        if series:
            found.append(Scaling("", plain[0], series))
    keys = varying([s.reference for s in found], same)
    for scaling in found:
        scaling.words = ", ".join(words(scaling.reference["params"], keys))
    return found


def with_scaling(docs: list[Doc], id_keys: list[str]) -> list[Doc]:
    """Each scaled cell with its efficiency against the one-GPU cell of its set-up (`scaling`: the
    figure, the reference cell, and whether both ran on one machine by their host ids: None where a
    result predates the id), for the table's `scaling_efficiency` column."""
    found = {}
    for scaling in scalings(docs, id_keys):
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


def _counted(count: int, unit: str) -> str:
    return f"{count:g} {unit}{'' if count == 1 else 's'}"


def _scaling_point(chunk: list[Scaling], unit: str, measured: bool) -> str:
    """What a scaling figure shows, in one sentence: each series' efficiency at the most GPUs it ran on
    (over the figure's set-ups, a range): "at 4 GPUs, DDP keeps 97% and FSDP2 93-99% of one GPU's
    throughput per GPU"."""
    at: dict[str, tuple[int, list[float]]] = {}
    for scaling in chunk:
        for name, cells in scaling.series.items():
            found = [(d["params"]["gpus"], e) for d in cells
                     if (e := _efficiency(d, scaling.reference, measured)) is not None]
            if not found:
                continue
            most = max(n for n, _ in found)
            kept = at.get(name)
            if kept is None or most > kept[0]:
                at[name] = kept = (most, [])
            if most == kept[0]:
                kept[1].extend(e for n, e in found if n == most)
    whose = f"of one {unit}'s throughput per {unit}"
    if not at:
        return f"samples/s per {unit} against one {unit}'s"
    percent = [(name, _range([100 * v for v in found], lambda v: f"{v:.0f}", "%"), most)
               for name, (most, found) in at.items()]
    if len({most for *_, most in percent}) == 1:
        said = [f"{name} {'keeps ' if i == 0 else ''}{p}" for i, (name, p, _) in enumerate(percent)]
        return f"at {_counted(percent[0][2], unit)}, {_join(said)} {whose}"
    first, *rest = percent
    return (f"{first[0]} keeps {first[1]} {whose} at {_counted(first[2], unit)}, "
            + ", ".join(f"{name} {p} at {_counted(most, unit)}" for name, p, most in rest))


def _measured_scaling(scaling: Scaling) -> bool:
    return _samples(scaling.reference, True) is not None and any(
        _samples(d, True) is not None for cells in scaling.series.values() for d in cells)


def _drawable(scaling: Scaling) -> Scaling | None:
    """The set-up's series that have a point to draw (a strategy the stack refused has none), or None."""
    series = {name: cells for name, cells in scaling.series.items()
              if any(_efficiency(d, scaling.reference, m) is not None for d in cells for m in (True, False))}
    return Scaling(scaling.words, scaling.reference, series) if series else None


SCALING_STYLES = [Line2D([], [], color="black", label="measured"),
                  Line2D([], [], color="black", linestyle="--", marker="o", markerfacecolor="white",
                         label="the time model's prediction"),
                  Line2D([], [], color="gray", linestyle=":", label="ideal (linear)")]


def scaling_figures(docs: list[Doc], id_keys: list[str], title: str) -> Iterator[StudyFigure]:
    """Each scaled strategy's efficiency against its GPU count, measured (solid) and as the time model
    predicts it (dashed), beside the ideal: N GPUs giving N times one GPU's samples/s. One panel a
    set-up, up to MAX_PANELS a figure, in two columns, on one y axis fitted to the data; a set-up with
    nothing measured is left out, unless the study measured nothing (its title then says "predicted")."""
    predicted_only = measured_none(docs)
    found = [s for s in map(_drawable, scalings(docs, id_keys))
             if s and (predicted_only or _measured_scaling(s))]
    chunks = [found[i:i + MAX_PANELS] for i in range(0, len(found), MAX_PANELS)]
    unit = _unit(docs)
    for number, chunk in enumerate(chunks):
        with plt.style.context(STYLE):
            # a series keeps its colour in every panel, whichever others a panel has (one legend a figure)
            colours: dict[str, str] = {}
            for scaling in chunk:
                for series in scaling.series:
                    colours.setdefault(series, f"C{len(colours) % 10}")
            legend = [Line2D([], [], color=c, marker="o", label=name) for name, c in colours.items()]
            point = _scaling_point(chunk, unit, measured=not predicted_only)
            on = _on([s.reference for s in chunk]) if unit == "GPU" else ""
            said = f"{title}: {'predicted scaling: ' * predicted_only}{point}{on}"
            fig, axes = _scaling_figure(len(chunk), said, [h.get_label() for h in legend + SCALING_STYLES])
            drawn = [value for ax, scaling in zip(axes, chunk)
                     for value in _draw_scaling(ax, scaling, colours, unit, notes=len(colours) <= 3)]
            for ax in axes:  # one y axis for the figure's panels: their set-ups side by side
                _scaling_limits(ax, drawn)
            _legend(fig, [], legend + SCALING_STYLES)
        name = "scaling.png" if len(chunks) == 1 else f"scaling-{number + 1}.png"
        yield StudyFigure("scaling", ", ".join(s.words for s in chunk) if len(chunks) > 1 else "", name, fig)


def _scaling_figure(panels: int, title: str, legend: list[str]):
    """A figure of `panels` scaling panels, two a row, its height as its title and legend need (within
    MAX_HEIGHT_IN); its panels' axes (the spare one hidden)."""
    columns = min(2, panels)
    rows = math.ceil(panels / columns)
    width = max(9.0, 6.0 * columns + 0.5)
    lines = textwrap.wrap(title, _chars_in(width, TITLE_FONT))
    legend_rows = math.ceil(len(legend) / _legend_columns(legend, width))
    height = rows * 3.4 + len(lines) * TITLE_FONT * LINE_IN + legend_rows * FONT * 1.6 / 72 + 0.4
    fig, axes = plt.subplots(rows, columns, squeeze=False, layout="constrained",
                             figsize=(width, min(MAX_HEIGHT_IN, height)))
    for ax in list(axes.flat)[panels:]:
        ax.set_visible(False)
    fig.suptitle("\n".join(lines), fontsize=TITLE_FONT)
    return fig, list(axes.flat)[:panels]


def _scaling_limits(ax, values: list[float]) -> None:
    """A y axis around the efficiencies drawn and the ideal's 100%, in steps of 5%: 85-110% for data
    between 90% and 107%, never below 0."""
    low, high = min([100.0, *values]), max([100.0, *values])
    pad = max(2.0, 0.1 * (high - low))
    ax.set_ylim(max(0.0, 5 * math.floor((low - pad) / 5)), 5 * math.ceil((high + pad) / 5))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], integer=True))
    ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))


def _draw_scaling(ax, scaling: Scaling, colours: dict[str, str], unit: str, notes: bool) -> list[float]:
    """One set-up's series, measured and predicted, against GPU counts, each measured point's efficiency
    written beside it where `notes` (few series: more would overlap); the efficiencies drawn (%)."""
    counts = sorted({1} | {d["params"]["gpus"] for cells in scaling.series.values() for d in cells})
    ax.axhline(100, color="gray", linestyle=":", linewidth=1.5)
    drawn: list[float] = []
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
            drawn += [100 * e for _, e in points]
            if measured and notes:
                for n, e in points[1:]:
                    ax.annotate(f"{e:.0%}", (n, 100 * e), textcoords="offset points",
                                xytext=(6, 4 if i % 2 == 0 else -10), fontsize=NOTE_FONT, color=colour)
        for doc in cells:
            if doc["status"] not in ("ok", "planned", "not run"):
                ax.text(doc["params"]["gpus"], 0.02, doc["status"], transform=ax.get_xaxis_transform(),
                        fontsize=NOTE_FONT, color="firebrick", ha="center", va="bottom", rotation=90)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.minorticks_off()
    ax.set_xlim(counts[0] / 1.3, counts[-1] * 1.3)
    ax.set_xlabel(f"{unit}s", fontsize=FONT)
    ax.set_ylabel(f"samples/s per {unit}, of one {unit}'s", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    params = scaling.reference["params"]
    reference = value_label("strategy", params.get("strategy"), params)
    ax.set_title("; ".join(filter(None, [scaling.words, f"against {reference} on 1 {unit}"])), fontsize=FONT)
    return drawn


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


def _exposed_share(docs: list[Doc]) -> str:
    """The share of the step that collectives left exposed, over the profiled cells ("4-38%")."""
    found = [d["metrics"]["breakdown"] for d in docs]
    shares = [f["parts_s"]["exposed_communication"] / f["step_s"] for f in found if f.get("step_s")]
    share = _range([100 * v for v in shares], lambda v: f"{v:.0f}", "%") if shares else ""
    return f"exposed communication takes {share} of a step" if shares else ""


def breakdown_figures(docs: list[Doc], id_keys: list[str], title: str,
                      panel_keys: list[str] = ()) -> Iterator[StudyFigure]:
    """Where each profiled cell's step went (execute/profiling.py), its parts stacked in ms per step at
    the timed median; beside it, hatched, the time model's parts of the same step (a GPU cell's). None
    for a study none of whose cells was profiled."""
    profiled = [d for d in docs if is_profiled(d)]
    if not profiled:
        return
    for part in parts(profiled, id_keys, panel_keys):
        with plt.style.context(STYLE):
            shared, laid = _panel_layout(part, id_keys)
            compared = any(parts_compared(d) for d in part.docs)
            grid = _grid(laid, 0.9)
            ticks = [_ticks(p.docs, p.keys, grid.cell_in) for p in laid]
            point = "; ".join(filter(None, [f"where a profiled step's time went{_on(part.docs)}",
                                            _exposed_share(part.docs)]))
            fig, axes = _figure(grid, [t.height_in() for t in ticks],
                                f"{_titled(title, shared)}: {point} (measured, solid"
                                f"{'; the time model, hatched' if compared else ''})",
                                [p.replace("_", " ") for p in PARTS]
                                + ([f"model: {p}" for p in MODEL_PARTS] if compared else []),
                                [p.title for p in laid])
            for ax, panel, tick in zip(axes, laid, ticks):
                _draw_breakdown(ax, panel, compared, tick)
            _legend(fig, axes)
        yield StudyFigure("breakdown", part.shows, part.file_name("breakdown"), fig)


def _draw_breakdown(ax, panel: Panel, compared: bool, ticks: Ticks) -> None:
    """Stacked parts on a linear axis, which a log axis would misdraw; a panel whose steps span more
    than LOG_ABOVE draws each cell's parts as shares of its step instead, its step's ms written over it."""
    width = 0.4 if compared else 0.8
    steps = [d["metrics"]["step_time_s"] for d in panel.docs]
    shares = max(steps) / min(steps) > LOG_ABOVE
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
    _set_ticks(ax, ticks)
    ax.set_ylabel("% of the step" if shares else "ms per optimizer step", fontsize=FONT)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.18)


# --- a study's folder -------------------------------------------------------------------------------------

def study_figures(docs: list[Doc], *, study: str, id_keys: list[str], panel_keys: list[str] = (),
                  profiled: bool = False) -> Iterator[StudyFigure]:
    """Every plot of a study, in reading order (memory, throughput, scaling, breakdown), one figure at a
    time: each is drawn when asked for, so that the caller saves and closes it before the next
    (megatron's make two dozen). A study of no cell has none; `profiled`: the study asks for profiles
    (its breakdown plot, once a cell has one)."""
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
    lists them in reading order with their kind and the cells each shows (paths.plot_files reads it):
    an empty list where the study has nothing to plot yet."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    index = []
    for figure in study_figures(docs, study=study, id_keys=id_keys, panel_keys=panel_keys, profiled=profiled):
        save(figure.figure, directory / figure.name)
        index.append({"file": figure.name, "kind": figure.kind, "shows": figure.shows})
    (directory / paths.PLOTS_INDEX).write_text(json.dumps({"study": study, "plots": index}, indent=1) + "\n")
    return [directory / entry["file"] for entry in index]
