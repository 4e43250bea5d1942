"""Compare two result trees cell by cell: did a rerun reproduce what was published, and did anything
change beyond the noise?

Cells are matched by study and cell id (the metrics.json under `<root>/<study>/<cell>/`). For each
cell that ran in both with the same parameters (a cell rerun with other parameters is not a repeat,
and says so; an emulated rank is never a repeat of a real run), every figure a table reports changes
by some percent. A change is *significant*:

- for timed figures (step time, samples/s), when the two runs' 95% intervals do not overlap and the
  change is at least `min_change` (the measurement's own target precision: a difference smaller than
  what a cell is timed to is not a claim it supports); where either run has no interval (too few
  windows), it cannot be judged and says so;
- for memory (the busiest GPU's NVML peak, torch's peak allocation, the host's peak), which repeats
  exactly run to run, when it is at least `min_change`.

A host-bound cell (the time model puts half its step or more on the host: its loop, the GPU waiting
for the host's launches, ranks waiting in collectives for the slowest host) is held to a wider bar:
its timed figures count as changed from 1 + HOST_BOUND_SPREAD apart either way, as far apart as its
reruns in fresh processes on one host came, which its own interval does not cover.

Beside the figures, each cell's host pace (provenance.host_pace_ms, a fixed piece of Python work on
one core, read once as the cell starts) in both runs: a hint of the host, not a measure of the run
(an idle VM host read it 2x apart from one call to the next).

A gate (`fail_on`, e.g. slower by 5% or memory up by 5%) fails the comparison when a significant
change goes the wrong way by more than its tolerance, so a reviewer or a CI job can stop on it.

The hardware is part of a figure's identity: a cell that ran on one GPU model in the first tree and on
another in the second (an H200 and an H100; or a GPU and CPU ranks, or a part the hardware table does
not know) is a *cross-GPU comparison*, never a repeat. Its step time and samples/s are set side by side
as ratios (the second run's over the first's), beside the ratio the time model predicts for the cell on
the two GPUs, and nothing of it is significant or trips a gate: a gate is about regressions on the same
hardware.
"""

from __future__ import annotations

import fnmatch
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainbench.errors import UsageError
from trainbench.contract.result import InvalidResult
from trainbench.reporting.documents import read_reported
from trainbench.registry.hardware import gpu_label, gpu_model_of, gpu_type_of


def _busiest(values) -> float | None:
    return max(values or [0]) or None


@dataclass(frozen=True)
class Figure:
    name: str
    read: Callable[[dict], float | None]
    interval_key: str | None  # where its 95% interval is, for timed figures
    higher_is_worse: bool
    kind: str  # "time" or "memory": what a gate's tolerance names


FIGURES = (
    Figure("step_time_s", lambda m: m.get("step_time_s"), "step_time_s_ci", True, "time"),
    Figure("samples_per_s", lambda m: m.get("samples_per_s"), "samples_per_s_ci", False, "time"),
    Figure("gpu_mem_used_mib", lambda m: _busiest(m.get("gpu_mem_used_mib")), None, True, "memory"),
    Figure("torch_peak_allocated_mib", lambda m: _busiest(m.get("torch_peak_allocated_mib")), None, True,
           "memory"),
    Figure("host_mem_peak_mib", lambda m: m.get("host_mem_peak_mib"), None, True, "memory"),
)
FIGURE_NAMES = [f.name for f in FIGURES]
# a second host this much slower (its pace over the first's) is named in the report: on 4 x H200 a host
# at 5-7 ms (2.5 ms as usual) ran the host-bound gpt2_zero and Lightning cells 1.1-2.3 times slower
SLOWER_HOST = 1.5
# A host-bound cell's step moves from one process to the next on the same host by more than one run's
# interval says, following neither host_pace_ms nor the pace sampled while it ran: the lightning
# study's one-GPU cell's slowest of 14 fresh processes was 1.23 times its fastest
# (trainbench/calibration.yaml). A timed change of such a cell counts from this far apart.
HOST_BOUND_SPREAD = 0.23
# the share of a cell's predicted step on the host (time_model.TimePrediction.host_s) that makes it
# host-bound
HOST_BOUND_SHARE = 0.5


