"""What a cell's step sends, collective by collective, and how long that takes on a measured interconnect.

`step_collectives` derives the collectives from what each strategy does, per optimizer step of one rank:

- DDP: the fp32 gradients all-reduced once a step (accumulation runs under no_sync), in buckets of
  `ddp_bucket_cap_mb` (DDP's 25 MiB);
- FSDP2: each block's weights all-gathered in the compute dtype 2 x grad_accum times a step, or fewer as
  `fsdp_reshard` keeps them, and its gradients reduce-scattered once a step in fp32 (FSDP2's reduce
  dtype); the root's (embeddings, final norm) gathered for each micro batch (once a step with
  `after_step`); float8 layers' weights gathered in float8 where `float8_all_gather` says so;
- DeepSpeed ZeRO: stage 0 all-reduces the gradients once; stage 1 too, each rank keeping its
  partition (DeepSpeed's use_multi_rank_bucket_allreduce), then all-gathers the updated weights;
  stage 2 all-reduces them so after every micro batch, then all-gathers the weights; stage 3 gathers
  each block's weights for every forward and backward (and recomputation), the embeddings' for
  forward and backward, and reduce-scatters the gradients every micro batch; reductions in buckets
  of `reduce_bucket_size` elements (the framework's: DeepSpeed's 5e8, Lightning's 2e8, the Trainer's
  width^2), ZeRO-1/2's gathers in buckets of `allgather_bucket_size` (5e8);
- tensor parallelism: an all-reduce of a micro batch's activations (tokens x width) per split layer
  and pass; a pipeline's send/recv of them at each stage boundary, forward and backward.

Sizes are counted as nccl-tests counts them (the buffer of an all-reduce, the gathered output of an
all-gather, the scattered input of a reduce-scatter), so that `BandwidthTable` can time each from
`trainbench commbench`'s rows for the same collective and number of ranks: interpolated between the
measured sizes (log-log), at the smallest size's time below them (an operation's issue time), and at
the largest size's bandwidth above them. The sum is the time the collectives take alone on the link;
a step exposes only what compute does not overlap, which is the time model's business.

`Interconnect` is what the time model knows of a GPU type's links: the tables measured on it, or made
from nccl-tests' output (results/comm/<gpu>-x<ranks>.json on one host, <gpu>-n<nodes>x<ranks>.json
across nodes), time a group's collectives where one has the group's ranks (and nodes) and every
collective of it; another group (more ranks or nodes than any table, or a collective its table lacks)
moves its bus bytes (2(n-1)/n of an all-reduce's buffer, (n-1)/n of a gather's or a scatter's) at the
share of its link's bandwidth the tables' large messages reached, measured, not fitted. A group's link
(`link_gb_s`) is NVLink (or PCIe) inside a node; across nodes it is the network cards of the group's
ranks on one node together: NCCL's rings and trees cross a node's boundary on as many channels as the
node has cards, one a GPU on rail-optimised nodes, so a ring's bus bandwidth is the node's share of the
network, not one card's (8 GPUs of 400 Gb/s cards: up to 400 GB/s, where one card is 50; NCCL's
maintainers give that peak for such nodes in NVIDIA/nccl-tests#309, and results/comm/h200-n4x8's 4
nodes reach 331 GB/s).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from trainbench.paths import INTERCONNECT_NAME
from trainbench.predict.memory_model import (block_shard_params, float8_linear_params, shard_params,
                                             vocab_parallel)
from trainbench.registry.hardware import GpuType
from trainbench.study.cell_view import CellView, as_view
from trainbench.study.params import CellParams

MIB = 1 << 20
DDP_BUCKET_MIB = 25  # torch DDP's bucket_cap_mb default
ZERO_BUCKET_ELEMENTS = 5e8  # DeepSpeed's reduce_bucket_size and allgather_bucket_size defaults
# the share of a link's bandwidth collectives reach where no table of the GPU type was measured: what a
# 1 GiB all-reduce reached on 2 H200s (329 of 450 GB/s, results/comm/h200-x2.csv)
UNMEASURED_LINK_EFFICIENCY = 0.73
# messages from this size up show a link's bandwidth rather than an operation's issue time
LARGE_MESSAGE_BYTES = 64 * MIB
# bytes each rank moves over its link per byte of an operation's size (nccl-tests' bus factor; the
# number of ranks n): ring all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, a send/recv 1
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}
# where `trainbench commbench` writes its tables, relative to the project (the working directory, or
# else the checkout this package runs from)
COMM_DIR = Path("results/comm")


@dataclass(frozen=True)
class Collective:
    """`count` operations a step of one `kind` over `ranks` ranks, each of `size_bytes` (nccl-tests'
    convention)."""

    what: str
    kind: str  # all_reduce, all_gather, reduce_scatter, send_recv (commbench's names)
    size_bytes: float
    count: float
    ranks: int
    group: str = "dp"  # the process group: data parallel ("dp"), tensor ("tp") or pipeline ("pp") parallel

    def bus_bytes(self) -> float:
        """What each rank moves over its link for these operations, together."""
        return self.count * self.size_bytes * BUS_FACTOR[self.kind](self.ranks)


def _buckets(what: str, kind: str, total_bytes: float, bucket_bytes: float, times: float,
             ranks: int) -> list[Collective]:
    """`total_bytes` sent `times` a step in buckets of `bucket_bytes`: the full ones, then the rest."""
    full = math.floor(total_bytes / bucket_bytes)
    rest = total_bytes - full * bucket_bytes
    found = [Collective(what, kind, bucket_bytes, full * times, ranks)] if full else []
    if rest > 0:
        found.append(Collective(what, kind, rest, times, ranks))
    return found


def fsdp_gathers(cell: CellParams | CellView) -> int:
    """How often FSDP2 all-gathers each block a step: for forward and again for backward of every micro
    batch (its default), kept to backward (after_backward), or kept for the whole step (after_step)."""
    cell = as_view(cell)
    params = cell.params
    ga = params.grad_accum
    return {"after_backward": ga, "after_step": 1}.get(params.fsdp_reshard or "", 2 * ga)


def tp_all_reduces(cell: CellParams | CellView, layers: float) -> float:
    """Tensor parallelism's activation all-reduces a step on a rank holding `layers` blocks: per block 2
    forward and 2 backward in Megatron's layout (2 more recomputing), or one per layer a user's plan
    splits (ModelFacts.tp_collectives_per_block; half again recomputing); a vocabulary-parallel
    embedding all-reduces its output, and the LM head's input gradient is all-reduced."""
    cell = as_view(cell)
    params = cell.params
    spec = cell.model
    per_block = spec.facts.tp_collectives_per_block if spec.user_defined else 4
    recomputing = 1 + bool(params.activation_checkpointing) / 2
    return params.grad_accum * (layers * per_block * recomputing + 2 * vocab_parallel(cell))


