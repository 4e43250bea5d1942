"""Predictions made before a cell runs: GPU and host memory (`memory_model`), step time
(`time_model`, with its fitted constants), and the largest-batch search's bounds and walk
(`batch_search`).

May import: `registry`, `study`, and `trainbench.errors` / `trainbench.paths`.
"""
