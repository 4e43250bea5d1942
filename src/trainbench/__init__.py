"""trainbench: reproducible benchmarks of distributed deep-learning training set-ups.

The package follows the pipeline, one subpackage per stage, each importing only the stages before
it (tests/test_layers.py holds them to it, and to no import cycle):

    registry   models, frameworks and GPU types, by name
    study      parameters, schema, grid, typed cells, config.yaml
    contract   a cell's result as a type: metrics.json's keys, schema, migration, reader
    predict    memory and time models, the largest-batch search, the set-up search (advise)
    training   trainbench's GPT, data, one runner per framework, emulated ranks
    execute    running one cell: launch, worker, memory sampling, metrics, results
    reporting  answer, tables, findings, plots, report, compare, progress (and cost), freshness
    checks     how good the memory and time models are on the published results (`check-models`)

`errors` and `paths` are shared by all; `cli`, `fit`, `commbench` and `workflow` (the Snakefile's side)
sit on top.
ARCHITECTURE.md draws the picture.
"""

__version__ = "0.2.0"

# The stages in import order: a module of one may import the stages before it, never one after.
LAYERS = ("registry", "study", "contract", "predict", "training", "execute", "reporting", "checks")
