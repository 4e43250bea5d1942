"""A cell's result as a type: metrics.json's contract (`result`: its keys, schema, migration of older
files, the typed `Result` and its reader) and the figures timed windows give (`figures`). Every stage
after it reads results through it; none reads a result document by its keys.

May import: `registry`, `study`, and `trainbench.errors` / `trainbench.paths`.
"""
