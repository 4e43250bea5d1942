"""Findings: the conclusions a study exists to test, declared as relations between its cells and judged
on every table build.

A study's `findings` list holds its campaign's conclusions, each a `claim` (the campaign's words), an
optional `note` (how it is checked, what this version cannot check), and one relation:

- `compare`: a `metric` (a number of the table: `trainbench columns`, or the max-batch search's
  `max_micro_batch` and `max_global_batch`) of some cells against others:
    - `less: <cells>, than: <cells>`: the first cells' figure is below the second's;
      `more: <cells>, than: <cells>`: above; either with `factor: {min, max}`: by a factor (the larger
      figure over the smaller) within that range;
    - `same: <cells>, as: <cells>, within: x`: the two differ by at most x, in the metric's unit;
    - `rises_with: <key>` / `falls_with: <key>`: the figure rises (falls) as the key's value grows;
    - `where: <cells>`: only cells matching this take part.
  `<cells>` is a pattern like `measure.cells` (a key's value, or a list of values). Every cell of the
  first pattern is paired with every cell of the second that has the same value of each other key
  telling the study's cells apart (`rises_with`: every two cells that differ in that key alone).
- `fits: <cells>`: every matching cell trains (status ok); `oom: <cells>`: every one runs out of
  memory.

Each pair (each cell, for fits and oom) is judged on measured figures: timed ones with their 95%
intervals (the relation holds when the intervals leave no doubt, fails when they leave no doubt the
other way, and is unresolved when they overlap; a cell timed in too few windows for an interval is
judged on its median, and the verdict says so), memory and counts exactly; a cell that ran out of
memory counts as above every cell that fit on a memory metric. The search's largest batch is known to
lie between the largest that trained and the smallest that failed. A finding is *reproduced* when
every measured pair holds, *partly* when some do, *not reproduced* when none does, and *not yet
measured* when no pair has both cells measured. Planned cells are not measured; where the memory and
time models give their figures, the pairs are also judged on those, reported apart and labelled
"predicted". Cells the stack cannot run (`unsupported`) take no part. An emulated cell (one rank of its
world, measured alone: emulation.py) is measured for memory, fits and oom, and says so; its timed
figures are its rank's compute alone, so on a timed metric it counts as not measured.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas

from trainbench.contract.result import sanity_problems
from trainbench.reporting.columns import (COLUMNS, column_values, emulated, predicted_gib, predicted_time,
                                          result_text)
from trainbench.reporting.predictions import prediction, time_prediction

Doc = dict[str, Any]

RELATIONS = ("compare", "fits", "oom")
COMPARISONS = ("less", "more", "same", "rises_with", "falls_with")
NOT_MEASURED = ("planned", "not run", "infeasible")
SHOWN_PAIRS = 4  # pairs the markdown names per finding; the CSV has them all


# --- what a finding can compare ----------------------------------------------------------------------

@dataclass(frozen=True)
class Metric:
    name: str
    header: str
    text: Callable[[Any], str]
    figure: Callable[[Doc], tuple[float | None, tuple[float, float] | None]]  # value, interval
    timed: bool = False  # has 95% intervals (a cell without one is judged on its median)
    memory: bool = False  # a cell that ran out of memory is above every cell that fit
    predicted: Callable[[Doc], float | None] | None = None  # the models' figure for a planned cell


def _column_figure(name: str) -> Callable[[Doc], tuple[Any, Any]]:
    return lambda doc: column_values(doc, name)


def _search_figure(key: str) -> Callable[[Doc], tuple[Any, Any]]:
    """The search's largest batch, and where the largest that trains lies: from the largest that
    trained to one micro batch below the smallest that failed (open above when none failed)."""

    def figure(doc: Doc):
        found = doc.get("search") or {}
        largest = found.get("max_micro_batch")
        if not largest:
            return None, None
        scale = (found.get("max_global_batch") or largest) / largest if key == "max_global_batch" else 1
        failure = (found.get("first_failure") or {}).get("micro_batch")
        high = (failure - 1) * scale if failure else math.inf
        return largest * scale, (largest * scale, max(high, largest * scale))

    return figure


def _predicted(name: str) -> Callable[[Doc], float | None] | None:
    """The memory or time model's figure standing for a column (None where neither models it)."""
    time_keys = {"step_time_ms": ("step_time_s", 1e3), "samples_per_s": ("samples_per_s", 1.0),
                 "mfu": ("mfu", 1.0)}
    if name in time_keys:
        return predicted_time(*time_keys[name])
    if name in ("gpu_mem_rank0_gib", "gpu_mem_max_gib"):
        return predicted_gib
    if name in ("gpu_mem_rank0_mib", "gpu_mem_max_mib"):
        return lambda doc: prediction(doc).get("gpu_mem_mib")
    if name == "tokens_per_s":
        return lambda doc: _times(time_prediction(doc).get("samples_per_s"),
                                  doc["params"].get("seq_len"))
    if name in ("projected_min", "projected_hms", "time_per_sample_ms"):
        def run(doc: Doc):
            step, p = time_prediction(doc).get("step_time_s"), doc["params"]
            if step is None or not p.get("global_batch"):
                return None
            if name == "time_per_sample_ms":
                return 1e3 * step / p["global_batch"]
            if not (p.get("dataset_size") and p.get("epochs")):
                return None
            seconds = math.ceil(p["dataset_size"] / p["global_batch"]) * p["epochs"] * step
            return seconds / 60 if name == "projected_min" else seconds
        return run
    return None


