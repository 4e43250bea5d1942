"""The JSON schema of config.yaml, built from the parameter table.

`trainbench schema` writes it to workflow/schemas/config.schema.yaml; tests check that the file in
the repository is what this module builds, so the table in params.py stays the single source.
"""

from __future__ import annotations

from typing import Any

from trainbench.registry.hardware import GPUS
from trainbench.study.params import PARAMS
from trainbench.study.timing import TimingSettings

# How a cell is run, as opposed to what it measures: changing these reruns nothing.
EXECUTION: dict[str, dict[str, Any]] = {
    "runtime_min": {"type": "integer", "minimum": 1, "default": 30,
                    "description": "Wall-clock limit of one attempt in minutes: the SLURM time request; "
                                   "the run is stopped a little before it and recorded as 'timeout'."},
    "mem_mb_per_rank": {"type": "integer", "minimum": 1, "default": 16000,
                        "description": "Host memory per rank in MB; a node asks for this times its ranks."},
    "cpus_per_rank": {"type": "integer", "minimum": 1, "default": 4,
                      "description": "CPU cores per rank (data loading, optimizer offload)."},
    "retries": {"type": "integer", "minimum": 0, "default": 1,
                "description": "Relaunches after an unexpected failure (not after OOM) before the cell is "
                               "recorded as 'failed' with its log."},
    # Where a cell's SLURM job runs (the executor plugin's resources; a run on one machine ignores them)
    "slurm_partition": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.-]+$", "default": None,
                        "description": "The SLURM partition of the cell's job (sbatch -p); null: the "
                                       "profile's or the cluster's default."},
    "slurm_account": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.-]+$", "default": None,
                      "description": "The SLURM account the job is charged to (sbatch -A); null: the "
                                     "profile's or the user's default."},
    "gpu_model": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.]+$", "default": None,
                  "description": "The GPU model a GPU cell's job asks for, as the cluster's GRES names "
                                 "it (sbatch --gpus=MODEL:N, or --gres=gpu:MODEL:N per node of a "
                                 "multi-node cell); null: any GPU."},
    "constraint": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.&|,:*()\\[\\]-]+$",
                   "default": None,
                   "description": "Node features the job needs (sbatch --constraint), e.g. "
                                  "'nvlink&ib'; null: none."},
    "slurm_array": {"type": "boolean", "default": False,
                    "description": "Submit the study's cells as SLURM job arrays: one sbatch for many "
                                   "cells, under the rule train_<study> (--slurm-array-jobs "
                                   "train_<study>). Its cells must ask for the same GPUs, nodes, CPUs "
                                   "and placement; each asks for the largest memory and time of any."},
}

# An entry of `models` (study/models.py checks what a schema cannot: one kind, files, names).
USER_MODEL: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "hf_config": {"type": "string", "default": None,
                      "description": "A transformers config.json (or the folder holding it), relative to "
                                     "the folder of config.yaml."},
        "hf": {"type": "object", "default": None,
               "description": "The keys of a transformers config inline (model_type, hidden_size, ...)."},
        "factory": {"type": "string", "default": None,
                    "description": "'module:function' returning your torch.nn.Module; forward(input_ids, "
                                   "labels=None) returns the mean loss given labels (the next tokens)."},
        "args": {"type": "object", "default": {}, "description": "Keyword arguments of the factory."},
        "block": {"type": "string", "default": None,
                  "description": "The class repeated in the model (the unit FSDP shards and checkpointing "
                                 "recomputes); a transformers model names its own (_no_split_modules)."},
        "vocab_size": {"type": "integer", "minimum": 1, "default": None,
                       "description": "A factory's model: its vocabulary."},
        "max_seq": {"type": "integer", "minimum": 1, "default": None,
                    "description": "A factory's model: its longest sequence (a cell's seq_len default)."},
        "tp_plan": {"type": "object", "default": None, "additionalProperties": {"type": "string"},
                    "description": "How tensor parallelism (tp > 1) splits the model: module paths ('*' one "
                                   "part) to colwise, rowwise, colwise_gather_output, rowwise_split_input "
                                   "or embedding_rowwise. A transformers model without one splits by the "
                                   "plan transformers publishes for its architecture."},
        "description": {"type": "string", "default": "",
                        "description": "What the model is, for `trainbench models`."},
    },
}

