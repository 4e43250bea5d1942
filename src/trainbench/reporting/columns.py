"""The table columns a study can report, one registry (COLUMNS): each column's header, how its value and
interval are read from a cell's metrics.json, how it is shown, and what it means; a cell's outcome as
the table's result column says it, and its parameters in short words (plots' labels, the summary's
set-up). Every number comes from a metrics.json or from the models'
predictions beside it (reporting.predictions); nothing here invents one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from trainbench.contract.result import MEANINGS, PARTS
from trainbench.contract.result import sanity_problems
from trainbench.reporting.predictions import Doc, prediction, time_prediction

def metric(doc: Doc, key: str):
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
        bounds = metric(doc, f"{key}_ci")
        return None if not bounds else (bounds[0] * scale, bounds[1] * scale)

    return interval


def _per_step(scale: Callable[[Doc], float | None]) -> Callable[[Doc], tuple[float, float] | None]:
    """A column proportional to the step time: its interval is the step time's, scaled."""

    def interval(doc: Doc):
        bounds, factor = metric(doc, "step_time_s_ci"), scale(doc)
        return None if not bounds or not factor else (bounds[0] * factor, bounds[1] * factor)

    return interval


def _per_gpu(doc: Doc) -> str | None:
    used, total = metric(doc, "gpu_mem_used_mib"), metric(doc, "gpu_mem_total_mib")
    if not used:
        return None
    return ", ".join(f"{u:,.0f} / {t:,.0f}" for u, t in zip(used, total or [None] * len(used)))


def _rank0_mib(key: str) -> Callable[[Doc], float | None]:
    """Rank 0's figure of a per-rank (per-GPU, in rank order) metric."""
    return lambda doc: (metric(doc, key) or [None])[0]


def _max_mib(key: str) -> Callable[[Doc], float | None]:
    """The worst rank's figure of a per-rank metric."""
    return lambda doc: _max(metric(doc, key))


def _gib(mib: Callable[[Doc], float | None]) -> Callable[[Doc], float | None]:
    def value(doc: Doc):
        figure = mib(doc)
        return figure / 1024 if figure is not None else None

    return value


def _ms_per_sample(doc: Doc):
    batch = doc["params"].get("global_batch")
    return 1e3 / batch if batch else None


def _time_per_sample_ms(doc: Doc):
    step, factor = metric(doc, "step_time_s"), _ms_per_sample(doc)
    return step * factor if step and factor else None


def _timed_steps(doc: Doc):
    return doc["params"].get("timed_steps")


def _timed_total_s(doc: Doc):
    """The study's timed steps at the median step (gpt2_zero: 3 steps, its origin's 48 samples)."""
    step, steps = metric(doc, "step_time_s"), _timed_steps(doc)
    return step * steps if step and steps else None


def _steps_of_run(doc: Doc):
    step, projected = metric(doc, "step_time_s"), metric(doc, "projected_run_s")
    return projected / step if step and projected else None


def _params_held_rank0(doc: Doc):
    counts = metric(doc, "params_per_module_rank0")
    return sum(counts.values()) if counts else None


def _loss(doc: Doc):
    first, last = metric(doc, "loss_first"), metric(doc, "loss_last")
    return None if first is None else f"{first:.3f} → {last:.3f}"


