"""Every cell of every study as one dataset: a tidy long table, one row per cell and figure, written as
parquet (`results/dataset/cells.parquet`, rule `dataset`) for slicing across studies with pandas or
DuckDB, and read back by `trainbench query`.

Each row is one figure of one cell: who the cell is (study, cell id, status and reason, whether it was
an emulated rank, every parameter as `p_<name>`), where and with what it ran (GPU, GPUs, nodes,
host, commit, when, the versions of python, torch and the frameworks), and the figure (`metric`,
`value`, its 95% interval `low`/`high` where it has one, `source`: measured, predicted by the models,
or from the cell's profile). A cell that did not train
still has its rows: its status and whatever it measured (an OOM's memory), so a slice never loses a
cell. The schema is SCHEMA (its version in the file's metadata, `trainbench.dataset_schema`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from trainbench.contract.result import PARTS
from trainbench.contract.result import VERSION_KEYS
from trainbench.reporting.predictions import Doc, prediction, time_prediction
from trainbench.study.params import CHOOSERS, PARAMS

SCHEMA_VERSION = 1
METADATA_KEY = b"trainbench.dataset_schema"

# The scalar figures of metrics.json kept as rows, with their interval's key where they have one
MEASURED = {"step_time_s": "step_time_s_ci", "samples_per_s": "samples_per_s_ci",
            "tokens_per_s": "tokens_per_s_ci", "tflops_per_gpu": "tflops_per_gpu_ci", "mfu": "mfu_ci",
            "mfu_fp8": "mfu_fp8_ci",
            "ci_half_width": None, "host_mem_peak_mib": None, "loss_first": None, "loss_last": None,
            "test_accuracy": None, "params_total": None, "wall_time_s": None, "projected_run_s": None,
            "timed_share": None, "energy_j_per_step": None, "energy_j_per_token": None, "gpu_power_w": None}
# per-GPU (per-rank) lists, kept as their largest entry: the busiest GPU
PER_GPU = {"gpu_mem_used_mib": "gpu_mem_used_max_mib", "torch_peak_allocated_mib": "torch_alloc_max_mib",
           "torch_peak_reserved_mib": "torch_reserved_max_mib"}

SCHEMA: dict[str, str] = {
    "study": "the study (config.yaml)",
    "cell_id": "the cell's id in its study",
    "status": "ok, oom, unsupported, infeasible, failed or timeout",
    "reason": "why, where the status is not ok",
    "emulated": "one rank of a larger world measured alone (docs/emulation.md)",
    **{f"p_{p.name}": f"parameter {p.name}: {p.description}" for p in PARAMS if p.name not in CHOOSERS},
    "gpu_name": "the GPU model it ran on (none: CPU ranks)",
    "gpu_count": "GPUs of the run", "nodes": "nodes of the run", "hostname": "the (first) node",
    "git_commit": "the code's commit", "started": "when it started (ISO 8601)",
    **{f"{name}_version": f"{name}'s version" for name in VERSION_KEYS},
    "metric": "the figure's name (metrics.json's key; *_max_mib: the busiest GPU's; "
              "breakdown.<part>_s: seconds per profiled step)",
    "value": "the figure", "low": "its 95% interval's low end, where it has one", "high": "its high end",
    "source": "measured, predicted (the memory and time models, current), or profile",
}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cell_rows(doc: Doc) -> list[dict[str, Any]]:
    """One cell's rows: its identity and provenance on each, one row per figure it has."""
    params = doc.get("params") or {}
    prov = doc.get("provenance") or {}
    base = {"study": doc["study"], "cell_id": doc["cell_id"], "status": doc["status"],
            "reason": doc.get("reason"), "emulated": bool(doc.get("emulation")),
            **{f"p_{p.name}": params.get(p.name) for p in PARAMS if p.name not in CHOOSERS},
            "gpu_name": prov.get("gpu_name"), "gpu_count": prov.get("gpu_count"), "nodes": prov.get("nodes"),
            "hostname": prov.get("hostname"), "git_commit": prov.get("git_commit"),
            "started": prov.get("started"),
            **{f"{name}_version": (prov.get("versions") or {}).get(name) for name in VERSION_KEYS}}
    metrics = doc.get("metrics") or {}
    rows = []

    def add(metric: str, value: Any, source: str, interval=None) -> None:
        number = _number(value)
        if number is not None:
            low, high = interval if interval else (None, None)
            rows.append({**base, "metric": metric, "value": number, "low": _number(low),
                         "high": _number(high), "source": source})

    for key, interval in MEASURED.items():
        add(key, metrics.get(key), "measured", metrics.get(interval) if interval else None)
    for key, name in PER_GPU.items():
        values = [v for v in metrics.get(key) or [] if v is not None]
        add(name, max(values) if values else None, "measured")
    found = metrics.get("breakdown")
    if found:
        for part in PARTS:
            add(f"breakdown.{part}_s", found["parts_s"][part], "profile")
        add("breakdown.communication_hidden", found.get("communication_hidden"), "profile")
    memory = prediction(doc)
    add("gpu_mem_mib", memory.get("gpu_mem_mib"), "predicted")
    add("host_mem_mib", memory.get("host_mem_mib"), "predicted")
    timed = time_prediction(doc)
    add("step_time_s", timed.get("step_time_s"), "predicted")
    if not rows:  # a cell with no figure at all (unsupported, infeasible) keeps one row: its status
        rows.append({**base, "metric": None, "value": None, "low": None, "high": None, "source": None})
    return rows


def frame(docs: Iterable[Doc]):
    """The dataset as a pandas DataFrame, its columns in SCHEMA's order."""
    import pandas

    rows = [row for doc in docs for row in cell_rows(doc)]
    table = pandas.DataFrame(rows, columns=list(SCHEMA))
    for column in table.columns:  # one type per parquet column: mixed parameters (int and str) as text
        kinds = {type(v) for v in table[column] if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            table[column] = table[column].map(lambda v: None if v is None else str(v))
    return table


def write(docs: Iterable[Doc], path: str | Path) -> int:
    """Write the dataset as parquet with its schema's version in the file's metadata; its row count."""
    import pyarrow
    import pyarrow.parquet

    table = pyarrow.Table.from_pandas(frame(docs), preserve_index=False)
    meta = {**(table.schema.metadata or {}),
            METADATA_KEY: json.dumps({"version": SCHEMA_VERSION, "columns": SCHEMA}).encode()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(table.replace_schema_metadata(meta), path)
    return table.num_rows


def read(path: str | Path):
    """The dataset back as a DataFrame; refuses a file of another schema version."""
    import pyarrow.parquet

    table = pyarrow.parquet.read_table(path)
    stamp = (table.schema.metadata or {}).get(METADATA_KEY)
    version = json.loads(stamp)["version"] if stamp else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: dataset schema {version}, this version reads {SCHEMA_VERSION}: "
                         f"make it again (snakemake -c1 {path})")
    return table.to_pandas()
