"""metrics.json, the contract: every key declared once (with its type and meaning), the JSON schema
generated from the declarations, the code that fills the metrics section from the ranks' reports,
atomic writing, and reading results back, checked, in the current shape.

A cell's metrics.json is written once, at the end, by renaming a finished temporary file over the
target: readers see the old file or the new one, never half of one, and a run killed before the
rename leaves no metrics.json at all.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainbench.study.params import CellParams
from trainbench.execute.metrics import timed_metrics
from trainbench.study.params import with_optional_defaults
from trainbench.study.timing import TimingSettings

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


def read_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)


# --- filling the metrics section from the ranks' reports (worker.py writes them) -------------------

def node_memory(entries: list[dict[str, Any] | None]) -> dict[str, list]:
    """Concatenate per-node sampler peaks (in rank order) into per-GPU lists."""
    used, total, names, host_used, host_percent = [], [], [], [], []
    for entry in entries:
        if not entry:
            continue
        used += entry["gpu_used_mib"]
        total += entry["gpu_total_mib"]
        names += entry["gpu_names"]
        host_used.append(entry["host_used_mib"])
        host_percent.append(entry["host_percent"])
    return {"used": used, "total": total, "names": names, "host_used": host_used,
            "host_percent": host_percent}


# --- is the training that was timed sane? -------------------------------------------------------------
# A timed result is a result only if the training it timed was sane (ReFrame's rule: sanity before
# performance). Checked on what every result keeps; a cell that fails is marked in its table, and
# findings leave it out (docs/measurement.md, "Sane training").
DIVERGED_NATS = 1.0  # the loss's last quarter this far above its lowest point: diverged
SANE_CURVE_STEPS = 8  # a curve shorter than this says too little to judge divergence


def sanity_problems(doc: dict[str, Any]) -> list[str]:
    """Why a cell that ran (`ok`) did not train sanely: a loss that is not finite, a loss that fell and
    then climbed more than DIVERGED_NATS above its lowest point (over the curve's last quarter, or at
    its end), an optimizer that skipped timed steps (fp16 overflow). Empty for a sane one, and for cells
    that did not run (their status says what happened)."""
    if doc.get("status") != "ok":
        return []
    m = doc.get("metrics") or {}
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


def _round(value, digits=3):
    return None if value is None else round(value, digits)


def phases(marks: dict[str, float]) -> dict[str, float]:
    """Seconds per phase (PHASES) from the marks; a phase whose mark is missing (no warm-up steps)
    takes none, and its time goes to the next."""
    out, previous = {}, marks["launched"]
    for name, mark, _ in PHASES:
        end = max(marks.get(mark, previous), previous)  # clocks of 10 ms: never a negative phase
        out[name] = round(end - previous, 3)
        previous = end
    return out


def summarize(params: CellParams, result: dict[str, Any], wall_time_s: float,
              timing: TimingSettings, launched: float, exited: float) -> dict[str, Any]:
    """The metrics of a successful run, from rank 0's result.json; `launched` and `exited`: when the
    launcher started and when it ended (wall clock)."""
    ranks = result["ranks"]
    memory = node_memory([r["node_memory"] for r in ranks])
    gpu_name = memory["names"][0] if memory["names"] else None
    timed = timed_metrics(params, result["step_times_s"], steps_per_window=result["steps_per_window"],
                          gpu_name=gpu_name, target_ci=timing.target_ci)
    projected = None
    if params.dataset_size and params.epochs:
        # Steady state only: optimizer steps of the whole run times the median step (no start-up,
        # evaluation or checkpoint time).
        steps = math.ceil(params.dataset_size / params.global_batch) * params.epochs
        projected = steps * timed["step_time_s"]
    rss_by_host: dict[str, float] = {}
    for r in ranks:
        rss_by_host[r["host"]] = rss_by_host.get(r["host"], 0.0) + r["host_rss_peak_mib"]
    metrics = empty_metrics()
    metrics.update(
        # warm-up goes on until fp16 loss scaling settles (worker.WARMUP_SETTLED_STEPS): the steps it ran
        warmup_steps=len(result.get("warmup_step_times_s") or []) or params.warmup_steps,
        **timed,
        wall_time_s=_round(wall_time_s, 2),
        projected_run_s=_round(projected, 1),
        gpu_mem_used_mib=[_round(v, 1) for v in memory["used"]] or None,
        gpu_mem_total_mib=[_round(v, 1) for v in memory["total"]] or None,
        torch_peak_allocated_mib=[_round(r["torch_peak_allocated_mib"], 1) for r in ranks]
        if ranks[0]["torch_peak_allocated_mib"] is not None else None,
        torch_peak_reserved_mib=[_round(r["torch_peak_reserved_mib"], 1) for r in ranks]
        if ranks[0]["torch_peak_reserved_mib"] is not None else None,
        # the busiest node's ranks together: what that node's host memory had to hold
        host_mem_peak_mib=_round(max(rss_by_host.values()), 1),
        test_accuracy=_round(result.get("test_accuracy"), 4),
        loss_first=_round(result["losses"][0], 5),
        loss_last=_round(result["losses"][-1], 5),
        params_total=result["params_total"],
        params_per_module_rank0=result["params_per_module_rank0"],
    )
    metrics.update(
        step_times_s=[_round(t, 6) for t in result["step_times_s"]],
        warmup_step_times_s=[_round(t, 6) for t in result["warmup_step_times_s"]],
        loss_curve=[_round(v, 5) for v in result["losses"]],
        optimizer_steps_skipped=result.get("optimizer_steps_skipped"),
        timing={"method": "windows", "stopped": result["timing_stopped"], **timing.as_dict(),
                **({"gc": result["gc"]} if result.get("gc") else {})},
        host_rss_peak_mib_per_rank=[_round(r["host_rss_peak_mib"], 1) for r in ranks],
        tensors_held_bytes_per_rank=[r.get("tensors_held_bytes") for r in ranks],
        params_held_per_rank=[sum((r.get("params_per_module") or {}).values()) for r in ranks],
        host_mem_used_peak_mib=_round(max(memory["host_used"]), 1) if memory["host_used"] else None,
        host_mem_percent_peak=_round(max(memory["host_percent"]), 1) if memory["host_percent"] else None,
    )
    spent = phases({**result["phase_marks"], "launched": launched, "exited": exited})
    metrics.update(phases_s=spent,
                   timed_share=_round(spent["timed"] / wall_time_s, 4) if wall_time_s else None)
    if ranks[0].get("memory_snapshot"):
        metrics["memory_snapshot"] = {"rank": ranks[0]["rank"], **ranks[0]["memory_snapshot"]}
    if ranks[0].get("breakdown"):  # the profiled steps' (profiling.py), on the rank that reports
        metrics["breakdown"] = ranks[0]["breakdown"]
        if len(ranks) > 1:
            metrics["breakdown_per_rank"] = [r.get("breakdown") for r in ranks]
    metrics.update(energy_metrics(params, ranks, timed["steps_timed"]))
    if "dataset" in result:  # where accuracy was measured: real data, or the synthetic stand-in
        metrics.update(dataset=result["dataset"], test_samples=result["test_samples"])
    return metrics


def publishes_energy(params: CellParams) -> bool:
    """Whether a run of these parameters, its ranks' GPU counters read, publishes energy per step and
    per token: only a whole world does. An emulated rank's energy is one GPU's, not its world's."""
    return not params.emulate


