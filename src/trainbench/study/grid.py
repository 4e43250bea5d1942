"""Expand a study's declarative grid into cells, each with a stable id and a canonical parameter string.

A cell's id is made of the keys the study varies (its axes, and the keys of its `include` entry), in
the parameter table's order: `strategy~zero2__offload_optimizer~true`. Fixed settings stay out of the
id, so editing one reruns the same cells (their parameters changed) rather than creating new ones.
The canonical string (JSON with sorted keys) is what the Snakemake rule receives as a param: it
changes exactly when the cell's own parameters change.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any, Iterable

from trainbench.registry import frameworks
from trainbench import paths
from trainbench.errors import ConfigError
from trainbench.registry.models import known_models
from trainbench.study.params import PARAMS_BY_NAME, SDPA_KERNELS, CellParams, canonical_json, sort_keys
from trainbench.study.schema import EXECUTION, REPORT_COLUMNS_DEFAULT, SEARCH
from trainbench.study.timing import TimingSettings

ID_VALUE = re.compile(r"^[A-Za-z0-9._+-]+$")
ID_SEPARATOR = "__"


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Cell:
    study: str
    cell_id: str
    params: CellParams
    id_keys: tuple[str, ...] = ()
    execution: dict[str, Any] = field(default_factory=dict)
    timing: TimingSettings = TimingSettings()
    unsupported: str | None = None
    measured: bool = True  # False: a planned cell (see Study.planned), in the table without a run

    # A cell's parameters never change once it is made (CellParams is frozen), so what is computed from
    # them is computed once: Snakemake asks for them many times per job (params, each resource), and
    # the grid stamp, freshness checks and tables once per cell each.
    @property
    def canonical(self) -> str:
        return self.params.canonical

    @property
    def params_hash(self) -> str:
        return self.params.params_hash

    @property
    def target(self) -> str:
        return paths.path(paths.RUN, study=self.study, cell=self.cell_id)

    def resources(self) -> dict[str, int | str | None]:
        """What the cell's job asks the scheduler for, as Snakemake resources that the SLURM plugin
        maps to sbatch flags, and how often the cell runner relaunches after an unexpected failure.

        A one-node cell asks for `gpu` (sbatch --gpus) and runs inside the plugin's own job step.
        A multi-node cell asks for GPUs per node (`gres`, sbatch --gres=gpu:N), one task per node,
        and `mpi`: the plugin then runs the job's command without a step of its own, and the cell
        runner starts one launcher per node with srun. None drops a resource from the job.
        """
        return dict(self._resources)  # a copy: the cell's own stays as computed

    @cached_property
    def _resources(self) -> dict[str, int | str | None]:
        p, ex = self.params, self.execution
        if self.unsupported is not None:  # recorded without launching anything
            return {"gpu": 0, "gres": None, "nodes": 1, "tasks": None, "tasks_per_gpu": None, "mpi": None,
                    "cpus_per_task": 1, "cpus_per_rank": 1, "mem_mb": 1000, "runtime": 5, "cell_runtime": 5,
                    "threads": 1, "retries": 0,
                    "timing": self.timing.as_argument(), "slurm_partition": None, "slurm_account": None,
                    "constraint": None, "gpu_model": None}
        # an emulated cell is one process of its world on one device, whatever the world's size
        ranks_per_node = p.ranks_here
        cpus = ex["cpus_per_rank"] * ranks_per_node
        cuda = p.device == "cuda"
        multinode = p.nodes > 1 and not p.emulate
        return {
            "gpu": ranks_per_node if cuda and not multinode else (None if multinode else 0),
            # a multi-node cell's GPUs per node, of the model asked for (the plugin's gpu_model is per job)
            "gres": (f"gpu:{ex['gpu_model'] + ':' if ex.get('gpu_model') else ''}{ranks_per_node}"
                     if cuda and multinode else None),
            "nodes": p.nodes if multinode else 1,
            "tasks": p.nodes if multinode else None,
            "tasks_per_gpu": 0 if cuda and multinode else None,  # 0: no --ntasks-per-gpu from the plugin
            "mpi": "srun" if multinode else None,
            "cpus_per_task": cpus,
            "cpus_per_rank": ex["cpus_per_rank"],  # what run-cell gives each rank (OMP threads)
            "mem_mb": ex["mem_mb_per_rank"] * ranks_per_node,
            "runtime": ex["runtime_min"],  # the job's time limit
            "cell_runtime": ex["runtime_min"],  # the run's own (a job array's limit may be longer)
            # cores Snakemake books on one machine: CPU ranks need their cores; GPU ranks one each
            "threads": cpus if not cuda else ranks_per_node,
            "retries": ex["retries"],
            # how long the cell times its steps: a setting of the run, not a parameter (no rerun)
            "timing": self.timing.as_argument(),
            # where its SLURM job runs (None: the profile's or the cluster's default)
            "slurm_partition": ex.get("slurm_partition"),
            "slurm_account": ex.get("slurm_account"),
            "constraint": ex.get("constraint"),
            "gpu_model": ex.get("gpu_model") if cuda and not multinode else None,
        }


@dataclass
class Study:
    name: str
    description: str
    cells: list[Cell]
    id_keys: list[str]
    report: list[str] = field(default_factory=lambda: list(REPORT_COLUMNS_DEFAULT))
    search: dict[str, Any] = field(default_factory=dict)  # the max-batch search's settings
    plan_for: dict[str, Any] | None = None  # the hardware planned cells are judged against
    searched: tuple[str, ...] = ()  # ids of the cells whose max-batch search the table reports
    plot_panels: tuple[str, ...] = ()  # keys whose values split the plots into panels
    # as config.yaml declares them; trainbench.workflow.load_checked checks them (reporting.findings)
    findings: list[dict[str, Any]] = field(default_factory=list)
    # reference figures with tolerances, checked by the reporting stage (reporting.references)
    references: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Every job of the workflow looks its cell up by id, several times (params, resources, the
        # grid stamp): a scan of the cells each time made planning quadratic in the grid's size.
        # A study's cells are fixed once it is made.
        self._cells_by_id = {c.cell_id: c for c in self.cells}

    @cached_property
    def slurm_array(self) -> bool:
        """Whether its cells go to SLURM as job arrays (execution.slurm_array; array_problems checks
        that its cells agree). Asked for every job's every resource: read once, not once per cell."""
        return any(c.execution.get("slurm_array") for c in self.cells)

    @cached_property
    def _array_request(self) -> dict[str, int | str | None]:
        """The one request of a job-array study's jobs (array_problems checked its cells agree on
        ARRAY_SHARED): the runnable cells' shared resources, and the largest of the raised ones."""
        runnable = [c.resources() for c in self.cells if c.unsupported is None] or [{}]
        return {**{name: runnable[0].get(name) for name in ARRAY_SHARED},
                **{name: max(r.get(name) or 0 for r in runnable) for name in ARRAY_RAISED}}

    def job_resources(self, cell: Cell) -> dict[str, int | str | None]:
        """What the cell's job asks the scheduler for: its resources, and in a study submitted as job
        arrays (one sbatch request for all its cells, which Snakemake's SLURM plugin takes from
        whichever job comes first) the array's request, an unsupported cell's minimal job included."""
        resources = cell.resources()
        if self.slurm_array:
            resources.update(self._array_request)
        return resources

    def cell(self, cell_id: str) -> Cell:
        try:
            return self._cells_by_id[cell_id]
        except KeyError:
            raise ConfigError(f"study {self.name!r} has no cell {cell_id!r}; "
                              f"`trainbench cells {self.name}` lists its cells") from None

    @property
    def targets(self) -> list[str]:
        """What the study's table and plots read: the measured cells' results."""
        return [c.target for c in self.cells if c.measured]

    @property
    def search_targets(self) -> list[str]:
        """The max-batch searches the study's table reports."""
        return [search_target(self.name, cell_id) for cell_id in self.searched]

    @property
    def profiled(self) -> bool:
        """Whether any measured cell profiles steps (timing's profile_steps): the study then has a
        breakdown plot."""
        return any(c.measured and c.timing.profile_steps for c in self.cells)

    @property
    def planned(self) -> list[Cell]:
        """Cells outside the study's `measure` selection: planned by the memory model, not run for
        the table (asking for one's target still runs it)."""
        return [c for c in self.cells if not c.measured]