def _times(a, b):
    return a * b if a is not None and b is not None else None


def metrics() -> dict[str, Metric]:
    """Every metric a finding can compare: the table's numeric columns and the search's largest batch."""
    out = {name: Metric(name, column.header, column.text, _column_figure(name),
                        timed=column.interval is not None,
                        memory=name.startswith(("gpu_mem_", "torch_alloc_")), predicted=_predicted(name))
           for name, column in COLUMNS.items() if column.comparable}
    for key, header in (("max_micro_batch", "largest micro batch that trains"),
                        ("max_global_batch", "largest global batch that trains")):
        out[key] = Metric(key, header, lambda v: f"{v:,.0f}", _search_figure(key))
    return out


# --- declarations -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    claim: str
    relation: str  # compare, fits, oom
    note: str = ""
    metric: str | None = None
    comparison: str | None = None  # less, more, same, rises_with, falls_with
    first: dict[str, Any] = field(default_factory=dict)  # less / more / same, or fits / oom's cells
    second: dict[str, Any] = field(default_factory=dict)  # than / as
    key: str | None = None  # rises_with / falls_with
    where: dict[str, Any] = field(default_factory=dict)
    factor: tuple[float, float] | None = None
    within: float | None = None

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> "Finding":
        """A schema-valid declaration (problems() has checked it)."""
        relation = next(r for r in RELATIONS if r in spec)
        base = {"claim": spec["claim"], "note": spec.get("note") or "", "relation": relation}
        if relation != "compare":
            return cls(**base, first=spec[relation] or {})
        compare = spec["compare"]
        comparison = next(c for c in COMPARISONS if c in compare)
        factor = compare.get("factor")
        return cls(**base, metric=compare["metric"], comparison=comparison,
                   first=compare[comparison] if comparison in ("less", "more", "same") else {},
                   second=compare.get("than") or compare.get("as") or {},
                   key=compare[comparison] if comparison in ("rises_with", "falls_with") else None,
                   where=compare.get("where") or {},
                   factor=(factor.get("min", 0.0), factor.get("max", math.inf)) if factor else None,
                   within=compare.get("within"))

    @property
    def named(self) -> set[str]:
        """The keys a pair's cells may differ in."""
        return {self.key} if self.key else set(self.first) | set(self.second)

    def checked_as(self, header: str | None = None) -> str:
        """The relation in words."""
        if self.relation == "fits":
            return f"every cell of {pattern_text(self.first)} trains"
        if self.relation == "oom":
            return f"every cell of {pattern_text(self.first)} runs out of memory"
        what = header or self.metric
        if self.comparison in ("rises_with", "falls_with"):
            text = f"{what} {'rises' if self.comparison == 'rises_with' else 'falls'} as {self.key} grows"
        elif self.comparison == "same":
            text = (f"{what}: {pattern_text(self.first)} within {self.within:g} of "
                    f"{pattern_text(self.second)}")
        else:
            text = (f"{what}: {pattern_text(self.first)} {'below' if self.comparison == 'less' else 'above'} "
                    f"{pattern_text(self.second)}")
            if self.factor:
                low, high = self.factor
                text += (f" by {low:g}-{high:g}x" if high < math.inf else f" by at least {low:g}x")
        return text + (f", where {pattern_text(self.where)}" if self.where else "")


