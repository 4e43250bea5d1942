"""Adapter for rule study_plots: read the study's metrics.json files, draw its plots (planned cells at
their predictions) into its plot folder."""

import sys

from trainbench.study.config import load_config
from trainbench.reporting.plots import write_plots
from trainbench.contract.result import read_search
from trainbench.reporting.documents import read_cells
from trainbench.reporting.tables import short_of_gpus, with_planned, with_searches
from trainbench.workflow import Workflow

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    study = load_config(snakemake.config).study(snakemake.wildcards.study)  # noqa: F821
    layout = Workflow.plot_layout(study)  # what the rule's made_with parameter digests
    metrics = list(snakemake.input.metrics)  # noqa: F821
    docs = with_planned(read_cells(metrics), study, short_of_gpus=short_of_gpus(study, metrics))
    docs = with_searches(docs, [read_search(path) for path in snakemake.input.searches])  # noqa: F821
    written = write_plots(docs, study=study.name, id_keys=layout["id_keys"], panel_keys=layout["plot_panels"],
                          profiled=study.profiled, directory=snakemake.output[0])  # noqa: F821
    print(f"{len(written)} plots: {', '.join(path.name for path in written)}", file=log)