def energy_metrics(params: CellParams, ranks: list[dict[str, Any]], steps_timed: int) -> dict[str, Any]:
    """Energy over the timed windows from every rank's GPU counter (worker.py), where each rank read
    one: per rank, per step and token for the cell's GPUs together, and their mean power."""
    energy = [r.get("gpu_energy_j") for r in ranks]
    if not energy or any(e is None for e in energy) or not steps_timed:
        return {}
    out: dict[str, Any] = {"gpu_energy_j_per_rank": [_round(e, 2) for e in energy]}
    timed = [r.get("gpu_energy_timed_s") for r in ranks]
    if all(timed):
        out["gpu_power_w"] = _round(sum(e / t for e, t in zip(energy, timed)) / len(energy), 1)
    if publishes_energy(params):
        per_step = sum(energy) / steps_timed
        out["energy_j_per_step"] = _round(per_step, 3)
        out["energy_j_per_token"] = _round(per_step / (params.global_batch * params.seq_len), 8)
    return out


def partial_metrics(rank_records: list[dict[str, Any]], wall_time_s: float) -> dict[str, Any]:
    """What is known of a run that did not finish (from the ranks' failure records): wall time, and
    memory at the failure (an OOM's)."""
    metrics = empty_metrics()
    metrics["wall_time_s"] = _round(wall_time_s, 2)
    records = sorted(rank_records, key=lambda r: r["rank"])
    memory = node_memory([r.get("node_memory") for r in records])
    if memory["used"]:
        metrics["gpu_mem_used_mib"] = [_round(v, 1) for v in memory["used"]]
        metrics["gpu_mem_total_mib"] = [_round(v, 1) for v in memory["total"]]
    allocated = [r.get("torch_peak_allocated_mib") for r in records]
    if allocated and all(a is not None for a in allocated):
        metrics["torch_peak_allocated_mib"] = [_round(a, 1) for a in allocated]
    snapshots = {r["rank"]: r["memory_snapshot"] for r in records if r.get("memory_snapshot")}
    if snapshots:  # the GPU allocator at the OOM, on the first rank that ran out
        metrics["memory_snapshot"] = {"rank": min(snapshots), **snapshots[min(snapshots)]}
    return metrics


