"""Which set-up for a model on a cluster, and does it fit? Every set-up the frameworks can run, predicted
before anything runs (`trainbench advise`, docs/advise.md).

For a model and a cluster (a GPU type, GPUs per node, nodes, host memory per node), `advise` enumerates
each framework's strategies (registry.frameworks: what each offers, what it offloads where a cell may
choose, whether it splits the model by tensor or pipeline parallelism) x micro batch (powers of two) x
activation checkpointing x offload x tp (and pp) dividing the GPUs. Each becomes a cell's parameters as a
study's cell would (`CellParams.resolve`, so `tuning: best` fills in the same settings) and is checked as
the grid checks one (`grid.check_cell`): a combination the checks refuse is skipped and counted, as is
one the stack or this version cannot run. The memory model says which fit the GPUs and the host, the
time model how fast each runs; the ones that fit are ranked by predicted tokens/s per GPU.

`study_text` writes the answer as a study (the schema of studies/*.yaml): the top set-ups, the plain
DDP and FSDP ones at their fastest fitting micro batch and each framework's fastest, with findings that
hold the measured order to the predicted one, so that building its table confirms the ranking or says
where it does not hold.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from trainbench.predict import time_model
from trainbench.predict.memory_model import Hardware, Prediction, predict as predict_memory
from trainbench.registry import frameworks
from trainbench.registry.hardware import MIB, GpuType, peak_flops
from trainbench.registry.models import get_model
from trainbench.study.grid import check_cell
from trainbench.study.params import CellParams

# What tells one set-up from another: a cell's keys the search varies (the rest is the request's)
SETUP_KEYS = ("framework", "strategy", "tp", "pp", "micro_batch", "grad_accum", "activation_checkpointing",
              "offload_optimizer", "offload_param")
# how a set-up's outcome is counted
INVALID, CANNOT_RUN, TOO_BIG, FITS = "invalid", "cannot run", "does not fit", "fits"
# the plain set-ups the written study measures beside the top ones: a replicated model on several ranks
# (DDP) and a sharded one (FSDP), neither split nor offloaded
PLAIN = {"DDP": lambda s: s.layout == "replicated" and not s.single_rank,
         "FSDP": lambda s: s.layout == "fsdp"}
# host memory a rank of the written study asks for over the model's figure: its prediction is a median
HOST_MEMORY_MARGIN = 1.25
MB_PER_MIB = MIB / 1e6


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """The powers of two from `low` to `high` (a micro-batch range): 1-64 is 1, 2, 4, ..., 64."""
    return tuple(2 ** k for k in range(max(0, math.ceil(math.log2(low))), int(math.log2(high)) + 1))


@dataclass(frozen=True)
class Cluster:
    gpu: GpuType
    gpus_per_node: int
    nodes: int
    host_mem_gib: float

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def hardware(self) -> Hardware:
        return Hardware(self.gpu.memory_mib, self.host_mem_gib * 1024, self.gpus_per_node, self.gpu.key,
                        self.gpu)

    def describe(self) -> str:
        nodes = f"{self.nodes} nodes" if self.nodes > 1 else "1 node"
        return (f"{nodes} of {self.gpus_per_node} {self.gpu.key} ({self.gpu.memory_mib / 1024:.1f} GiB each, "
                f"{self.host_mem_gib:,.0f} GiB host per node)")


@dataclass(frozen=True)
class Request:
    """What to search: a model on a cluster, at one sequence length and precision, over micro batches (and
    the accumulation that makes a global batch, where one is given; else one micro batch a step)."""

    model: str
    cluster: Cluster
    seq_len: int | None = None  # None: the model's context
    precision: str = "bf16"
    micro_batches: tuple[int, ...] = powers_of_two(1, 64)
    global_batch: int | None = None
    cpu_threads: int = time_model.DEFAULT_CPU_THREADS  # each rank's, for an offloaded optimizer

    def command(self) -> str:
        """The command line that asks this."""
        c = self.cluster
        line = (f"trainbench advise --model {self.model} --gpu {c.gpu.key} --gpus-per-node {c.gpus_per_node} "
                f"--nodes {c.nodes} --host-mem-gib {c.host_mem_gib:g}")
        if self.seq_len is not None:
            line += f" --seq-len {self.seq_len}"
        batches = self.micro_batches
        line += f" --precision {self.precision} --micro-batch {batches[0]}-{batches[-1]}"
        return line + (f" --global-batch {self.global_batch}" if self.global_batch else "")

    def problems(self) -> list[str]:
        """What makes the request unanswerable, each naming its option."""
        spec, found = get_model(self.model), []
        if self.seq_len is not None and self.seq_len > spec.max_seq:
            found.append(f"--seq-len {self.seq_len} exceeds {self.model}'s context of {spec.max_seq} tokens")
        if peak_flops(self.cluster.gpu, self.precision, False) is None:
            found.append(f"--precision {self.precision}: {self.cluster.gpu.key} has no {self.precision} "
                         "tensor cores; try fp16 or fp32")
        if not self.micro_batches:
            found.append("--micro-batch: the range holds no power of two")
        return found


@dataclass(frozen=True, eq=False)  # one set-up is itself: compared and hashed by identity
class SetUp:
    """A set-up that fits, with what the models predict of it."""

    params: CellParams
    memory: Prediction
    time: time_model.TimePrediction

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.time.tokens_per_s / self.params.gpus

    def headroom_mib(self, cluster: Cluster) -> float:
        return cluster.gpu.memory_mib - self.memory.gpu_mem_mib

    @property
    def words(self) -> str:
        return words(self.params)


def words(p: CellParams) -> str:
    """A set-up in a few words: its framework and strategy, and what it splits, offloads and recomputes
    (a strategy that offloads by itself says so in its name)."""
    parts = [f"{p.framework} {p.strategy}"]
    parts += [f"tp {p.tp}"] if p.tp > 1 else []
    parts += [f"pp {p.pp}"] if p.pp > 1 else []
    parts += ["offload optimizer"] if p.offload_optimizer else []
    parts += ["offload params"] if p.offload_param else []
    parts += ["act. checkpointing"] if p.activation_checkpointing else []
    return ", ".join(parts)


@dataclass
class Advice:
    request: Request
    ranked: list[SetUp]  # every set-up that fits, fastest first
    counts: dict[str, int]  # by outcome (INVALID, CANNOT_RUN, TOO_BIG, FITS), and "considered"
    time_note: str | None  # where the time model's efficiencies come from another GPU type
    seconds: float
    # of the set-ups that do not fit, the one nearest to fitting (its need over what the cluster has)
    nearest: tuple[CellParams, Prediction] | None = None
    plain: dict[str, SetUp | None] = field(default_factory=dict)

    @property
    def best_of_framework(self) -> dict[str, SetUp]:
        """Each framework's fastest set-up that fits, in rank order."""
        best: dict[str, SetUp] = {}
        for setup in self.ranked:
            best.setdefault(setup.params.framework, setup)
        return best

    def rank(self, setup: SetUp) -> int:
        return self.ranked.index(setup) + 1