def value_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"{key} {'yes' if value else 'no'}"
    return value if isinstance(value, str) else f"{key} {value}"


def pattern_text(pattern: dict[str, Any]) -> str:
    if not pattern:
        return "every cell"
    return ", ".join(" or ".join(value_text(k, x) for x in (v if isinstance(v, list) else [v]))
                     for k, v in pattern.items())


def selects(params: dict[str, Any], pattern: dict[str, Any]) -> bool:
    """A cell pattern: every key's value, or one of a list of values."""
    return all(params.get(k) in (v if isinstance(v, list) else [v]) for k, v in pattern.items())


def pairs(finding: Finding, cells: list[dict[str, Any]], id_keys: list[str]) -> list[tuple[int, int | None]]:
    """The (cell, against) index pairs a finding judges among cells' parameters, in the cells' order
    (fits and oom: (cell, None)). Two cells pair when they agree on every id key the finding does not
    name."""
    if finding.relation != "compare":
        return [(i, None) for i, p in enumerate(cells) if selects(p, finding.first)]
    chosen = [i for i, p in enumerate(cells) if selects(p, finding.where)]
    context = [k for k in id_keys if k not in finding.named]
    groups: dict[tuple, list[int]] = {}
    for i in chosen:
        groups.setdefault(tuple(repr(cells[i].get(k)) for k in context), []).append(i)
    found = []
    for i in chosen:
        same = groups[tuple(repr(cells[i].get(k)) for k in context)]
        if finding.key:
            value = cells[i].get(finding.key)
            found += [(i, j) for j in same if value is not None and cells[j].get(finding.key) is not None
                      and value > cells[j][finding.key]]
        elif selects(cells[i], finding.first):
            found += [(i, j) for j in same if j != i and selects(cells[j], finding.second)]
    return found


def problems(study: str, specs: list[dict[str, Any]] | None, cells: list[dict[str, Any]],
             id_keys: list[str]) -> list[str]:
    """What is wrong with a study's schema-valid findings, each naming its key."""
    out: list[str] = []
    known = metrics()
    for index, spec in enumerate(specs or []):
        where = f"studies.{study}.findings[{index}]"
        given = [r for r in RELATIONS if r in spec]
        if len(given) != 1:
            out.append(f"{where}: give one relation: compare, fits or oom"
                       + (f" (it gives {', '.join(given)})" if given else ""))
            continue
        relation = given[0]
        if relation == "compare":
            found = _compare_problems(f"{where}.compare", spec["compare"], known, id_keys)
            if found:
                out += found
                continue
        finding = Finding.parse(spec)
        patterns = ({relation: finding.first} if relation != "compare" else
                    {k: spec["compare"][k] for k in ("less", "more", "same", "than", "as", "where")
                     if k in spec["compare"]})
        idle = [f"{where}{'.compare' if relation == 'compare' else ''}.{k}: {pattern!r} matches no cell"
                for k, pattern in patterns.items() if not any(selects(p, pattern) for p in cells)]
        if idle:
            out += idle
        elif not pairs(finding, cells, id_keys):
            others = ", ".join(k for k in id_keys if k not in finding.named)
            out.append(f"{where}.compare: pairs no cells: no two cells match its patterns and agree on every "
                       f"other key telling the cells apart ({others}); name the keys its cells differ in")
    return out