# The max-batch search's settings but its cell patterns (the grid fills a study's search from these
# defaults).
SEARCH: dict[str, dict[str, Any]] = {
    "max_micro_batch": {"type": "integer", "minimum": 1, "default": 256,
                        "description": "The largest micro batch a probe may try."},
    "steps": {"type": ["integer", "null"], "minimum": 1, "default": None,
              "description": "Timed steps of each probe (enough to reach late OOMs); "
                             "null: the cell's timed_steps."},
    "gpu_mem_gib": {"type": ["number", "null"], "minimum": 0, "default": None,
                    "description": "Memory per GPU the memory model seeds and bounds the "
                                   "search with; null: no GPU bound (CPU cells use this "
                                   "host's memory)."},
    "tolerance": {"type": "number", "minimum": 0, "maximum": 1, "default": 0,
                  "description": "Stop bisecting once the smallest failing micro batch is within "
                                 "this fraction of the largest that trained (0: exact)."},
}

REPORT_COLUMNS_DEFAULT = ["step_time_ms", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                          "gpu_mem_max_mib", "host_mem_mib", "loss"]


def _param_object() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "properties": {p.name: p.json_schema() for p in PARAMS}}


def _param_lists() -> dict[str, Any]:
    props = {}
    for p in PARAMS:
        item = p.json_schema()
        props[p.name] = {"type": "array", "minItems": 1, "items": {k: v for k, v in item.items()
                                                                  if k not in ("description", "default")},
                         "description": f"Values of {p.name} to cross with the other axes.", "default": []}
    return {"type": "object", "additionalProperties": False, "properties": props}


def _param_selector(description: str = "The {name} of measured cells: a value, or a list of values."
                    ) -> dict[str, Any]:
    """A cell pattern whose values may be lists (any of them matches; in `include`, each makes cells)."""
    props = {}
    for p in PARAMS:
        item = {k: v for k, v in p.json_schema().items() if k not in ("description", "default")}
        props[p.name] = {"anyOf": [item, {"type": "array", "minItems": 1, "items": item}], "default": None,
                         "description": description.format(name=p.name)}
    return {"type": "object", "additionalProperties": False, "properties": props}


# A cell pattern (values or lists of values per parameter) is written out once, under the schema's
# $defs, and referred to wherever a study names cells: measure, search, findings.
CELL_PATTERN = {"$ref": "#/$defs/cell_pattern"}


def _cells(description: str) -> dict[str, Any]:
    return {**CELL_PATTERN, "default": None, "description": description}


def _findings() -> dict[str, Any]:
    """A study's findings (src/trainbench/reporting/findings.py): a claim and one relation between its
    cells."""
    keys = [p.name for p in PARAMS]
    compare = {
        "type": "object", "additionalProperties": False, "required": ["metric"], "default": None,
        "description": "A metric of some cells against others: one of less, more (with than), same (with as "
                       "and within), rises_with, falls_with; pairs are cells that agree on every other key "
                       "telling the study's cells apart.",
        "properties": {
            "metric": {"type": "string", "default": None,
                       "description": "A number of the table (`trainbench columns`), or the max-batch "
                                      "search's max_micro_batch or max_global_batch."},
            "less": _cells("Cells whose figure is below that of the cells `than` names."),
            "more": _cells("Cells whose figure is above that of the cells `than` names."),
            "than": _cells("The cells `less` or `more` are held against."),
            "same": _cells("Cells whose figure is within `within` of that of the cells `as` names."),
            "as": _cells("The cells `same` is held against."),
            "within": {"type": "number", "minimum": 0, "default": None,
                       "description": "How far apart `same` allows the two figures, in the metric's unit."},
            "factor": {"type": "object", "additionalProperties": False, "default": None,
                       "description": "With less or more: the larger figure over the smaller lies in this "
                                      "range.",
                       "properties": {
                           "min": {"type": "number", "exclusiveMinimum": 0, "default": None,
                                   "description": "The smallest factor that holds."},
                           "max": {"type": "number", "exclusiveMinimum": 0, "default": None,
                                   "description": "The largest factor that holds (absent: no limit)."}}},
            "rises_with": {"enum": keys, "default": None,
                           "description": "A key telling cells apart: the figure rises as its value grows "
                                          "(every two cells that differ in it alone)."},
            "falls_with": {"enum": keys, "default": None,
                           "description": "A key telling cells apart: the figure falls as its value grows."},
            "where": _cells("Only cells matching this take part."),
        },
    }
    return {
        "type": "array", "default": [],
        "description": "The conclusions the study exists to test, judged on every table build and shown "
                       "under the table: reproduced, partly, not reproduced or not yet measured "
                       "(docs/studies.md, \"Findings\").",
        "items": {
            "type": "object", "additionalProperties": False, "required": ["claim"],
            "properties": {
                "claim": {"type": "string", "minLength": 1, "default": None,
                          "description": "The conclusion, in the campaign's words."},
                "note": {"type": "string", "default": "",
                         "description": "How the claim is checked: assumptions, and what this version "
                                        "cannot check."},
                "compare": compare,
                "fits": _cells("Every matching cell trains (status ok)."),
                "oom": _cells("Every matching cell runs out of memory."),
            },
        },
    }