def step_collectives(cell: CellParams | CellView) -> list[Collective]:
    """The collectives of one optimizer step of the cell's busiest rank (see the module's notes)."""
    cell = as_view(cell)
    params = cell.params
    spec = cell.model
    strategy = cell.strategy
    layout, stage = strategy.layout, strategy.zero_stage
    tp, pp, dp, ga = params.tp, params.pp, params.dp or 1, params.grad_accum
    mixed = params.precision != "fp32"
    weight_bytes = 2 if mixed else 4
    psi = shard_params(cell, spec)
    layers = spec.n_layer / pp
    block = block_shard_params(cell, spec)
    found: list[Collective] = []
    if dp > 1 and layout == "replicated":
        bucket = (params.ddp_bucket_cap_mb or DDP_BUCKET_MIB) * MIB
        found += _buckets("DDP's gradient buckets", "all_reduce", 4 * psi, bucket, 1, dp)
    elif dp > 1 and layout == "fsdp":
        gathers = fsdp_gathers(cell)
        reduce_bytes = cell.framework.memory.fsdp_reduce_bytes or weight_bytes
        root = psi - layers * block
        gathered = block * weight_bytes
        if params.float8_all_gather:  # the float8 layers' weights gathered in float8, 1 byte each
            gathered -= (weight_bytes - 1) * float8_linear_params(cell, spec) / spec.n_layer
        found.append(Collective("FSDP2: a block's weights", "all_gather", gathered, gathers * layers, dp))
        # the root (embeddings, final norm) is not resharded after its forward: gathered once a micro
        # batch, or once a step where nothing reshards until the last backward
        root_gathers = 1 if params.fsdp_reshard == "after_step" else ga
        found.append(Collective("FSDP2: the root's weights", "all_gather", root * weight_bytes, root_gathers,
                                dp))
        found.append(Collective("FSDP2: a block's gradients", "reduce_scatter", block * reduce_bytes,
                                layers, dp))
        found.append(Collective("FSDP2: the root's gradients", "reduce_scatter", root * reduce_bytes, 1, dp))
    elif dp > 1 and layout == "zero":
        # the framework's reduce bucket (DeepSpeed's 5e8 elements, Lightning's 2e8, the Trainer's width^2)
        bucket = (params.reduce_bucket_size or cell.framework.memory.reduce_bucket_elements(spec)
                  ) * weight_bytes
        gather_bucket = (params.allgather_bucket_size or ZERO_BUCKET_ELEMENTS) * weight_bytes
        if stage == 0:
            found += _buckets("ZeRO-0: gradients", "all_reduce", psi * weight_bytes, bucket, 1, dp)
        elif stage in (1, 2):
            # every bucket all-reduced whole, each rank keeping its partition (DeepSpeed's default
            # use_multi_rank_bucket_allreduce): ZeRO-1 at the accumulation boundary, ZeRO-2 as every
            # micro batch's backward fills its buckets
            found += _buckets(f"ZeRO-{stage}: gradients", "all_reduce", psi * weight_bytes, bucket,
                              1 if stage == 1 else ga, dp)
        else:
            passes = 2 + bool(params.activation_checkpointing)
            root = psi - layers * block
            found.append(Collective("ZeRO-3: a block's weights", "all_gather", block * weight_bytes,
                                    ga * passes * layers, dp))
            # the embeddings and the final norm, gathered for forward and backward (never recomputed)
            found.append(Collective("ZeRO-3: the root's weights", "all_gather", root * weight_bytes, ga * 2,
                                    dp))
            # each micro batch's gradients leave through the reduce bucket as the backward fills it
            found += _buckets("ZeRO-3: gradients", "reduce_scatter", psi * weight_bytes, bucket, ga, dp)
        if stage in (1, 2):
            found += _buckets(f"ZeRO-{stage}: updated weights", "all_gather", psi * weight_bytes,
                              gather_bucket, 1, dp)
    tokens = params.micro_batch * (params.seq_len or spec.max_seq)
    activations = tokens * spec.d_model * weight_bytes
    if tp > 1:
        found.append(Collective("tensor parallelism: a split layer's activations", "all_reduce",
                                activations, tp_all_reduces(cell, layers), tp, "tp"))
    if pp > 1:
        found.append(Collective("pipeline: activations and their gradients", "send_recv", activations,
                                2 * ga, 2, "pp"))
    return [c for c in found if c.count > 0 and c.size_bytes > 0]


