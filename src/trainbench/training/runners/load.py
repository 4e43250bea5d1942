"""A cell's runner, by the name the framework registry gives it ("module:Class", Framework.runner): the
one place runners are loaded by string, so that a framework of one's own (TRAINBENCH_PLUGINS) needs no
edit here. tests/test_layers.py counts the registry's names as this module's imports."""

from __future__ import annotations

import importlib

from trainbench.study.cell_view import CellView, as_view
from trainbench.study.params import CellParams
from trainbench.training.runners import RunContext, Runner


def runner_class(cell: CellParams | CellView) -> type[Runner]:
    """The class of the cell's framework's runner."""
    module_name, class_name = as_view(cell).framework.runner.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make_runner(context: RunContext) -> Runner:
    """The cell's framework's runner for this rank."""
    return runner_class(context.view)(context)