def _compare_problems(where: str, compare: dict[str, Any], known: dict[str, Metric],
                      id_keys: list[str]) -> list[str]:
    out = []
    if compare["metric"] not in known:
        close = difflib.get_close_matches(compare["metric"], list(known), n=1)
        out.append(f"{where}.metric: unknown metric {compare['metric']!r}"
                   + (f" (did you mean {close[0]!r}?)" if close else "")
                   + "; a finding compares a number of the table (`trainbench columns`) or max_micro_batch, "
                   "max_global_batch")
    given = [c for c in COMPARISONS if c in compare]
    if len(given) != 1:
        return out + [f"{where}: give one comparison: {', '.join(COMPARISONS)}"
                      + (f" (it gives {', '.join(given)})" if given else "")]
    comparison = given[0]
    partner = {"less": "than", "more": "than", "same": "as"}.get(comparison)
    for key in ("than", "as"):
        if key in compare and key != partner:
            out.append(f"{where}.{key}: goes with " + ("less or more" if key == "than" else "same"))
    if partner and partner not in compare:
        out.append(f"{where}: {comparison} needs {partner}: the cells it is held against")
    if ("within" in compare) != (comparison == "same"):
        out.append(f"{where}.within: " + ("goes with same only" if "within" in compare else
                                         "same needs within: how far apart the two may be"))
    if "factor" in compare:
        factor = compare["factor"]
        if comparison not in ("less", "more"):
            out.append(f"{where}.factor: goes with less or more")
        elif not factor:
            out.append(f"{where}.factor: give min, max or both")
        elif factor.get("min", 0) > factor.get("max", math.inf):
            out.append(f"{where}.factor: min {factor['min']:g} is above max {factor['max']:g}")
    if comparison in ("rises_with", "falls_with"):
        from trainbench.study.params import PARAMS_BY_NAME

        key = compare[comparison]
        if key not in id_keys:
            out.append(f"{where}.{comparison}: {key!r} is not a key that tells the study's cells apart "
                       f"(those are: {', '.join(id_keys)})")
        elif PARAMS_BY_NAME[key].kind not in ("int", "float"):
            out.append(f"{where}.{comparison}: {key!r} is not a number; a figure rises or falls with gpus, "
                       "micro_batch, tp and the like")
    return out


# --- judging --------------------------------------------------------------------------------------------

@dataclass
class Pair:
    cell: str
    against: str | None
    label: str
    basis: str  # measured, not measured, no figure (a cell that did not finish), left out (unsupported)
    outcome: str | None = None  # holds, fails, unresolved: on measured figures
    value: float | None = None
    low: float | None = None
    high: float | None = None
    against_value: float | None = None
    against_low: float | None = None
    against_high: float | None = None
    medians_only: bool = False  # a timed figure without its interval
    predicted_outcome: str | None = None  # on the memory and time models' figures (not measured pairs)
    predicted_value: float | None = None
    predicted_against: float | None = None
    status: str | None = None  # fits / oom: the cell's result ("trains", "OOM at step 2", "predicted to fit")


@dataclass
class Result:
    index: int
    finding: Finding
    checked_as: str
    pairs: list[Pair]
    verdict: str  # reproduced, partly, not reproduced, not yet measured
    summary: str  # the verdict with its counts, as the table shows it
    evidence: str  # the pairs behind it, as the table shows them


def _interval(figure: float, interval, timed: bool) -> tuple[float, float, bool]:
    """The figure's range and whether it is a timed median without its interval."""
    if interval is not None:
        return interval[0], interval[1], False
    return figure, figure, timed


def judge(finding: Finding, a: tuple[float, float], b: tuple[float, float]) -> str:
    """holds, fails or unresolved for one pair's ranges (a: the cell, b: the one it is held against)."""
    comparison = finding.comparison
    if comparison in ("rises_with", "falls_with"):
        comparison = "more" if comparison == "rises_with" else "less"
    if math.isinf(a[0]) and math.isinf(b[0]):  # both ran out of memory: no order
        return "unresolved"
    if comparison == "same":
        low, high = a[0] - b[1], a[1] - b[0]
        if -finding.within <= low and high <= finding.within:
            return "holds"
        return "fails" if low > finding.within or high < -finding.within else "unresolved"
    if comparison == "more":
        a, b = b, a  # a more than b: b less than a
    if finding.factor:
        low, high = _ratio(b[0], a[1]), _ratio(b[1], a[0])  # larger over smaller
        if math.isnan(low) or math.isnan(high):
            return "unresolved"
        if finding.factor[0] <= low and high <= finding.factor[1]:
            return "holds"
        return "fails" if high < finding.factor[0] or low > finding.factor[1] else "unresolved"
    if a[1] < b[0]:
        return "holds"
    return "fails" if a[0] >= b[1] else "unresolved"


def _ratio(top: float, bottom: float) -> float:
    if math.isinf(top) and math.isinf(bottom):
        return math.nan
    return top / bottom if bottom > 0 else math.inf