def _overrides(param_object: dict, settings: dict, settings_text: str, description: str) -> dict:
    return {
        "type": "array", "default": [], "description": description,
        "items": {"type": "object", "additionalProperties": False, "required": ["when", "set"],
                  "properties": {
                      "when": {**param_object, "description": "Parameters a cell must match.", "default": {}},
                      "set": {**settings, "description": settings_text, "default": {}}}},
    }


def _search() -> dict:
    return {
        "type": "object", "additionalProperties": False, "default": {},
        "description": "The largest micro batch search "
                       "(`results/search/<study>/<cell>/max_batch.json`): probes double then "
                       "bisect the cell's micro batch, each a cached run.",
        "properties": {
            **SEARCH,
            "cells": {"type": ["array", "null"], "minItems": 1, "items": CELL_PATTERN,
                      "default": None,
                      "description": "The measured cells whose search the study table reports "
                                     "(patterns as in measure.cells); null: every measured cell."},
        },
    }


def _measure() -> dict:
    return {
        "type": "object", "additionalProperties": False, "required": ["cells"], "default": None,
        "description": "Which cells are measured; the others are planned: their table rows give the "
                       "memory model's verdict for `plan_for` and no run. Absent: every cell is "
                       "measured.",
        "properties": {
            "cells": {"type": "array", "items": CELL_PATTERN, "default": [],
                      "description": "Patterns: a cell is measured when it matches every key of one "
                                     "(a list matches any of its values); none: every cell is "
                                     "planned (a round whose predictions come before its run)."},
            "plan_for": {
                "type": "object", "additionalProperties": False,
                "required": ["gpu_mem_gib", "gpus_per_node", "host_mem_gib"], "default": None,
                "description": "The hardware planned cells are judged against.",
                "properties": {
                    "gpu_mem_gib": {"type": "number", "exclusiveMinimum": 0, "default": None,
                                    "description": "Memory of one GPU, GiB."},
                    "gpus_per_node": {"type": "integer", "minimum": 1, "default": None,
                                      "description": "GPUs per node."},
                    "host_mem_gib": {"type": "number", "exclusiveMinimum": 0, "default": None,
                                     "description": "Host memory per node, GiB."},
                    "name": {"type": "string", "default": "",
                             "description": "What the hardware is, for the table."},
                },
            },
        },
    }


def _references() -> dict:
    return {
        "type": "array", "default": [],
        "description": "Reference figures the study's measured cells are checked against on every "
                       "table build, with tolerances (reporting/references.py).",
        "items": {
            "type": "object", "additionalProperties": False, "required": ["metric", "value"],
            "properties": {
                "cells": _cells("The cells the reference is for (all: none)."),
                "metric": {"type": "string", "default": None,
                           "description": "A measured table column (`trainbench columns`)."},
                "value": {"type": "number", "default": None, "description": "The reference figure."},
                "tolerance": {"type": "number", "minimum": 0, "default": 0.05,
                              "description": "Within ± this fraction of the reference."},
                "lower": {"type": "number", "default": None,
                          "description": "Instead of -tolerance: the lowest deviation allowed "
                                         "(-0.02: 2% below)."},
                "upper": {"type": "number", "default": None,
                          "description": "Instead of +tolerance: the highest deviation allowed."},
                "gpu": {"enum": list(GPUS), "default": None,
                        "description": "The GPU type the figure holds for (`trainbench predict "
                                       "--gpu`'s names); a cell run on another GPU is reported as "
                                       "having no reference for its GPU; null: any GPU."},
            },
        },
    }


