"""metrics.json: the public schema, atomic writing, and reading cells back.

A cell's metrics.json is written once, at the end, by renaming a finished temporary file over the
target: readers see the old file or the new one, never half of one, and a run killed before the
rename leaves no metrics.json at all.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "unsupported", "infeasible", "failed", "timeout")

# each timed figure's 95% interval [low, high], how tight the step time's is, and how it was timed
# (timing.py); results from before timing windows get them from their per-step times (`current`)
INTERVAL_KEYS = ("step_time_s_ci", "samples_per_s_ci", "tokens_per_s_ci", "tflops_per_gpu_ci", "mfu_ci",
                 "ci_half_width", "noisy", "steps_per_window", "windows")
METRIC_KEYS = (
    "warmup_steps", "steps_timed", "step_time_s", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu",
    *INTERVAL_KEYS,
    "wall_time_s", "projected_run_s", "gpu_mem_used_mib", "gpu_mem_total_mib", "torch_peak_allocated_mib",
    "torch_peak_reserved_mib", "host_mem_peak_mib", "loss_first", "loss_last", "test_accuracy",
    "params_total", "params_per_module_rank0",
)
PREDICTED_KEYS = ("gpu_mem_mib", "host_mem_mib", "fits")
PROVENANCE_KEYS = (
    "gpu_name", "gpu_count", "nodes", "driver", "cuda", "hostname", "versions", "git_commit", "slurm_job_id",
    "started", "ended", "command",
)
VERSION_KEYS = ("python", "torch", "deepspeed", "lightning", "transformers", "snakemake")
TOP_KEYS = ("schema", "study", "cell_id", "params", "params_hash", "status", "reason", "metrics", "predicted",
            "provenance")


def empty_metrics() -> dict[str, Any]:
    return {key: None for key in METRIC_KEYS}


def empty_predicted() -> dict[str, Any]:
    return {key: None for key in PREDICTED_KEYS}


_NUMBER = {"type": ["number", "null"]}
_NUMBERS = {"type": ["array", "null"], "items": {"type": ["number", "null"]}}
_INTERVAL = {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
# Types of the metrics every reader relies on (the rest: numbers or null).
_METRIC_TYPES: dict[str, dict] = {
    "gpu_mem_used_mib": _NUMBERS, "gpu_mem_total_mib": _NUMBERS, "torch_peak_allocated_mib": _NUMBERS,
    "torch_peak_reserved_mib": _NUMBERS, "params_per_module_rank0": {"type": ["object", "null"]},
    "noisy": {"type": ["boolean", "null"]}, "step_times_s": {"type": "array", "items": {"type": "number"}},
    **{key: _INTERVAL for key in INTERVAL_KEYS if key.endswith("_ci")},
}


def metrics_json_schema() -> dict[str, Any]:
    """The JSON schema of metrics.json: what every reader (tables, plots, compare, searches) relies on."""
    metrics = {key: _METRIC_TYPES.get(key, _NUMBER) for key in METRIC_KEYS}
    metrics["step_times_s"] = _METRIC_TYPES["step_times_s"]
    return {
        "type": "object",
        "properties": {
            "schema": {"const": SCHEMA_VERSION},
            "study": {"type": "string", "minLength": 1},
            "cell_id": {"type": "string", "minLength": 1},
            "params": {"type": "object", "required": ["model", "framework", "strategy", "gpus", "global_batch"]},
            "params_hash": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
            "status": {"enum": list(STATUSES)},
            "reason": {"type": ["string", "null"]},
            "metrics": {"type": "object", "properties": metrics},
            "predicted": {"type": "object"},
            "provenance": {"type": "object", "properties": {"versions": {"type": "object"}}},
        },
        # a finished run has its timed windows: everything its figures come from
        "if": {"properties": {"status": {"const": "ok"}}},
        "then": {"properties": {"metrics": {"required": ["step_times_s"], "properties": {
            "step_times_s": {"minItems": 1}, "step_time_s": {"type": "number", "exclusiveMinimum": 0}}}}},
    }


def schema_problems(doc: Any) -> list[str]:
    """What is missing or wrong in a metrics.json document; empty when it follows the schema."""
    if not isinstance(doc, dict):
        return [f"a {type(doc).__name__}, not a JSON object"]
    problems = [f"missing key {k!r}" for k in TOP_KEYS if k not in doc]
    if problems:
        return problems
    if doc["schema"] != SCHEMA_VERSION:
        problems.append(f"schema {doc['schema']!r} is not {SCHEMA_VERSION}")
    if doc["status"] not in STATUSES:
        problems.append(f"status {doc['status']!r} is not one of {STATUSES}")
    if doc["status"] != "ok" and not doc["reason"]:
        problems.append(f"status {doc['status']!r} needs a reason")
    for section, keys in (("metrics", METRIC_KEYS), ("predicted", PREDICTED_KEYS),
                          ("provenance", PROVENANCE_KEYS)):
        if not isinstance(doc[section], dict):
            problems.append(f"{section} is not an object")
            continue
        problems += [f"missing key {section}.{k}" for k in keys if k not in doc[section]]
    if problems:
        return problems
    problems += [f"missing key provenance.versions.{k}" for k in VERSION_KEYS
                 if k not in (doc["provenance"].get("versions") or {})]
    import jsonschema

    for error in sorted(jsonschema.Draft202012Validator(metrics_json_schema()).iter_errors(doc),
                        key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        problems.append(f"{where}: {error.message}")
    return problems


def write_json_atomic(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)


# How results from before timing windows were timed: every step synchronised and timed alone.
PER_STEP_METHOD = "synchronised steps (each step timed alone, before timing windows)"


def with_intervals(params: dict[str, Any], metrics: dict[str, Any] | None, gpu_name: str | None) -> dict[str, Any]:
    """Metrics in the current shape. Results written before timing windows existed kept one time per
    step: windows of one step, which give their intervals by the same computation."""
    metrics = dict(metrics or {})
    if "step_time_s_ci" in metrics:
        return metrics
    if metrics.get("step_times_s") and params.get("model"):
        from trainbench.metrics import timed_metrics

        figures = timed_metrics(params, metrics["step_times_s"], steps_per_window=1, gpu_name=gpu_name)
        return {**metrics, **figures, "timing": {"method": PER_STEP_METHOD}}
    return {**{key: None for key in INTERVAL_KEYS}, **metrics}


def current(doc: dict[str, Any]) -> dict[str, Any]:
    """A metrics.json document in the current shape (see with_intervals)."""
    if not isinstance(doc.get("metrics"), dict) or not isinstance(doc.get("params"), dict):
        return doc  # not a result: schema_problems says why
    gpu_name = (doc.get("provenance") or {}).get("gpu_name")
    return {**doc, "metrics": with_intervals(doc["params"], doc["metrics"], gpu_name)}


class InvalidResult(ValueError):
    """A file that should be a result and is not one (unreadable, or not following its schema)."""


def read_result(path: str | Path) -> dict[str, Any]:
    """One metrics.json, checked against the schema and in the current shape; InvalidResult says why not."""
    try:
        doc = read_json(path)
    except (OSError, ValueError) as error:
        raise InvalidResult(f"{path}: unreadable: {error}") from None
    try:
        doc = current(doc)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:  # figures that make no sense
        raise InvalidResult(f"{path}: not a metrics.json of schema {SCHEMA_VERSION}: "
                            f"{type(error).__name__}: {error}") from None
    problems = schema_problems(doc)
    if problems:
        raise InvalidResult(f"{path}: not a metrics.json of schema {SCHEMA_VERSION}: {'; '.join(problems)}")
    return doc


# max_batch.json: a max-batch search's answer (batch_search.summary writes it)
SEARCH_KEYS = ("study", "cell_id", "max_micro_batch", "max_global_batch", "tolerance", "bound", "hardware",
               "first_failure", "probes", "metrics_at_max")


def read_search(path: str | Path) -> dict[str, Any]:
    """One max_batch.json, checked; InvalidResult says why it is not one."""
    try:
        doc = read_json(path)
    except (OSError, ValueError) as error:
        raise InvalidResult(f"{path}: unreadable: {error}") from None
    if not isinstance(doc, dict):
        raise InvalidResult(f"{path}: not a max_batch.json: a {type(doc).__name__}, not a JSON object")
    missing = [k for k in SEARCH_KEYS if k not in doc]
    if missing or not isinstance(doc["probes"], list) or not doc["probes"]:
        problem = f"missing key {missing[0]!r}" if missing else "no probes"
        raise InvalidResult(f"{path}: not a max_batch.json: {problem}")
    return doc


def result_problem(path: str | Path) -> str | None:
    """Why an existing result file cannot be used (None when it can): for `trainbench cells` and for the
    workflow, which runs such a cell again rather than let it reach a table."""
    try:
        (read_search if Path(path).name == "max_batch.json" else read_result)(path)
    except InvalidResult as error:
        return str(error).split(": ", 1)[1]
    return None


def read_cells(paths) -> list[dict[str, Any]]:
    """metrics.json documents in the order given; a missing or malformed file is an error, not a gap."""
    return [read_result(path) for path in paths]
