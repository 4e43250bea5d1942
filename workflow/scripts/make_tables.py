"""Adapter for rule study_table: read the study's metrics.json files, write its CSV and markdown."""

import sys

from trainbench.config import load_config
from trainbench.results import read_cells
from trainbench.tables import with_planned, write_tables

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    layout, planning = snakemake.params.layout, snakemake.params.planning  # noqa: F821
    study = snakemake.wildcards.study  # noqa: F821
    # rows in the grid's order, which is config.yaml's (not a param: reordering it reruns nothing)
    order = [c.cell_id for c in load_config(snakemake.config).study(study).cells]  # noqa: F821
    docs = with_planned(read_cells(snakemake.input.metrics), {**planning, "order": order}, study)  # noqa: F821
    write_tables(docs, study=study, description=layout["description"], id_keys=layout["id_keys"],
                 report=layout["report"], csv_path=snakemake.output.csv, md_path=snakemake.output.md,  # noqa: F821
                 plan_for=planning["plan_for"])
