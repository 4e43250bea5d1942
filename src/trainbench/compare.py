"""Compare two result trees cell by cell: did a rerun reproduce what was published?

Cells are matched by study and cell id (the metrics.json under `<root>/<study>/<cell>/`). For each
cell that ran in both, the relative change of every figure a table reports (step time, samples/s,
the busiest GPU's NVML peak and torch's peak allocation, the host's peak) and whether the
parameters were the same (a cell rerun with other parameters is not a repeat, and says so).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainbench.results import read_json

# (label, how to read the figure from a metrics document's "metrics")
FIGURES: dict[str, Callable[[dict], float | None]] = {
    "step_time_s": lambda m: m.get("step_time_s"),
    "samples_per_s": lambda m: m.get("samples_per_s"),
    "gpu_mem_used_mib": lambda m: max(m.get("gpu_mem_used_mib") or [0]) or None,
    "torch_peak_allocated_mib": lambda m: max(m.get("torch_peak_allocated_mib") or [0]) or None,
    "host_mem_peak_mib": lambda m: m.get("host_mem_peak_mib"),
}


@dataclass
class CellComparison:
    study: str
    cell_id: str
    status: tuple[str, str]
    same_params: bool
    change_pct: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Comparison:
    cells: list[CellComparison]
    only_in_first: list[str]
    only_in_second: list[str]

    def spread(self, figure: str) -> list[float]:
        """|relative change| in percent of one figure over the repeated cells that ran in both."""
        return [abs(c.change_pct[figure]) for c in self.cells
                if c.same_params and c.change_pct.get(figure) is not None]


def shorten(text: str, width: int) -> str:
    """A cell id within a column, keeping its end (where a probe's /mb~<k> is)."""
    return text if len(text) <= width else text[:width - 12] + "…" + text[-11:]


def _metrics_docs(root: Path) -> dict[str, dict]:
    return {f"{p.parent.parent.name}/{p.parent.name}": read_json(p) for p in sorted(root.glob("*/*/metrics.json"))}


def compare(first: Path, second: Path) -> Comparison:
    a, b = _metrics_docs(first), _metrics_docs(second)
    cells = []
    for key in sorted(a.keys() & b.keys()):
        old, new = a[key], b[key]
        row = CellComparison(old["study"], old["cell_id"], (old["status"], new["status"]),
                             old.get("params_hash") == new.get("params_hash"))
        if old["status"] == new["status"] == "ok":
            for name, read in FIGURES.items():
                x, y = read(old["metrics"]), read(new["metrics"])
                row.change_pct[name] = 100.0 * (y - x) / x if x and y is not None else None
        cells.append(row)
    return Comparison(cells, sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys()))


def report(comparison: Comparison, first: Path, second: Path) -> str:
    """The comparison as text: one line per cell, then each figure's spread."""
    lines = [f"{first} -> {second}: {len(comparison.cells)} cells in both"]
    names = list(FIGURES)
    lines.append(f"{'cell':<70} " + " ".join(f"{n[:16]:>16}" for n in names))
    for c in comparison.cells:
        label = shorten(f"{c.study}/{c.cell_id}", 70)
        if not c.same_params:
            lines.append(f"{label:<70} parameters differ: not a repeat")
        elif c.status[0] != c.status[1] or c.status[0] != "ok":
            lines.append(f"{label:<70} status {c.status[0]} -> {c.status[1]}")
        else:
            lines.append(f"{label:<70} " + " ".join(
                f"{'-' if c.change_pct[n] is None else format(c.change_pct[n], '+.1f') + '%':>16}" for n in names))
    lines.append("")
    for name in names:
        spread = comparison.spread(name)
        if spread:
            lines.append(f"{name}: {len(spread)} cells, median |change| {statistics.median(spread):.1f}%, "
                         f"largest {max(spread):.1f}%")
    if comparison.only_in_first or comparison.only_in_second:
        lines.append(f"only in {first}: {len(comparison.only_in_first)} cells; "
                     f"only in {second}: {len(comparison.only_in_second)} cells")
    return "\n".join(lines)