@dataclass
class Change:
    figure: str
    first: float
    second: float
    pct: float
    first_ci: list[float] | None = None
    second_ci: list[float] | None = None
    significant: bool | None = None  # None: a timed figure without an interval on one side

    @property
    def worse(self) -> bool:
        figure = next(f for f in FIGURES if f.name == self.figure)
        return (self.pct > 0) == figure.higher_is_worse and self.pct != 0


# the figures a cross-GPU pair sets side by side as ratios, measured and predicted
RATIO_FIGURES = ("step_time_s", "samples_per_s")


@dataclass
class Ratio:
    """A figure of a cross-GPU pair: the second run's over the first's, as measured and as the time model
    predicts it for the cell on the two GPUs (None where the model says nothing: CPU ranks, a part it
    does not know, a cell it cannot describe)."""

    figure: str
    measured: float | None
    predicted: float | None


@dataclass
class CellComparison:
    study: str
    cell_id: str
    status: tuple[str, str]
    same_params: bool
    changes: dict[str, Change] = field(default_factory=dict)
    host_pace_ms: tuple[float | None, float | None] = (None, None)  # each run's provenance.host_pace_ms
    host_bound: bool = False  # its timed changes count from HOST_BOUND_SPREAD (host_bound())
    gpus: tuple[str | None, str | None] = (None, None)  # each run's provenance.gpu_name (None: no GPU)
    ratios: dict[str, Ratio] = field(default_factory=dict)  # a cross-GPU pair's figures, both ok
    predicted_note: str | None = None  # what the time model's ratio rests on, where it borrows

    @property
    def cross_gpu(self) -> bool:
        """Whether the two runs ran on different GPU models (or one of them on none)."""
        return gpu_model_of(self.gpus[0]) != gpu_model_of(self.gpus[1])

    @property
    def gpu_change(self) -> str:
        return f"{gpu_label(self.gpus[0])} -> {gpu_label(self.gpus[1])}"

    @property
    def host_pace_ratio(self) -> float | None:
        """The second run's host pace over the first's (2.0: its host ran Python half as fast)."""
        first, second = self.host_pace_ms
        return second / first if first and second else None

    @property
    def change_pct(self) -> dict[str, float | None]:
        return {name: (self.changes[name].pct if name in self.changes else None) for name in FIGURE_NAMES}

    @property
    def repeated(self) -> bool:
        return self.same_params and not self.cross_gpu and self.status == ("ok", "ok")


@dataclass
class Comparison:
    cells: list[CellComparison]
    only_in_first: list[str]
    only_in_second: list[str]
    min_change: float

    def spread(self, figure: str) -> list[float]:
        """|relative change| in percent of one figure over the repeated cells that ran in both."""
        return [abs(c.changes[figure].pct) for c in self.cells if c.repeated and figure in c.changes]

    def significant(self) -> list[tuple[CellComparison, Change]]:
        return [(c, ch) for c in self.cells if c.repeated for ch in c.changes.values() if ch.significant]

    def cross_gpu(self) -> dict[str, int]:
        """How many cells pair across which GPU models ("H200 -> H100": 2)."""
        pairs: dict[str, int] = {}
        for cell in self.cells:
            if cell.cross_gpu:
                pairs[cell.gpu_change] = pairs.get(cell.gpu_change, 0) + 1
        return pairs


def shorten(text: str, width: int) -> str:
    """A cell id within a column, keeping its end (where a probe's /mb~<k> is)."""
    return text if len(text) <= width else text[:width - 12] + "…" + text[-11:]


def _metrics_docs(root: Path, select: Selection) -> dict[str, dict]:
    return {key: doc for key, (doc, _) in _results(root, select).items()}


@dataclass(frozen=True)
class Selection:
    """Which cells to compare: those of the named studies (all if none) that match one of the shell
    patterns of study/cell (all if none). Both narrow: `--study llama --cells 'llama/*gpus~2*'`
    is llama's two-GPU cells, not llama's cells and every two-GPU cell besides."""

    studies: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()

    def __contains__(self, key: str) -> bool:
        study = key.split("/", 1)[0]
        return ((not self.studies or any(fnmatch.fnmatchcase(study, s) for s in self.studies))
                and (not self.patterns or any(fnmatch.fnmatchcase(key, p) for p in self.patterns)))

    def __str__(self) -> str:
        return " and ".join(filter(None, (", ".join(self.studies), " or ".join(self.patterns))))


