"""How one rank trains: trainbench's GPT (`gpt`) and its tensor-parallel plan (`tensor_parallel`), the
data (`data`, `sentiment`), one runner per framework (`runners`), and emulated ranks (`emulation`).

May import: `registry`, `study`, `predict` (emulation asks the memory model for the heaviest rank), and
`trainbench.errors` / `trainbench.paths`. Framework libraries (torch, deepspeed, lightning,
transformers) are imported here and in `execute.worker` only.
"""