def _study() -> dict:
    param_object = _param_object()
    execution = {"type": "object", "additionalProperties": False, "properties": EXECUTION}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["description"],
        "properties": {
            "description": {"type": "string", "default": "",
                            "description": "What the study measures and where its set-up comes from."},
            "settings": {**param_object, "default": {},
                         "description": "Parameters every cell of the study shares (missing keys take "
                                        "their defaults)."},
            "axes": {**_param_lists(), "default": {},
                     "description": "Parameters that vary: the cells are the cartesian product of these "
                                    "lists, minus `exclude`. Axis keys name the cells."},
            "variants": {"type": "object", "default": {},
                         "additionalProperties": {"type": "array", "minItems": 1, "items": param_object},
                         "description": "Named axes whose values are sets of parameters that go together "
                                        "(e.g. {nodes: 8, gpus: 64}); crossed with `axes` like one more "
                                        "axis. The keys a value sets name its cells."},
            "include": {"type": "array", "default": [],
                        "items": _param_selector("The {name} of the entry's cells: a value, or a list of "
                                                 "values (one cell per combination of the entry's lists)."),
                        "description": "Extra cells: settings updated with the entry, one cell per entry, or "
                                       "where some of its values are lists one per combination of them (a "
                                       "small grid of its own). The entry's keys name its cells."},
            "exclude": {"type": "array", "items": param_object, "default": [],
                        "description": "Combinations removed from the product of the axes: a cell is "
                                       "dropped when it matches every key of an entry."},
            "execution": {**execution, "default": {},
                          "description": "How the study's cells are run (resources, limits, retries); "
                                         "changing these reruns nothing."},
            "timing": {**TimingSettings.json_schema(), "default": {},
                       "description": "How long the study's cells time their steps: windows, the interval "
                                      "to reach, a cap (src/trainbench/study/timing.py); changing these "
                                      "reruns nothing."},
            "execution_overrides": _overrides(
                param_object, execution, "Execution settings for those cells.",
                "Per-cell execution settings: `set` applies to the cells matching `when`."),
            "timing_overrides": _overrides(
                param_object, TimingSettings.json_schema(), "Timing settings for those cells.",
                "Per-cell timing: `set` applies to the cells matching `when` (an emulated rank of a large "
                "model whose steps take a minute needs fewer windows)."),
            "search": _search(),
            "measure": _measure(),
            "plot_panels": {"type": "array", "items": {"type": "string"}, "default": [],
                            "description": "Cell keys that split the study's plots into panels, one per "
                                           "combination of their values with its own y axis (the other keys "
                                           "label the bars); empty: one panel."},
            "findings": _findings(),
            "references": _references(),
            "report": {"type": "array", "items": {"type": "string"}, "default": REPORT_COLUMNS_DEFAULT,
                       "description": "Metric columns of the study's markdown table, in order "
                                      "(`trainbench columns` lists them)."},
        },
    }


def build_schema() -> dict[str, Any]:
    study = _study()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {"cell_pattern": _param_selector()},
        "title": "trainbench config.yaml",
        "description": "Benchmark studies: each a grid of training-run cells.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "default_studies": {
                "type": "object", "additionalProperties": False,
                "description": "Studies `snakemake` runs with no target, by what the machine has "
                               "(none: name targets on the command line).",
                "default": {"without_gpus": [], "with_gpus": []},
                "properties": {
                    "without_gpus": {"type": "array", "items": {"type": "string"}, "default": [],
                                     "description": "On a machine where NVML finds no GPU."},
                    "with_gpus": {"type": "array", "items": {"type": "string"}, "default": [],
                                  "description": "On a machine with GPUs."},
                },
            },
            "study_files": {"type": "array", "items": {"type": "string"}, "default": [],
                            "description": "More studies: glob patterns of YAML files, relative to the "
                                           "folder of config.yaml (the working directory), each holding a "
                                           "`studies` mapping of its own. A study is defined once, in "
                                           "config.yaml or in one file."},
            "studies": {"type": "object", "additionalProperties": study, "default": {},
                        "description": "Study name (letters, digits, '_' and '-') to its grid."},
            "models": {"type": "object", "additionalProperties": USER_MODEL, "default": {},
                       "description": "Your own models, by the name a study's `model` gives "
                                      "(docs/your-model.md): a transformers architecture (hf_config or "
                                      "hf) or a module of yours (factory)."},
            "placement": {"enum": ["local", "cluster"], "default": "local",
                          "description": "Where cells run: on this machine (cells needing more GPUs than it "
                                         "has are shown as such in the tables, not run), or through a "
                                         "cluster executor (profiles/slurm sets this; every cell is "
                                         "submitted)."},
        },
    }
