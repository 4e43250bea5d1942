"""Emulated ranks: one rank of a cell's world, alone on one device, through PyTorch's fake process group.

A cell with `emulate: true` starts one process, not the world's N. That process joins a world of N
ranks as rank r (`emulate_rank`, or the heaviest rank by the memory model) through torch's `fake`
backend: every collective returns at once, while the cell's framework builds, shards, gathers into
and frees its real buffers, computes its real forward and backward passes and steps its real
optimizer on rank r's shard. What it measures is rank r's: its device memory (torch's peak
allocation and reservation, NVML's 'used'), its host memory, and its compute time per step.

What it cannot see, and what the result says instead (`emulation` in metrics.json):
- communication time: none happens, so the step time is rank r's compute time alone;
- NCCL's own buffers: no communicator exists, so the memory model's figure for the cell's layout
  (memory_model.nccl_buffers_mib, with the context an emulated rank does not load; both measured
  against real ranks) is added to the GPU's measured 'used' and said to be modelled;
- the other ranks' host memory on the node: the node's figure is rank r's times the ranks per node,
  and said to be derived.

The values that fake collectives write: torch's fake backend copies an all-gather's input into every
slot of its output, and newer releases also write a reduce-scatter's output (rank r's chunk of the
input) and the like; a release that leaves an output unwritten would hand the framework uninitialised
memory (NaN or Inf under fp16 loss scaling skips every step, and an optimizer whose states appear at
its first step never allocates them). `init_process_group` probes the backend it gets and, for each
collective whose output it leaves unwritten, writes that output the way newer releases do.
Broadcasts and receives leave their buffers as they were on every release: each rank's own values,
as if rank 0 were its twin; a broadcast of Python objects likewise. Where a framework relies on what
rank 0 sends, its adapter fills it in: a pipeline stage's received shapes and activations (seeded
normal values: zeros would overflow a deep stage's backward and skip its optimizer), DeepSpeed's checks
against rank 0 (trainbench.training.runners.deepspeed_engine), the Trainer's ZeRO-3 weights that rank 0 alone
initialises (trainbench.training.runners.hf_trainer). DDP reduces through a hook of its own (_hook_ddp).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from trainbench.study.params import CellParams

FAKE_BACKEND = "fake"
EMULATED_ENV = "TRAINBENCH_EMULATED"  # set by the worker of an emulated cell, for the runners


def in_this_process() -> bool:
    """Whether this process is an emulated rank (frameworks' adapters ask where a real world differs)."""
    return os.environ.get(EMULATED_ENV) == "1"


@dataclass(frozen=True)
class EmulatedRank:
    """Which rank of which world a process stands in for."""

    rank: int
    world_size: int
    ranks_per_node: int

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size}"


def rank_of(params: CellParams) -> EmulatedRank:
    """The rank an emulated cell runs: the one it names, or the heaviest by the memory model."""
    from trainbench.predict.memory_model import heaviest_rank

    rank = params.emulate_rank if params.emulate_rank is not None else heaviest_rank(params)
    return EmulatedRank(rank, params.gpus, params.gpus_per_node)


