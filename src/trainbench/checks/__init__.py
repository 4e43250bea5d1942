"""How good the models are on what was measured: `trainbench check-models memory|time|predictions|
emulation`. The memory model against every measured cell and max-batch probe, in and out of sample
(`memory`, `memory_out_of_sample`, `memory_snapshots`); the time model leave-one-out and on thread
curves it never fits (`step_time`, `thread_curves`); predictions committed before their cells ran,
against the cells' results (`predictions`); emulated ranks against the real ranks of their number
(`emulation`); the causal LMs of transformers it counts (`architectures`). `inputs` says which
published results they read by default; `commands` is their command line.

May import: every stage below it (`registry`, `study`, `contract`, `predict`, `training`, `execute`,
`reporting`); nothing imports it but the command line (`trainbench.cli`).
"""
