"""Adapter for rule dataset: every result on disk into results/dataset/cells.parquet."""

import sys

from trainbench.reporting.documents import read_cells
from trainbench.reporting.dataset import write

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    rows = write(read_cells(snakemake.input.cells), snakemake.output[0])  # noqa: F821
    print(f"{rows} rows from {len(snakemake.input.cells)} cells", file=log)  # noqa: F821
