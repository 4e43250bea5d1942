"""Per-study plots: peak memory of every GPU (or CPU rank) by cell, and throughput by cell.

The memory plot draws, for every GPU in rank order, the device memory in use as nvidia-smi shows it
(NVML 'used': the caching allocator's reserve, the CUDA context, NCCL) as the whole bar, and torch's
peak allocated memory (the tensors a strategy controls) as its solid part.

Cells that did not run to the end keep their place on the x axis with their status written in, so
a plot shows the same cells as the table. Planned cells (and cells this machine could not run) are
drawn as hatched outlines at the memory and time models' predictions, where there are few enough of
them to read (PLANNED_DRAWN_UP_TO per panel); measured cells carry the predictions as black marks. A
study's `plot_panels` keys split a plot into rows, one per combination of their values, each with its
own y axis: a grid's cells differ in throughput and memory by orders of magnitude across models, and
one row of them all is too wide to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from trainbench.execute.results import with_intervals  # noqa: E402
from trainbench.execute.profiling import PARTS  # noqa: E402
from trainbench.reporting.predictions import (MODEL_PARTS, parts_compared, prediction, time_prediction,  # noqa: E402
                                              with_current_predictions)

Doc = dict[str, Any]

# a study with more planned cells than this in one panel (llama's 497) plots its measured cells only
PLANNED_DRAWN_UP_TO = 40
PREDICTED_STYLE = {"fill": False, "hatch": "///", "edgecolor": "dimgray", "linewidth": 0.8}


def is_planned(doc: Doc) -> bool:
    return doc["status"] in ("planned", "not run")


def value_label(key: str, value: Any) -> str:
    """Names alone say what they are (zero2), numbers keep their key (gpus=2), flags appear by name
    when set and not at all when not."""
    if isinstance(value, bool):
        return key if value else ""
    return value if isinstance(value, str) else f"{key}={value}"


def cell_label(doc: Doc, id_keys: list[str]) -> str:
    """Short x-axis label, one line per key."""
    parts = [value_label(key, doc["params"].get(key)) for key in id_keys]
    return "\n".join(p for p in parts if p) or doc["cell_id"]


def _cell_ticks(ax, docs: list[Doc], id_keys: list[str]) -> None:
    labels = [cell_label(d, id_keys) for d in docs]
    widest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    # slanted when neighbours' labels would run into each other
    crowded = widest > 12 or len(docs) > 12
    ax.set_xticks(range(len(docs)), labels, fontsize=7, rotation=35 if crowded else 0,
                  ha="right" if crowded else "center", rotation_mode="anchor")


def _status_mark(ax, x: float, doc: Doc) -> None:
    text = "OOM" if doc["status"] == "oom" else doc["status"]
    ax.text(x, 0, text, rotation=90, ha="center", va="bottom", fontsize=8, color="firebrick")


def _memory_series(doc: Doc) -> tuple[list[float], str]:
    metrics = doc.get("metrics") or {}
    if metrics.get("gpu_mem_used_mib"):
        return metrics["gpu_mem_used_mib"], "GPU"
    if metrics.get("host_rss_peak_mib_per_rank"):
        return metrics["host_rss_peak_mib_per_rank"], "CPU rank"
    return [], ""


def _predicted_per_device(doc: Doc, kind: str) -> float | None:
    """The memory model's figure comparable to the bars: per GPU, or per CPU rank."""
    predicted = prediction(doc)
    if kind == "GPU":
        return predicted.get("gpu_mem_mib")
    host = predicted.get("host_mem_mib")
    return host / doc["params"]["gpus_per_node"] if host is not None else None


def panels(docs: list[Doc], keys: list[str]) -> list[tuple[str, list[Doc]]]:
    """The cells split by their values of `keys`, in the order the cells come: (title, cells) each."""
    groups: dict[tuple, list[Doc]] = {}
    for doc in docs:
        groups.setdefault(tuple(doc["params"].get(k) for k in keys), []).append(doc)
    return [(", ".join(f"{k}={v}" if not isinstance(v, str) else v for k, v in zip(keys, values)), members)
            for values, members in groups.items()] or [("", [])]  # no cells yet: one empty panel


