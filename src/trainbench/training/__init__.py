"""How one rank trains: trainbench's GPT (`gpt`) and its tensor-parallel plan (`tensor_parallel`), a
user's own models (`user_models`), the data (`data`, `sentiment`), one runner per framework
(`runners`, each loaded by `runners.load`), and emulated ranks (`emulation`).

May import: `registry`, `study`, `predict` (emulation asks the memory model for the heaviest rank), and
`trainbench.errors` / `trainbench.paths`. A framework (DeepSpeed, Lightning, the Trainer) is imported
by its runner alone (tests/test_frameworks.py); torch and transformers' models by the model code too.
"""

# The profiler range a runner puts around its framework's optimizer step (execute/profiling.py reads
# it beside torch's own `Optimizer.step#...`): here, where importing it imports no framework.
OPTIMIZER_RANGE = "trainbench: optimizer step"


def register_cell_model(params) -> None:
    """A model of the config's `models`, from the definition the cell carries: the cell runner and each
    rank load no config (the model is counted once, its facts kept beside the results). torch and
    transformers are imported only for such a model."""
    if params.model_definition:
        from trainbench.training.user_models import register_from_params

        register_from_params(params.model, params.model_definition)
