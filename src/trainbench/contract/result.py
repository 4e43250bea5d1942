"""A cell's result, as a type: metrics.json's contract (every key declared once, with its type and
meaning; the JSON schema generated from the declarations), the migration of older files to the current
shape, and `Result`, the typed document every stage after this one reads.

Reading never recomputes in silence: what a file holds is what `Result.metrics` holds. Where a
reader needs a figure the file lacks and can derive (the intervals of a result from before timing
windows), it is a field of its own, named for what it is (`Result.per_step_figures`).

The schema's version has stayed 1 since metrics.json was first published: its shape grew within it
(parameters and interval keys added), and `MIGRATIONS` bring such a file up to the current shape,
each step named, and `Result.migrated` says which a file took. A file of another version is not a
result this code can read.

A cell's metrics.json is written once, at the end, by renaming a finished temporary file over the
target (write_json_atomic): readers see the old file or the new one, never half of one, and a run
killed before the rename leaves no metrics.json at all.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainbench.contract.figures import timed_metrics
from trainbench.study.params import CellParams, with_optional_defaults

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "unsupported", "infeasible", "failed", "timeout")

_NUMBER = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_TEXT = {"type": ["string", "null"]}
_NUMBERS = {"type": ["array", "null"], "items": {"type": ["number", "null"]}}
_INTERVAL = {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2, "maxItems": 2}

# A run's phases, in order: each ends at a mark (the cell runner's `launched` and `exited`, rank 0's
# others: worker.py), and together they span the run's wall time.
PHASES = (
    ("launch", "process_start", "the launcher's start until rank 0's process exists (torchrun, "
                                "the DeepSpeed launcher)"),
    ("imports", "imported", "rank 0's imports: Python, torch, the framework"),
    ("builds", "ops_loaded", "DeepSpeed's ops the cell steps with (CPU Adam for an offloaded optimizer): "
                             "compiled once per environment, loaded from its cache after"),
    ("setup", "built", "process group, memory sampler, model build, wrapping, optimizer"),
    ("first_step", "first_step", "the first warm-up step: compilation and other first-call costs"),
    ("warmup", "warmed_up", "the other warm-up steps"),
    ("timed", "timed", "the timed windows"),
    ("profiled", "profiled", "the profiled steps after them, where timing's profile_steps asks for some"),
    ("teardown", "exited", "gathering results, shutting down, the launcher's exit"),
)


# The parts of a profiled step (metrics.breakdown.parts_s), in the order they win an instant
# (execute/profiling.py says how a trace is split into them).
PARTS = ("matmul", "attention", "other_kernels", "optimizer_kernels", "exposed_communication",
         "exposed_copies", "optimizer_host", "idle")
MEANINGS = {
    "matmul": "matrix multiplies of forward and backward",
    "attention": "attention kernels (flash, memory-efficient, cuDNN; a CPU rank's SDPA)",
    "other_kernels": "every other kernel of forward and backward: norms, activations, the loss, casts",
    "optimizer_kernels": "kernels the optimizer step launched (a CPU rank: its ops)",
    "exposed_communication": "collectives that no compute overlapped",
    "exposed_copies": "host-device copies that nothing overlapped",
    "optimizer_host": "the host stepping the optimizer while the device had nothing to do (CPU Adam)",
    "idle": "the device waiting for the host: launches, Python, synchronisation",
}


@dataclass(frozen=True)
class Key:
    """One key of metrics.json: its JSON-schema type, what it means, and whether every result has it
    (null where it does not apply); the others appear where they apply."""

    name: str
    schema: dict[str, Any]
    meaning: str
    required: bool = True


# The metrics section. Every key a table, plot, comparison or model reads is declared here.
METRICS: tuple[Key, ...] = (
    Key("warmup_steps", _INT, "optimizer steps run before timing"),
    Key("steps_timed", _INT, "optimizer steps in the timed windows"),
    Key("step_time_s", _NUMBER, "median over the timed windows of their mean step time (timing.py)"),
    Key("samples_per_s", _NUMBER, "global batch / step time"),
    Key("tokens_per_s", _NUMBER, "samples/s x sequence length"),
    Key("tflops_per_gpu", _NUMBER, "model TFLOP/s per GPU (6N + 12LHQT per token)"),
    Key("mfu", _NUMBER, "model FLOPs utilisation against the GPU's dense peak at the training precision"),
    Key("step_time_s_ci", _INTERVAL, "the step time's 95% interval [low, high]"),
    Key("samples_per_s_ci", _INTERVAL, "samples/s's 95% interval"),
    Key("tokens_per_s_ci", _INTERVAL, "tokens/s's 95% interval"),
    Key("tflops_per_gpu_ci", _INTERVAL, "TFLOPS/GPU's 95% interval"),
    Key("mfu_ci", _INTERVAL, "MFU's 95% interval"),
    Key("mfu_fp8", _NUMBER, "a float8 cell's MFU against the GPU's dense FP8 peak (mfu: against the "
        "bf16 peak, comparable across cells)", required=False),
    Key("mfu_fp8_ci", _INTERVAL, "its 95% interval", required=False),
    Key("ci_half_width", _NUMBER, "half the step time's interval over its median (0.02: ±2%)"),
    Key("noisy", {"type": ["boolean", "null"]}, "the interval stayed wider than the study's target_ci"),
    Key("steps_per_window", _INT, "optimizer steps per timed window"),
    Key("windows", _INT, "timed windows"),
    Key("wall_time_s", _NUMBER, "wall time of the run, start-up included"),
    Key("projected_run_s", _NUMBER, "steady-state time of the whole run the study describes"),
    Key("gpu_mem_used_mib", _NUMBERS, "peak NVML 'used' memory of every GPU (as nvidia-smi shows it)"),
    Key("gpu_mem_total_mib", _NUMBERS, "NVML total memory of every GPU"),
    Key("torch_peak_allocated_mib", _NUMBERS, "torch's peak allocated memory, per rank"),
    Key("torch_peak_reserved_mib", _NUMBERS, "torch's peak reserved memory, per rank"),
    Key("host_mem_peak_mib", _NUMBER, "peak resident memory of the busiest node's ranks together"),
    Key("loss_first", _NUMBER, "training loss at the first step"),
    Key("loss_last", _NUMBER, "training loss at the last step"),
    Key("loss_curve", _NUMBERS, "the training loss at every step, warm-up included (the rank that "
        "reports: its micro batches' mean)", required=False),
    Key("optimizer_steps_skipped", _INT, "timed steps whose optimizer step the framework skipped (fp16 "
        "loss scaling found an overflow); null where the framework does not say", required=False),
    Key("test_accuracy", _NUMBER, "accuracy on held-out data, where the study measures it"),
    Key("params_total", _INT, "parameters of the whole model"),
    Key("params_per_module_rank0", {"type": ["object", "null"]},
        "parameter elements rank 0 holds, by module class"),
    Key("step_times_s", {"type": "array", "items": {"type": "number"}}, "every timed window's mean step time "
        "(runs from before windows: every step's time)", required=False),
    Key("warmup_step_times_s", _NUMBERS, "every warm-up step's time", required=False),
    Key("timing", {"type": "object"}, "how the cell was timed: method, why it stopped, the study's timing "
        "settings", required=False),
    Key("flops_per_token", _NUMBER, "model FLOPs per token of a training step", required=False),
    Key("host_rss_peak_mib_per_rank", _NUMBERS, "peak resident memory of each rank", required=False),
    Key("tensors_held_bytes_per_rank", {"type": "array", "items": {"type": ["object", "null"]}},
        "bytes of the tensors each CPU rank holds at the end of its run, by device type "
        "(metrics.tensors_held_bytes; null for GPU ranks, which have their allocator's peaks)",
        required=False),
    Key("params_held_per_rank", {"type": "array", "items": {"type": "integer"}},
        "parameter elements each rank holds (its shards)", required=False),
    Key("host_mem_used_peak_mib", _NUMBER, "peak memory in use on the node, all processes", required=False),
    Key("host_mem_percent_peak", _NUMBER, "the same as a share of the node's memory", required=False),
    Key("phases_s", {"type": "object", "additionalProperties": {"type": "number"}},
        "where the run's wall time went, in seconds: " + ", ".join(f"{name} ({meaning})"
                                                               for name, _, meaning in PHASES),
        required=False),
    Key("timed_share", _NUMBER, "the timed windows' share of the run's wall time", required=False),
    Key("breakdown", {"type": "object", "required": ["timeline", "steps", "step_s", "parts_s"]},
        "where a profiled step's time went on the reporting rank (execute/profiling.py): seconds per step "
        "by part, collective and copy time, the share of collectives hidden, its trace", required=False),
    Key("breakdown_per_rank", {"type": "array", "items": {"type": ["object", "null"]}},
        "every rank's breakdown, where more than one rank was profiled", required=False),
    Key("memory_snapshot", {"type": "object", "required": ["peak_allocated_mib", "peak_by_category_mib"]},
        "the GPU allocator's snapshot (execute/profiling.py) at an OOM, or at the end where timing's "
        "memory_snapshot asks: its peak by category (parameters, gradients, optimizer states, "
        "activations and other), allocated and reserved memory, the pickle beside metrics.json",
        required=False),
    Key("gpu_energy_j_per_rank", _NUMBERS, "each rank's GPU energy over the timed windows (NVML's energy "
        "counter read at both ends of every window), joules", required=False),
    Key("energy_j_per_step", _NUMBER, "the cell's GPUs together, joules per optimizer step over the timed "
        "windows (not for an emulated rank: its world's other GPUs were not there)", required=False),
    Key("energy_j_per_token", _NUMBER, "energy_j_per_step / tokens per step", required=False),
    Key("gpu_power_w", _NUMBER, "mean power of the cell's GPUs over the timed windows, watts",
        required=False),
    Key("dataset", _TEXT, "the data accuracy was measured on", required=False),
    Key("test_samples", _INT, "held-out samples accuracy was measured on", required=False),
)
PREDICTED: tuple[Key, ...] = (
    Key("gpu_mem_mib", _NUMBER, "the memory model's per-GPU prediction (NVML 'used')"),
    Key("host_mem_mib", _NUMBER, "its prediction for the busiest node's host memory"),
    Key("fits", {"type": ["boolean", "null"]}, "whether both fit the hardware the cell was given"),
)
PROVENANCE: tuple[Key, ...] = (
    Key("gpu_name", _TEXT, "the GPU model"), Key("gpu_count", _INT, "GPUs of the cell"),
    Key("nodes", _INT, "nodes of the cell"), Key("driver", _TEXT, "the NVIDIA driver"),
    Key("cuda", _TEXT, "torch's CUDA version"), Key("hostname", _TEXT, "the (first) node"),
    Key("host_id", _TEXT, "which machine and boot of it: a hash of its machine and boot ids (hostnames "
        "repeat)", required=False),
    Key("versions", {"type": "object"}, "python, torch, deepspeed, lightning, transformers, snakemake"),
    Key("git_commit", _TEXT, "the code's commit (-dirty: with changes)"),
    Key("slurm_job_id", _TEXT, "the SLURM job, where there is one"),
    Key("started", _TEXT, "ISO 8601"), Key("ended", _TEXT, "ISO 8601"),
    Key("command", _TEXT, "the launch command"),
    Key("gpu_memory_mib", _NUMBER, "memory of one GPU (NVML)", required=False),
    Key("host_mem_total_mib", _NUMBER, "the node's memory", required=False),
    Key("cpu_count", _INT, "the node's CPUs", required=False),
    Key("cpu_model", _TEXT, "the node's CPU model (/proc/cpuinfo): host-bound steps run at its pace",
        required=False),
    Key("host_pace_ms", _NUMBER, "ms one of the node's cores takes for a fixed piece of Python work "
        "(provenance.host_pace_ms; lower is faster): the pace host-bound steps run at", required=False),
    Key("gpu_power_limit_w", _NUMBER, "the power limit the GPU enforces (NVML)", required=False),
    Key("gpu_sm_clock_max_mhz", _INT, "the GPU's maximum SM clock", required=False),
    Key("gpu_mem_clock_max_mhz", _INT, "its maximum memory clock", required=False),
    Key("gpu_sm_clock_app_mhz", _INT, "the SM clock applications run at", required=False),
    Key("gpu_topology", _TEXT, "how the node's GPUs connect: `nvidia-smi topo -m`", required=False),
    Key("host_alone", {"type": ["boolean", "null"]}, "whether a GPU cell run on one machine held it alone "
        "(the slot pool's host lock; TRAINBENCH_SHARE_HOST=1: no); absent under SLURM and on CPU",
        required=False),
    Key("slurm_restart_count", _INT, "times SLURM requeued the job before this run (preemption)",
        required=False),
    Key("slurm_array_job_id", _TEXT, "the job array the cell's job was a task of", required=False),
    Key("slurm_array_task_id", _TEXT, "its task in the array", required=False),
)
METRIC_KEYS = tuple(k.name for k in METRICS if k.required)
PREDICTED_KEYS = tuple(k.name for k in PREDICTED if k.required)
PROVENANCE_KEYS = tuple(k.name for k in PROVENANCE if k.required)
# each timed figure's 95% interval, how tight the step time's is, and how it was timed (timing.py);
# results from before timing windows get them from their per-step times (`current`)
INTERVAL_KEYS = ("step_time_s_ci", "samples_per_s_ci", "tokens_per_s_ci", "tflops_per_gpu_ci", "mfu_ci",
                 "ci_half_width", "noisy", "steps_per_window", "windows")
VERSION_KEYS = ("python", "torch", "deepspeed", "lightning", "transformers", "snakemake")
TOP_KEYS = ("schema", "study", "cell_id", "params", "params_hash", "status", "reason", "metrics", "predicted",
            "provenance")


def empty_metrics() -> dict[str, Any]:
    return {key: None for key in METRIC_KEYS}


def empty_predicted() -> dict[str, Any]:
    return {key: None for key in PREDICTED_KEYS}


def _section(keys: tuple[Key, ...]) -> dict[str, Any]:
    return {"type": "object", "properties": {k.name: k.schema for k in keys}}


def metrics_json_schema() -> dict[str, Any]:
    """The JSON schema of metrics.json, from the declared keys: what every reader relies on."""
    return {
        "type": "object",
        "properties": {
            "schema": {"const": SCHEMA_VERSION},
            "study": {"type": "string", "minLength": 1},
            "cell_id": {"type": "string", "minLength": 1},
            "params": {"type": "object",
                       "required": ["model", "framework", "strategy", "gpus", "global_batch"]},
            "params_hash": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
            "status": {"enum": list(STATUSES)},
            "reason": {"type": ["string", "null"]},
            "metrics": _section(METRICS),
            "predicted": _section(PREDICTED),
            "provenance": _section(PROVENANCE),
            # an emulated cell's (emulation.py): which rank of which world, and what was measured,
            # modelled and derived rather than measured
            "emulation": {"type": "object",
                          "required": ["rank", "world_size", "ranks_per_node", "not_measured"],
                          "properties": {"rank": {"type": "integer", "minimum": 0},
                                         "world_size": {"type": "integer", "minimum": 2},
                                         "ranks_per_node": {"type": "integer", "minimum": 1},
                                         "measured": {"type": "object"}, "modelled": {"type": "object"},
                                         "derived": {"type": "object"}, "not_measured": {"type": "string"}}},
            # a cell held to a smaller GPU (gpu_mem_limit_gib): the limit and the allocator's share of it
            "device_limit": {"type": ["object", "null"]},
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

def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` to `path` whole or not at all: written beside it, then moved over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


# --- filling the metrics section from the ranks' reports (worker.py writes them) -------------------


def read_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)


# --- older files: the migration to the current shape ------------------------------------------------
# How results from before timing windows were timed: every step synchronised and timed alone.
PER_STEP_METHOD = "synchronised steps (each step timed alone, before timing windows)"


@dataclass(frozen=True)
class Migration:
    """One step from an older shape of metrics.json to the current one: `applies` says whether a
    document (a JSON object with params and metrics) needs it, `apply` returns it changed."""

    name: str
    meaning: str
    applies: Callable[[dict[str, Any]], bool]
    apply: Callable[[dict[str, Any]], dict[str, Any]]


def _lacks_optional_parameters(doc: dict[str, Any]) -> bool:
    return with_optional_defaults(doc["params"]) != doc["params"]


def _with_optional_parameters(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "params": with_optional_defaults(doc["params"])}


def _lacks_intervals(doc: dict[str, Any]) -> bool:
    return any(key not in doc["metrics"] for key in INTERVAL_KEYS)


def _with_null_intervals(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "metrics": {**{key: None for key in INTERVAL_KEYS}, **doc["metrics"]}}


MIGRATIONS: tuple[Migration, ...] = (
    Migration("optional parameters", "a parameter added after the file was written: its default, the "
              "value every run before it had", _lacks_optional_parameters, _with_optional_parameters),
    Migration("intervals", "a result from before timing windows has no intervals: null (its per-step "
              "times give them: Result.per_step_figures)", _lacks_intervals, _with_null_intervals),
)


def migrate(doc: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A metrics.json document in the current shape, and the names of the migrations it took; a
    document that is not a result comes back as it is (schema_problems says why)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict) \
            or not isinstance(doc.get("params"), dict) or doc.get("schema") != SCHEMA_VERSION:
        return doc, ()
    applied = []
    for step in MIGRATIONS:
        if step.applies(doc):
            doc = step.apply(doc)
            applied.append(step.name)
    return doc, tuple(applied)


def with_intervals(params: dict[str, Any], metrics: dict[str, Any] | None,
                   gpu_name: str | None) -> dict[str, Any]:
    """Metrics with their intervals, from a result's parameters (as its metrics.json holds them) and
    metrics: those of a result from before timing windows (one time per step: windows of one step,
    which give their intervals by the same computation) derived, and marked so by their timing method.
    For a max_batch.json's metrics_at_max; a metrics.json keeps them apart (Result.per_step_figures)."""
    metrics = dict(metrics or {})
    if "step_time_s_ci" in metrics:
        return metrics
    figures = per_step_figures(params, metrics, gpu_name)
    if figures is not None:
        return {**metrics, **figures}
    return {**{key: None for key in INTERVAL_KEYS}, **metrics}