# A job array is one sbatch request: the resources its cells must share, and those raised to the
# largest any of them asks for (more memory or time than a cell needs costs the queue, not the result:
# the run keeps its own time limit, cell_runtime)
ARRAY_SHARED = ("gpu", "gres", "nodes", "tasks", "tasks_per_gpu", "mpi", "cpus_per_task", "slurm_partition",
                "slurm_account", "constraint", "gpu_model")
ARRAY_RAISED = ("mem_mb", "runtime")


def array_problems(name: str, cells: list[Cell]) -> list[str]:
    """What keeps a study's cells from one job array: execution.slurm_array set for some cells only,
    or cells that ask for different GPUs, nodes, CPUs or placement (unsupported cells, which run no
    training, take the others' request: Study.job_resources)."""
    flags = {bool(c.execution.get("slurm_array")) for c in cells}
    if flags == {False}:
        return []
    if len(flags) > 1:
        return [f"studies.{name}.execution.slurm_array: set for some of its cells only "
                "(execution_overrides); a study goes to SLURM as arrays or not"]
    requests: dict[tuple, list[str]] = {}
    for cell in cells:
        if cell.unsupported is None:
            resources = cell.resources()
            requests.setdefault(tuple(resources[key] for key in ARRAY_SHARED), []).append(cell.cell_id)
    if len(requests) <= 1:
        return []
    differ = [i for i, _ in enumerate(ARRAY_SHARED) if len({request[i] for request in requests}) > 1]
    shown = "; ".join(f"{', '.join(f'{ARRAY_SHARED[i]}={request[i]}' for i in differ)}: {len(ids)} cell(s) "
                      f"({ids[0]}{', ...' if len(ids) > 1 else ''})" for request, ids in requests.items())
    return [f"studies.{name}.execution.slurm_array: one job array is one sbatch request, and its cells ask "
            f"for {len(requests)} different ones ({shown}); split the study, or leave slurm_array off"]