def label_keys(docs: list[Doc], id_keys: list[str], panel_keys: list[str]) -> tuple[list[str], str]:
    """The keys that tell the plotted cells apart (for the x-axis labels), and the others' common
    values (for the title): a key all plotted cells share says nothing under every bar. Panel keys
    are in each panel's title. Where no key varies (one cell), every key labels the bar."""
    keys = [k for k in id_keys if k not in panel_keys]
    varying = [k for k in keys if len({repr(d["params"].get(k)) for d in docs}) > 1]
    if not varying:
        return keys, ""
    shared = [value_label(k, docs[0]["params"].get(k)) for k in keys if k not in varying]
    return varying, ", ".join(label for label in shared if label)


DPI = 120
# A study of many panels (megatron: 14 rows of up to 40 bars) would make a figure of 6,000 x 4,500 pixels
# and 3 MB at DPI; beyond this many pixels on its longer side the figure is saved at a lower resolution,
# its layout unchanged, so that the results tree stays light enough to travel with the checkout.
MAX_PIXELS = 3000


def save(fig, path: Path) -> None:
    longest = max(fig.get_size_inches())
    fig.savefig(path, dpi=min(DPI, MAX_PIXELS / longest))
    plt.close(fig)


def _panel_figure(groups: list[tuple[str, list[Doc]]], inches_per_cell: float, title: str):
    """One row per panel, as wide as the panel with the most cells and the title."""
    most = max(len(members) for _, members in groups)
    width = max(6, inches_per_cell * most + 2, 0.1 * len(title))  # about 0.1 inch per character at 12 pt
    fig, axes = plt.subplots(len(groups), 1, squeeze=False, layout="constrained",
                             figsize=(width, 5 if len(groups) == 1 else 4.2 * len(groups)))
    for ax in axes[:, 0]:
        ax.set_xlim(-0.6, most - 0.4)  # equal bar widths in every panel
    fig.suptitle(title)
    return fig, list(axes[:, 0])


def _memory_kind(docs: list[Doc], series: list[tuple[list[float], str]]) -> str:
    return next((k for _, k in series if k), "GPU" if any(d["params"].get("device") == "cuda" for d in docs)
                else "CPU rank")


def _draw_memory(ax, docs: list[Doc], keys: list[str], kind: str) -> None:
    series = [_memory_series(d) for d in docs]
    width_per_cell = max(len(v) for v, _ in series) if any(v for v, _ in series) else 1
    bar = 0.8 / width_per_cell
    labelled: set[int] = set()
    for x, (doc, (values, _)) in enumerate(zip(docs, series)):
        if is_planned(doc):
            predicted = _predicted_per_device(doc, kind)
            if predicted is not None:
                ax.bar(x, predicted, width=0.8, **PREDICTED_STYLE,
                       label=None if -2 in labelled else f"not measured: predicted {kind} memory")
                labelled.add(-2)
            else:
                _status_mark(ax, x, doc)
            continue
        if not values:
            _status_mark(ax, x, doc)
            continue
        allocated = (doc.get("metrics") or {}).get("torch_peak_allocated_mib") if kind == "GPU" else None
        for i, value in enumerate(values):
            where = x - 0.4 + bar * (i + 0.5)
            # the whole bar: what nvidia-smi shows; its solid part: the tensors torch allocated
            ax.bar(where, value, width=bar, color=f"C{i % 10}", alpha=0.4 if allocated else 1.0,
                   label=None if i in labelled else f"{kind} {i}")
            if allocated and i < len(allocated) and allocated[i] is not None:
                ax.bar(where, allocated[i], width=bar, color=f"C{i % 10}")
            labelled.add(i)
        if doc["status"] != "ok":
            ax.text(x, max(values), doc["status"], ha="center", va="bottom", fontsize=8, color="firebrick")
    predicted_label = "memory model's prediction"
    for x, doc in enumerate(docs):
        predicted = _predicted_per_device(doc, kind)
        if predicted is not None and not is_planned(doc):
            ax.hlines(predicted, x - 0.45, x + 0.45, colors="black", linewidths=2, label=predicted_label)
            predicted_label = None
            labelled.add(-1)
    _cell_ticks(ax, docs, keys)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the legend above the tallest bar
    ax.set_ylabel("MiB (nvidia-smi used; solid: torch allocated)" if kind == "GPU" else "MiB")
    if labelled:
        ax.legend(fontsize=7, ncols=min(8, width_per_cell + 1))