def per_step_figures(params: dict[str, Any], metrics: Mapping[str, Any],
                     gpu_name: str | None) -> dict[str, Any] | None:
    """The timed figures and their intervals of a result from before timing windows, from its per-step
    times (windows of one step); None for a result that has its intervals, or no times."""
    if metrics.get("step_time_s_ci") is not None or not metrics.get("step_times_s") \
            or not params.get("model") or metrics.get("steps_per_window") is not None:
        return None
    figures = timed_metrics(CellParams.from_dict(params), metrics["step_times_s"], steps_per_window=1,
                            gpu_name=gpu_name)
    return {**figures, "timing": {"method": PER_STEP_METHOD}}


# --- the typed result ---------------------------------------------------------------------------------

class Section(Mapping[str, Any]):
    """One section of a result (metrics, predicted, provenance), read-only: its declared keys as
    attributes (None where the file has none), every key it holds by name."""

    __slots__ = ("_name", "_declared", "_values")

    def __init__(self, name: str, declared: tuple[Key, ...], values: Mapping[str, Any] | None):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_declared", frozenset(k.name for k in declared))
        object.__setattr__(self, "_values", dict(values or {}))

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or key not in self._declared:
            raise AttributeError(f"{self._name} declares no key {key!r}")
        return self._values.get(key)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a result's {self._name} is read-only")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Section({self._name!r}, {self._values!r})"

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