def shared_resources(jobs: Iterable[dict[str, int | str | None]]) -> dict[str, int | str | None]:
    """The resources (Study.job_resources) that every one of the jobs asks for alike, with their value.

    The workflow hands Snakemake these as values and the others as functions of a job's cell: Snakemake
    takes a value as it is, and calls a function through its input-function machinery for every job
    it plans. On a grid swept over batch sizes and seeds most resources are the same in every cell.
    Of no cells, nothing: there is no value to give."""
    shared: dict[str, int | str | None] | None = None
    for resources in jobs:
        if shared is None:
            shared = resources
        else:
            shared = {name: value for name, value in shared.items()
                      if name in resources and resources[name] == value}
        if not shared:
            break
    return shared or {}


def search_target(study: str, cell_id: str) -> str:
    return paths.path(paths.SEARCH, study=study, cell=cell_id)


# Keys that change what a measurement is, not only its set-up: a cell that sets one is always named
# by it, so an emulated result (or one on a smaller GPU) never takes the name, and the place, of the
# real cell it stands for, whatever the study varies.
ALWAYS_NAMED = ("emulate", "emulate_rank", "gpu_mem_limit_gib")


def named_keys(params: CellParams, keys: tuple[str, ...]) -> tuple[str, ...]:
    """A cell's id keys: the ones its study varies, and any key of ALWAYS_NAMED it sets."""
    extra = tuple(k for k in ALWAYS_NAMED if k not in keys and params.get(k) != PARAMS_BY_NAME[k].default)
    return keys + extra


def make_cell_id(params: CellParams, keys: tuple[str, ...]) -> str:
    return ID_SEPARATOR.join(f"{k}~{format_value(params.get(k))}" for k in _sorted_id_keys(keys))


@lru_cache(maxsize=None)
def _sorted_id_keys(keys: tuple[str, ...]) -> tuple[str, ...]:
    """A study's cells share a few tuples of id keys: each sorted once (a tuple: the cache's, shared)."""
    return tuple(sort_keys(keys))


