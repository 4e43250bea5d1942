"""How one rank trains: trainbench's GPT (`gpt`) and its tensor-parallel plan (`tensor_parallel`), the
data (`data`, `sentiment`), one runner per framework (`runners`), and emulated ranks (`emulation`).

May import: `registry`, `study`, `predict` (emulation asks the memory model for the heaviest rank), and
`trainbench.errors` / `trainbench.paths`. Framework libraries (torch, deepspeed, lightning,
transformers) are imported here and in `execute.worker` only.
"""

# The profiler range a runner puts around its framework's optimizer step (execute/profiling.py reads
# it beside torch's own `Optimizer.step#...`): here, where importing it imports no framework.
OPTIMIZER_RANGE = "trainbench: optimizer step"