def _titled(study: str, shared: str) -> str:
    return f"{study} ({shared})" if shared else study


def memory_plot(docs: list[Doc], id_keys: list[str], title: str, path: Path,
                panel_keys: list[str] = (), note: str = "") -> None:
    kind = _memory_kind(docs, [_memory_series(d) for d in docs])
    groups = panels(docs, list(panel_keys))
    keys, shared = label_keys(docs, id_keys, list(panel_keys))
    what = ("peak memory per GPU in rank order: nvidia-smi 'used' (whole bar), torch peak allocated (solid)"
            if kind == "GPU" else "peak resident memory per CPU rank")
    fig, axes = _panel_figure(groups, 0.9, f"{_titled(title, shared)}: {what}; the memory model's "
                                           f"prediction in black (hatched: not measured){note}")
    for ax, (name, members) in zip(axes, groups):
        _draw_memory(ax, members, keys, kind)
        if name:
            ax.set_title(name, fontsize=9)
    save(fig, path)


def _draw_throughput(ax, docs: list[Doc], keys: list[str], searched: bool) -> None:
    width = 0.4 if searched else 0.8
    labels = {"configured": "at the study's batch", "largest": "at the largest batch that trains",
              "planned": "not measured: the time model's prediction", "mark": "the time model's prediction"}
    for x, doc in enumerate(docs):
        predicted = time_prediction(doc).get("samples_per_s")
        if is_planned(doc):
            if predicted is None:
                _status_mark(ax, x, doc)
                continue
            ax.bar(x, predicted, width=width, **PREDICTED_STYLE, label=labels.pop("planned", None))
            ax.text(x, predicted, f"{predicted:,.1f}\npredicted", ha="center", va="bottom", fontsize=6,
                    color="dimgray")
            continue
        if predicted is not None and doc["status"] == "ok":
            offset = -width / 2 if searched else 0
            ax.hlines(predicted, x + offset - width / 2, x + offset + width / 2, colors="black", linewidths=2,
                      label=labels.pop("mark", None))
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
                   yerr=error, capsize=3, ecolor="black",
                   label=labels.pop(which, None) if searched else None)
            note = f"{value:,.1f}" + (f"\n{mfu:.0%} MFU" if mfu is not None else "")
            if searched and batch is not None:
                note += f"\nbatch {batch}"
            ax.text(x + offset, value, note, ha="center", va="bottom", fontsize=6 if searched else 7)
    _cell_ticks(ax, docs, keys)
    ax.set_ylabel("samples / s (all ranks)")
    ax.set_ylim(top=ax.get_ylim()[1] * (1.25 if searched else 1.1))  # room for the notes above the bars
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def throughput_plot(docs: list[Doc], id_keys: list[str], title: str, path: Path,
                    panel_keys: list[str] = (), note: str = "") -> None:
    """Samples/s of every cell at its configured batch; next to it, for a cell whose largest batch was
    searched, the run at that batch (labelled with the global batch)."""
    searched = any(d.get("search") for d in docs)
    groups = panels(docs, list(panel_keys))
    keys, shared = label_keys(docs, id_keys, list(panel_keys))
    fig, axes = _panel_figure(groups, 1.2 if searched else 0.9,
                              f"{_titled(title, shared)}: training throughput (median step, 95% interval; "
                              f"black and hatched: predicted){note}")
    for ax, (name, members) in zip(axes, groups):
        _draw_throughput(ax, members, keys, searched)
        if name:
            ax.set_title(name, fontsize=9)
    save(fig, path)