def _params_rank0(doc: Doc):
    counts = metric(doc, "params_per_module_rank0")
    if not counts:
        return None
    return ", ".join(f"{name} {si(n)}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def predicted_gib(doc: Doc):
    value = prediction(doc).get("gpu_mem_mib")
    return value / 1024 if value is not None else None


def _predicted_host_gib(doc: Doc):
    value = prediction(doc).get("host_mem_mib")
    return value / 1024 if value is not None else None


def predicted_time(key: str, scale: float = 1.0) -> Callable[[Doc], float | None]:
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
    predicted, measured = time_prediction(doc).get("step_time_s"), metric(doc, "step_time_s")
    return 100 * (predicted - measured) / measured if predicted and measured else None


def _whole_step_ms(doc: Doc) -> float | None:
    step, wait = metric(doc, "step_time_s"), time_prediction(doc).get("emulated_wait_s")
    return (step + wait) * 1e3 if step and wait is not None else None


COLUMNS: dict[str, Column] = {
    "gpus": Column("GPUs", lambda d: d["params"]["gpus"], str, "ranks (GPUs) of the cell", needs_ok=False),
    "global_batch": Column("global batch", lambda d: d["params"].get("global_batch"), str,
                           "micro batch x accumulation x data-parallel size", needs_ok=False),
    "step_time_ms": Column("step (ms)",
                           lambda d: metric(d, "step_time_s") and metric(d, "step_time_s") * 1e3,
                           _fmt(1), "median optimizer-step time", interval=_ci("step_time_s", 1e3)),
    "time_per_sample_ms": Column("ms/sample", _time_per_sample_ms, _fmt(2), "median step time / global batch",
                                 interval=_per_step(_ms_per_sample)),
    "timed_total_s": Column("timed (s)", _timed_total_s, _fmt(2),
                            "the study's timed steps (timed_steps x global batch samples) at the median step",
                            interval=_per_step(_timed_steps)),
    "samples_per_s": Column("samples/s", lambda d: metric(d, "samples_per_s"), _fmt(1), "samples per second",
                            interval=_ci("samples_per_s")),
    "tokens_per_s": Column("tokens/s", lambda d: metric(d, "tokens_per_s"), _fmt(0), "tokens per second",
                           interval=_ci("tokens_per_s")),
    "tflops_per_gpu": Column("TFLOPS/GPU", lambda d: metric(d, "tflops_per_gpu"), _fmt(2),
                             "model TFLOP/s per GPU (6N + 12LHQT per token)", interval=_ci("tflops_per_gpu")),
    "mfu": Column("MFU", lambda d: metric(d, "mfu"), lambda v: f"{v:.1%}",
                  "model FLOPs utilisation against the GPU's dense peak at the cell's precision (bf16 for "
                  "float8 cells: comparable across cells)", interval=_ci("mfu")),
    "mfu_fp8": Column("MFU (FP8 peak)", lambda d: metric(d, "mfu_fp8"), lambda v: f"{v:.1%}",
                      "a float8 cell's model FLOPs utilisation against the GPU's dense FP8 peak",
                      interval=_ci("mfu_fp8")),
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
    "host_mem_mib": Column("host mem (MiB)", lambda d: metric(d, "host_mem_peak_mib"), _fmt(0),
                           "peak resident memory of the busiest node's ranks together"),
    "host_mem_pct": Column("host mem %", lambda d: metric(d, "host_mem_percent_peak"), _fmt(1),
                           "peak share of the node's memory in use (all processes)"),
    "wall_min": Column("wall (min)", lambda d: metric(d, "wall_time_s") and metric(d, "wall_time_s") / 60,
                       _fmt(2), "wall time of the measured run, start-up included"),
    "projected_hms": Column("whole run (h:mm:ss)", lambda d: metric(d, "projected_run_s"), hms,
                            "projected steady-state time of the run the study describes",
                            interval=_per_step(_steps_of_run)),
    "projected_min": Column("whole run (min)", lambda d: metric(d, "projected_run_s") and
                            metric(d, "projected_run_s") / 60, _fmt(1),
                            "projected steady-state time of the run the study describes",
                            interval=_per_step(lambda d: _steps_of_run(d) and _steps_of_run(d) / 60)),
    "test_accuracy": Column("test acc.", lambda d: metric(d, "test_accuracy"), lambda v: f"{v:.1%}",
                            "accuracy on held-out data"),
    "loss": Column("loss first → last", _loss, str, "training loss at the first and last step",
                   comparable=False),
    "params_total": Column("params", lambda d: metric(d, "params_total"), si, "parameters in the model"),
    "params_rank0": Column("params held by rank 0, by module", _params_rank0, str,
                           "parameter elements rank 0 holds, by module class (ZeRO-3 shards them)",
                           comparable=False),
    "params_held_rank0": Column("params held by rank 0", _params_held_rank0, si,
                                "parameter elements rank 0 holds, all modules together"),
    "predicted_gpu_mem_gib": Column("predicted GPU mem, worst rank (GiB, nvidia-smi)", predicted_gib,
                                    _fmt(1),
                                    "the memory model's prediction of the busiest GPU's NVML 'used' memory",
                                    needs_ok=False, comparable=False),
    "predicted_host_mem_gib": Column("predicted host mem (GiB)", _predicted_host_gib, _fmt(1),
                                     "the memory model's prediction of the busiest node's ranks' memory",
                                     needs_ok=False, comparable=False),
    "predicted_step_time_ms": Column("predicted step (ms)", predicted_time("step_time_s", 1e3), _fmt(1),
                                     "the time model's optimizer-step time (docs/time-model.md)",
                                     needs_ok=False, comparable=False),
    "predicted_samples_per_s": Column("predicted samples/s", predicted_time("samples_per_s"), _fmt(1),
                                      "global batch / the time model's step time", needs_ok=False,
                                      comparable=False),
    "predicted_mfu": Column("predicted MFU", predicted_time("mfu"), lambda v: f"{v:.1%}",
                            "MFU at the time model's step time", needs_ok=False, comparable=False),
    "whole_step_ms": Column("whole step (ms, modelled wait)", _whole_step_ms, _fmt(1),
                            "an emulated rank's measured step plus what its world adds as the time model has "
                            "it (exposed communication, a pipeline's bubble, the node's shared host): the "
                            "world's step, compute measured and communication modelled",
                            comparable=False),
    "step_time_error_pct": Column("time model error", _step_time_error_pct, lambda v: f"{v:+.0f}%",
                                  "predicted step time against the measured median", needs_ok=True,
                                  comparable=False),
}


def _breakdown(doc: Doc) -> dict | None:
    return metric(doc, "breakdown")


def _part_share(part: str) -> Callable[[Doc], float | None]:
    def value(doc: Doc):
        found = _breakdown(doc)
        return found and found["parts_s"][part] / found["step_s"]
    return value


def _exposed_ms(doc: Doc):
    found = _breakdown(doc)
    return found and found["parts_s"]["exposed_communication"] * 1e3


# where a profiled step's time went (execute/profiling.py), for cells run with timing's profile_steps
BREAKDOWN_COLUMNS: dict[str, Column] = {
    **{f"time_{part}": Column(f"{part.replace('_', ' ')} %", _part_share(part), lambda v: f"{v:.0%}",
                              f"share of a profiled step: {MEANINGS[part]}", comparable=False)
       for part in PARTS},
    "exposed_comm_ms": Column("exposed comm (ms)", _exposed_ms, _fmt(1),
                              "collective time per profiled step that no compute overlapped",
                              comparable=False),
    "comm_hidden": Column("comm hidden", lambda d: (_breakdown(d) or {}).get("communication_hidden"),
                          lambda v: f"{v:.0%}", "share of the collectives' time that compute overlapped",
                          comparable=False),
}


def _scaling(doc: Doc) -> float | None:
    """A scaled cell's samples/s per GPU over the one-GPU cell of its set-up (plots.with_scaling attaches
    it); none where the two ran on different machines (their host ids differ): hosts of one type differ
    by a few per cent, as much as what scaling loses."""
    scaling = doc.get("scaling") or {}
    return None if scaling.get("same_host") is False else scaling.get("efficiency")


COLUMNS["scaling_efficiency"] = Column(
    "scaling efficiency", _scaling, lambda v: f"{v:.1%}",
    "samples/s per GPU over the one-GPU cell of the same set-up and machine (100%: linear)", comparable=False)
COLUMNS.update(BREAKDOWN_COLUMNS)

# what the timed steps cost in energy (NVML's counter on every GPU cell: execute/gpus.py EnergyCounter)
ENERGY_COLUMNS: dict[str, Column] = {
    "energy_j_step": Column("energy (J/step)", lambda d: metric(d, "energy_j_per_step"), _fmt(1),
                            "joules per optimizer step, the cell's GPUs together, over the timed windows"),
    "energy_mj_token": Column("energy (mJ/token)", lambda d: metric(d, "energy_j_per_token") and
                              metric(d, "energy_j_per_token") * 1e3, _fmt(3),
                              "millijoules per trained token, the cell's GPUs together"),
    "gpu_power_w": Column("GPU power (W)", lambda d: metric(d, "gpu_power_w"), _fmt(0),
                          "mean power of the cell's GPUs over the timed windows"),
}
COLUMNS.update(ENERGY_COLUMNS)
# names a study's `report` may give for several columns at once
COLUMN_SETS = {"breakdown": list(BREAKDOWN_COLUMNS), "energy": list(ENERGY_COLUMNS)}


# The summary table every study's markdown opens with (reporting.answer): its columns and what each means
SUMMARY_COLUMNS = {
    "set-up": "framework and strategy, the settings the study varies, model, precision, micro batch x "
              "gradient accumulation",
    "GPUs": "the cell's ranks (GPUs), and its nodes where more than one; emulated: one rank of that world "
            "measured alone on one GPU, with the cap its GPU memory was held to",
    "result": "ok; noisy where its interval stayed wider than the study's target; OOM at init or at step k; "
              "unsupported, infeasible, failed or timeout with the reason (a long one numbered under the "
              "table)",
    "tokens/s per GPU": "tokens per second over the cell's GPUs (CPU ranks: per rank), ± half its 95% "
                        "interval; (compute): an emulated rank's compute alone",
    "MFU": "model FLOPs utilisation against the GPU's dense peak at the cell's precision (bf16 for float8 "
           "cells)",
    "GPU mem, peak (GiB)": "peak NVML 'used' memory of the busiest GPU, as nvidia-smi shows it; an OOM's "
                           "at the OOM",
    "step, ms (predicted)": "median optimizer-step time, and the time model's for the GPU it ran on; "
                            "compute: an emulated rank's compute alone, beside the model's whole step",
}


def expand_sets(report: list[str]) -> list[str]:
    """A study's report columns with every set (COLUMN_SETS) replaced by its columns."""
    return [name for entry in report for name in COLUMN_SETS.get(entry, [entry])]


def with_predictions(report: list[str], docs: list[Doc]) -> list[str]:
    """Every study's table shows the memory model's prediction next to what was measured, and a GPU
    study's the time model's step time and samples/s (planned cells: predicted only; measured ones: beside
    the measurement, with the prediction's error)."""
    report = expand_sets(report)
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
    half = metric(doc, "ci_half_width")
    if half is None:
        return f"noisy ({metric(doc, 'windows')} windows: no interval)"
    return f"noisy (±{half:.1%})"


def emulated(doc: Doc) -> str | None:
    """"emulated rank r of N" for a cell measured as one rank of its world alone (emulation.py)."""
    section = doc.get("emulation")
    return f"emulated rank {section['rank']} of {section['world_size']}" if section else None


def result_text(doc: Doc, notes: list[str] | None = None) -> str:
    """A cell's outcome for the table: "ok", "OOM at step 23 (timed)", "unsupported: why"; an emulated
    cell's starts with "emulated rank r of N: ". With a notes list, a long reason becomes a numbered
    footnote there (shared by every cell that gives it)."""
    text = outcome_text(doc, notes)
    return f"{emulated(doc)}: {text}" if emulated(doc) else text


def outcome_text(doc: Doc, notes: list[str] | None = None, footnote_after: int = FOOTNOTE_AFTER) -> str:
    """The outcome alone, without the emulated rank it ran as (the summary says that in its GPUs); with a
    notes list, a reason longer than `footnote_after` characters becomes a numbered footnote."""
    status, reason = doc["status"], doc.get("reason")
    insane = sanity_problems(doc)
    if status == "ok" and insane:  # it ran, but what it timed was not sane training: no figure of it counts
        status, reason = "ok, not sane", "; ".join(insane)
    elif status == "ok":
        return f"ok, {noisy_text(doc)}" if metric(doc, "noisy") else "ok"
    if status == "oom":
        # "OOM at step 23 (timed) on rank 0, 1: <allocator message>" -> the part before the ranks
        return reason.split(" on rank")[0] if reason else "OOM"
    if not reason:
        return status
    if notes is not None and len(reason) > footnote_after:
        if reason not in notes:
            notes.append(reason)
        return f"{status} [{notes.index(reason) + 1}]"
    return f"{status}: {reason}"


def cell_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else str(value)


def escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def column_values(doc: Doc, name: str) -> tuple[Any, tuple[float, float] | None]:
    """One table cell's value and its interval: what the markdown shows and the CSV keeps."""
    column = COLUMNS[name]
    if column.needs_ok and doc["status"] != "ok":
        return None, None
    value = column.value(doc)
    return value, (column.interval(doc) if column.interval and value is not None else None)




def report_problems(study: str, report: list[str]) -> list[str]:
    """Report columns of a study that no table knows, each naming its key (found before any job runs,
    not when the table is made)."""
    problems = []
    for column in report:
        if column not in COLUMNS and column not in COLUMN_SETS:
            close = difflib.get_close_matches(column, [*COLUMNS, *COLUMN_SETS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"studies.{study}.report: unknown column {column!r}{hint}; "
                            f"`trainbench columns` lists them")
    return problems
