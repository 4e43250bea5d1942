"""Running one cell: the cell runner (`cellrun`) places and launches its ranks (`launch`, `gpus`,
`slurm`) and watches them and what started it (`watch`); each rank's worker (`worker`) trains through
a runner, samples memory (`memory_sampler`), profiles a few steps (`profiling`), records provenance
(`provenance`) and turns timings into metrics (`metrics`); `results` is the one metrics.json schema,
read and written, and `history` keeps every run of a cell.

May import: `registry`, `study`, `predict`, `training`, and `trainbench.errors` / `trainbench.paths`.
"""