def drawn(docs: list[Doc], panel_keys: list[str]) -> tuple[list[Doc], int]:
    """The cells to draw: all of them, or, where a panel would hold more than PLANNED_DRAWN_UP_TO planned
    cells, the measured ones only; and how many planned cells were left out."""
    widest = max((sum(map(is_planned, members)) for _, members in panels(docs, list(panel_keys))), default=0)
    if widest <= PLANNED_DRAWN_UP_TO:
        return docs, 0
    kept = [d for d in docs if not is_planned(d)]
    return kept, len(docs) - len(kept)


def write_plots(docs: list[Doc], *, study: str, id_keys: list[str], memory_path: Path,
                throughput_path: Path, panel_keys: list[str] = ()) -> None:
    Path(memory_path).parent.mkdir(parents=True, exist_ok=True)
    docs, left_out = drawn(with_current_predictions(docs), panel_keys)
    note = f"; {left_out} planned cells not drawn (see the table)" if left_out else ""
    memory_plot(docs, id_keys, study, Path(memory_path), panel_keys, note)
    throughput_plot(docs, id_keys, study, Path(throughput_path), panel_keys, note)


# one colour family per part of the time model's step: compute blue, communication red, the optimizer
# green, the host's time grey (copies, which offload adds to the optimizer's part, orange)
PART_COLOURS = {"matmul": "#08519c", "attention": "#4292c6", "other_kernels": "#9ecae1",
                "optimizer_kernels": "#238b45", "optimizer_host": "#a1d99b",
                "exposed_copies": "#fd8d3c", "exposed_communication": "#cb181d", "idle": "#bdbdbd"}
MODEL_COLOURS = {"compute": "#4292c6", "communication": "#cb181d", "optimizer": "#41ab5d",
                 "framework": "#bdbdbd"}


def breakdown_plot(docs: list[Doc], id_keys: list[str], title: str, path: Path) -> None:
    """Where each profiled cell's step went (execute/profiling.py), its parts stacked in ms per step at
    the timed median; beside it, hatched, the time model's parts of the same step (a GPU cell's)."""
    profiled = [d for d in docs if d["status"] == "ok" and (d.get("metrics") or {}).get("breakdown")]
    keys, shared = label_keys(profiled or docs, id_keys, [])
    fig, (ax,) = _panel_figure([("", profiled or docs)], 1.0,
                               f"{_titled(title, shared)}: where a step's time went (profiled steps, "
                               f"scaled to the median step); hatched: the time model's parts")
    compared = any(parts_compared(d) for d in profiled)
    width = 0.4 if compared else 0.8
    for x, doc in enumerate(profiled):
        found = doc["metrics"]["breakdown"]
        scale = doc["metrics"]["step_time_s"] / found["step_s"] * 1e3
        bottom = 0.0
        offset = -width / 2 if compared else 0
        for part in PARTS:
            height = found["parts_s"][part] * scale
            ax.bar(x + offset, height, width=width, bottom=bottom, color=PART_COLOURS[part],
                   label=part.replace("_", " ") if x == 0 else None)
            bottom += height
        model = parts_compared(doc)
        if model:
            top = 0.0
            for part in MODEL_PARTS:
                height = model[part][1] * 1e3
                ax.bar(x + width / 2, height, width=width, bottom=top, color=MODEL_COLOURS[part],
                       hatch="///", edgecolor="white", linewidth=0.5,
                       label=f"model: {part}" if x == 0 else None)
                top += height
        if found.get("communication_hidden") is not None:
            ax.text(x + offset, bottom, f"comm {found['communication_hidden']:.0%}\nhidden",
                    ha="center", va="bottom", fontsize=6)
    if not profiled:
        ax.text(0.5, 0.5, "no profiled cells yet (timing: profile_steps)", transform=ax.transAxes,
                ha="center", va="center")
    _cell_ticks(ax, profiled, keys)
    ax.set_ylabel("ms per optimizer step")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncols=4)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save(fig, path)