def _model_splits(strategy: frameworks.Strategy, gpus: int) -> list[tuple[int, int]]:
    """(tp, pp) pairs the strategy offers whose product divides the GPUs."""
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    tps = divisors if strategy.tensor_parallel else [1]
    pps = divisors if strategy.pipeline_parallel else [1]
    return [(tp, pp) for tp, pp in itertools.product(tps, pps) if gpus % (tp * pp) == 0]


def _offloads(strategy: frameworks.Strategy) -> list[tuple[bool, bool]]:
    """(offload_optimizer, offload_param) choices a strategy leaves to the cell."""
    optimizer = [False, True] if strategy.offload_optimizer == frameworks.OPTIONAL else [False]
    param = [False, True] if strategy.offload_param == frameworks.OPTIONAL else [False]
    return list(itertools.product(optimizer, param))


def candidates(request: Request) -> list[dict[str, Any]]:
    """Every set-up to consider, as a cell's given parameters (what a study's include entry says). With a
    global batch, only micro batches whose accumulation makes it exactly."""
    gpus = request.cluster.gpus
    base = {"model": request.model, "precision": request.precision, "seq_len": request.seq_len,
            "gpus": gpus, "nodes": request.cluster.nodes}
    found = []
    for framework in frameworks.registry().values():
        for strategy in framework.strategies:
            for (tp, pp), (optimizer, param) in itertools.product(_model_splits(strategy, gpus),
                                                                  _offloads(strategy)):
                dp = gpus // (tp * pp)
                for micro_batch in request.micro_batches:
                    accumulation = 1
                    if request.global_batch is not None:
                        accumulation, left = divmod(request.global_batch, micro_batch * dp)
                        if left or not accumulation:
                            continue
                    found += [{**base, "framework": framework.name, "strategy": strategy.name, "tp": tp,
                               "pp": pp, "micro_batch": micro_batch, "grad_accum": accumulation,
                               "activation_checkpointing": checkpointing, "offload_optimizer": optimizer,
                               "offload_param": param} for checkpointing in (False, True)]
    return found


