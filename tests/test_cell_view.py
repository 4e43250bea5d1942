"""The memory, time and communication models, the runners and the rank process read a cell through its
view (study.cell_view), never looking its model, framework or strategy up in the registry themselves."""

import ast
import dataclasses
from pathlib import Path

from trainbench.predict import communication, memory_model, time_model
from trainbench.registry.hardware import GPUS
from trainbench.registry.models import get_model
from trainbench.study.cell_view import as_view, view_of
from trainbench.study.params import CellParams

SRC = Path(__file__).resolve().parents[1] / "src/trainbench"
LOOKUPS = {"get_model", "framework_of", "strategy_of", "offloads", "zero_overlaps_comm"}


def test_the_models_import_no_registry_lookup():
    for name in ("memory_model", "time_model", "communication"):
        tree = ast.parse((SRC / "predict" / f"{name}.py").read_text())
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names}
        assert not imported & LOOKUPS, (name, imported & LOOKUPS)


def test_the_runners_and_the_rank_process_import_no_registry_lookup():
    files = [*sorted((SRC / "training" / "runners").glob("*.py")), SRC / "execute" / "worker.py"]
    for path in files:
        tree = ast.parse(path.read_text())
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names}
        assert not imported & LOOKUPS, (path.name, imported & LOOKUPS)
    # nor do they reach into the parent's cell runner for a model of the config's own
    assert "execute.cellrun" not in (SRC / "execute" / "worker.py").read_text()


def test_a_view_resolves_the_cells_names_once():
    params = CellParams.resolve({"framework": "deepspeed", "strategy": "zero2", "model": "gpt2-124m",
                                 "gpus": 2, "seq_len": 1024, "micro_batch": 8, "offload_optimizer": True,
                                 "vocab_multiple": 64})
    view = view_of(params)
    assert view.strategy.zero_stage == 2 and view.framework.name == "deepspeed"
    assert view.offloads == (True, False)
    assert view.model is get_model("gpt2-124m")
    assert view.built.vocab_size == 50304 != view.model.vocab_size  # padded as the cell builds it
    assert as_view(view) is view and as_view(params) == view


def test_the_models_read_what_the_view_says_not_the_registry():
    # a view whose model has twice the blocks: every model follows the view it is handed
    params = CellParams.resolve({"framework": "torch", "strategy": "fsdp", "model": "gpt2-124m", "gpus": 2,
                                 "seq_len": 1024, "micro_batch": 8, "precision": "bf16"})
    view = view_of(params)
    deeper = dataclasses.replace(view, model=dataclasses.replace(view.model, n_layer=2 * view.model.n_layer))
    assert memory_model.predict(deeper).gpu_mem_mib > memory_model.predict(view).gpu_mem_mib
    assert memory_model.predict(view) == memory_model.predict(params)
    gathers = [len(communication.step_collectives(v)) for v in (view, deeper)]
    assert gathers[0] == gathers[1]  # the same collectives, of more bytes:
    sizes = [sum(c.size_bytes * c.count for c in communication.step_collectives(v)) for v in (view, deeper)]
    assert sizes[1] > 1.5 * sizes[0]
    work = [time_model.work(v, GPUS["h100"]) for v in (view, deeper)]
    assert work[1].matmul_s > 1.5 * work[0].matmul_s and work[1].layer_passes == 2 * work[0].layer_passes


def test_a_runner_builds_and_configures_what_its_view_says():
    import torch

    from trainbench.training.runners import RunContext
    from trainbench.training.runners.deepspeed_engine import deepspeed_config
    from trainbench.training.runners.load import runner_class

    params = CellParams.resolve({"framework": "deepspeed", "strategy": "zero2", "model": "gpt2-tiny",
                                 "device": "cpu", "gpus": 2, "seq_len": 32, "micro_batch": 2})
    view = view_of(params)
    deeper = dataclasses.replace(view, model=dataclasses.replace(view.model, n_layer=2 * view.model.n_layer))
    cpu = torch.device("cpu")
    assert RunContext(params, 0, 1, 0, cpu).view == view  # built from the parameters where none is handed
    built = [len(RunContext(params, 0, 1, 0, cpu, view=v).new_model().blocks) for v in (view, deeper)]
    assert built[1] == 2 * built[0]
    # the strategy and offloads the view holds, not the registry's for the cell's names
    offloaded = dataclasses.replace(view, offload_optimizer=True)
    assert "offload_optimizer" not in deepspeed_config(view, "cpu")["zero_optimization"]
    assert deepspeed_config(offloaded, "cpu")["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert runner_class(view).__name__ == runner_class(params).__name__