def _results(root: Path, select: Selection) -> dict[str, tuple[dict, Path]]:
    docs = {}
    for path in sorted(root.glob("*/*/metrics.json")):
        key = f"{path.parent.parent.name}/{path.parent.name}"
        if key in select:
            try:
                docs[key] = (read_reported(path), path)
            except InvalidResult as error:
                raise UsageError(str(error)) from None
    return docs


def host_bound(doc: dict) -> bool:
    """Whether the time model puts HOST_BOUND_SHARE of the cell's step or more on the host (False where
    it says nothing: CPU ranks, an unknown GPU, and a history record, which keeps no parameters)."""
    from trainbench.reporting.predictions import time_prediction

    if "params" not in doc:
        return False
    predicted = time_prediction(doc)
    step, host = predicted.get("step_time_s"), predicted.get("host_s")
    return bool(step) and host is not None and host >= HOST_BOUND_SHARE * step


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _change(figure: Figure, old: dict, new: dict, min_change: float, as_ratio: bool = False) -> Change | None:
    """`min_change`: the smallest relative change that counts, of the first run's figure; `as_ratio`: of
    the larger over the smaller, so that a step 23% longer and samples/s 23% higher count alike."""
    x, y = figure.read(old), figure.read(new)
    if not x or y is None:
        return None
    change = Change(figure.name, x, y, 100.0 * (y - x) / x)
    if as_ratio:
        large = y > 0 and max(y / x, x / y) - 1 >= min_change
    else:
        large = change.pct != 0 and abs(change.pct) >= 100 * min_change
    if figure.interval_key is None:
        change.significant = large
        return change
    change.first_ci, change.second_ci = old.get(figure.interval_key), new.get(figure.interval_key)
    if change.first_ci and change.second_ci:
        change.significant = large and not _overlap(change.first_ci, change.second_ci)
    return change


def compare(first: Path, second: Path, *, min_change: float = 0.02, select: Selection = Selection()
            ) -> Comparison:
    return compare_docs(_metrics_docs(first, select), _metrics_docs(second, select), min_change)


def compare_with_history(tree: Path, *, min_change: float = 0.02, select: Selection = Selection()
                         ) -> Comparison:
    """Each cell of a results tree against its last earlier run on the same GPU model with the same
    parameters, from the cell's history (contract/history.py); a cell without one is listed as such."""
    from trainbench.contract.history import last_comparable

    now = _results(tree, select)
    before = {key: old for key, (doc, path) in now.items()
              if (old := last_comparable(doc.get("params_hash"), _provenance(doc).get("gpu_name"),
                                         _provenance(doc).get("started"), path)) is not None}
    return compare_docs(before, {key: doc for key, (doc, _) in now.items()}, min_change)


def compare_docs(a: dict[str, dict], b: dict[str, dict], min_change: float) -> Comparison:
    """Results (or history records) keyed by study/cell, the first set against the second."""
    cells = [_pair(a[key], b[key], min_change) for key in sorted(a.keys() & b.keys())]
    return Comparison(cells, sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys()), min_change)


def _provenance(doc: dict) -> dict:
    return doc.get("provenance") or {}


def _pair(old: dict, new: dict, min_change: float) -> CellComparison:
    """One cell's two runs: the changes of a repeat, or the ratios of a cross-GPU pair."""
    first, second = _provenance(old), _provenance(new)
    # an emulated rank is never set against a real one (their parameters differ in `emulate` too)
    row = CellComparison(old["study"], old["cell_id"], (old["status"], new["status"]),
                         old.get("params_hash") == new.get("params_hash")
                         and bool(old.get("emulation")) == bool(new.get("emulation")),
                         host_pace_ms=(first.get("host_pace_ms"), second.get("host_pace_ms")),
                         gpus=(first.get("gpu_name"), second.get("gpu_name")))
    if row.repeated:
        row.host_bound = host_bound(new)
        for figure in FIGURES:
            if row.host_bound and figure.kind == "time":  # as far apart as its reruns came, either way
                change = _change(figure, old["metrics"], new["metrics"],
                                 max(min_change, HOST_BOUND_SPREAD), as_ratio=True)
            else:
                change = _change(figure, old["metrics"], new["metrics"], min_change)
            if change is not None:
                row.changes[figure.name] = change
    elif row.cross_gpu and row.same_params and row.status == ("ok", "ok"):
        row.ratios, row.predicted_note = cross_gpu_ratios(old, new)
    return row