def _label(finding: Finding, a: dict[str, Any], b: dict[str, Any] | None, context: list[str]) -> str:
    def named(params):
        keys = [finding.key] if finding.key else [k for k in finding.first | finding.second]
        return ", ".join(value_text(k, params.get(k)) for k in dict.fromkeys(keys))

    shared = ", ".join(value_text(k, a.get(k)) for k in context)
    if b is None:
        return shared or "the cell"
    return f"{named(a)} vs {named(b)}" + (f" ({shared})" if shared else "")


def _figure(metric: Metric, doc: Doc) -> tuple[str, tuple[float, float, bool] | None]:
    """A cell's basis and measured range (low, high, medians only) for a metric."""
    status = doc["status"]
    if status == "unsupported":
        return "left out", None
    if status in NOT_MEASURED:
        return "not measured", None
    if status == "oom" and metric.memory:
        return "measured", (math.inf, math.inf, False)
    if status != "ok" or sanity_problems(doc):  # a cell that did not train sanely gives no figure
        return "no figure", None
    if metric.timed and doc.get("emulation"):  # one rank's compute: no measure of the whole step
        return "not measured", None
    value, interval = metric.figure(doc)
    if value is None:  # a figure this cell lacks (no search, no accuracy): not measured yet
        return "not measured", None
    return "measured", _interval(value, interval, metric.timed)


def _compare_pair(finding: Finding, metric: Metric, a: Doc, b: Doc, label: str) -> Pair:
    pair = Pair(a["cell_id"], b["cell_id"], label, "measured")
    (basis_a, fa), (basis_b, fb) = _figure(metric, a), _figure(metric, b)
    for basis in ("left out", "not measured", "no figure"):
        if basis in (basis_a, basis_b):
            pair.basis = basis
            break
    if fa is not None:
        pair.value, pair.low, pair.high = _point(a, metric, fa), fa[0], fa[1]
    if fb is not None:
        pair.against_value, pair.against_low, pair.against_high = _point(b, metric, fb), fb[0], fb[1]
    if pair.basis == "measured":
        pair.medians_only = fa[2] or fb[2]
        pair.outcome = judge(finding, fa[:2], fb[:2])
    elif pair.basis == "not measured" and metric.predicted is not None:
        pa, pb = metric.predicted(a), metric.predicted(b)
        if pa is not None and pb is not None:
            pair.predicted_value, pair.predicted_against = pa, pb
            pair.predicted_outcome = judge(finding, (pa, pa), (pb, pb))
    return pair


def _point(doc: Doc, metric: Metric, figure: tuple[float, float, bool]) -> float:
    if math.isinf(figure[0]):
        return math.inf
    return metric.figure(doc)[0]


def _outcome_cell(finding: Finding, doc: Doc, label: str) -> Pair:
    """fits / oom: one cell."""
    status = doc["status"]
    pair = Pair(doc["cell_id"], None, label, "measured", status=status)
    wanted = "ok" if finding.relation == "fits" else "oom"
    if status == "unsupported":
        pair.basis = "left out"
    elif status in NOT_MEASURED:
        pair.basis = "not measured"
        fits = (doc.get("predicted_now") or doc.get("predicted") or {}).get("fits")
        if fits is not None:
            pair.predicted_outcome = "holds" if fits == (finding.relation == "fits") else "fails"
            pair.status = "predicted to fit" if fits else "predicted not to fit"
            short = (doc.get("predicted_now") or doc.get("predicted") or {}).get("short_of")
            if not fits and short:
                pair.status += ": " + ", ".join(short)
    elif status == "ok" and sanity_problems(doc):
        pair.basis = "no figure"
        pair.status = "not sane: " + sanity_problems(doc)[0]
    elif status in ("ok", "oom"):
        pair.outcome = "holds" if status == wanted else "fails"
        pair.status = "trains" if status == "ok" else result_text(doc)
        if status == "ok" and doc.get("emulation"):
            pair.status = f"trains ({emulated(doc)})"
    else:
        pair.basis = "no figure"
    return pair


