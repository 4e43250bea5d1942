"""One resolved view of a cell: its parameters with the model, framework and strategy they name.

The memory, time and communication models read a cell through this view and never look a name up in
the registry themselves: what a cell *is* (its model's shapes and facts, its framework's facts, its
strategy's layout and offloads) is resolved here, once, where the view is built. A caller that holds
a view hands it on; one that holds only `CellParams` gets a view built at the model's door
(`as_view`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainbench.registry.frameworks import Framework, Strategy, framework_of, offloads, strategy_of
from trainbench.registry.frameworks import zero_overlaps_comm as _zero_overlaps_comm
from trainbench.registry.models import ModelSpec, get_model
from trainbench.study.params import CellParams


@dataclass(frozen=True)
class CellView:
    params: CellParams
    model: ModelSpec  # as its name registers it (the registry's, or the config's own model)
    framework: Framework
    strategy: Strategy
    offload_optimizer: bool  # the strategy's own offloads, or the cell's where it may choose
    offload_param: bool
    overlaps_comm: bool  # a ZeRO cell reduces its gradients during backward (overlap_comm)

    @property
    def built(self) -> ModelSpec:
        """The model as the cell builds it: its vocabulary padded to the cell's multiple."""
        return self.model.with_vocab_multiple(self.params.vocab_multiple)

    @property
    def offloads(self) -> tuple[bool, bool]:
        return self.offload_optimizer, self.offload_param


def view_of(params: CellParams) -> CellView:
    """The cell's view; KeyError where a name is unknown (the grid has checked a study's cells)."""
    offload_optimizer, offload_param = offloads(params)
    return CellView(params, get_model(params.model), framework_of(params), strategy_of(params),
                    offload_optimizer, offload_param, _zero_overlaps_comm(params))


def as_view(cell: CellParams | CellView) -> CellView:
    return cell if isinstance(cell, CellView) else view_of(params=cell)


def strategy_of_cell(cell: CellParams | CellView) -> Strategy:
    """The cell's strategy alone, resolved without its model: what a figure that depends on the strategy
    and nothing of the model needs (an emulated result's NCCL shortfall, read without the config that
    defines a model of one's own)."""
    return cell.strategy if isinstance(cell, CellView) else strategy_of(cell)


def params_of(cell: CellParams | CellView) -> CellParams:
    return cell.params if isinstance(cell, CellView) else cell