def cross_gpu_ratios(old: dict, new: dict) -> tuple[dict[str, Ratio], str | None]:
    """A cell run on two GPU models: its step time and samples/s, the second run's over the first's, as
    measured and as the time model predicts them (samples/s: the inverse of the step's ratio, the
    global batch being the cell's), and the model's note where it borrows another GPU's efficiencies."""
    steps, note = _predicted_steps(old, new)
    step = steps[1] / steps[0] if steps else None
    predicted = {"step_time_s": step, "samples_per_s": 1 / step if step else None}
    ratios = {}
    for name in RATIO_FIGURES:
        figure = next(f for f in FIGURES if f.name == name)
        first, second = figure.read(old["metrics"]), figure.read(new["metrics"])
        ratios[name] = Ratio(name, second / first if first and second is not None else None, predicted[name])
    return ratios, note


def _predicted_steps(old: dict, new: dict) -> tuple[tuple[float, float] | None, str | None]:
    """The time model's step of the cell on each run's GPU, as each run measures it (an emulated rank's
    without what its world adds), with each run's optimizer threads, and its notes; None where it
    predicts nothing for either: CPU ranks, a GPU the hardware table does not know, a record that keeps
    neither parameters nor threads."""
    from trainbench.predict import time_model
    from trainbench.reporting.predictions import counted
    from trainbench.study.params import CellParams

    try:  # a history record keeps no parameters; the two runs share theirs (the same hash)
        params = counted(CellParams.from_dict((new if "params" in new else old)["params"]))
        threads = [time_model.threads_of_run(doc) for doc in (old, new)]
    except (KeyError, TypeError, ValueError):
        return None, None
    steps, notes = [], []
    for doc, cpu_threads in zip((old, new), threads):
        gpu = gpu_type_of(_provenance(doc).get("gpu_name"))
        predicted = time_model.predict(params, gpu, cpu_threads=cpu_threads)
        if predicted is None:
            return None, None
        step = predicted.step_time_s
        if params.emulate:  # the rank alone, as an emulated run times it
            step -= time_model.waiting_s(params, gpu, cpu_threads=cpu_threads, whole_s=step) or 0.0
        steps.append(step)
        if predicted.note and predicted.note not in notes:
            notes.append(predicted.note)
    return (steps[0], steps[1]), "; ".join(notes) or None


def parse_gate(text: str) -> dict[str, float]:
    """`slower:5%,memory:5%` -> {"time": 0.05, "memory": 0.05}."""
    kinds = {"slower": "time", "time": "time", "memory": "memory", "heavier": "memory"}
    gate = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition(":")
        if name not in kinds or not value:
            raise UsageError(f"--fail-on {text!r}: expected e.g. 'slower:5%,memory:5%' "
                             "(names: slower, memory)")
        try:
            gate[kinds[name]] = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
        except ValueError:
            raise UsageError(f"--fail-on {text!r}: {value!r} is not a number or a percentage") from None
    return gate


def gate_failures(comparison: Comparison, gate: dict[str, float]) -> list[tuple[CellComparison, Change]]:
    """Significant changes for the worse beyond the gate's tolerance for their kind."""
    kind = {f.name: f.kind for f in FIGURES}
    return [(c, ch) for c, ch in comparison.significant()
            if ch.worse and kind[ch.figure] in gate and abs(ch.pct) > 100 * gate[kind[ch.figure]]]


def _cell_text(change: Change | None) -> str:
    if change is None:
        return "-"
    mark = {True: "*", False: "", None: "?"}[change.significant]
    return f"{change.pct:+.1f}%{mark}"