class BandwidthTable:
    """A `trainbench commbench` table (results/comm/<gpu>-x<ranks>.json, or <gpu>-n<nodes>x<ranks>.json
    across nodes): each collective's measured time by message size, over its number of ranks (all of
    them, on `nodes` nodes)."""

    def __init__(self, document: dict):
        self.name, self.ranks = document["interconnect"], document["ranks"]
        self.nodes = int(document.get("nodes") or 1)
        self.times: dict[str, tuple[list[float], list[float]]] = {}
        for row in sorted(document["rows"], key=lambda r: (r["collective"], r["size_bytes"])):
            sizes, times = self.times.setdefault(row["collective"], ([], []))
            sizes.append(float(row["size_bytes"]))
            times.append(row["time_us"] * 1e-6)

    @classmethod
    def read(cls, path: Path) -> BandwidthTable:
        return cls(json.loads(Path(path).read_text()))

    def seconds(self, kind: str, size_bytes: float) -> float:
        """One operation's time at `size_bytes`: log-log between measured sizes, the smallest's time
        below them, the largest's bandwidth above."""
        if kind not in self.times:
            raise KeyError(f"{self.name} has no {kind} rows")
        sizes, times = self.times[kind]
        if size_bytes <= sizes[0]:
            return times[0]
        if size_bytes >= sizes[-1]:
            return times[-1] * size_bytes / sizes[-1]
        i = bisect.bisect_left(sizes, size_bytes)
        if sizes[i] == size_bytes:
            return times[i]
        share = math.log(size_bytes / sizes[i - 1]) / math.log(sizes[i] / sizes[i - 1])
        return math.exp(math.log(times[i - 1]) + share * math.log(times[i] / times[i - 1]))

    def step_seconds(self, collectives: list[Collective]) -> float | None:
        """The collectives' time alone on this interconnect; None where one runs over another number of
        ranks than the table's (it says nothing of them)."""
        if any(c.ranks != self.ranks for c in collectives):
            return None
        return sum(c.count * self.seconds(c.kind, c.size_bytes) for c in collectives)