def check_cell(p: CellParams) -> tuple[list[tuple[str, str]], str | None]:
    """Semantic checks of one resolved cell: (key, problem) pairs, and the unsupported reason if any."""
    errors: list[tuple[str, str]] = []
    models = known_models()
    model = models.get(p.model)
    if model is None:
        close = difflib.get_close_matches(p.model, list(models), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        errors.append(("model", f"unknown model {p.model!r}{hint}; known: {', '.join(models)} (the "
                                "registry's, and the config's `models`)"))
    elif p.seq_len > model.max_seq:
        errors.append(("seq_len", f"{p.seq_len} exceeds {p.model}'s context of {model.max_seq} tokens"))
    if p.gpus_per_node is None:
        errors.append(("gpus", f"gpus={p.gpus} is not a multiple of nodes={p.nodes}"))
    if p.dp is None:
        errors.append(("gpus", f"gpus={p.gpus} is not divisible by tp x pp = {p.tp} x {p.pp}"))
    steps = p.warmup_steps + p.timed_steps
    if p.inject_oom_at_step is not None and p.inject_oom_at_step > steps:
        errors.append(("inject_oom_at_step", f"step {p.inject_oom_at_step} is never reached: the cell "
                                             f"runs {steps} steps"))
    if (p.dataset_size is None) != (p.epochs is None):
        errors.append(("epochs" if p.epochs is None else "dataset_size",
                       "dataset_size and epochs describe the whole run together: set both or neither"))
    if p.vocab_multiple > 1 and model is not None and model.family != "gpt":
        errors.append(("vocab_multiple", f"pads trainbench's GPT models; {p.model} is built by "
                                         "transformers with its own vocabulary"))
    if p.attention in SDPA_KERNELS and p.device != "cuda":
        errors.append(("attention", f"{p.attention!r} is a CUDA kernel of SDPA; a CPU cell can use "
                                    "'sdpa' or 'eager'"))
    if p.launcher == "python" and p.nodes > 1:
        errors.append(("launcher", "'python' cannot span nodes"))
    if p.emulate_rank is not None and not p.emulate:
        errors.append(("emulate_rank", "names the rank an emulated cell runs; set emulate: true, or leave it "
                                       "null"))
    elif p.emulate_rank is not None and p.emulate_rank >= p.gpus:
        errors.append(("emulate_rank", f"rank {p.emulate_rank} is not a rank of a world of {p.gpus}"))
    if p.emulate and p.gpus == 1:
        errors.append(("emulate", "a one-rank cell already runs alone on one device; emulate is for cells "
                                  "of several ranks"))
    if p.float8 and p.precision != "bf16":
        errors.append(("float8", "float8 training runs what is not a matmul in bf16; set precision: bf16"))
    if p.float8_all_gather and (p.float8 != "tensorwise"
                                or frameworks.configures_another_strategy(p, "float8_all_gather")):
        errors.append(("float8_all_gather", "all-gathers FSDP2's tensorwise float8 weights in float8 "
                                            "(torchao has none for rowwise scales); set float8: tensorwise "
                                            "and strategy: fsdp, or leave it off"))
    if frameworks.configures_another_strategy(p, "fsdp_reshard"):
        errors.append(("fsdp_reshard", f"chooses when FSDP2 frees gathered parameters; strategy "
                                       f"{p.strategy!r} gathers none: set strategy: fsdp, or leave it unset"))
    for key in ("ddp_compile", "ddp_bucket_cap_mb", "ddp_bucket_view", "ddp_static_graph"):
        if frameworks.configures_another_strategy(p, key):
            errors.append((key, f"sets up torch DDP; strategy {p.strategy!r} is not DDP: set strategy: ddp, "
                                "or leave it unset"))
    if p.ddp_static_graph and p.grad_accum > 1:
        # torch's reducer asserts on the first backward under no_sync with a static graph, and past that
        # stops all-reducing gradients (pytorch/pytorch#143580, fixed by #187732, not yet released)
        errors.append(("ddp_static_graph", "DDP's static graph breaks under no_sync, which accumulating "
                                           "micro batches uses (torch asserts on the first backward); set "
                                           "grad_accum: 1, or leave it off"))
    if p.ddp_compile and not p.compile:
        errors.append(("ddp_compile", "says how torch.compile meets DDP; set compile: true, or leave it "
                                      "unset"))
    errors += _zero_setting_errors(p)
    if p.checkpoint_in_cpu and not p.activation_checkpointing:
        errors.append(("checkpoint_in_cpu", "keeps checkpointed activations in host memory; set "
                                            "activation_checkpointing: true"))
    if p.gpu_mem_limit_gib is not None and p.device != "cuda":
        errors.append(("gpu_mem_limit_gib", "holds a rank to less GPU memory; a CPU cell has none"))
    if p.tokens is not None and p.head != "lm":
        errors.append(("tokens", "trains a language model on your tokens; a classifier's data is "
                                 "dataset_path (or synthetic)"))
    strategy_errors, unsupported = frameworks.check(p)
    return errors + strategy_errors, unsupported


def _zero_setting_errors(p: CellParams) -> list[tuple[str, str]]:
    """A ZeRO setting on a stage that never reads it, by key: DeepSpeed would accept it and ignore it."""
    stage, unread = frameworks.zero_settings_unread(p)
    return [(key, f"is read by ZeRO stage {' and '.join(map(str, stages))}, and strategy {p.strategy!r} is "
                  f"stage {stage}: leave it unset") for key, stages in unread.items()]


def _matches(params: CellParams, pattern: dict[str, Any]) -> bool:
    return all(params.get(k) == v for k, v in pattern.items())


def selects(params: CellParams | dict[str, Any], selector: dict[str, Any]) -> bool:
    """A cell pattern (`measure`, `search`, `references`): a list value matches any of its items."""
    return all(params.get(k) in (v if isinstance(v, list) else [v]) for k, v in selector.items())


def _selected(cells: list[Cell], selectors: list[dict[str, Any]], key: str, what: str) -> list[Cell]:
    """The cells any selector matches, in grid order; a selector matching none is a config error."""
    idle = [f"{key}[{i}]: {selector!r} matches no {what}" for i, selector in enumerate(selectors)
            if not any(selects(c.params, selector) for c in cells)]
    if idle:
        raise ConfigError(idle)
    return [c for c in cells if any(selects(c.params, s) for s in selectors)]


def _execution(study_spec: dict[str, Any], params: CellParams) -> dict[str, Any]:
    settings = {k: v["default"] for k, v in EXECUTION.items()}
    settings.update(study_spec.get("execution") or {})
    for override in study_spec.get("execution_overrides") or []:
        if _matches(params, override["when"]):
            settings.update(override["set"])
    return settings


def _timing(study_spec: dict[str, Any], params: CellParams, base: TimingSettings) -> TimingSettings:
    overrides = [o["set"] for o in study_spec.get("timing_overrides") or [] if _matches(params, o["when"])]
    if not overrides:
        return base  # shared by the study's cells
    settings = base.as_dict()
    for override in overrides:
        settings.update(override)
    return TimingSettings(**settings)


def _key_conflicts(name: str, spec: dict[str, Any]) -> list[str]:
    """A key repeated within an axis, or set in two places (settings, axes, variants)."""
    settings = spec.get("settings") or {}
    axes: dict[str, list[Any]] = spec.get("axes") or {}
    problems: list[str] = []
    for key, values in axes.items():
        seen = [canonical_json({"v": v}) for v in values]
        if len(set(seen)) != len(seen):
            problems.append(f"studies.{name}.axes.{key}: repeated value in {values!r}")
        if key in settings:
            problems.append(f"studies.{name}: {key!r} is both a setting and an axis; keep one")
    owners: dict[str, str] = {}
    for variant, values in (spec.get("variants") or {}).items():
        for key in sorted({k for value in values for k in value}):
            if key in settings or key in axes or key in owners:
                other = ("settings" if key in settings else "axes" if key in axes
                         else f"variants.{owners[key]}")
                problems.append(f"studies.{name}.variants.{variant}: {key!r} is also set in {other}; "
                                "keep one")
            owners[key] = variant
    return problems


Entry = tuple[dict[str, Any], tuple[str, ...]]  # a cell's parameters beyond settings, and its id keys


def _grid_entries(name: str, spec: dict[str, Any], problems: list[str]) -> list[Entry]:
    """The product of the axes and variants, less what `exclude` removes."""
    settings = spec.get("settings") or {}
    # Each dimension is a list of (parameters, id keys) choices: one per axis value or variant value.
    axes, variants = spec.get("axes") or {}, spec.get("variants") or {}
    dimensions = [[({key: value}, (key,)) for value in values] for key, values in axes.items()]
    dimensions += [[(value, tuple(value)) for value in values] for values in variants.values()]
    excludes = spec.get("exclude") or []
    if not dimensions:
        if excludes:
            problems.append(f"studies.{name}.exclude: there are no axes to exclude combinations from")
        return []
    product = []
    for choice in itertools.product(*dimensions):
        combo = {k: v for part, _ in choice for k, v in part.items()}
        product.append((combo, tuple(k for _, keys in choice for k in keys)))
    # each combination resolved once, and only where there is something to exclude
    resolved = [CellParams.resolve({**settings, **combo}) for combo, _ in product] if excludes else []
    for i, pattern in enumerate(excludes):
        if not any(_matches(full, pattern) for full in resolved):
            problems.append(f"studies.{name}.exclude[{i}]: {pattern!r} matches no cell of the axes")
    return [entry for index, entry in enumerate(product)
            if not (excludes and any(_matches(resolved[index], pattern) for pattern in excludes))]


def _included_entries(spec: dict[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    for entry in spec.get("include") or []:
        # an entry with list values is a small grid of its own: one cell per combination of them
        listed = [key for key, value in entry.items() if isinstance(value, list)]
        for values in itertools.product(*(entry[key] for key in listed)):
            entries.append(({**entry, **dict(zip(listed, values))}, tuple(entry)))
    return entries


def _cell_id_problems(name: str, params: CellParams, id_keys: list[str],
                      cell_id: str) -> tuple[list[str], bool]:
    """What is wrong with the cell's name, and whether it is too long to be a file's name."""
    problems = [f"studies.{name}: value {params.get(key)!r} of {key} cannot name a cell; "
                "use letters, digits, '.', '_', '+' and '-'"
                for key in id_keys if not ID_VALUE.match(format_value(params.get(key)))]
    # every name made of it must fit a file name: its folder, its history `<cell>.jsonl` and the
    # SLURM plugin's log folder `<study>_<cell>`
    longest = max(f"{name}_{cell_id}", f"{cell_id}{paths.HISTORY_SUFFIX}", key=len)
    too_long = len(longest.encode()) > paths.NAME_MAX
    if too_long:
        problems.append(f"studies.{name}: cell {cell_id!r} is {len(cell_id.encode())} characters long: "
                        f"as {longest[-12:]!r} more than a file's name may be ({paths.NAME_MAX}); "
                        "vary fewer keys between its entries (keys every entry shares belong in "
                        "settings; a key at its default value need not be given)")
    return problems, too_long


def _cells(name: str, spec: dict[str, Any], entries: list[Entry], problems: list[str]) -> list[Cell]:
    settings = spec.get("settings") or {}
    timing = TimingSettings(**(spec.get("timing") or {}))
    cells: list[Cell] = []
    seen_ids: set[str] = set()
    grouped: dict[tuple[str, str], list[str]] = {}
    for entry, entry_keys in entries:
        params = CellParams.resolve({**settings, **entry})
        id_keys = named_keys(params, entry_keys)
        cell_id = make_cell_id(params, id_keys) if id_keys else "default"
        naming, too_long = _cell_id_problems(name, params, id_keys, cell_id)
        problems += naming
        if too_long:
            continue
        if cell_id in seen_ids:
            problems.append(f"studies.{name}: two entries make the same cell {cell_id!r}; "
                            "an include entry repeats another cell")
            continue
        seen_ids.add(cell_id)
        errors, unsupported = check_cell(params)
        for key, message in errors:
            grouped.setdefault((key, message), []).append(cell_id)
        cells.append(Cell(name, cell_id, params, tuple(sort_keys(id_keys)), _execution(spec, params),
                          _timing(spec, params, timing), unsupported))
    for (key, message), ids in grouped.items():
        shown = ", ".join(repr(i) for i in ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        problems.append(f"study {name!r}, cell {shown}: {key}: {message}")
    return cells


def _searched(name: str, spec: dict[str, Any], cells: list[Cell]) -> tuple[dict[str, Any], list[str]]:
    """The study's search settings, and the cells whose search its table reports."""
    search = {**{key: value["default"] for key, value in SEARCH.items()}, "cells": None,
              **(spec.get("search") or {})}
    if not spec.get("search"):
        return search, []
    # a study that declares a search reports it for the cells it names
    measured = [c for c in cells if c.measured]
    chosen = _selected(measured, search["cells"] or [{}], f"studies.{name}.search.cells", "measured cell")
    return search, [c.cell_id for c in chosen if not c.unsupported]


def expand_study(name: str, spec: dict[str, Any]) -> Study:
    """All cells of one schema-valid study, in a stable order; ConfigError lists every problem."""
    problems = _key_conflicts(name, spec)
    entries = _grid_entries(name, spec, problems) + _included_entries(spec)
    if not entries and not problems:
        problems.append(f"studies.{name}: no cells; give it axes, variants or include entries")
    cells = _cells(name, spec, entries, problems)
    problems += array_problems(name, cells)
    if problems:
        raise ConfigError(problems)

    measure = spec.get("measure")
    if measure:
        chosen = {c.cell_id for c in _selected(cells, measure["cells"], f"studies.{name}.measure.cells",
                                               "cell")}
        cells = [replace(c, measured=c.cell_id in chosen) for c in cells]
    id_keys = sort_keys({k for c in cells for k in c.id_keys})
    search, searched = _searched(name, spec, cells)
    plot_panels = tuple(spec.get("plot_panels") or ())
    unknown = [key for key in plot_panels if key not in id_keys]
    if unknown:
        raise ConfigError(f"studies.{name}.plot_panels: {unknown[0]!r} is not a key that tells the study's "
                          f"cells apart (those are: {', '.join(id_keys)})")
    return Study(name, spec.get("description", ""), cells, id_keys,
                 list(spec.get("report") or REPORT_COLUMNS_DEFAULT), search,
                 (measure or {}).get("plan_for"), tuple(searched), plot_panels,
                 list(spec.get("findings") or []), list(spec.get("references") or []))

def no_runner_problems(study: Study) -> list[str]:
    """The study's measured cells this version can plan and predict but not run
    (frameworks.not_implemented): each would fail only when its job starts, after the cells before it
    ran, so the workflow refuses them before any job (planning and `trainbench predict` take them)."""
    return [f"study {study.name!r}, cell {c.cell_id!r}: {why}; it can be planned, not measured: leave it "
            f"out of studies.{study.name}.measure.cells" for c in study.cells
            if c.measured and c.unsupported is None and (why := frameworks.not_implemented(c.params))]


def probe_cell(study: Study, cell: Cell, micro_batch: int) -> Cell:
    """One probe of the max-batch search: the cell with another micro batch (and the search's steps)."""
    changes: dict[str, Any] = {"micro_batch": micro_batch}
    if study.search.get("steps"):
        changes["timed_steps"] = study.search["steps"]
    params = cell.params.replace(**changes)  # derived sizes (global batch) follow: they are properties
    return Cell(study.name, paths.probe_id(cell.cell_id, micro_batch), params, cell.id_keys, cell.execution,
                cell.timing, cell.unsupported)


def short_of_gpus(params: CellParams, gpus_here: int) -> str | None:
    """Why a cell cannot run on this machine for want of GPUs (None if it can): a local run names
    such cells when it plans, rather than fail them one job at a time (SLURM places them instead)."""
    if params.device != "cuda":
        return None
    if params.emulate:  # one rank of its world, on one GPU
        return "needs 1 GPU" if gpus_here < 1 else None
    if params.nodes > 1:
        return f"needs {params.nodes} nodes"
    need = params.gpus_per_node
    if need > gpus_here:
        return f"needs {need} GPU{'s' if need > 1 else ''}"
    return None