def _pace_text(cell: CellComparison) -> str:
    ratio = cell.host_pace_ratio
    return ("-" if ratio is None else f"x{ratio:.2f}") + (" h" if cell.host_bound else "")


def _pace_summary(comparison: Comparison) -> list[str]:
    """Where the hosts' paces differ, a line saying so; where cells are host-bound, a line saying how
    they were judged."""
    lines = []
    paced = [c for c in comparison.cells if c.repeated and c.host_pace_ratio is not None]
    if paced:
        slower = [c for c in paced if c.host_pace_ratio >= SLOWER_HOST]
        faster = [c for c in paced if c.host_pace_ratio <= 1 / SLOWER_HOST]
        line = (f"host pace (provenance.host_pace_ms; the second run's over the first's, higher is slower): "
                f"median x{statistics.median(c.host_pace_ratio for c in paced):.2f} over {len(paced)} cells")
        if slower or faster:
            line += (f"; the second host at least x{SLOWER_HOST:g} slower in {len(slower)}, that much "
                     f"faster in {len(faster)} (one reading as each cell starts: a hint, not the run's pace)")
        lines.append(line)
    bound = [c for c in comparison.cells if c.repeated and c.host_bound]
    if bound:
        spread = max(comparison.min_change, HOST_BOUND_SPREAD)
        lines.append(f"host-bound (h): {len(bound)} cells, whose step time and samples/s count as changed "
                     f"from x{1 + spread:.2f} apart, either way (their reruns' spread on one host)")
    return lines


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"x{ratio:.2f}"


def _cross_gpu_header(comparison: Comparison) -> list[str]:
    """Where cells pair across GPU models, a line saying how many, across which, and how they are read."""
    pairs = comparison.cross_gpu()
    if not pairs:
        return []
    notes = sorted({c.predicted_note for c in comparison.cells if c.cross_gpu and c.predicted_note})
    return [f"cross-GPU comparison: {sum(pairs.values())} cells pair across GPU models ("
            + ", ".join(f"{change}: {n}" for change, n in sorted(pairs.items()))
            + "): not repeats, never significant nor gated; their step time and samples/s, the second "
              "run's over the first's, beside the time model's ratio for the cell on the two GPUs",
            *(f"  the time model: {note}" for note in notes)]


def _cross_gpu_summary(comparison: Comparison) -> list[str]:
    """Per pair of GPU models, the median step time ratio, measured and predicted."""
    lines = []
    for change in sorted(comparison.cross_gpu()):
        ratios = [c.ratios["step_time_s"] for c in comparison.cells
                  if c.cross_gpu and c.gpu_change == change and c.ratios]
        measured = [r.measured for r in ratios if r.measured is not None]
        predicted = [r.predicted for r in ratios if r.predicted is not None]
        if measured:
            lines.append(f"cross-GPU {change}: step time x{statistics.median(measured):.2f} measured over "
                         f"{len(measured)} cells (median), "
                         + (f"x{statistics.median(predicted):.2f} predicted over {len(predicted)}"
                            if predicted else "no prediction"))
    return lines


def _row(c: CellComparison) -> str:
    label = shorten(f"{c.study}/{c.cell_id}", 70)
    if not c.same_params:
        return f"{label:<70} parameters differ: not a repeat" + (f" ({c.gpu_change})" if c.cross_gpu else "")
    if c.cross_gpu and not c.ratios:
        return f"{label:<70} {c.gpu_change}, cross-GPU: status {c.status[0]} -> {c.status[1]}"
    if c.cross_gpu:
        return (f"{label:<70} {c.gpu_change}, cross-GPU: "
                + ", ".join(f"{name} {_ratio_text(r.measured)} (model {_ratio_text(r.predicted)})"
                            for name, r in c.ratios.items()))
    if not c.repeated:
        return f"{label:<70} status {c.status[0]} -> {c.status[1]}"
    return (f"{label:<70} " + " ".join(f"{_cell_text(c.changes.get(n)):>16}" for n in FIGURE_NAMES)
            + f" {_pace_text(c):>10}")