@dataclass(frozen=True)
class Emulation:
    """An emulated cell's section (training.emulation): which rank of which world it ran, and what was
    measured, modelled and derived rather than measured. `measured` keeps the rank's own figures where
    the metrics hold them completed (its GPU memory, plus what a real rank shows beyond it); older
    results say none of the three (empty here, and left out of the document)."""

    rank: int
    world_size: int
    ranks_per_node: int
    not_measured: str
    measured: dict[str, Any] = field(default_factory=dict)
    modelled: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    others: dict[str, Any] = field(default_factory=dict)  # what else the section says (its world's nodes)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> Emulation:
        typed = {"rank", "world_size", "ranks_per_node", "not_measured", "measured", "modelled", "derived"}
        return cls(rank=section["rank"], world_size=section["world_size"],
                   ranks_per_node=section["ranks_per_node"], not_measured=section["not_measured"],
                   measured=dict(section.get("measured") or {}), modelled=dict(section.get("modelled") or {}),
                   derived=dict(section.get("derived") or {}),
                   others={k: v for k, v in section.items() if k not in typed})

    def as_dict(self) -> dict[str, Any]:
        said = {name: section for name, section in (("measured", self.measured), ("modelled", self.modelled),
                                                     ("derived", self.derived)) if section}
        return {"rank": self.rank, "world_size": self.world_size, "ranks_per_node": self.ranks_per_node,
                **self.others, **said, "not_measured": self.not_measured}


