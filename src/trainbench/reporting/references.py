"""Reference figures a study declares, with tolerances, that its measured cells are checked against on
every table build (as ReFrame checks a test's performance against its references): a rerun that got
slower, or a change that made a set-up heavier, shows as outside its reference under the table, and
`trainbench references STUDY` exits 1 on it (a gate for CI).

    references:
      - cells: {strategy: ddp, gpus: 4}      # every measured cell matching (parameters, lists allowed)
        metric: samples_per_s                # a table column (`trainbench columns`)
        value: 2400
        tolerance: 0.05                      # within ±5%; or lower / upper: -0.02 and 0.10
        gpu: h200                            # the GPU type it holds for (none: any)

A cell's figure is within its reference when (figure - value) / value lies in [lower, upper]
(`tolerance` t: [-t, t]); a cell that did not run ok, or has no such figure, is not measured. A figure
measured on one GPU model says nothing of another: where a reference names its GPU type, a cell that
ran on another (or on none) has no reference for its GPU, and is not judged within or outside.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from trainbench.registry.hardware import gpu_label, gpu_model_of
from trainbench.reporting.columns import COLUMNS, column_values
from trainbench.reporting.predictions import Doc
from trainbench.study.grid import selects

WITHIN, OUTSIDE, NOT_MEASURED = "within", "outside", "not measured"
OTHER_GPU = "no reference for its GPU"  # measured on a GPU other than the one the reference holds for


@dataclass(frozen=True)
class Check:
    index: int  # the reference's number (1-based, as listed)
    cell_id: str
    metric: str
    reference: float
    measured: float | None
    lower: float
    upper: float
    gpu: str | None = None  # the GPU type the reference holds for (None: any)
    ran_on: str | None = None  # the GPU the cell ran on, as NVML names it (provenance.gpu_name)

    @property
    def other_gpu(self) -> bool:
        return self.gpu is not None and gpu_model_of(self.ran_on) != self.gpu

    @property
    def deviation(self) -> float | None:
        if self.measured is None or self.other_gpu:
            return None
        return (self.measured - self.reference) / self.reference

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return NOT_MEASURED
        if self.other_gpu:
            return OTHER_GPU
        return WITHIN if self.lower <= self.deviation <= self.upper else OUTSIDE

    @property
    def verdict_text(self) -> str:
        """The verdict as a table shows it: where the cell ran on another GPU, which, and which the
        reference holds for."""
        if self.verdict == OTHER_GPU:
            return f"no reference for {gpu_label(self.ran_on)} (references hold for {self.gpu.upper()})"
        return self.verdict


def bounds(reference: dict[str, Any]) -> tuple[float, float]:
    tolerance = reference.get("tolerance")
    tolerance = 0.05 if tolerance is None else tolerance
    lower, upper = reference.get("lower"), reference.get("upper")
    return (-tolerance if lower is None else lower), (tolerance if upper is None else upper)


def check(references: list[dict[str, Any]], docs: list[Doc]) -> list[Check]:
    """Every reference against every cell it names."""
    checks = []
    for index, reference in enumerate(references, 1):
        lower, upper = bounds(reference)
        named = [d for d in docs if d["status"] not in ("planned", "not run")
                 and selects(d["params"], reference.get("cells") or {})]
        for doc in named:
            value, _ = column_values(doc, reference["metric"])
            ran = isinstance(value, (int, float)) and doc["status"] == "ok"
            checks.append(Check(index, doc["cell_id"], reference["metric"], float(reference["value"]),
                                float(value) if ran else None, lower, upper, reference.get("gpu"),
                                (doc.get("provenance") or {}).get("gpu_name")))
    return checks


def problems(study: str, references: list[dict[str, Any]], params: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a study's references, each naming its key (found before any job runs)."""
    out = []
    for i, reference in enumerate(references):
        key = f"studies.{study}.references[{i}]"
        metric = reference.get("metric")
        if metric not in COLUMNS or not COLUMNS[metric].comparable:
            measured = [n for n, c in COLUMNS.items() if c.comparable]
            close = difflib.get_close_matches(str(metric), measured, n=1)
            out.append(f"{key}.metric: {metric!r} is not a measured table column"
                       + (f" (did you mean {close[0]!r}?)" if close else "")
                       + "; `trainbench columns` lists them")
        lower, upper = bounds(reference)
        if lower > upper:
            out.append(f"{key}: lower ({lower}) is above upper ({upper})")
        if reference.get("value") == 0:
            out.append(f"{key}.value: 0 has no relative tolerance")
        if not any(selects(p, reference.get("cells") or {}) for p in params):
            out.append(f"{key}.cells: {reference.get('cells')!r} matches no cell of the study")
    return out


def markdown(checks: list[Check]) -> list[str]:
    """The References section under a study's table."""
    if not checks:
        return []
    counts = {v: sum(c.verdict == v for c in checks) for v in (WITHIN, OUTSIDE, NOT_MEASURED, OTHER_GPU)}
    lines = ["| # | cell | figure | reference | measured | deviation | band | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    def number(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"

    for c in checks:
        measured = "—" if c.measured is None else number(c.measured)
        deviation = "—" if c.deviation is None else f"{c.deviation:+.1%}"
        lines.append(f"| {c.index} | {c.cell_id} | {c.metric} | {number(c.reference)} | {measured} | "
                     f"{deviation} | {c.lower:+.0%} to {c.upper:+.0%} | {c.verdict_text} |")
    return ["## References", "",
            "The study's reference figures, each cell's median against its band (reporting/references.py): "
            + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".", "", "\n".join(lines), ""]