def _spread_lines(comparison: Comparison) -> list[str]:
    lines = []
    repeated = [c for c in comparison.cells if c.repeated]
    for name in FIGURE_NAMES:
        spread = comparison.spread(name)
        if spread:
            judged = [c for c in repeated if name in c.changes and c.changes[name].significant is not None]
            quiet = sum(1 for c in judged if not c.changes[name].significant)
            lines.append(f"{name}: {len(spread)} cells, median |change| {statistics.median(spread):.1f}%, "
                         f"largest {max(spread):.1f}%; no significant change in {quiet} of "
                         f"{len(judged)} judged")
    return lines


def report(comparison: Comparison, first: Path, second: Path, failures: list | None = None) -> str:
    """People's reading: the significant changes first, then every cell, then each figure's spread."""
    repeated = [c for c in comparison.cells if c.repeated]
    significant = comparison.significant()
    lines = [f"{first} -> {second}: {len(comparison.cells)} cells in both, {len(repeated)} repeated "
             f"(same parameters and GPU model, ok in both)", *_cross_gpu_header(comparison),
             f"significant: the 95% intervals do not overlap and the change is at least "
             f"{comparison.min_change:.0%} (memory: at least {comparison.min_change:.0%})", ""]
    if significant:
        lines.append(f"{len(significant)} significant change(s):")
        for cell, change in significant:
            lines.append(f"  {shorten(f'{cell.study}/{cell.cell_id}', 70):<70} {change.figure:<25} "
                         f"{change.first:,.4g} -> {change.second:,.4g} ({change.pct:+.1f}%)")
    else:
        lines.append("no significant change")
    if failures is not None:
        cells = sorted({f"{c.study}/{c.cell_id}" for c, _ in failures})
        lines.append(f"gate failed: {len(cells)} cell(s) significantly worse beyond the tolerance: "
                     + ", ".join(f"{shorten(f'{c.study}/{c.cell_id}', 70)} {ch.figure} {ch.pct:+.1f}%"
                                 for c, ch in failures) if failures else "gate: passed")
    lines += ["", f"{'cell':<70} " + " ".join(f"{n[:16]:>16}" for n in FIGURE_NAMES) + f" {'host pace':>10}"]
    lines += [_row(c) for c in comparison.cells]
    lines += ["", "(* significant; ? no interval to judge by: too few timed windows in one run; host pace: "
                  "the second run's over the first's; h: host-bound; cross-GPU: the second run's figure "
                  "over the first's, and the time model's for the cell on the two GPUs)", ""]
    lines += _spread_lines(comparison) + _pace_summary(comparison) + _cross_gpu_summary(comparison)
    if comparison.only_in_first or comparison.only_in_second:
        lines.append(f"only in {first}: {len(comparison.only_in_first)} cells; "
                     f"only in {second}: {len(comparison.only_in_second)} cells")
    return "\n".join(lines)


def as_json(comparison: Comparison, failures: list | None = None) -> dict:
    """Machines' reading: every cell with every change (or, across GPU models, its ratios, measured and
    predicted), the significant ones, the gate's verdict."""
    return {
        "min_change": comparison.min_change,
        "cells": [{"study": c.study, "cell_id": c.cell_id, "status": list(c.status),
                   "same_params": c.same_params, "host_pace_ms": list(c.host_pace_ms),
                   "host_bound": c.host_bound,
                   "gpus": list(c.gpus), "gpu_models": [gpu_model_of(g) for g in c.gpus],
                   "cross_gpu": c.cross_gpu,
                   "changes": {name: asdict(change) for name, change in c.changes.items()},
                   "ratios": {name: asdict(ratio) for name, ratio in c.ratios.items()},
                   "predicted_note": c.predicted_note}
                  for c in comparison.cells],
        "cross_gpu": comparison.cross_gpu(),
        "significant": [{"cell": f"{c.study}/{c.cell_id}", **asdict(ch)}
                        for c, ch in comparison.significant()],
        "gate_failures": None if failures is None else [{"cell": f"{c.study}/{c.cell_id}", **asdict(ch)}
                                                       for c, ch in failures],
        "only_in_first": comparison.only_in_first, "only_in_second": comparison.only_in_second,
    }
