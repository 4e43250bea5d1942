"""Aggregate a study's metrics.json files into a CSV (everything, flattened) and a markdown table.

The markdown table has one row per cell, whatever its status: the cell's varying parameters, its
result ("ok", "OOM at step 23 (timed)", "unsupported: why"), then the study's report columns in the
units its origin used. Every number comes from a metrics.json; nothing here invents one.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas

from trainbench import paths
from trainbench.study.grid import Cell, Study
from trainbench.execute.results import PER_STEP_METHOD, with_intervals

Doc = dict[str, Any]


def _metric(doc: Doc, key: str):
    return (doc.get("metrics") or {}).get(key)


def _max(values):
    values = [v for v in (values or []) if v is not None]
    return max(values) if values else None


def hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def si(count: float) -> str:
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(count) >= factor:
            return f"{count / factor:.1f}{suffix}"
    return f"{count:g}"


def _fmt(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:,.{digits}f}"


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Doc], Any]
    text: Callable[[Any], str]
    description: str
    needs_ok: bool = True  # only meaningful for a run that finished
    # a timed figure's 95% interval (low, high) in the column's unit, None where the run has none
    interval: Callable[[Doc], tuple[float, float] | None] | None = None
    comparable: bool = True  # a measured number that findings can compare (not text, not a prediction)


def _ci(key: str, scale: float = 1.0) -> Callable[[Doc], tuple[float, float] | None]:
    """A metrics key's interval, in the column's unit."""

    def interval(doc: Doc):
        bounds = _metric(doc, f"{key}_ci")
        return None if not bounds else (bounds[0] * scale, bounds[1] * scale)

    return interval


def _per_step(scale: Callable[[Doc], float | None]) -> Callable[[Doc], tuple[float, float] | None]:
    """A column proportional to the step time: its interval is the step time's, scaled."""

    def interval(doc: Doc):
        bounds, factor = _metric(doc, "step_time_s_ci"), scale(doc)
        return None if not bounds or not factor else (bounds[0] * factor, bounds[1] * factor)

    return interval


def _per_gpu(doc: Doc) -> str | None:
    used, total = _metric(doc, "gpu_mem_used_mib"), _metric(doc, "gpu_mem_total_mib")
    if not used:
        return None
    return ", ".join(f"{u:,.0f} / {t:,.0f}" for u, t in zip(used, total or [None] * len(used)))


def _rank0_mib(key: str) -> Callable[[Doc], float | None]:
    """Rank 0's figure of a per-rank (per-GPU, in rank order) metric."""
    return lambda doc: (_metric(doc, key) or [None])[0]


def _max_mib(key: str) -> Callable[[Doc], float | None]:
    """The worst rank's figure of a per-rank metric."""
    return lambda doc: _max(_metric(doc, key))


def _gib(mib: Callable[[Doc], float | None]) -> Callable[[Doc], float | None]:
    def value(doc: Doc):
        figure = mib(doc)
        return figure / 1024 if figure is not None else None

    return value


def _ms_per_sample(doc: Doc):
    batch = doc["params"].get("global_batch")
    return 1e3 / batch if batch else None


def _time_per_sample_ms(doc: Doc):
    step, factor = _metric(doc, "step_time_s"), _ms_per_sample(doc)
    return step * factor if step and factor else None


def _timed_steps(doc: Doc):
    return doc["params"].get("timed_steps")


def _timed_total_s(doc: Doc):
    """The study's timed steps at the median step (gpt2_zero: 3 steps, its origin's 48 samples)."""
    step, steps = _metric(doc, "step_time_s"), _timed_steps(doc)
    return step * steps if step and steps else None


def _steps_of_run(doc: Doc):
    step, projected = _metric(doc, "step_time_s"), _metric(doc, "projected_run_s")
    return projected / step if step and projected else None


def _params_held_rank0(doc: Doc):
    counts = _metric(doc, "params_per_module_rank0")
    return sum(counts.values()) if counts else None


def _loss(doc: Doc):
    first, last = _metric(doc, "loss_first"), _metric(doc, "loss_last")
    return None if first is None else f"{first:.3f} → {last:.3f}"