# How results from before timing windows were timed: every step synchronised and timed alone.
PER_STEP_METHOD = "synchronised steps (each step timed alone, before timing windows)"


def with_intervals(params: dict[str, Any], metrics: dict[str, Any] | None,
                   gpu_name: str | None) -> dict[str, Any]:
    """Metrics in the current shape, from a result's parameters (as its metrics.json holds them) and
    metrics. Results written before timing windows existed kept one time per step: windows of one step,
    which give their intervals by the same computation."""
    metrics = dict(metrics or {})
    if "step_time_s_ci" in metrics:
        return metrics
    if metrics.get("step_times_s") and params.get("model"):
        figures = timed_metrics(CellParams.from_dict(params), metrics["step_times_s"], steps_per_window=1,
                                gpu_name=gpu_name)
        return {**metrics, **figures, "timing": {"method": PER_STEP_METHOD}}
    return {**{key: None for key in INTERVAL_KEYS}, **metrics}


def current(doc: dict[str, Any]) -> dict[str, Any]:
    """A metrics.json document in the current shape (see with_intervals)."""
    if not isinstance(doc.get("metrics"), dict) or not isinstance(doc.get("params"), dict):
        return doc  # not a result: schema_problems says why
    gpu_name = (doc.get("provenance") or {}).get("gpu_name")
    params = with_optional_defaults(doc["params"])  # made before an optional parameter: its default
    doc = {**doc, "params": params, "metrics": with_intervals(params, doc["metrics"], gpu_name)}
    return with_current_emulation(doc)


def with_current_emulation(doc: dict[str, Any]) -> dict[str, Any]:
    """An emulated result's GPU 'used' completed as the memory model completes it now (its measured
    figure, kept in its `emulation` section, plus what a real rank shows beyond it): a result written
    under an older model carries that model's NCCL figure."""
    emulation = doc.get("emulation") or {}
    measured = (emulation.get("measured") or {}).get("gpu_mem_used_mib")
    if not measured or not doc["metrics"].get("gpu_mem_used_mib"):
        return doc
    from trainbench.predict.memory_model import emulated_rank_shortfall_mib

    added = emulated_rank_shortfall_mib(CellParams.from_dict(doc["params"]))
    modelled = {**(emulation.get("modelled") or {}), "nccl_buffers_mib": added}
    return {**doc, "metrics": {**doc["metrics"], "gpu_mem_used_mib": [round(u + added, 1) for u in measured]},
            "emulation": {**emulation, "modelled": modelled}}


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


def read_cells(paths) -> list[dict[str, Any]]:
    """metrics.json documents in the order given; a missing or malformed file is an error, not a gap."""
    return [read_result(path) for path in paths]