def judge(given: dict[str, Any], request: Request, hardware: Hardware,
          constants: time_model.Constants) -> tuple[str, CellParams | None, Prediction | None, Any]:
    """One set-up's outcome: (INVALID | CANNOT_RUN | TOO_BIG | FITS, its parameters, its memory, its time)."""
    params = CellParams.resolve(given)
    errors, unsupported = check_cell(params)
    if errors:
        return INVALID, None, None, None
    if unsupported or frameworks.not_implemented(params):
        return CANNOT_RUN, params, None, None
    memory = predict_memory(params, hardware)
    if not memory.fits:
        return TOO_BIG, params, memory, None
    timed = time_model.predict(params, request.cluster.gpu, constants, request.cpu_threads)
    # the time model predicts every checked cell on a GPU with the precision's peak (Request.problems)
    return (FITS, params, memory, timed) if timed is not None else (CANNOT_RUN, params, None, None)


def _need(memory: Prediction, hardware: Hardware) -> float:
    """How far a set-up is from fitting: its larger need over what the cluster has (1: it just fits)."""
    return max(memory.gpu_mem_mib / hardware.gpu_mem_mib, memory.host_mem_mib / hardware.host_mem_mib)


def advise(request: Request, progress: Callable[[int, int], None] | None = None) -> Advice:
    """Every set-up of the request judged (progress(done, total) now and then), those that fit ranked by
    predicted tokens/s per GPU."""
    started = time.perf_counter()
    hardware = request.cluster.hardware()
    constants, note = time_model.constants_for(request.cluster.gpu)
    given = candidates(request)
    counts = dict.fromkeys((INVALID, CANNOT_RUN, TOO_BIG, FITS), 0)
    fitting: list[SetUp] = []
    nearest: tuple[CellParams, Prediction] | None = None
    with frameworks.settled_plugins():  # the checks and models look frameworks up ~10 times a set-up
        for done, setup in enumerate(given, 1):
            outcome, params, memory, timed = judge(setup, request, hardware, constants)
            counts[outcome] += 1
            if outcome == FITS:
                fitting.append(SetUp(params, memory, timed))
            elif outcome == TOO_BIG and (nearest is None
                                         or _need(memory, hardware) < _need(nearest[1], hardware)):
                nearest = (params, memory)
            if progress is not None and (done % 64 == 0 or done == len(given)):
                progress(done, len(given))
    # fastest first; between equals, the one with more memory to spare
    fitting.sort(key=lambda s: (-s.tokens_per_s_per_gpu, s.memory.gpu_mem_mib))
    counts["considered"] = len(given)
    plain = {name: next((s for s in fitting if _plain(s.params, layout)), None)
             for name, layout in PLAIN.items()}
    return Advice(request, fitting, counts, note, time.perf_counter() - started, nearest, plain)


def _plain(params: CellParams, layout: Callable[[frameworks.Strategy], bool]) -> bool:
    return (layout(frameworks.strategy_of(params)) and params.tp == params.pp == 1
            and frameworks.offloads(params) == (False, False))


# --- what it prints ------------------------------------------------------------------------------------

# the set-up's words last: the figures line up, and a long set-up pads no column
TABLE_HEADER = ("#", "tokens/s per GPU", "MFU", "step (ms)", "GPU mem (GiB)", "headroom (GiB)",
                "GPUs x nodes", "micro x accum", "set-up")


def table(advice: Advice, top: int) -> str:
    """The `top` fastest set-ups that fit, as aligned text."""
    cluster = advice.request.cluster
    rows = [(str(i), f"{s.tokens_per_s_per_gpu:,.0f}", "" if s.time.mfu is None else f"{s.time.mfu:.1%}",
             f"{s.time.step_time_s * 1e3:,.0f}", f"{s.memory.gpu_mem_mib / 1024:.1f}",
             f"{s.headroom_mib(cluster) / 1024:.1f}", f"{cluster.gpus_per_node} x {cluster.nodes}",
             f"{s.params.micro_batch} x {s.params.grad_accum}", s.words)
            for i, s in enumerate(advice.ranked[:top], 1)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(TABLE_HEADER)]
    left = {len(TABLE_HEADER) - 1}  # the words read left-aligned, the figures right-aligned

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join(line(r).rstrip() for r in (TABLE_HEADER, *rows))


