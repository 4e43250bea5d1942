"""A cell's result as a type: metrics.json's contract (`result`: its keys, schema, migration of older
files, the typed `Result` and its reader), the figures timed windows give (`figures`) and a cell's
history lines (`history`). Every stage after it reads results through it.

May import: `registry`, `study`, and `trainbench.errors` / `trainbench.paths`.
"""
