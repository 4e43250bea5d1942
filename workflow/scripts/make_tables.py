"""Adapter for rule study_table: read the study's metrics.json files, write its markdown (its answer
first), its every-column markdown, CSV and plan, and its findings judged (findings CSV, and a section of
the markdown)."""

import sys

from trainbench.contract.result import read_search
from trainbench.reporting.documents import read_cells
from trainbench.reporting.plots import with_scaling
from trainbench.reporting.tables import short_of_gpus, with_planned, with_searches, write_tables
from trainbench.study.config import load_config
from trainbench.workflow import Workflow

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    # the study as the workflow expanded it (config.yaml and its study files): its planned cells and the
    # grid's row order; what the table shows, as the rule's made_with parameter digests it
    study = load_config(snakemake.config).study(snakemake.wildcards.study)  # noqa: F821
    layout = Workflow.table_layout(study)
    metrics = list(snakemake.input.metrics)  # noqa: F821
    docs = with_planned(read_cells(metrics), study, short_of_gpus=short_of_gpus(study, metrics))
    docs = with_searches(docs, [read_search(path) for path in snakemake.input.searches])  # noqa: F821
    docs = with_scaling(docs, layout["id_keys"])  # a study that scales a strategy: its efficiency
    output = snakemake.output  # noqa: F821
    write_tables(docs, study=study.name, description=layout["description"], id_keys=layout["id_keys"],
                 report=layout["report"], csv_path=output.csv, md_path=output.md,
                 all_path=output.every_column, plan_path=output.plan,
                 plan_for=study.plan_for, findings=layout["findings"], references=layout["references"],
                 findings_path=output.findings)