def heading(advice: Advice) -> str:
    r = advice.request
    seq = r.seq_len or get_model(r.model).max_seq
    text = f"{r.model} on {r.cluster.describe()}, sequence {seq:,}, {r.precision}"
    if r.global_batch:
        text += f", global batch {r.global_batch:,}"
    return text + (f"\nstep times: {advice.time_note}" if advice.time_note else "")


def summary(advice: Advice) -> str:
    """One line: how many set-ups were judged, in how long, and what became of them."""
    c = advice.counts
    return (f"{c['considered']:,} set-ups of {advice.request.model} predicted in {advice.seconds:.1f} s: "
            f"{c[FITS]:,} fit, {c[TOO_BIG]:,} do not, {c[INVALID]:,} invalid combinations skipped, "
            f"{c[CANNOT_RUN]:,} no runner here can run (its framework does not build the model, or the stack "
            "refuses)")


def no_fit(advice: Advice) -> str:
    """The one-line answer where nothing fits: the set-up nearest to fitting and what it lacks."""
    r = advice.request
    if advice.nearest is None:
        return f"{r.model}: no set-up the frameworks can run on {r.cluster.describe()}"
    params, memory = advice.nearest
    return (f"{r.model} fits no set-up on {r.cluster.describe()}: the nearest, {words(params)} at micro "
            f"batch {params.micro_batch}, {memory.why_not}")


# --- the study that confirms it ------------------------------------------------------------------------

def chosen(advice: Advice, top: int) -> list[SetUp]:
    """The set-ups the written study measures, fastest first: the `top` fastest, the plain ones, and each
    framework's fastest (which framework to use is as much the question as which strategy)."""
    picked = (advice.ranked[:top] + [s for s in advice.plain.values() if s is not None]
              + list(advice.best_of_framework.values()))
    return sorted(dict.fromkeys(picked), key=advice.rank)


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10 ** 6, sort_keys=False).strip()


def _label(advice: Advice, setup: SetUp) -> str:
    """A set-up as the study names it: its words, micro batch, predicted rank and which plain one it is."""
    rank = advice.rank(setup)
    plain = [f", plain {name}" for name, s in advice.plain.items() if s is setup]
    framework = setup.params.framework
    best = ([f", fastest {framework}"] if rank > 1 and advice.best_of_framework.get(framework) is setup
            else [])
    return (f"{setup.words}, micro batch {setup.params.micro_batch} (predicted #{rank}"
            f"{''.join(plain + best)})")


# two set-ups predicted closer than this (a share of the faster's tokens/s) are predicted alike: measured,
# they should be within SAME_WITHIN of each other, in either order
TIED, SAME_WITHIN = 0.01, 0.05


def _tied(faster: SetUp, slower: SetUp) -> bool:
    return faster.time.tokens_per_s - slower.time.tokens_per_s < TIED * faster.time.tokens_per_s


def findings(advice: Advice, setups: list[SetUp], varying: list[str],
             emulated: bool = False) -> list[dict[str, Any]]:
    """What measuring the study should show: every set-up trains, the fastest predicted is the fastest
    measured, and each is faster than the next in the predicted order (as fast, where predicted alike).
    `emulated`: its cells run as one rank of their world, whose order the findings cannot measure."""
    found: list[dict[str, Any]] = [{"claim": "every set-up predicted to fit trains", "fits": {}}]
    if len(setups) < 2:
        return found

    def cells(s: SetUp) -> dict[str, Any]:
        return {key: s.params.get(key) for key in varying}

    chain = list(zip(setups, setups[1:]))
    if not _tied(*chain[0]):  # the headline, which holds the first pair of the chain too
        found.append({"claim": f"{_label(advice, setups[0])} is the fastest measured",
                      "compare": {"metric": "tokens_per_s", "more": cells(setups[0]), "than": {}}})
        chain = chain[1:]
    for faster, slower in chain:
        if _tied(faster, slower):
            claim, relation = "is as fast as", {"same": cells(faster), "as": cells(slower),
                                                "within": round(SAME_WITHIN * faster.time.tokens_per_s)}
        else:
            claim, relation = "is faster than", {"more": cells(faster), "than": cells(slower)}
        found.append({"claim": f"{_label(advice, faster)} {claim} {_label(advice, slower)}",
                      "compare": {"metric": "tokens_per_s", **relation}})
    if emulated:
        found[1]["note"] = ("tokens/s of the whole world: an emulated cell times one rank's compute alone, "
                            "so its pairs are judged on the models' figures until it runs whole")
    return found