@dataclass(frozen=True)
class Result:
    """One cell's metrics.json, checked and in the current shape. `params` as the file holds them (its
    optional parameters filled in: `migrated` says so), `cell` the same as CellParams."""

    study: str
    cell_id: str
    status: str
    reason: str | None
    params: dict[str, Any]
    params_hash: str
    metrics: Section
    predicted: Section
    provenance: Section
    emulation: Emulation | None = None
    device_limit: dict[str, Any] | None = None
    sanity: tuple[str, ...] | None = None  # what the run found of its training (absent: older files)
    attempts: int | None = None  # the runs it took (a retried launch: more than one; absent: older files)
    model: dict[str, Any] | None = None  # a config's own model's facts and its token file (cellrun)
    failure: str | None = None  # "infrastructure": the machine failed, not the cell (run it again)
    migrated: tuple[str, ...] = ()
    per_step_figures: dict[str, Any] | None = None
    schema: int = SCHEMA_VERSION

    @classmethod
    def from_document(cls, doc: dict[str, Any], migrated: tuple[str, ...] = ()) -> Result:
        """A result from a document in the current shape (schema_problems has found nothing)."""
        provenance = Section("provenance", PROVENANCE, doc["provenance"])
        sanity = doc.get("sanity")
        return cls(
            study=doc["study"], cell_id=doc["cell_id"], status=doc["status"], reason=doc["reason"],
            params=dict(doc["params"]), params_hash=doc["params_hash"],
            metrics=Section("metrics", METRICS, doc["metrics"]),
            predicted=Section("predicted", PREDICTED, doc["predicted"]), provenance=provenance,
            emulation=Emulation.from_dict(doc["emulation"]) if doc.get("emulation") else None,
            device_limit=doc.get("device_limit"), sanity=None if sanity is None else tuple(sanity),
            attempts=doc.get("attempts"), model=doc.get("model"), failure=doc.get("failure"),
            migrated=migrated, schema=doc["schema"],
            per_step_figures=per_step_figures(doc["params"], doc["metrics"], provenance.gpu_name))

    def as_document(self) -> dict[str, Any]:
        """The result as a metrics.json document (JSON types), in the current shape."""
        doc = {"schema": self.schema, "study": self.study, "cell_id": self.cell_id, "params": self.params,
               "params_hash": self.params_hash, "status": self.status, "reason": self.reason,
               "metrics": self.metrics.as_dict(), "predicted": self.predicted.as_dict(),
               "provenance": self.provenance.as_dict()}
        if self.emulation is not None:
            doc["emulation"] = self.emulation.as_dict()
        if self.device_limit is not None:
            doc["device_limit"] = self.device_limit
        for name, value in (("sanity", None if self.sanity is None else list(self.sanity)),
                            ("attempts", self.attempts), ("model", self.model), ("failure", self.failure)):
            if value is not None:
                doc[name] = value
        return doc

    @property
    def cell(self) -> CellParams:
        return CellParams.from_dict(self.params)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def emulated(self) -> bool:
        return self.emulation is not None

    @property
    def gpu_name(self) -> str | None:
        return self.provenance.gpu_name

    def metric(self, name: str) -> Any:
        """A metric by the name a column or a study file gives it: a declared key, else an error."""
        if name not in METRIC_NAMES:
            raise KeyError(f"metrics.json declares no metric {name!r}")
        return self.metrics.get(name)

    def sanity_problems(self) -> list[str]:
        """Why a cell that ran did not train sanely (see sanity_problems); empty for a sane one."""
        return loss_problems(self.metrics) if self.ok else []


