"""The memory and time models' predictions beside each result: for the machine a measured cell ran on,
for the study's planning hardware for a planned cell. The current models' figures, so tables follow
improvements to them; the prediction a run was launched with stays in its metrics.json.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trainbench.study.grid import Cell
from trainbench.study.params import CellParams

Doc = dict[str, Any]  # one cell's metrics.json, as read


def counted(params: CellParams) -> CellParams:
    """The cell, its model counted first where it is one of the config's `models` (whose facts the
    predictions read: trainbench.training.user_models, once per definition)."""
    if params.model_definition:
        from trainbench.training.user_models import register_from_params

        register_from_params(params.model, params.model_definition)
    return params


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
        return predict(counted(CellParams.from_dict(doc["params"])), hardware_of_run(doc)).as_dict()
    except (KeyError, TypeError, ValueError):  # a model or strategy it does not know, or not a cell's
        return {}


# The profile's parts (execute/profiling.py) that each part of the time model's step stands for: its
# compute is the kernels of forward and backward; its communication what overlap left exposed; its
# optimizer the optimizer's kernels, the host's time in it and the copies offload adds; its fixed
# costs per step (the loop, the engine) the time the device waits for the host.
MODEL_PARTS = {"compute": ("matmul", "attention", "other_kernels"),
               "communication": ("exposed_communication",),
               "optimizer": ("optimizer_kernels", "optimizer_host", "exposed_copies"),
               "framework": ("idle",)}


def profiled_parts(metrics: dict[str, Any]) -> dict[str, float]:
    """A profiled cell's step as the time model's parts, seconds at its timed median ({} where the
    cell was not profiled): the profile's shares are applied to the timed step, since the profiler's
    own cost lengthens the profiled steps, not the parts' proportions."""
    measured, step = metrics.get("breakdown"), metrics.get("step_time_s")
    if not measured or not step:
        return {}
    scale = step / measured["step_s"]
    return {part: sum(measured["parts_s"][p] for p in profiled) * scale
            for part, profiled in MODEL_PARTS.items()}


def parts_compared(doc: Doc) -> dict[str, tuple[float, float]]:
    """Each part of the time model's step, (measured, predicted) seconds per step, for a profiled cell
    the model predicts ({} otherwise)."""
    measured = profiled_parts(doc.get("metrics") or {})
    predicted = time_prediction(doc).get("parts_s")
    if not measured or not predicted or doc.get("emulation"):
        return {}
    return {part: (measured[part], predicted[part]) for part in MODEL_PARTS}


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
    try:
        params = counted(CellParams.from_dict(doc["params"]))
    except (TypeError, ValueError):  # not a whole cell's parameters: the model says nothing of it
        return {}
    predicted = time_model.predict(params, gpu, cpu_threads=threads)
    if not predicted:
        return {}
    found = predicted.as_dict()
    if doc.get("emulation") and doc["status"] == "ok":  # what its world adds to the rank's measured step
        found["emulated_wait_s"] = time_model.waiting_s(params, gpu, cpu_threads=threads,
                                                        whole_s=predicted.step_time_s)
    return found


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

    counted(cell.params)
    doc: Doc = {"study": cell.study, "cell_id": cell.cell_id, "params": cell.params.as_dict(), "metrics": {},
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