def evaluate(specs: list[dict[str, Any]] | None, docs: list[Doc], id_keys: list[str]) -> list[Result]:
    """Every declared finding judged on a study's documents (measured, planned and unsupported cells,
    in the grid's order, with the models' predictions: predictions.with_current_predictions)."""
    known = metrics()
    params = [d["params"] for d in docs]
    results = []
    for index, spec in enumerate(specs or [], 1):
        finding = Finding.parse(spec)
        metric = known.get(finding.metric) if finding.metric else None
        found = [(i, j) for i, j in pairs(finding, params, id_keys)
                 if "unsupported" not in (docs[i]["status"], docs[j]["status"] if j is not None else None)]
        ran = [(i, j) for i, j in found if docs[i]["status"] not in NOT_MEASURED
               and (j is None or docs[j]["status"] not in NOT_MEASURED)]
        labelled = _varying(params, ran, id_keys, finding), _varying(params, found, id_keys, finding)
        judged = []
        for i, j in found:
            context = labelled[0] if (i, j) in ran else labelled[1]
            label = _label(finding, params[i], params[j] if j is not None else None, context)
            judged.append(_compare_pair(finding, metric, docs[i], docs[j], label) if j is not None
                          else _outcome_cell(finding, docs[i], label))
        results.append(_result(index, finding, metric, judged))
    return results


def _varying(params: list[dict[str, Any]], found: list[tuple[int, int | None]], id_keys: list[str],
             finding: Finding) -> list[str]:
    """The keys a pair's label gives: those that vary among the pairs and the finding does not name
    (fits and oom: those that vary among their cells)."""
    named = finding.named if finding.relation == "compare" else set()
    return [k for k in id_keys if k not in named and len({repr(params[i].get(k)) for i, _ in found}) > 1]


def _verdict(outcomes: list[str]) -> str:
    held = outcomes.count("holds")
    if not outcomes:
        return "not yet measured"
    return "reproduced" if held == len(outcomes) else "partly" if held else "not reproduced"


def _result(index: int, finding: Finding, metric: Metric | None, judged: list[Pair]) -> Result:
    unit = "pair" if finding.relation == "compare" else "cell"
    measured = [p for p in judged if p.basis == "measured"]
    waiting = [p for p in judged if p.basis == "not measured"]
    predicted = [p for p in waiting if p.predicted_outcome]
    verdict = _verdict([p.outcome for p in measured])
    held = sum(p.outcome == "holds" for p in measured)
    forecast = [p.predicted_outcome for p in predicted]
    medians = sum(p.medians_only for p in measured)
    if measured:
        alone = ", on medians alone" if medians == len(measured) else ""
        summary = f"{verdict} ({held} of {_count(len(measured), unit)}{alone})"
    elif predicted:
        summary = (f"not yet measured; predicted: {_verdict(forecast)} ({forecast.count('holds')} of "
                   f"{_count(len(forecast), unit)})")
    else:
        summary = verdict
    notes = []
    unresolved = sum(p.outcome == "unresolved" for p in measured)
    if unresolved:
        notes.append(f"{_count(unresolved, unit)} within the intervals (undecided)")
    if medians:
        notes.append(f"{_count(medians, unit)} on medians alone (too few timed windows for an interval)")
    if waiting and measured:
        text = f"{_count(len(waiting), unit)} not yet measured"
        if predicted:
            text += f" (predicted: {forecast.count('holds')} of {len(forecast)} hold)"
        notes.append(text)
    elif waiting and len(predicted) < len(waiting):
        notes.append(f"{_count(len(waiting) - len(predicted), unit)} not yet measured, without a prediction")
    unfinished = sum(p.basis == "no figure" for p in judged)
    if unfinished:
        notes.append(f"{_count(unfinished, unit)} without a figure (a cell failed or timed out)")
    order = {"fails": 0, "unresolved": 1, "holds": 2}
    if measured:
        shown = sorted(measured, key=lambda p: order[p.outcome])
        details = [_detail(p, metric, finding) for p in shown[:SHOWN_PAIRS]]
    else:
        shown = sorted(predicted, key=lambda p: order[p.predicted_outcome])
        details = [_detail(p, metric, finding, predicted=True) for p in shown[:SHOWN_PAIRS]]
    if len(shown) > SHOWN_PAIRS:
        details.append(f"{len(shown) - SHOWN_PAIRS} more in the findings CSV")
    evidence = "; ".join(details + notes)
    header = metric.header if metric else None
    return Result(index, finding, finding.checked_as(header), judged, verdict, summary, evidence)


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _text(metric: Metric | None, value: float | None, low=None, high=None) -> str:
    if value is None:
        return "—"
    if math.isinf(value):
        return "OOM"
    text = metric.text(value)
    if low is not None and high is not None and high > low:
        text += f" ({metric.text(low)}-{metric.text(high) if high < math.inf else '?'})"
    return text


