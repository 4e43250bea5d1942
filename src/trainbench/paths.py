"""Where everything the workflow makes lives: the path patterns the rules use as outputs and the
package uses to find results, written once. `{study}`, `{cell}`, `{micro_batch}` are the rules'
wildcards; `path(pattern, ...)` fills them in.

A max-batch probe is its cell with another micro batch; its id is the cell's id and `/mb~<k>`, so
that its results sit under the cell's search folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# bytes in one file or folder name (ext4, xfs, tmpfs): a cell's id names its folder, its history file
# (HISTORY_SUFFIX) and, with its study's name, the SLURM plugin's log folder, so all are held to this
NAME_MAX = 255
HISTORY_SUFFIX = ".jsonl"
RUNS = "results/runs/{study}"  # a study's cells, one folder each
RUN = RUNS + "/{cell}/metrics.json"
RUN_LOG = "results/runs/{study}/{cell}/log"
PROBE = "results/search/{study}/{cell}/mb~{micro_batch}/metrics.json"
PROBE_LOG = "results/search/{study}/{cell}/mb~{micro_batch}/log"
SEARCH = "results/search/{study}/{cell}/max_batch.json"
SEARCH_LOG = "results/search/{study}/{cell}/max_batch.log"
TABLE_MD = "results/tables/{study}.md"  # the answer, the cells with a result, findings, a count of the others
TABLE_ALL = "results/tables/{study}.all.md"  # the cells with a result, every column the study reports
TABLE_CSV = "results/tables/{study}.csv"  # the cells with a result, one row each
TABLE_PLAN = "results/tables/{study}.plan.csv"  # the cells without one (planned, not run), one row each
TABLE_FINDINGS = "results/tables/{study}.findings.csv"
TABLE_LOG = "results/logs/tables/{study}.log"
# A study's plots, one folder (reporting/plots.py): `<kind>.png`, or `<kind>-<part>.png` where the study
# has more cells than one figure holds; kinds memory, throughput, scaling (a study that scales strategies
# over GPU counts from one GPU) and breakdown (a study that profiles). PLOTS_INDEX in it lists them.
PLOTS_DIR = "results/plots/{study}"
PLOTS_INDEX = "plots.json"
PLOTS_LOG = "results/logs/plots/{study}.log"
DATASET = "results/dataset/cells.parquet"  # every study's cells, one long table (reporting/dataset.py)
DATASET_LOG = "results/logs/dataset.log"
# the collectives' bus bandwidth over `ranks` GPUs of one host (`trainbench commbench`)
COMMBENCH = "results/comm/{interconnect}-x{ranks}.json"
COMMBENCH_LOG = "results/comm/{interconnect}-x{ranks}.log"
# the same over {nodes} nodes of {ranks} each, through SLURM
COMMBENCH_NODES = "results/comm/{interconnect}-n{nodes}x{ranks}.json"
COMMBENCH_NODES_LOG = "results/comm/{interconnect}-n{nodes}x{ranks}.log"
# a bandwidth table's name: the hardware, then its ranks on one host (h200-x4) or its nodes and the
# ranks on each (h200-n2x4)
INTERCONNECT_NAME = re.compile(r"(?P<hardware>[a-z0-9][a-z0-9-]*?)-(?:x\d+|n\d+x\d+)")
# the study's page: beside its table, so that a clone has it, as it has the table; its plots linked
STUDY_PAGE = "results/tables/{study}.html"
# the same page as the report shows it, its plots embedded (the report's viewer follows no path); made
# again from the page's sources, not kept in the repository, where each redraw would add megabytes
REPORT_PAGE = "results/report/{study}.html"
# its part of the report's front page (workflow/report/workflow.rst, beside REPORT_PAGE): answer,
# headline numbers, key plots, embedded
STUDY_FRONT = "results/report/{study}.front.html"
STUDY_PAGE_LOG = "results/logs/report/{study}.log"
GRID_STAMP = "results/.grid/{study}.json"
# the prediction models' digest (Workflow.prediction_models), rewritten when it changes: no study's name
MODELS_STAMP = "results/.grid/prediction-models.txt"
# what the workflow found each result file to be when it last read it (freshness.py): local, not a result
RESULTS_CHECKED = ".snakemake/trainbench/checked/{study}.json"

PROBE_SEPARATOR = "/mb~"


def path(pattern: str, **wildcards) -> str:
    return pattern.format(**wildcards)


def study_outputs(study: str) -> list[str]:
    """What a study's `rule all` target is made of: its table (markdown, every column, CSV, plan and
    findings), its plots' folder (where the study profiles its cells, where their time went, too), and
    the report's copy of its page and its part of the front page. The page kept beside the table
    (STUDY_PAGE) comes with them, one rule's outputs; it is not named, so that a report of a fresh clone,
    where the report's copies are not made yet, leaves the pages out rather than asks for them."""
    patterns = (TABLE_MD, TABLE_ALL, TABLE_CSV, TABLE_PLAN, TABLE_FINDINGS, PLOTS_DIR, REPORT_PAGE,
                STUDY_FRONT)
    return [path(pattern, study=study) for pattern in patterns]


def plot_files(directory: str | Path) -> list[dict[str, Any]]:
    """The plots in a study's PLOTS_DIR, in reading order, from its PLOTS_INDEX: each a dict of `path`
    (a Path), `kind` (memory, throughput, scaling, breakdown) and `shows` (which of the study's cells,
    in words, e.g. "gpt-345m, 8 GPUs"; "" for all of them)."""
    directory = Path(directory)
    index = json.loads((directory / PLOTS_INDEX).read_text())
    return [{"path": directory / entry["file"], "kind": entry["kind"], "shows": entry["shows"]}
            for entry in index["plots"]]


def probe_id(cell_id: str, micro_batch: int) -> str:
    return f"{cell_id}{PROBE_SEPARATOR}{micro_batch}"


def cell_of_probe(probe: str) -> str:
    """The cell id of a probe id (the cell's own id unchanged)."""
    return probe.rsplit(PROBE_SEPARATOR, 1)[0]


def probe_glob(study: str, cell: str) -> str:
    """The probes of one cell's search, for Path.glob from the results' root."""
    return path(PROBE, study=study, cell=cell, micro_batch="*")