METRIC_NAMES = frozenset(k.name for k in METRICS)


# --- is the training that was timed sane? -------------------------------------------------------------
# A timed result is a result only if the training it timed was sane (ReFrame's rule: sanity before
# performance). Checked on what every result keeps; a cell that fails is marked in its table, and
# findings leave it out (docs/measurement.md, "Sane training").
DIVERGED_NATS = 1.0  # the loss's last quarter this far above its lowest point: diverged
SANE_CURVE_STEPS = 8  # a curve shorter than this says too little to judge divergence


def sanity_problems(doc: Mapping[str, Any] | Result) -> list[str]:
    """Why a cell that ran (`ok`) did not train sanely: a loss that is not finite, a loss that fell and
    then climbed more than DIVERGED_NATS above its lowest point (over the curve's last quarter, or at
    its end), an optimizer that skipped timed steps (fp16 overflow). Empty for a sane one, and for cells
    that did not run (their status says what happened)."""
    if isinstance(doc, Result):
        return doc.sanity_problems()
    if doc.get("status") != "ok":
        return []
    return loss_problems(doc.get("metrics") or {})


def loss_problems(m: Mapping[str, Any]) -> list[str]:
    """What sanity_problems finds in a run's metrics: its loss and its optimizer's skipped steps."""
    curve = m.get("loss_curve") or [v for v in (m.get("loss_first"), m.get("loss_last"))
                                    if v is not None]
    problems = []
    bad = next((i for i, v in enumerate(curve) if not math.isfinite(v)), None)
    if bad is not None:
        problems.append(f"the loss is {curve[bad]} at step {bad + 1}")
    elif len(curve) >= SANE_CURVE_STEPS:
        tail = curve[-max(2, len(curve) // 4):]
        end, low = sum(tail) / len(tail), min(curve)
        if end > low + DIVERGED_NATS:
            problems.append(f"diverged: the loss fell to {low:.3g} and its last quarter averages {end:.3g}")
        elif curve[-1] > low + DIVERGED_NATS:
            problems.append(f"diverged: the loss fell to {low:.3g} and ended at {curve[-1]:.3g}")
    skipped = m.get("optimizer_steps_skipped")
    if skipped:
        problems.append(f"the optimizer skipped {skipped} timed step(s) (fp16 overflow)")
    return problems


class InvalidResult(ValueError):
    """A file that should be a result and is not one (unreadable, or not following its schema)."""


def read_document(path: str | Path) -> tuple[dict[str, Any], tuple[str, ...]]:
    """One metrics.json as a checked document in the current shape, and the migrations it took;
    InvalidResult says why it is not one."""
    try:
        doc = read_json(path)
    except (OSError, ValueError) as error:
        raise InvalidResult(f"{path}: unreadable: {error}") from None
    try:
        doc, migrated = migrate(doc)
    except (KeyError, TypeError, ValueError) as error:  # parameters that make no sense
        raise InvalidResult(f"{path}: not a metrics.json of schema {SCHEMA_VERSION}: "
                            f"{type(error).__name__}: {error}") from None
    problems = schema_problems(doc)
    if problems:
        raise InvalidResult(f"{path}: not a metrics.json of schema {SCHEMA_VERSION}: {'; '.join(problems)}")
    return doc, migrated


def read_result(path: str | Path) -> Result:
    """One metrics.json, checked against the schema and in the current shape; InvalidResult says why not."""
    doc, migrated = read_document(path)
    try:
        return Result.from_document(doc, migrated)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:  # figures that make no sense
        raise InvalidResult(f"{path}: not a metrics.json of schema {SCHEMA_VERSION}: "
                            f"{type(error).__name__}: {error}") from None


def read_results(paths) -> list[Result]:
    """Results in the order given; a missing or malformed file is an error, not a gap."""
    return [read_result(path) for path in paths]



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


def why_invalid(error: InvalidResult) -> str:
    """An InvalidResult's reason, without the path it starts with."""
    return str(error).split(": ", 1)[1]


def result_problem(path: str | Path) -> str | None:
    """Why an existing result file cannot be used (None when it can): for `trainbench cells` and for the
    workflow, which runs such a cell again rather than let it reach a table."""
    try:
        (read_search if Path(path).name == "max_batch.json" else read_result)(path)
    except InvalidResult as error:
        return why_invalid(error)
    return None