def _params_rank0(doc: Doc):
    counts = _metric(doc, "params_per_module_rank0")
    if not counts:
        return None
    return ", ".join(f"{name} {si(n)}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def prediction(doc: Doc) -> dict:
    """The memory model's prediction for the cell on the machine it ran on: the current model's, so
    tables follow improvements to it (the prediction the run was launched with stays in its
    metrics.json, and in the CSV as predicted_at_run). A planned row carries its own. Computed once
    per document (with_current_predictions) and read by every column and plot that shows it."""
    if "predicted_now" in doc:
        return doc["predicted_now"]
    if doc["status"] in ("planned", "not run"):
        return doc.get("predicted") or {}
    from trainbench.predict.memory_model import hardware_of_run, predict

    try:
        return predict(doc["params"], hardware_of_run(doc)).as_dict()
    except (KeyError, ValueError):  # a cell of a model or strategy the model does not know
        return {}


def _study_gpu(docs: list[Doc]):
    """The GPU type most of a study's measured cells ran on (None if none ran on a known one): what its
    planned cells are predicted for where the study's plan_for names none."""
    from trainbench.predict.memory_model import hardware_of_run

    kinds = Counter()
    for doc in docs:
        if doc["status"] == "ok" and (hardware := hardware_of_run(doc)) is not None and hardware.gpu:
            kinds[hardware.gpu.key] += 1
    return kinds.most_common(1)[0][0] if kinds else None


def time_prediction(doc: Doc, study_gpu: str | None = None) -> dict:
    """The time model's step time, samples/s and MFU for the cell: on the GPU it ran on (a measured
    cell), or on the study's planning GPU (`planned_for_gpu`, else `study_gpu`); {} where the model
    says nothing (CPU ranks, no GPU type, a run that did not train). Computed once per document, like
    the memory prediction."""
    if "predicted_time" in doc:
        return doc["predicted_time"]
    from trainbench.predict import time_model
    from trainbench.registry.hardware import GPUS
    from trainbench.predict.memory_model import hardware_of_run

    if doc["status"] == "ok":
        hardware = hardware_of_run(doc)
        gpu = hardware.gpu if hardware else None
        threads = time_model.threads_of_run(doc)
    elif doc["status"] in ("planned", "not run"):
        key = doc.get("planned_for_gpu") or study_gpu
        gpu, threads = GPUS.get(key) if key else None, time_model.DEFAULT_CPU_THREADS
    else:
        return {}
    predicted = time_model.predict(doc["params"], gpu, cpu_threads=threads)
    return predicted.as_dict() if predicted else {}


def with_current_predictions(docs: list[Doc]) -> list[Doc]:
    """Each document with the current memory model's prediction under "predicted_now", and the time
    model's under "predicted_time"."""
    study_gpu = _study_gpu(docs)
    return [{**doc, "predicted_now": prediction(doc), "predicted_time": time_prediction(doc, study_gpu)}
            for doc in docs]


def planned_document(cell: Cell, plan_for: dict[str, Any] | None) -> Doc:
    """A table row for a cell outside the study's `measure` selection: no run, the memory model's
    verdict for the study's planning hardware (or the stack's refusal, which needs no run)."""
    from trainbench.predict.memory_model import hardware_from_args, held_gpu_mib, predict

    doc: Doc = {"study": cell.study, "cell_id": cell.cell_id, "params": cell.params, "metrics": {},
                "provenance": {}}
    if cell.unsupported:
        return {**doc, "status": "unsupported", "reason": cell.unsupported, "predicted": {}}
    hardware = None
    if plan_for:
        # a cell held to a smaller GPU (gpu_mem_limit_gib) is planned on that GPU
        gpu_gib = held_gpu_mib(plan_for["gpu_mem_gib"] * 1024, cell.params) / 1024
        hardware = hardware_from_args(plan_for.get("name"), gpu_gib, plan_for["host_mem_gib"],
                                      plan_for["gpus_per_node"])
        if hardware.gpu is not None:  # the GPU type plan_for's name mentions: the time model's hardware
            doc["planned_for_gpu"] = hardware.gpu.key
    try:
        predicted = predict(cell.params, hardware).as_dict()
    except (KeyError, ValueError):  # a model or strategy the memory model does not know
        predicted = {}
    if predicted.get("fits") is None:
        reason = "not measured"
    elif predicted["fits"]:
        reason = "predicted to fit"
    else:  # the numbers are in the predicted columns; the row says what runs short
        reason = "predicted not to fit: " + ", ".join(predicted["short_of"])
    return {**doc, "status": "planned", "reason": reason, "predicted": predicted}


def _predicted_gib(doc: Doc):
    value = prediction(doc).get("gpu_mem_mib")
    return value / 1024 if value is not None else None


def _predicted_host_gib(doc: Doc):
    value = prediction(doc).get("host_mem_mib")
    return value / 1024 if value is not None else None


def _predicted_time(key: str, scale: float = 1.0) -> Callable[[Doc], float | None]:
    def value(doc: Doc):
        figure = time_prediction(doc).get(key)
        return figure * scale if figure is not None else None

    return value


def _memory_columns(name: str, key: str, what: str, source: str,
                    meaning: dict[str, str]) -> dict[str, Column]:
    """One per-rank memory figure as four columns: rank 0's and the worst rank's, in MiB and in GiB."""
    columns = {}
    for who, pick, whose in (("rank0", _rank0_mib, "rank 0"), ("max", _max_mib, "worst rank")):
        for unit, value, digits, said in (("mib", pick(key), 0, meaning[who]),
                                           ("gib", _gib(pick(key)), 2, f"{meaning[who]}, GiB")):
            columns[f"{name}_{who}_{unit}"] = Column(f"{what}, {whose} ({unit[0].upper()}i{unit[2].upper()}"
                                                     f"{source})", value, _fmt(digits), said, needs_ok=False)
    return columns


def _step_time_error_pct(doc: Doc):
    if doc.get("emulation"):  # a rank's compute alone against the model's whole step: no error to give
        return None
    predicted, measured = time_prediction(doc).get("step_time_s"), _metric(doc, "step_time_s")
    return 100 * (predicted - measured) / measured if predicted and measured else None


COLUMNS: dict[str, Column] = {
    "gpus": Column("GPUs", lambda d: d["params"]["gpus"], str, "ranks (GPUs) of the cell", needs_ok=False),
    "global_batch": Column("global batch", lambda d: d["params"].get("global_batch"), str,
                           "micro batch x accumulation x data-parallel size", needs_ok=False),
    "step_time_ms": Column("step (ms)",
                           lambda d: _metric(d, "step_time_s") and _metric(d, "step_time_s") * 1e3,
                           _fmt(1), "median optimizer-step time", interval=_ci("step_time_s", 1e3)),
    "time_per_sample_ms": Column("ms/sample", _time_per_sample_ms, _fmt(2), "median step time / global batch",
                                 interval=_per_step(_ms_per_sample)),
    "timed_total_s": Column("timed (s)", _timed_total_s, _fmt(2),
                            "the study's timed steps (timed_steps x global batch samples) at the median step",
                            interval=_per_step(_timed_steps)),
    "samples_per_s": Column("samples/s", lambda d: _metric(d, "samples_per_s"), _fmt(1), "samples per second",
                            interval=_ci("samples_per_s")),
    "tokens_per_s": Column("tokens/s", lambda d: _metric(d, "tokens_per_s"), _fmt(0), "tokens per second",
                           interval=_ci("tokens_per_s")),
    "tflops_per_gpu": Column("TFLOPS/GPU", lambda d: _metric(d, "tflops_per_gpu"), _fmt(2),
                             "model TFLOP/s per GPU (6N + 12LHQT per token)", interval=_ci("tflops_per_gpu")),
    "mfu": Column("MFU", lambda d: _metric(d, "mfu"), lambda v: f"{v:.1%}",
                  "model FLOPs utilisation against the GPU's dense peak", interval=_ci("mfu")),
    # Device memory as nvidia-smi shows it (NVML 'used': the caching allocator's reserve, the CUDA context,
    # NCCL) and the tensors torch allocated (what a strategy controls), for rank 0 (the figure
    # campaigns that read one nvidia-smi line reported) and for the worst rank: they differ where ranks
    # hold different things (ZeRO-1/2's rank 0, pipeline stages, tensor parallelism's first rank).
    **_memory_columns("gpu_mem", "gpu_mem_used_mib", "GPU mem", ", nvidia-smi",
                      {"rank0": "peak NVML 'used' memory of rank 0's GPU",
                       "max": "peak NVML 'used' memory of the busiest GPU"}),
    "gpu_mem_each": Column("GPU mem used / total (MiB, nvidia-smi), each GPU", _per_gpu, str,
                           "peak NVML 'used' and total memory of every GPU, in rank order", needs_ok=False,
                           comparable=False),
    **_memory_columns("torch_alloc", "torch_peak_allocated_mib", "torch peak alloc", "",
                      {"rank0": "torch's peak allocated memory on rank 0 (tensors only)",
                       "max": "the largest torch peak allocated memory over ranks (tensors only)"}),
    "host_mem_mib": Column("host mem (MiB)", lambda d: _metric(d, "host_mem_peak_mib"), _fmt(0),
                           "peak resident memory of the busiest node's ranks together"),
    "host_mem_pct": Column("host mem %", lambda d: _metric(d, "host_mem_percent_peak"), _fmt(1),
                           "peak share of the node's memory in use (all processes)"),
    "wall_min": Column("wall (min)", lambda d: _metric(d, "wall_time_s") and _metric(d, "wall_time_s") / 60,
                       _fmt(2), "wall time of the measured run, start-up included"),
    "projected_hms": Column("whole run (h:mm:ss)", lambda d: _metric(d, "projected_run_s"), hms,
                            "projected steady-state time of the run the study describes",
                            interval=_per_step(_steps_of_run)),
    "projected_min": Column("whole run (min)", lambda d: _metric(d, "projected_run_s") and
                            _metric(d, "projected_run_s") / 60, _fmt(1),
                            "projected steady-state time of the run the study describes",
                            interval=_per_step(lambda d: _steps_of_run(d) and _steps_of_run(d) / 60)),
    "test_accuracy": Column("test acc.", lambda d: _metric(d, "test_accuracy"), lambda v: f"{v:.1%}",
                            "accuracy on held-out data"),
    "loss": Column("loss first → last", _loss, str, "training loss at the first and last step",
                   comparable=False),
    "params_total": Column("params", lambda d: _metric(d, "params_total"), si, "parameters in the model"),
    "params_rank0": Column("params held by rank 0, by module", _params_rank0, str,
                           "parameter elements rank 0 holds, by module class (ZeRO-3 shards them)",
                           comparable=False),
    "params_held_rank0": Column("params held by rank 0", _params_held_rank0, si,
                                "parameter elements rank 0 holds, all modules together"),
    "predicted_gpu_mem_gib": Column("predicted GPU mem, worst rank (GiB, nvidia-smi)", _predicted_gib,
                                    _fmt(1),
                                    "the memory model's prediction of the busiest GPU's NVML 'used' memory",
                                    needs_ok=False, comparable=False),
    "predicted_host_mem_gib": Column("predicted host mem (GiB)", _predicted_host_gib, _fmt(1),
                                     "the memory model's prediction of the busiest node's ranks' memory",
                                     needs_ok=False, comparable=False),
    "predicted_step_time_ms": Column("predicted step (ms)", _predicted_time("step_time_s", 1e3), _fmt(1),
                                     "the time model's optimizer-step time (docs/time-model.md)",
                                     needs_ok=False, comparable=False),
    "predicted_samples_per_s": Column("predicted samples/s", _predicted_time("samples_per_s"), _fmt(1),
                                      "global batch / the time model's step time", needs_ok=False,
                                      comparable=False),
    "predicted_mfu": Column("predicted MFU", _predicted_time("mfu"), lambda v: f"{v:.1%}",
                            "MFU at the time model's step time", needs_ok=False, comparable=False),
    "step_time_error_pct": Column("time model error", _step_time_error_pct, lambda v: f"{v:+.0f}%",
                                  "predicted step time against the measured median", needs_ok=True,
                                  comparable=False),
}


def with_predictions(report: list[str], docs: list[Doc]) -> list[str]:
    """Every study's table shows the memory model's prediction next to what was measured, and a GPU
    study's the time model's step time and samples/s (planned cells: predicted only; measured ones: beside
    the measurement, with the prediction's error)."""
    wanted = ["predicted_host_mem_gib"]
    if any(d["params"].get("device") == "cuda" for d in docs):
        wanted = ["predicted_gpu_mem_gib", *wanted, "predicted_step_time_ms", "predicted_samples_per_s",
                  "step_time_error_pct"]
    return [*report, *(c for c in wanted if c not in report)]


FOOTNOTE_AFTER = 60  # reasons longer than this go under the table, once each
# a table row's flag, kept in the CSV as table.emulated: its timed figures are one emulated rank's compute
COMPUTE_ONLY = "emulated"


def noisy_text(doc: Doc) -> str:
    """Why a finished cell's timing is not as tight as its study asked."""
    half = _metric(doc, "ci_half_width")
    if half is None:
        return f"noisy ({_metric(doc, 'windows')} windows: no interval)"
    return f"noisy (±{half:.1%})"


def emulated(doc: Doc) -> str | None:
    """"emulated rank r of N" for a cell measured as one rank of its world alone (emulation.py)."""
    section = doc.get("emulation")
    return f"emulated rank {section['rank']} of {section['world_size']}" if section else None


def result_text(doc: Doc, notes: list[str] | None = None) -> str:
    """A cell's outcome for the table: "ok", "OOM at step 23 (timed)", "unsupported: why"; an emulated
    cell's starts with "emulated rank r of N: ". With a notes list, a long reason becomes a numbered
    footnote there (shared by every cell that gives it)."""
    text = _outcome_text(doc, notes)
    return f"{emulated(doc)}: {text}" if emulated(doc) else text


def _outcome_text(doc: Doc, notes: list[str] | None) -> str:
    status, reason = doc["status"], doc.get("reason")
    if status == "ok":
        return f"ok, {noisy_text(doc)}" if _metric(doc, "noisy") else "ok"
    if status == "oom":
        # "OOM at step 23 (timed) on rank 0, 1: <allocator message>" -> the part before the ranks
        return reason.split(" on rank")[0] if reason else "OOM"
    if not reason:
        return status
    if notes is not None and len(reason) > FOOTNOTE_AFTER:
        if reason not in notes:
            notes.append(reason)
        return f"{status} [{notes.index(reason) + 1}]"
    return f"{status}: {reason}"


def _cell_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else str(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def column_values(doc: Doc, name: str) -> tuple[Any, tuple[float, float] | None]:
    """One table cell's value and its interval: what the markdown shows and the CSV keeps."""
    column = COLUMNS[name]
    if column.needs_ok and doc["status"] != "ok":
        return None, None
    value = column.value(doc)
    return value, (column.interval(doc) if column.interval and value is not None else None)


def table_rows(docs: list[Doc], *, id_keys: list[str], report: list[str]) -> list[dict[str, Any]]:
    """Every table column of every cell, computed once: the markdown renders these rows and the CSV
    stores them (table.<column>, and table.<column>_low / _high for an interval)."""
    unknown = [c for c in report if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown report column(s) {unknown}; known: {', '.join(COLUMNS)}")
    rows = []
    for doc in docs:
        row: dict[str, Any] = {key: doc["params"].get(key) for key in id_keys}
        row[COMPUTE_ONLY] = bool(doc.get("emulation"))
        for name in report:
            value, interval = column_values(doc, name)
            row[name] = value
            if COLUMNS[name].interval is not None:
                row[f"{name}_low"], row[f"{name}_high"] = interval or (None, None)
        rows.append(row)
    return rows


def cell_text(row: dict[str, Any], name: str) -> str:
    """A table cell as the markdown shows it: the value, and ± half its interval's width; a timed figure
    of an emulated cell is marked as its rank's compute alone."""
    column, value = COLUMNS[name], row[name]
    if value is None:
        return "—"
    text = column.text(value)
    if row.get(f"{name}_low") is not None:
        text += f" ± {column.text((row[f'{name}_high'] - row[f'{name}_low']) / 2)}"
    if row.get(COMPUTE_ONLY) and column.interval is not None:
        text += " (compute)"
    return text


def markdown_table(docs: list[Doc], *, id_keys: list[str], report: list[str]) -> str:
    rows = table_rows(docs, id_keys=id_keys, report=report)
    headers = [*id_keys, "result", *(COLUMNS[c].header for c in report)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    notes: list[str] = []
    for doc, row in zip(docs, rows):
        cells = [_cell_value(row[k]) for k in id_keys] + [result_text(doc, notes)]
        cells += [cell_text(row, name) for name in report]
        lines.append("| " + " | ".join(_escape(v) for v in cells) + " |")
    if notes:
        lines.append("")
        lines += [f"[{i}] {_escape(note)}" + ("  " if i < len(notes) else "")
                  for i, note in enumerate(notes, 1)]
    return "\n".join(lines)


def _probe_outcome(status: str, reason: str | None) -> str:
    """A probe in a few characters: "ok", "OOM at step 3", "OOM at init", "timeout"."""
    if status != "oom":
        return status
    return result_text({"status": status, "reason": reason}).split(" of ")[0].split(" (")[0]


def _model_max(doc: Doc) -> str:
    """The current memory model's largest micro batch for the cell on the GPUs its search ran on (like
    the predicted columns, it follows improvements to the model)."""
    from trainbench.predict.batch_search import model_largest

    found = doc["search"]
    predicted = model_largest(doc["params"], found)
    if predicted is None:
        return "—"
    return f"≥ {found['bound']}" if predicted >= found["bound"] else str(predicted)


SEARCH_METRICS = ["step_time_ms", "samples_per_s", "tflops_per_gpu", "mfu", "gpu_mem_each"]


def search_markdown(docs: list[Doc], *, id_keys: list[str]) -> list[str]:
    """The largest micro batch of every searched cell, and the cell's run at that batch."""
    searched = [d for d in docs if d.get("search")]
    if not searched:
        return []
    headers = [*id_keys, "max micro batch", "max global batch", "smallest that failed", "model's max",
               "probes", *(f"{COLUMNS[c].header} at max" for c in SEARCH_METRICS)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for doc in searched:
        found = doc["search"]
        failure = found["first_failure"]
        at_max = {"status": "ok", "params": doc["params"], "metrics": with_intervals(
            doc["params"], found["metrics_at_max"] or {}, (doc.get("provenance") or {}).get("gpu_name"))}
        row = [_cell_value(doc["params"].get(k)) for k in id_keys]
        row += [_cell_value(found["max_micro_batch"]) or "none",
                _cell_value(found["max_global_batch"]) or "—",
                f"{failure['micro_batch']}: {_probe_outcome(failure['status'], failure['reason'])}" if failure
                else "none up to the bound",
                _model_max(doc),
                ", ".join(f"{p['micro_batch']} {_probe_outcome(p['status'], p['reason'])}"
                          for p in found["probes"])]
        values = (table_rows([at_max], id_keys=[], report=SEARCH_METRICS)[0] if found["metrics_at_max"]
                  else None)
        row += [cell_text(values, name) if values else "—" for name in SEARCH_METRICS]
        lines.append("| " + " | ".join(_escape(v) for v in row) + " |")
    tolerance = {d["search"].get("tolerance") or 0 for d in searched}
    within = ("exact" if tolerance == {0}
              else f"bisection stops within {max(tolerance):.0%} of the largest that trained")
    return [
        "## Largest micro batch (search)",
        "",
        "\n".join(lines),
        "",
        f"Each probe trains the cell at one micro batch for the search's steps; probes double, then bisect "
        f"({within}), seeded and bounded by the memory model (its largest fitting micro batch on that "
        f"hardware: \"model's max\"). The columns \"at max\" are the probe at the largest batch: the cell's "
        "run at that batch. Probes: "
        f"{paths.path(paths.PROBE, study='<study>', cell='<cell>', micro_batch='<k>')}.",
        "",
    ]


def _hardware_summary(docs: list[Doc]) -> str:
    machines = Counter()
    for doc in docs:
        prov = doc.get("provenance") or {}
        if doc["status"] in ("unsupported", "infeasible", "planned", "not run"):
            continue
        gpu = prov.get("gpu_name")
        where = f"{prov.get('gpu_count')} x {gpu}" if gpu else f"CPU ({prov.get('cpu_count')} cores)"
        if doc.get("emulation"):
            where += " (emulated ranks)"
        machines[f"{where} on {prov.get('hostname')}, torch {prov.get('versions', {}).get('torch')}"] += 1
    return "; ".join(f"{m} ({n} cells)" for m, n in machines.items()) or "none ran"


def _planning_note(docs: list[Doc], plan_for: dict[str, Any] | None) -> list[str]:
    if not any(d["status"] in ("planned", "not run") for d in docs):
        return []
    where = "no hardware (give measure.plan_for)"
    if plan_for:
        where = (f"{plan_for.get('name') or 'the planning hardware'}: {plan_for['gpus_per_node']} GPUs of "
                 f"{plan_for['gpu_mem_gib']:g} GiB and {plan_for['host_mem_gib']:g} GiB of host memory "
                 "per node")
    notes = []
    if any(d["status"] == "planned" for d in docs):
        notes.append(f"Planned cells are outside the study's `measure` selection: not run; their predicted "
                     f"memory and verdict are the memory model's for {where}.")
    if any(d["status"] == "not run" for d in docs):
        notes.append("Cells marked 'not run' need more GPUs than the machine that made this table has; they "
                     "run on a machine with enough, or through SLURM (`--profile profiles/slurm`). Their "
                     "predicted memory is the memory model's" + (f" for {where}." if plan_for else "."))
    return [" ".join(notes), ""]


def _emulation_note(docs: list[Doc]) -> list[str]:
    rows = [d for d in docs if d.get("emulation")]
    if not rows:
        return []
    from trainbench.predict.memory_model import NCCL_MIB

    limits = sorted({d["params"]["gpu_mem_limit_gib"] for d in rows if d["params"].get("gpu_mem_limit_gib")})
    held = (f" Where gpu_mem_limit_gib is set ({', '.join(f'{g:g}' for g in limits)} GiB), the rank was held "
            "to a GPU of that size: its allocator could reserve what such a GPU leaves after the CUDA "
            "context and NCCL's buffers, and an OOM is that GPU's." if limits else "")
    return [f"Rows marked \"emulated rank r of N\" ({len(rows)} here) ran one rank of the cell's world "
            "alone on one GPU through PyTorch's fake process group (docs/emulation.md): the framework "
            "built, sharded and stepped as that rank, and no collective moved data. Their memory is the "
            f"rank's, measured, with NCCL's buffers modelled ({NCCL_MIB:.0f} MiB added to the GPU's) and "
            "the node's host memory derived (the rank's times the ranks per node); their timed figures, "
            "marked (compute), are the rank's compute alone, beside the time model's whole step." + held, ""]


def _timing_note(docs: list[Doc]) -> list[str]:
    ran = [d for d in docs if d["status"] == "ok"]
    if not ran:
        return []
    per_step = sum(1 for d in ran if (_metric(d, "timing") or {}).get("method") == PER_STEP_METHOD)
    noisy = sum(1 for d in ran if _metric(d, "noisy"))
    text = ("Timed figures are medians over timed windows ± half their 95% interval (docs/measurement.md, "
            "\"How a cell is measured\"); a cell whose interval stayed wider than its study's target is "
            "marked noisy"
            f" ({noisy} of {len(ran)} here).")
    if per_step:
        text += (f" {per_step} of them ran before timing windows: each of their steps was synchronised and "
                 f"timed alone, and their intervals come from those step times.")
    return [text, ""]


def _time_model_note(docs: list[Doc]) -> list[str]:
    predicted = [d for d in docs if d.get("predicted_time")]
    if not predicted:
        return []
    from trainbench.predict.time_model import load_constants

    fitted = {gpu: c.fitted_on for gpu, c in load_constants().items()}
    gpus = sorted({d["predicted_time"]["gpu"] for d in predicted})
    text = (f"Predicted step times and samples/s are the time model's (docs/time-model.md) on "
            f"{', '.join(gpus)}: measured cells on the GPU they ran on, planned ones on the planning hardware"
            f" (or the GPU the study's measured cells ran on).")
    borrowed = sorted({d["predicted_time"]["note"] for d in predicted if d["predicted_time"].get("note")})
    text += "".join(f" {note[0].upper()}{note[1:]}." for note in borrowed)
    if any(d["status"] == "ok" for d in predicted):
        text += (" Its constants were fitted on measured cells, these among them"
                 + (f" ({'; '.join(f'{g}: {w}' for g, w in fitted.items())})" if fitted else "")
                 + ", so a measured cell's error here is in sample; predicted from fits that did not "
                 "see them, the error is in results/bench/time_model/time_model.txt.")
    return [text, ""]


def study_markdown(study: str, description: str, docs: list[Doc], *, id_keys: list[str], report: list[str],
                   plan_for: dict[str, Any] | None = None, judged: list | None = None) -> str:
    """The study's markdown: its table, notes, the largest-batch searches, and its findings as `judged`
    (findings.evaluate)."""
    from trainbench.reporting.findings import markdown as findings_markdown

    report = with_predictions(report, docs)
    docs = with_current_predictions(docs)
    statuses = Counter(d["status"] for d in docs)
    commits = sorted({(d.get("provenance") or {}).get("git_commit") or "unknown" for d in docs
                      if d["status"] not in ("planned", "not run")})
    parts = [
        f"# {study}",
        "",
        description.strip(),
        "",
        markdown_table(docs, id_keys=id_keys, report=report),
        "",
        f"{len(docs)} cells: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + ".",
        f"Ran on: {_hardware_summary(docs)}.",
        f"Code: {', '.join(commits)}. Generated {dt.date.today().isoformat()} by `snakemake "
        f"{paths.path(paths.TABLE_MD, study=study)}` from {paths.path(paths.RUN, study=study, cell='*')}.",
        "",
        *_planning_note(docs, plan_for),
        *_emulation_note(docs),
        *_timing_note(docs),
        *_time_model_note(docs),
        "Columns: " + "; ".join(f"{COLUMNS[c].header}: {COLUMNS[c].description}" for c in report) + ".",
        "",
        *search_markdown(docs, id_keys=id_keys),
        *findings_markdown(judged or []),
    ]
    return "\n".join(parts)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists to dotted columns: metrics.gpu_mem_used_mib.0, params.strategy."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list):
        if not value:
            return {prefix: ""}
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{i}"))
        return out
    return {prefix: value}


CSV_FIRST = ["study", "cell_id", "status", "reason", "params_hash"]


def csv_rows(docs: list[Doc], *, id_keys: list[str], report: list[str]) -> list[dict[str, Any]]:
    """One flat row per cell: everything in its metrics.json (the prediction it was launched with as
    predicted_at_run.*, the current model's as predicted_now.*), and the markdown table's columns as
    table.<column> from the same computation (table_rows)."""
    docs = with_current_predictions(docs)
    rows = []
    for doc, table in zip(docs, table_rows(docs, id_keys=id_keys, report=report)):
        document = {k: v for k, v in doc.items() if k not in ("predicted", "predicted_now")}
        document["predicted_at_run"] = (doc.get("predicted") if doc["status"] not in ("planned", "not run")
                                        else {})
        document["predicted_now"] = doc["predicted_now"]
        row = flatten(document)
        row.update({f"table.{name}": value for name, value in table.items() if name not in id_keys})
        rows.append(row)
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    table = [k for k in dict.fromkeys(k for row in rows for k in row) if k.startswith("table.")]
    rest = sorted({k for row in rows for k in row} - set(CSV_FIRST) - set(table))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pandas.DataFrame(rows, columns=CSV_FIRST + table + rest).to_csv(path, index=False)


def with_searches(docs: list[Doc], searches: list[Doc]) -> list[Doc]:
    """The cells' documents, each searched one carrying its max-batch search's result under "search"."""
    by_cell = {s["cell_id"]: s for s in searches}
    return [{**d, "search": by_cell[d["cell_id"]]} if d["cell_id"] in by_cell else d for d in docs]


def with_planned(docs: list[Doc], study: Study, short_of_gpus: dict[str, str] | None = None) -> list[Doc]:
    """The measured cells' documents and the planned cells' rows, in the grid's order; a measured cell
    the machine that made the table could not run (`short_of_gpus`: id to why) has a row saying so."""
    by_id = {d["cell_id"]: d for d in docs}
    by_id.update({c.cell_id: planned_document(c, study.plan_for) for c in study.planned})
    for cell_id, why in (short_of_gpus or {}).items():
        row = planned_document(study.cell(cell_id), study.plan_for)
        by_id[cell_id] = {**row, "status": "not run", "reason": why}
    return [by_id[c.cell_id] for c in study.cells if c.cell_id in by_id]


def write_tables(docs: list[Doc], *, study: str, description: str, id_keys: list[str], report: list[str],
                 csv_path: Path, md_path: Path, plan_for: dict[str, Any] | None = None,
                 findings: list[dict[str, Any]] | None = None, findings_path: Path | None = None) -> None:
    """The study's CSV and markdown, and its findings judged once for both the markdown and their CSV."""
    from trainbench.reporting import findings as judging

    judged = judging.evaluate(findings, with_current_predictions(docs), id_keys)
    write_csv(csv_rows(docs, id_keys=id_keys, report=with_predictions(report, docs)), Path(csv_path))
    Path(md_path).write_text(study_markdown(study, description, docs, id_keys=id_keys, report=report,
                                            plan_for=plan_for, judged=judged))
    if findings_path is not None:
        judging.write_csv(judged, Path(findings_path))