def link_gb_s(gpu: GpuType, ranks: int, nodes: int = 1) -> float:
    """The bandwidth, per direction, that bounds the collectives of a group of `ranks` ranks on `nodes`
    nodes: the peer link (NVLink, else PCIe) on one node; across nodes the network cards of the group's
    ranks on a node, each GPU's share of the network (`network_gb_s`) times those ranks, at most the peer
    link their traffic also crosses inside the node."""
    if nodes <= 1:
        return gpu.peer_gb_s()
    return min(gpu.peer_gb_s(), gpu.network_gb_s * max(1, ranks // nodes))


def _large_message_share(tables: list[BandwidthTable], gpu: GpuType) -> float | None:
    """The median, over the tables' all-reduces, all-gathers and reduce-scatters of LARGE_MESSAGE_BYTES
    and more, of their bus bandwidth over the link of the table's ranks and nodes (`link_gb_s`); None
    where they have none."""
    shares = []
    for table in tables:
        link = link_gb_s(gpu, table.ranks, table.nodes) * 1e9
        for kind, (sizes, times) in table.times.items():
            if kind not in ("all_reduce", "all_gather", "reduce_scatter"):
                continue
            factor = BUS_FACTOR[kind](table.ranks)
            shares += [size * factor / time / link for size, time in zip(sizes, times)
                       if size >= LARGE_MESSAGE_BYTES]
    return float(sorted(shares)[len(shares) // 2]) if shares else None


@dataclass(frozen=True)
class Interconnect:
    """What the time model knows of one GPU type's links: its commbench tables by number of ranks on
    one host (`tables`) and across nodes (`node_tables`, by nodes and ranks), and the share of the
    link's bandwidth their large messages reach (`efficiency`, NVLink's; `network_efficiency`, the
    network's, of the cards of a group's ranks on one node: `link_gb_s`), which times a group no table
    has."""

    gpu: str
    tables: dict[int, BandwidthTable]
    efficiency: float
    node_tables: dict[tuple[int, int], BandwidthTable] = field(default_factory=dict)
    network_efficiency: float | None = None

    @classmethod
    def measured(cls, gpu: GpuType, tables: list[BandwidthTable]) -> Interconnect:
        """From the tables of `gpu`'s hosts: the efficiencies are the large messages' shares of the
        link, one host's of NVLink (UNMEASURED_LINK_EFFICIENCY where no table has them, at most 1),
        and those across nodes of the network cards of a node's ranks (not bounded: algorithms that
        reduce inside each node first move fewer bytes over the network than a ring's bus bytes
        count, and NVLink SHARP reduces in the switch)."""
        host = [t for t in tables if t.nodes == 1]
        nodes = [t for t in tables if t.nodes > 1]
        efficiency = _large_message_share(host, gpu) or UNMEASURED_LINK_EFFICIENCY
        return cls(gpu.key, {t.ranks: t for t in host}, min(efficiency, 1.0),
                   {(t.nodes, t.ranks): t for t in nodes}, _large_message_share(nodes, gpu))

    def seconds(self, collectives: list[Collective], link_gb_s: float, crosses_nodes: bool,
                nodes: int = 1) -> float:
        """The collectives of one process group alone on its link: from the table of its ranks (and
        `nodes`, where it spans them) where one has every collective of it, else its bus bytes at the
        link's efficiency of `link_gb_s` (the group's link, `link_gb_s()`: NVLink, or across nodes the
        network cards of its ranks on a node; the network's efficiency where a table across nodes
        measured it, else NVLink's)."""
        if not collectives:
            return 0.0
        ranks = collectives[0].ranks
        table = self.node_tables.get((nodes, ranks)) if crosses_nodes else self.tables.get(ranks)
        if table is not None and all(c.kind in table.times for c in collectives):
            return table.step_seconds(collectives)
        efficiency = (self.network_efficiency or self.efficiency) if crosses_nodes else self.efficiency
        return sum(c.bus_bytes() for c in collectives) / (efficiency * link_gb_s * 1e9)


# the checkout this package runs from (src/trainbench/predict/ -> the project), for its published tables
CHECKOUT = Path(__file__).resolve().parents[3]
_READ: dict[tuple[str, Path], Interconnect] = {}


def table_files(here: Path | None = None) -> list[Path]:
    """The bandwidth tables the time model reads: this checkout's results/comm (the published ones) and
    the working directory's, whose table of a name takes the place of the published one."""
    roots = dict.fromkeys([CHECKOUT, (here or Path.cwd()).resolve()])  # one folder, where they are one
    found = {path.name: path for root in roots for path in sorted((root / COMM_DIR).glob("*.json"))
             if INTERCONNECT_NAME.fullmatch(path.stem)}
    return [found[name] for name in sorted(found)]


def interconnect_of(gpu: GpuType) -> Interconnect:
    """The links of `gpu`'s hosts as measured: its commbench tables (table_files), by number of ranks;
    read once per working directory."""
    key = (gpu.key, Path.cwd())
    if key not in _READ:
        tables = [BandwidthTable.read(path) for path in table_files(key[1])
                  if INTERCONNECT_NAME.fullmatch(path.stem)["hardware"] == gpu.key]
        _READ[key] = Interconnect.measured(gpu, sorted(tables, key=lambda table: table.ranks))
    return _READ[key]