def _detail(pair: Pair, metric: Metric | None, finding: Finding, predicted: bool = False) -> str:
    """One pair as the table shows it: `zero3 vs zero0 (fp16): 5.61 vs 5.55, +1.1% (does not hold)`."""
    outcome = pair.predicted_outcome if predicted else pair.outcome
    word = {"holds": "holds", "fails": "does not hold", "unresolved": "undecided"}[outcome]
    if pair.against is None:
        return f"{pair.label}: {pair.status} ({word})"
    if predicted:
        a, b = pair.predicted_value, pair.predicted_against
        change = _change(metric, finding, a, b)
        return f"{pair.label}: predicted {_text(metric, a)} vs {_text(metric, b)}{change} ({word})"
    a = _text(metric, pair.value, pair.low, pair.high)
    b = _text(metric, pair.against_value, pair.against_low, pair.against_high)
    return f"{pair.label}: {a} vs {b}{_change(metric, finding, pair.value, pair.against_value)} ({word})"


def _change(metric: Metric | None, finding: Finding, a: float | None, b: float | None) -> str:
    """How far apart two figures are: the difference for `same`, a factor where it is 2 or more either
    way, else a percentage."""
    if a is None or b is None or math.isinf(a) or math.isinf(b):
        return ""
    if finding.comparison == "same":
        return f", apart by {metric.text(abs(a - b))}"
    if not b:
        return ""
    ratio = a / b
    return f", {ratio:.2f}x" if ratio >= 2 or ratio <= 0.5 else f", {100 * (ratio - 1):+.1f}%"


# --- output ---------------------------------------------------------------------------------------------

def markdown(results: list[Result]) -> list[str]:
    """The Findings section under a study's table."""
    if not results:
        return []

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| # | claim | checked as | verdict | evidence |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r.index} | {cell(r.finding.claim)} | {cell(r.checked_as)} | {cell(r.summary)} | "
              f"{cell(r.evidence)} |" for r in results]
    notes = [f"[{r.index}] {cell(r.finding.note)}" for r in results if r.finding.note]
    counts = {v: sum(r.verdict == v for r in results)
              for v in ("reproduced", "partly", "not reproduced", "not yet measured")}
    return [
        "## Findings",
        "",
        "The campaign's conclusions, checked on this table's cells (docs/studies.md, \"Findings\"): "
        "each is judged pair by pair on cells that differ only in the keys it names, timed figures with "
        "their 95% intervals, memory exactly. " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".",
        "",
        "\n".join(lines),
        "",
        *(["  \n".join(notes), ""] if notes else []),
        "Verdicts: reproduced, every measured pair holds; partly, some do; not reproduced, none does; not "
        "yet measured, no pair has both cells measured. Pairs of planned cells are also judged on the memory "
        "and time models' figures, labelled predicted; they count toward no verdict. Every pair is in the "
        "findings CSV.",
        "",
    ]


CSV_COLUMNS = ["finding", "claim", "checked_as", "verdict", "summary", "evidence", "cell", "against", "label",
               "basis", "outcome", "value", "low", "high", "against_value", "against_low", "against_high",
               "medians_only", "status", "predicted_outcome", "predicted_value", "predicted_against"]


def csv_rows(results: list[Result]) -> list[dict[str, Any]]:
    """One row per judged pair, with its finding's verdict and texts (the markdown's)."""
    rows = []
    for r in results:
        for p in r.pairs:
            rows.append({"finding": r.index, "claim": r.finding.claim, "checked_as": r.checked_as,
                         "verdict": r.verdict, "summary": r.summary, "evidence": r.evidence,
                         **{k: getattr(p, k) for k in CSV_COLUMNS[6:]}})
    return rows


def write_csv(results: list[Result], path) -> None:
    pandas.DataFrame(csv_rows(results), columns=CSV_COLUMNS).to_csv(path, index=False)
