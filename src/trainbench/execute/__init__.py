"""Running one cell: the cell runner (`cellrun`) places and launches its ranks (`launch`, `gpus`,
`slurm`) and watches them and what started it (`watch`); each rank's worker (`worker`) trains through
a runner, samples memory (`memory_sampler`), profiles a few steps (`profiling`), records provenance
(`provenance`) and measures what it holds (`metrics`); `results` fills metrics.json from the ranks'
reports (its contract and reading are `contract.result`'s), and `history` keeps every run of a cell.

May import: `registry`, `study`, `contract`, `predict`, `training`, and `trainbench.errors` /
`trainbench.paths`.
"""