def study_text(advice: Advice, name: str, top: int, gpus_here: int,
               models: dict[str, Any] | None = None) -> str:
    """The study measuring the chosen set-ups, as YAML (each include entry under a comment giving its
    predicted rank and figures). `gpus_here`: GPUs of the machine that will run it; set-ups needing more
    run as one emulated rank each. `models`: the model's definition, where no config file holds it."""
    request, setups = advice.request, chosen(advice, top)
    cluster = request.cluster
    varying = [k for k in SETUP_KEYS if len({s.params.get(k) for s in setups}) > 1]
    emulate = cluster.gpus > max(gpus_here, 1)
    # an emulated rank runs on whatever GPU is here: held to the cluster's memory, it fits where one of the
    # cluster's would
    limit = round(cluster.gpu.memory_mib / 1024, 1)
    emulated = {"emulate": True, "gpu_mem_limit_gib": limit} if emulate else {}
    settings = {"model": request.model, "precision": request.precision, "seq_len": setups[0].params.seq_len,
                "gpus": cluster.gpus, "nodes": cluster.nodes, **emulated,
                **{k: setups[0].params.get(k) for k in SETUP_KEYS if k not in varying}}
    per_rank_mib = max(s.memory.host_mem_mib / cluster.gpus_per_node for s in setups)
    execution = {"cpus_per_rank": request.cpu_threads,
                 "mem_mb_per_rank": max(16000, math.ceil(per_rank_mib * HOST_MEMORY_MARGIN * MB_PER_MIB))}
    report = ["step_time_ms", "tokens_per_s", "mfu", "gpu_mem_max_gib", "step_time_error_pct"]
    report += ["whole_step_ms"] if emulate else []
    description = (f"The set-ups trainbench advise predicts fastest for {request.model} on "
                   f"{cluster.describe()}, ranked by predicted tokens/s per GPU, with plain DDP and FSDP "
                   "and each framework's fastest beside them where they fit; the findings say whether "
                   "the measured order follows the predicted one.")
    lines = [f"# Written by `{request.command()}` (docs/advise.md).",
             "# Each include entry's comment gives its predicted rank among the set-ups that fit, and its",
             "# predicted figures.", *([f"# Step times: {advice.time_note}."] if advice.time_note else []),
             *(_emulation_comment(gpus_here, cluster.gpus) if emulate else [])]
    lines += [_block({"models": models}, 0)] if models else []
    lines += ["studies:", f"  {name}:", _block({"description": description, "settings": settings}, 4),
              "    include:"]
    for s in setups:
        lines += [f"      # {_label(advice, s)}:",
                  f"      # {s.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
                  f"{s.memory.gpu_mem_mib / 1024:.1f} GiB per GPU, step {s.time.step_time_s * 1e3:,.0f} ms",
                  f"      - {_flow({k: s.params.get(k) for k in varying})}"]
    lines += [_block({"execution": execution, "report": report,
                      "findings": findings(advice, setups, varying, emulate)}, 4)]
    return "\n".join(lines) + "\n"


def _block(mapping: dict[str, Any], indent: int) -> str:
    """A mapping as block YAML, indented; its innermost collections in flow style, its text wrapped."""
    text = yaml.safe_dump(mapping, default_flow_style=None, width=100, sort_keys=False).rstrip("\n")
    return "\n".join(" " * indent + line for line in text.splitlines())


def _emulation_comment(gpus_here: int, gpus: int) -> list[str]:
    return [f"# emulate: the machine that runs it has {gpus_here} GPU(s) (advise --gpus-here) and each",
            f"# set-up needs {gpus}: each runs as one rank of its world on one GPU (docs/emulation.md), held",
            "# to the cluster's GPU memory (gpu_mem_limit_gib), its memory and compute measured, its",
            f"# communication modelled. --gpus-here {gpus} runs them whole."]