def environment(emulated: EmulatedRank, master_port: int) -> dict[str, str]:
    """The launcher variables frameworks read (DeepSpeed, accelerate, Lightning): rank r of the world,
    on device 0 of a node with the world's ranks per node."""
    return {"RANK": str(emulated.rank), "WORLD_SIZE": str(emulated.world_size), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(emulated.ranks_per_node), "GROUP_RANK": str(emulated.node),
            "NODE_RANK": str(emulated.node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}


# --- the fake process group, with the outputs it leaves unwritten written ---------------------------

_filled: list[str] = []  # the collectives this process writes after the backend (see _fill_outputs)


def init_process_group(emulated: EmulatedRank) -> list[str]:
    """Join the world as the emulated rank; returns the collectives whose outputs trainbench writes
    because this torch's fake backend does not."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the backend

    dist.init_process_group(FAKE_BACKEND, store=FakeStore(), rank=emulated.rank,
                            world_size=emulated.world_size)
    _hook_ddp()
    _broadcast_objects_as_twins()
    return _fill_outputs(emulated)


def _broadcast_objects_as_twins() -> None:
    """A broadcast of Python objects leaves every rank its own objects, as a fake broadcast of tensors
    does: rank r's are what a rank 0 that ran the same code would send. torch's own implementation would
    read the objects' sizes from a tensor the fake broadcast never writes, on every rank but the
    source (Lightning broadcasts from rank 0 as it sets up)."""
    import torch.distributed as dist

    if getattr(dist.broadcast_object_list, "_trainbench_emulated", False):
        return
    original = dist.broadcast_object_list

    def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
        return None

    broadcast_object_list._trainbench_emulated = True
    broadcast_object_list.__wrapped__ = original
    dist.broadcast_object_list = broadcast_object_list


def _allreduce_in_place(_state, bucket):
    """DDP's gradient all-reduce for an emulated rank: the default hook's division by the world size,
    the all-reduce (a fake one: it returns at once), and a future that holds the bucket. The default
    hook reads the reduced bucket from the collective's future, which the fake backend leaves empty."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    VISIBLE_ONLY_HERE.add(buffer.untyped_storage().data_ptr())
    buffer.div_(dist.get_world_size())
    dist.all_reduce(buffer)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


# Storages a real rank holds in C++ alone, which trainbench's own hooks bring into Python here (DDP's
# gradient buckets): the tensors-held census (metrics.tensors_held_bytes) leaves them out, so that
# emulated and real ranks are counted alike.
VISIBLE_ONLY_HERE: set[int] = set()


def _hook_ddp() -> None:
    """Every DistributedDataParallel this process makes (torch's own, Lightning's, the Trainer's)
    reduces its gradients through _allreduce_in_place."""
    from torch.nn.parallel import DistributedDataParallel

    if getattr(DistributedDataParallel, "_trainbench_emulated", False):
        return
    original = DistributedDataParallel.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.register_comm_hook(None, _allreduce_in_place)

    DistributedDataParallel.__init__ = init
    DistributedDataParallel._trainbench_emulated = True


def _leaves_unwritten(collective, emulated: EmulatedRank) -> bool:
    """Whether the fake backend leaves the output of `collective(output, input)` unwritten, tried on a
    small CPU tensor whose output starts as NaN."""
    import torch

    world = emulated.world_size
    source = torch.arange(world * 2, dtype=torch.float32)
    if collective.__name__.startswith("all_gather"):
        output, source = torch.full((world * 2,), float("nan")), source[:2].clone()
        expected = source.repeat(world)
    else:
        output = torch.full((2,), float("nan"))
        expected = source.chunk(world)[emulated.rank]
    with warnings.catch_warnings():  # newer releases call these deprecated; the frameworks call them
        warnings.simplefilter("ignore", FutureWarning)
        collective(output, source)
    return not torch.equal(output, expected)


def _fill_outputs(emulated: EmulatedRank, *, always: bool = False) -> list[str]:
    """Write the outputs of the collectives this torch's fake backend leaves unwritten, as newer
    releases do: an all-gather's input in every slot, a reduce-scatter's chunk of its input for this
    rank's place in the group. Done in torch.distributed's module before any framework looks its
    collectives up (DeepSpeed keeps the functions it finds when its backend starts). `always`: write
    them whatever the backend does (the tests' way to check the writing on a release that needs none)."""
    import inspect

    import torch.distributed as dist

    def gathered(output, source, group):
        output.view(-1).copy_(source.reshape(1, -1).expand(dist.get_world_size(group), -1).reshape(-1))

    def scattered(output, source, group):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        output.view(-1).copy_(source.reshape(size, -1)[rank])

    writers = {"all_gather_into_tensor": gathered, "reduce_scatter_tensor": scattered}
    for name, write in writers.items():
        original = getattr(dist, name)
        if name in _filled or not (always or _leaves_unwritten(original, emulated)):
            continue
        signature = inspect.signature(original)
        output_name, source_name = list(signature.parameters)[:2]

        def filled(*args, _original=original, _write=write, _signature=signature,
                   _names=(output_name, source_name), **kwargs):
            work = _original(*args, **kwargs)
            bound = _signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            _write(arguments[_names[0]].detach(), arguments[_names[1]].detach(), arguments.get("group"))
            return work

        filled.__name__ = name
        filled.__wrapped__ = original
        setattr(dist, name, filled)
        _filled.append(name)
    return list(_filled)


# --- holding a process to a smaller GPU ------------------------------------------------------------

@dataclass(frozen=True)
class DeviceLimit:
    """A GPU of `limit_mib` emulated on a larger one: the caching allocator may reserve what such a
    GPU leaves it after the CUDA context and NCCL's buffers (the memory model's constants)."""

    limit_mib: float
    device_total_mib: float
    cuda_context_mib: float
    nccl_buffers_mib: float

    @property
    def allocator_mib(self) -> float:
        return self.limit_mib - self.cuda_context_mib - self.nccl_buffers_mib

    @property
    def fraction(self) -> float:
        return self.allocator_mib / self.device_total_mib

    def as_dict(self) -> dict[str, float]:
        return {**{k: round(v, 1) for k, v in asdict(self).items()},
                "allocator_limit_mib": round(self.allocator_mib, 1), "fraction": round(self.fraction, 5)}


def device_limit(limit_gib: float, device_total_mib: float, params: CellParams) -> DeviceLimit:
    """The allocator's share of a GPU of `limit_gib` for one rank of the cell, emulated or real: what
    the GPU leaves after the CUDA context and NCCL's buffers for the cell's layout."""
    from trainbench.predict.memory_model import CUDA_CONTEXT_MIB, nccl_buffers_mib

    limit = DeviceLimit(limit_gib * 1024, device_total_mib, CUDA_CONTEXT_MIB, nccl_buffers_mib(params))
    if limit.allocator_mib <= 0:
        raise ValueError(f"gpu_mem_limit_gib={limit_gib:g} leaves nothing for tensors after the CUDA context "
                         f"({CUDA_CONTEXT_MIB:.0f} MiB) and NCCL's buffers")
    if limit.limit_mib > device_total_mib:
        raise ValueError(f"gpu_mem_limit_gib={limit_gib:g} is more than this GPU's "
                         f"{device_total_mib / 1024:.1f} GiB: a limit can only emulate a smaller GPU")
    return limit


def hold_to(limit: DeviceLimit, device) -> None:
    """Refuse allocations beyond the limit's share of the device, as the smaller GPU's allocator would
    run out (the caching allocator frees its cached blocks and retries first, as it does at a real
    GPU's end)."""
    import torch

    torch.cuda.set_per_process_memory_fraction(limit.fraction, device)


def device_total_mib(device) -> float:
    import torch

    return torch.cuda.get_device_properties(device).total_memory / (1024 * 1024)




# --- what a result of an emulated rank says -------------------------------------------------------

NOT_MEASURED = ("communication time: no collective moves data, so step_time_s (and every figure made "
                "from it) is the rank's compute time alone")


def section(params: CellParams) -> dict[str, Any]:
    """What every emulated cell's result says, whatever became of its run: which rank of which world,
    and what no emulated rank measures."""
    emulated = rank_of(params)
    return {"rank": emulated.rank, "world_size": emulated.world_size,
            "ranks_per_node": emulated.ranks_per_node, "nodes": params.nodes, "not_measured": NOT_MEASURED}


def account(metrics: dict[str, Any], reported: dict[str, Any], params: CellParams) -> dict[str, Any]:
    """The `emulation` section of an emulated cell's metrics.json, from what its rank reported
    (worker.py's `emulated`), and its metrics completed where a real rank's would hold more: the GPU's
    'used' memory with NCCL's buffers (modelled), the node's host memory as the rank's times the ranks
    per node (derived). `metrics` is changed in place; the measured figures stay in the section."""
    from trainbench.predict.memory_model import emulated_rank_shortfall_mib

    ranks_per_node = reported["ranks_per_node"]
    nccl = emulated_rank_shortfall_mib(params)
    said = {**section(params), "rank": reported["rank"], "world_size": reported["world_size"],
            "ranks_per_node": ranks_per_node,
            "outputs_written_by_trainbench": reported.get("outputs_written_by_trainbench", []),
            "measured": {"gpu_mem_used_mib": metrics.get("gpu_mem_used_mib"),
                         "host_rss_peak_mib": metrics.get("host_mem_peak_mib")},
            "modelled": {"nccl_buffers_mib": nccl}, "derived": {}}
    used = metrics.get("gpu_mem_used_mib")
    if used and nccl:
        metrics["gpu_mem_used_mib"] = [round(u + nccl, 1) for u in used]
        said["derived"]["gpu_mem_used_mib"] = "measured 'used' + modelled NCCL buffers"
    rss = metrics.get("host_mem_peak_mib")
    if rss is not None:
        metrics["host_mem_peak_mib"] = round(rss * ranks_per_node, 1)
        said["derived"]["host_mem_peak_mib"] = (f"the rank's peak resident memory x {ranks_per_node} "
                                                "ranks per node")
    return said
