"""Predictions made before a cell runs: GPU and host memory (`memory_model`), step time
(`time_model`, with its fitted constants), the largest-batch search's bounds and walk
(`batch_search`), and every set-up of a model on a cluster ranked by both models (`advise`).

May import: `registry`, `study`, `contract`, and `trainbench.errors` / `trainbench.paths`.
"""
