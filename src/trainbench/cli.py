"""`trainbench`: list cells and their status, follow a study's progress, run one cell, predict memory and
step time, advise a set-up for a model on a cluster, compare two result trees, print the vocabulary, write
the schema."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainbench.checks.commands import add_check_models  # the parser alone: no check is imported
from trainbench.errors import ConfigError, UsageError
from trainbench.registry.hardware import GPUS

if TYPE_CHECKING:
    from trainbench.registry.hardware import GpuType
    from trainbench.study.grid import Cell, Study


def _config(path: str):
    from trainbench.workflow import load_checked

    if not Path(path).exists():
        raise UsageError(f"{path}: no such file (run from the repository root, or pass --config)")
    return load_checked(path)


def cell_status(cell: Cell, target: Path) -> str:
    """A cell's state on disk, as freshness.result_state decides it: missing, unreadable (with why: the
    workflow runs it again), or the status in its metrics.json (marked stale if the cell's parameters
    changed since it ran, which is when Snakemake reruns it)."""
    from trainbench.reporting.freshness import INVALID, MISSING, RETRY, STALE, result_state

    state = result_state(cell, target)
    if state.kind == MISSING:
        return "missing"
    if state.kind == INVALID:
        return f"unreadable ({state.why[:120]})"
    status = state.result.status
    if state.kind == RETRY:
        return f"{status} (runs again: the infrastructure failed it)"
    return f"{status} (stale: parameters changed)" if state.kind == STALE else status


def search_status(root: Path, study: str, cell_id: str) -> str:
    """Where a cell's max-batch search stands: its answer, or how many probes have run."""
    from trainbench.study.grid import search_target
    from trainbench.paths import probe_glob
    from trainbench.contract.result import InvalidResult, read_search

    result = root / search_target(study, cell_id)
    if result.exists():
        try:
            found = read_search(result)
        except InvalidResult as error:
            return f"unreadable ({str(error).split(': ', 1)[1][:80]})"
        failure = found["first_failure"]
        limit = f" ({failure['micro_batch']}: {failure['status']})" if failure else ""
        return f"mb {found['max_micro_batch']}{limit}"
    probes = list(root.glob(probe_glob(study, cell_id)))
    return f"{len(probes)} probes, not finished" if probes else "not started"


def ranks(params) -> str:
    """A cell's ranks and what they run on: "2 (gpu)" is 2 GPUs, "2 (cpu)" 2 processes on CPU cores
    (the table's "gpus" column counts ranks either way); an emulated cell's is one rank of its world,
    "1 of 64 (gpu)"."""
    kind = 'gpu' if params.device == 'cuda' else 'cpu'
    if params.emulate:
        return f"1 of {params.gpus} ({kind})"
    return f"{params.gpus} ({kind})"


def cmd_cells(args) -> int:
    from trainbench.execute.gpus import local_gpu_count
    from trainbench.study.grid import short_of_gpus
    from trainbench.registry import frameworks

    config = _config(args.config)
    gpus_here = local_gpu_count()
    names = args.studies or list(config.studies)
    rows = []
    for name in names:
        study = config.study(name)
        for cell in study.cells:
            status = cell_status(cell, Path(args.root) / cell.target)
            if status == "missing" and not cell.measured:
                status = "planned"  # outside the study's `measure` selection: the table runs none
                if cell.unsupported is None and (why := frameworks.not_implemented(cell.params)):
                    status = f"planned ({why})"  # so nobody queues it to find out
            elif (status == "missing" and not cell.unsupported
                  and (short := short_of_gpus(cell.params, gpus_here))):
                status = f"missing: {short} (this machine has {gpus_here})"
            search = (search_status(Path(args.root), study.name, cell.cell_id)
                      if cell.cell_id in study.searched else "-")
            rows.append((name, cell.cell_id, status, ranks(cell.params), str(cell.params.nodes),
                         cell.target, search))
    header = ("study", "cell", "status", "ranks", "nodes", "target", "search")
    if args.tsv:
        print("\t".join(header))
        for row in rows:
            print("\t".join(row))
        return 0
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return 0


def cmd_progress(args) -> int:
    """One view of a study's grid while it runs; with --watch, refreshed until nothing runs or waits."""
    import time

    from rich.console import Console
    from rich.live import Live

    from trainbench.execute.gpus import local_gpu_count
    from trainbench.reporting.progress import render, survey

    study = _config(args.config).study(args.study)
    root, gpus_here = Path(args.root), local_gpu_count()

    def view():
        progress = survey(study, root, gpus_here=gpus_here, cluster=args.cluster)
        return progress, render(progress, every_cell=args.all)

    console = Console()
    progress, shown = view()
    if not args.watch:
        console.print(shown)
        return 0
    try:
        with Live(shown, console=console, auto_refresh=False) as live:
            while not progress.finished:
                time.sleep(args.interval)
                progress, shown = view()
                live.update(shown, refresh=True)
    except KeyboardInterrupt:  # Ctrl-C ends the watch, not the run
        pass
    return 0


def cmd_run_cell(args) -> int:
    from trainbench.execute.cellrun import run_cell
    from trainbench.registry import frameworks
    from trainbench.study.grid import Cell
    from trainbench.study.params import CellParams
    from trainbench.study.timing import TimingSettings

    try:
        timing = TimingSettings.from_argument(args.timing)
    except ValueError as error:
        raise UsageError(f"--timing {args.timing!r}: {error}") from None
    try:
        params = CellParams.from_json(args.params)
    except json.JSONDecodeError as error:
        raise UsageError(f"--params is not the cell's JSON ({error})") from None
    except (TypeError, ValueError) as error:  # not an object, or not the cell's parameters
        raise UsageError(f"--params {error}") from None
    # The workflow checked the cell when it made it (study.grid); what the stack cannot run is the
    # cell's result, and asked of the framework registry without checking the cell again.
    unsupported = frameworks.unsupported(params)
    cell = Cell(args.study, args.cell, params, execution={"cpus_per_rank": args.cpus_per_rank}, timing=timing,
                unsupported=unsupported)
    return run_cell(cell, Path(args.output), runtime_min=args.runtime_min, retries=args.retries,
                    search_probe=args.search_probe)


PREDICT_COLUMNS = ("study", "cell", "model", "strategy", "gpus", "nodes", "micro_batch",
                   "activation_checkpointing", "offload_optimizer", "offload_param", "gpu_mem_gib",
                   "host_mem_gib_per_node", "fits", "why_not", "step_time_s", "samples_per_s", "mfu",
                   "time_constants_from", "compute_s", "communication_s", "optimizer_s", "framework_s",
                   "emulated_wait_s")


def cpu_cells_note(studies: list[Study], gpu: GpuType | None) -> str | None:
    """One line for `predict` where cells run on CPU ranks (device: cpu): a GPU's memory, step time and
    MFU mean nothing for them, so their rows leave those columns empty; said once, for every such study,
    rather than refused, since a CPU study (smoke) sits beside GPU ones in a plan of every study."""
    cpu = {study.name: (sum(c.params.device == "cpu" for c in study.cells), len(study.cells))
           for study in studies}
    named = [name if count == total else f"{name} ({count} of {total} cells)"
             for name, (count, total) in cpu.items() if count]
    if not named:
        return None
    gpu_part = f"{gpu.key}'s memory, step time and MFU do not apply to them: " if gpu else ""
    return (f"the cells of {', '.join(named)} run on CPU ranks (device: cpu): {gpu_part}their rows give host "
            "memory per node only (device: cuda plans them for GPUs)")


def cmd_predict(args) -> int:
    """One CSV row per cell: predicted memory per GPU and per node, whether it fits the hardware, and
    (with --gpu) its step time, samples/s and MFU on that GPU type, and the step's parts."""
    import csv

    from trainbench.predict import time_model
    from trainbench.predict.memory_model import emulated_node, hardware_from_args, predict

    try:
        hardware = hardware_from_args(args.gpu, args.gpu_mem_gib, args.host_mem_gib, args.gpus_per_node)
    except ValueError as error:
        raise UsageError(str(error)) from None
    config = _config(args.config)
    studies = [config.study(name) for name in args.studies or list(config.studies)]  # unknown ones: an error
    if hardware.gpu is None:
        print("trainbench: no GPU type (--gpu): memory only, no step time", file=sys.stderr)
    else:
        constants, note = time_model.constants_for(hardware.gpu)
        if note:
            print(f"trainbench: step times: {note}", file=sys.stderr)
    if note := cpu_cells_note(studies, hardware.gpu):
        print(f"trainbench: {note}", file=sys.stderr)
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(PREDICT_COLUMNS)
    for study in studies:
        name = study.name
        for cell in study.cells:
            p = cell.params
            # an emulated rank runs on one GPU of this hardware, standing for a node of its world's ranks
            here = (emulated_node(hardware.gpu_mem_mib, hardware.host_mem_mib, p, hardware.name, hardware.gpu)
                    if p.emulate else hardware)
            prediction = predict(p, here)
            gpu = prediction.gpu_mem_mib
            threads = cell.execution.get("cpus_per_rank") or time_model.DEFAULT_CPU_THREADS
            timed = (None if hardware.gpu is None or cell.unsupported else
                     time_model.predict(p, hardware.gpu, constants, threads))
            # an emulated rank's measured step plus this is its world's whole step (time_model.waiting_s)
            wait = (time_model.waiting_s(p, hardware.gpu, constants, threads, whole_s=timed.step_time_s)
                    if timed and p.emulate else None)
            writer.writerow([name, cell.cell_id, p.model, p.strategy, p.gpus, p.nodes,
                             p.micro_batch,
                             p.activation_checkpointing, p.offload_optimizer, p.offload_param,
                             "" if gpu is None else f"{gpu / 1024:.1f}",
                             f"{prediction.host_mem_mib / 1024:.1f}",
                             prediction.fits, prediction.why_not or "",
                             "" if timed is None else f"{timed.step_time_s:.4g}",
                             "" if timed is None else f"{timed.samples_per_s:.4g}",
                             "" if timed is None or timed.mfu is None else f"{timed.mfu:.3f}",
                             "" if timed is None else timed.constants_gpu,
                             # the step's parts (time_model.parts): what a profile is held against
                             *(("",) * 4 if timed is None else
                               (f"{timed.parts_s[part]:.4g}" for part in
                                ("compute", "communication", "optimizer", "framework"))),
                             "" if wait is None else f"{wait:.4g}"])
    return 0


def cmd_advise(args) -> int:
    """Every set-up of a model on a cluster predicted, those that fit ranked; a study to measure the best."""
    from trainbench.predict import advise

    gpu = _gpu_named(args.gpu)  # a bad key is named before anything loads
    model, definition = _advise_model(args)
    written = (Path(args.write) if args.write
               else Path(args.config).parent / f"studies/local/advise-{model}.yaml")
    if definition:
        _refuse_redefinition(model, Path(args.config), written)
    request = advise.Request(model, advise.Cluster(gpu, args.gpus_per_node, args.nodes, args.host_mem_gib),
                             args.seq_len, args.precision, advise.powers_of_two(*args.micro_batch),
                             args.global_batch)
    if problems := request.problems():
        raise UsageError("; ".join(problems))
    advice = _advised(request)
    print(advise.heading(advice))
    if not advice.ranked:
        print(advise.no_fit(advice))
        print(advise.summary(advice))
        return 1
    print(advise.table(advice, args.top))
    # what was written and how to run it, apart from the answer: `advise ... > ranking.txt` keeps the
    # ranking alone
    print(_write_advice(args, advice, written, definition), file=sys.stderr)
    print(advise.summary(advice))
    return 0


def _gpu_named(key: str) -> GpuType:
    from trainbench.registry.hardware import gpu_type

    try:
        return gpu_type(key)
    except ValueError as error:
        raise UsageError(f"--gpu: {error}") from None


def _advise_model(args) -> tuple[str, dict | None]:
    """The model to advise on, registered, and its definition where the written study must carry it: one of
    the registry's, one of the config's `models` (the config loaded and its models counted), or a
    transformers config.json given with --model-config."""
    import difflib

    from trainbench.registry.models import MODELS, known_models

    if args.model_config:
        return _model_of_config_json(Path(args.model_config), args.model, Path(args.config))
    if args.model is None:
        raise UsageError("name the model: --model NAME (`trainbench models` lists them), or --model-config "
                         "PATH for a transformers config.json")
    if args.model not in MODELS and Path(args.config).exists():
        _config(args.config)  # registers the config's models, counted
    known = known_models()
    if args.model not in known:
        close = difflib.get_close_matches(args.model, list(known), n=1)
        raise UsageError(f"--model: unknown model {args.model!r}" + (f" (did you mean {close[0]!r}?)" if close
                         else "") + f"; known: {', '.join(known)} (the registry's, and {args.config}'s "
                         "`models`); or give a transformers config.json with --model-config")
    return args.model, None


def _model_of_config_json(path: Path, name: str | None, config: Path) -> tuple[str, dict]:
    """A transformers config.json registered as a model of this command's, counted as the config's are."""
    import os

    from trainbench.registry.models import register_user_models
    from trainbench.study.models import parse_models
    from trainbench.training.user_models import FACTS_DIR, count_registered

    if name is None:  # the file's name, or its folder's for a config.json (a model's folder holds one)
        name = path.name if path.is_dir() else path.parent.name if path.name == "config.json" else path.stem
    base = config.resolve().parent
    entry = {"hf_config": os.path.relpath(path.resolve(), base)}  # as config.yaml's folder sees it
    try:
        register_user_models(parse_models({name: entry}, base))
    except ConfigError as error:
        raise UsageError(f"--model-config {path}: {'; '.join(error.problems)}") from None
    count_registered(base / FACTS_DIR)
    return name, {name: entry}


def _refuse_redefinition(model: str, config: Path, written: Path) -> None:
    """The written study defines a --model-config model: refused where another file of the config defines
    that name already (loading both would fail)."""
    import yaml

    from trainbench.study.config import read_study_files

    if not config.exists():
        return
    raw = yaml.safe_load(config.read_text()) or {}
    _, _, model_origins = read_study_files(raw, config.parent, config.name)
    where = model_origins.get(model)
    if where is not None and (config.parent / where).resolve() != written.resolve():
        raise UsageError(f"model {model!r} is defined in {where} already: advise it as --model {model}, or "
                         "give this config.json another name with --model")


def _advised(request):
    """advise() with a progress bar on a terminal; quiet otherwise."""
    from trainbench.predict.advise import advise

    if not sys.stdout.isatty():
        return advise(request)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(f"predicting set-ups of {request.model}", total=None)
        return advise(request, lambda done, total: bar.update(task, completed=done, total=total))


def _write_advice(args, advice, written: Path, definition: dict | None) -> str:
    """Write the study that measures the advice; what was written and how to run it, in a line."""
    import re

    from trainbench.execute.gpus import local_gpu_count
    from trainbench.predict.advise import chosen, study_text

    gpus_here = local_gpu_count() if args.gpus_here is None else args.gpus_here
    name = re.sub(r"[^A-Za-z0-9_-]", "_", written.stem).lstrip("_-") or "advise"  # a study's name
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(study_text(advice, name, args.measure, gpus_here, definition))
    setups = chosen(advice, args.measure)
    absent = [f"no plain {kind} fits" for kind, setup in advice.plain.items() if setup is None]
    emulated = (f", each as one emulated rank (this machine has {gpus_here} GPU(s): --gpus-here)"
                if advice.request.cluster.gpus > max(gpus_here, 1) else "")
    run = f"snakemake -c all results/tables/{name}.md"
    if not _in_study_files(written, Path(args.config)):  # the workflow reads it only where told to
        run += f" --configfile {written}"
    return (f"wrote {written}: {len(setups)} set-ups to measure{emulated}"
            + (f" ({'; '.join(absent)})" if absent else "")
            + f"; `{run}` measures them and judges the predicted order")


def _in_study_files(path: Path, config: Path) -> bool:
    """Whether the config's study_files take in this file (the workflow then loads its studies)."""
    import yaml

    if not config.exists():
        return False
    patterns = (yaml.safe_load(config.read_text()) or {}).get("study_files") or []
    found = {match.resolve() for pattern in patterns for match in config.parent.glob(pattern)}
    return path.resolve() in found


def cmd_profile(args) -> int:
    """Run one cell of config.yaml again with its steps profiled, in place of its result."""
    import dataclasses

    from trainbench.execute.cellrun import run_cell

    cell = _config(args.config).study(args.study).cell(args.cell)  # an unknown one: ConfigError, named
    timing = dataclasses.replace(cell.timing, profile_steps=args.steps, memory_snapshot=int(args.memory))
    cell = dataclasses.replace(cell, timing=timing)
    resources = cell.resources()
    output = Path(cell.target)
    print(f"trainbench: profiling {args.steps} step(s) of {args.study}/{args.cell} after its timed ones; "
          f"its result, traces and breakdown go to {output.parent}", file=sys.stderr)
    status = run_cell(cell, output, runtime_min=resources["runtime"], retries=resources["retries"])
    if status == 0 and output.exists():
        found = json.loads(output.read_text())["metrics"].get("breakdown")
        if found:
            step = found["step_s"]
            print("; ".join(f"{part} {seconds / step:.0%}" for part, seconds in found["parts_s"].items()
                            if seconds / step >= 0.005) + f" of a {step * 1e3:.1f} ms profiled step")
    return status


QUERY_COLUMNS = "study,cell_id,status,metric,value,low,high,source"


def cmd_query(args) -> int:
    """Rows of the dataset (every cell of every study, one row per figure) matching a pandas query."""
    from trainbench.reporting.dataset import read

    path = Path(args.dataset)
    if not path.exists():
        raise UsageError(f"{path}: no dataset; make it with `snakemake -c1 {path}`")
    try:
        table = read(path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    try:
        found = table.query(args.where) if args.where else table
    except Exception as error:  # noqa: BLE001 - pandas raises many kinds for a bad expression
        raise UsageError(f"query {args.where!r}: {type(error).__name__}: {error} "
                         f"(columns: {', '.join(table.columns)})") from None
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = [c for c in columns if c not in table.columns]
    if unknown:
        raise UsageError(f"--columns: no column {', '.join(map(repr, unknown))} "
                         f"(columns: {', '.join(table.columns)})")
    if args.csv:
        found[columns].to_csv(sys.stdout, index=False)
    else:
        print(found[columns].to_string(index=False, max_colwidth=60) if len(found) else "no rows")
        print(f"{len(found)} of {len(table)} rows", file=sys.stderr)
    return 0


def cmd_breakdown(args) -> int:
    """Read profiled results' breakdowns again from their kept traces."""
    from trainbench.execute.profiling import reread

    for path in args.results:
        try:
            found = reread(Path(path))
        except (OSError, ValueError, KeyError) as error:
            raise UsageError(str(error)) from None
        step = found["step_s"]
        shares = ", ".join(f"{part} {seconds / step:.0%}" for part, seconds in found["parts_s"].items()
                           if seconds / step >= 0.005)
        print(f"{path}: {found['step_s'] * 1e3:.1f} ms per profiled step: {shares}")
    return 0


def cmd_fit(args) -> int:
    from trainbench import fit

    return fit.main(args, _config(args.config))


def cmd_commbench(args) -> int:
    from pathlib import Path

    from trainbench import commbench

    if args.from_nccl_tests:
        doc = commbench.import_nccl_tests([Path(f) for f in args.from_nccl_tests], name=args.name,
                                          ranks=args.ranks, source=args.source)
        out = Path(args.out or f"results/comm/{doc['interconnect']}.json")
        commbench.write(doc, out)
        print(f"commbench: {len(doc['rows'])} rows of {doc['ranks']} ranks on {doc['nodes']} node(s) "
              f"from nccl-tests' output: {out} and {out.with_suffix('.csv')}")
        return 0
    return commbench.run(ranks=args.ranks or 2, device=args.device, out=Path(args.out) if args.out else None,
                         collectives=args.collectives, min_bytes=commbench.parse_bytes(args.min_bytes),
                         max_bytes=commbench.parse_bytes(args.max_bytes) if args.max_bytes else None,
                         warmup=args.warmup,
                         iters=args.iters, repeats=args.repeats, dtype=args.dtype, name=args.name,
                         nodes=args.nodes)


def cmd_search_summary(args) -> int:
    """The max-batch search's result from its probes (the search_result rule)."""
    from trainbench.predict.batch_search import summary
    from trainbench.reporting.documents import read_cells
    from trainbench.contract.result import write_json_atomic

    docs = read_cells(args.probes)
    write_json_atomic(args.output, summary({doc["params"]["micro_batch"]: doc for doc in docs},
                                           args.tolerance, args.max_micro_batch))
    return 0


def cmd_compare(args) -> int:
    """Two result trees cell by cell (a rerun against what was published); with --fail-on, a gate."""
    from trainbench.reporting.compare import (Selection, as_json, compare, compare_with_history,
                                              gate_failures, parse_gate, report)

    if (args.second is None) != args.history:
        raise UsageError("give two results/runs folders, or one and --history")
    for root in (args.first, args.second or args.first):
        if not root.is_dir():
            raise UsageError(f"{root}: no such directory (give two results/runs folders)")
    gate = parse_gate(args.fail_on) if args.fail_on else None
    select = Selection(tuple(args.study), tuple(args.cells))
    matching = f" matching {select}" if select.studies or select.patterns else ""
    if args.history:
        result = compare_with_history(args.first, min_change=args.min_change, select=select)
        first, second = Path("its cells' last earlier runs"), args.first
        if not result.cells:
            raise UsageError(f"no cell{matching} of "
                             f"{args.first} has an earlier run on the same GPU model in its history")
    else:
        result = compare(args.first, args.second, min_change=args.min_change, select=select)
        first, second = args.first, args.second
        if not result.cells:
            raise UsageError(f"no cell{matching} is in both "
                             f"{args.first} and {args.second}")
    failures = gate_failures(result, gate) if gate is not None else None
    if args.json:
        print(json.dumps(as_json(result, failures), indent=1))
    else:
        print(report(result, first, second, failures))
    return 1 if failures else 0


def cmd_references(args) -> int:
    """A study's measured cells against its reference figures; exit 1 where one is outside its band."""
    from trainbench.reporting.documents import read_cells
    from trainbench.reporting.references import OUTSIDE, check, markdown

    study = _config(args.config).study(args.study)
    if not study.references:
        raise UsageError(f"study {args.study!r} declares no references (config.yaml: studies.{args.study}."
                         "references)")
    docs = read_cells([c.target for c in study.cells if Path(c.target).exists()])
    checks = check(study.references, docs)
    print("\n".join(markdown(checks)[4:]) if checks else "no measured cell of the study is referenced")
    return 1 if any(c.verdict == OUTSIDE for c in checks) else 0


def cmd_history(args) -> int:
    """A study's runs, cell by cell, from the histories kept beside its results."""
    from trainbench.contract.history import HISTORY, runs
    from trainbench.execute.history import seed

    root = Path(args.results)
    if args.seed:
        added = seed(sorted((root / "runs").glob("*/*/metrics.json")))
        print(f"{added} result(s) added to their cells' histories", file=sys.stderr)
        return 0
    files = sorted((root / HISTORY / args.study).glob("*.jsonl")) if args.study else []
    if not files:
        raise UsageError(f"no history for study {args.study!r} under {root / HISTORY}")
    for path in files:
        print(path.stem)
        for run in runs(path):
            prov, metrics = run["provenance"], run["metrics"]
            step = metrics.get("step_time_s")
            print(f"  {prov.get('started') or '-':<26} {(prov.get('git_commit') or '-')[:12]:<13} "
                  f"{prov.get('hostname') or '-':<12} {prov.get('gpu_name') or 'CPU':<22} {run['status']:<8} "
                  + (f"{step * 1e3:,.1f} ms" if step else ""))
    return 0


def cmd_cost(args) -> int:
    """Device hours of a study's results on disk and the timed steps' share of them."""
    from trainbench.reporting.progress import efficiency_report, newest_efficiency_report, report, study_cost

    config = _config(args.config)
    studies = [config.study(name) for name in args.studies or list(config.studies)]  # unknown ones: an error
    print(report([study_cost(study, args.root) for study in studies]))
    efficiency = Path(args.slurm_efficiency) if args.slurm_efficiency else newest_efficiency_report(args.root)
    if efficiency is not None:
        try:
            print("\n" + efficiency_report(efficiency, studies, args.root))
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    return 0


def cmd_headline(args) -> int:
    """The README's results, read from the published metrics.json files: printed, or written into a page's
    headline section."""
    from trainbench.reporting.answer import headline_markdown, with_headline

    headline = headline_markdown(args.root, _config(str(Path(args.root) / args.config)))
    if not args.write:
        print(headline)
        return 0
    page = Path(args.write)
    try:
        page.write_text(with_headline(page.read_text(), headline))
    except (OSError, ValueError) as error:
        print(f"error: {page}: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_schema(args) -> int:
    import yaml  # here, not at the top: `run-cell`, run by every cell's job, does without it

    from trainbench.study.schema import build_schema

    text = ("# Generated by `trainbench schema --write`; edit src/trainbench/study/params.py and schema.py "
            "instead.\n")
    text += yaml.safe_dump(build_schema(), sort_keys=False, width=110)
    if args.write:
        Path(args.write).write_text(text)
    elif args.check:
        if Path(args.check).read_text() != text:
            print(f"{args.check} is out of date: run `trainbench schema --write {args.check}`",
                  file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


def cmd_vocabulary(args) -> int:
    if args.command == "strategies":
        from trainbench.registry.frameworks import registry

        for framework in registry().values():
            for s in framework.strategies:
                splits = ([f"tp: {s.tensor_parallel.name}"] if s.tensor_parallel else []) + (
                    ["pp"] if s.pipeline_parallel else [])
                note = f"[{', '.join(splits)}] " if splits else ""
                note += f"unsupported: {s.unsupported}" if s.unsupported else ""
                print(f"{framework.name:<11} {s.name:<27} {s.description} {note}".rstrip())
            for practice in framework.best_practice:  # what `tuning: best` sets where a cell does not
                where = [", ".join(practice.strategies) or "every strategy"]
                where += [f"{practice.ranks}+ ranks"] if practice.ranks > 1 else []
                where += ["grad_accum > 1"] if practice.accumulating else []
                print(f"{framework.name:<11}   tuning best: {practice.key}: {json.dumps(practice.value)} "
                      f"({'; '.join(where)}): {practice.why}")
    elif args.command == "models":
        from trainbench.registry.frameworks import registry
        from trainbench.registry.models import known_models
        from trainbench.study.models import summary

        # your models, counted (built on fake tensors) as the workflow does, each with the file defining it
        origins = _config(args.config).model_origins if Path(args.config).exists() else {}
        for m in known_models().values():
            runners = [f.name for f in registry().values() if m.family in f.families]
            built = f" (runs with {', '.join(runners)})" if runners else " (planning only in this version)"
            mine = f" [defined in {origins.get(m.name, 'the config')}]" if m.user_defined else ""
            size = f"{m.param_count() / 1e6:>10,.1f}M" if not m.user_defined or m.facts else f"{'?':>11}"
            print(f"{m.name:<16} {size}  {summary(m)}{built}{mine}")
    elif args.command == "columns" and args.markdown:
        from trainbench.reporting.tables import glossary_markdown

        print(glossary_markdown(), end="")
    elif args.command == "columns":
        from trainbench.reporting.findings import metrics
        from trainbench.reporting.columns import COLUMN_SETS, COLUMNS

        width = max(len(c.header) for c in COLUMNS.values())
        for name, column in COLUMNS.items():
            print(f"{name:<23} {column.header:<{width}} {column.description}")
        for name, members in COLUMN_SETS.items():
            print(f"{name:<23} {'(a set)':<{width}} {', '.join(members)}")
        searched = [m for name, m in metrics().items() if name not in COLUMNS]
        print("findings also compare: " + ", ".join(f"{m.name} ({m.header})" for m in searched))
    return 0


def cmd_check_models(args) -> int:
    """How good the memory and time models are on what was measured (trainbench.checks)."""
    from trainbench.checks.commands import run

    return run(args)


def positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} is not above 0")
        return value
    parse.__name__ = kind.__name__
    return parse


def batch_range(text: str) -> tuple[int, int]:
    """A micro-batch range, LOW-HIGH (or one number)."""
    low, _, high = text.partition("-")
    try:
        bounds = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range LOW-HIGH, e.g. 1-64") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 <= LOW <= HIGH")
    return bounds


def _add_advise(sub) -> None:
    """`trainbench advise`'s options."""
    advise = sub.add_parser(
        "advise", help="which set-up for a model on a cluster, and does it fit? (ranked by predicted speed)",
        description="Enumerate every set-up the frameworks can run for a model on a cluster (framework x "
                    "strategy x micro batch x activation checkpointing x offload x tp and pp dividing the "
                    "GPUs), predict each one's memory and step time, rank those that fit by predicted "
                    "tokens/s per GPU, and write a study measuring the best of them beside plain DDP and "
                    "FSDP (docs/advise.md). Exit status: 0; 1 when no set-up fits; 2 for bad input.")
    advise.add_argument("--model", help="a model of the registry or of the config's `models` (`trainbench "
                                        "models`); with --model-config, the name to give it")
    advise.add_argument("--model-config", metavar="PATH",
                        help="a transformers config.json (or its folder): your model, for this command")
    advise.add_argument("--config", default="config.yaml")
    advise.add_argument("--gpu", required=True, help=f"GPU type: {', '.join(GPUS)}")
    advise.add_argument("--gpus-per-node", type=positive(int), default=8)
    advise.add_argument("--nodes", type=positive(int), default=1)
    advise.add_argument("--host-mem-gib", type=positive(float), required=True,
                        help="host memory per node in GiB")
    advise.add_argument("--seq-len", type=positive(int),
                        help="tokens per sample (default: the model's context)")
    advise.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    advise.add_argument("--micro-batch", type=batch_range, default=(1, 64), metavar="LOW-HIGH",
                        help="the powers of two to try as micro batch (default 1-64)")
    advise.add_argument("--global-batch", type=positive(int),
                        help="samples per optimizer step: each set-up accumulates micro batches to make it "
                             "(default: one micro batch a step)")
    advise.add_argument("--top", type=positive(int), default=15, help="set-ups to list (default 15)")
    advise.add_argument("--measure", type=positive(int), default=5,
                        help="the fastest set-ups the written study measures, beside plain DDP and FSDP "
                             "and each framework's fastest (default 5)")
    advise.add_argument("--write", metavar="PATH",
                        help="the study file to write (default: studies/local/advise-<model>.yaml)")
    advise.add_argument("--gpus-here", type=int, metavar="N",
                        help="GPUs of the machine that will run the written study (default: this machine's): "
                             "a set-up needing more runs as one emulated rank (emulate: true)")
    advise.set_defaults(func=cmd_advise)


def _add_cells(sub) -> None:
    cells = sub.add_parser("cells",
                           help="list cells with their status, ranks (on GPUs or CPU), nodes and target")
    cells.add_argument("studies", nargs="*", help="studies to list (default: all)")
    cells.add_argument("--config", default="config.yaml")
    cells.add_argument("--root", default=".", help="the directory results/ lives in")
    cells.add_argument("--tsv", action="store_true", help="tab-separated, for scripts")
    cells.set_defaults(func=cmd_cells)


def _add_progress(sub) -> None:
    progress = sub.add_parser("progress", help="a study's grid while it runs: cells done, running, failed, "
                                                "waiting, and the time left",
                              description="Show where a study's measured cells stand (done, running, failed, "
                                          "waiting) from results/, and the time left, from the wall times of "
                                          "the cells that ran.")
    progress.add_argument("study")
    progress.add_argument("--config", default="config.yaml")
    progress.add_argument("--root", default=".", help="the directory results/ lives in")
    progress.add_argument("--watch", action="store_true",
                          help="refresh until no cell runs or waits (Ctrl-C stops watching, not the run)")
    progress.add_argument("--interval", type=positive(float), default=5.0, help="seconds between refreshes")
    progress.add_argument("--all", action="store_true", help="list every cell, however many")
    progress.add_argument("--cluster", action="store_true",
                          help="cells run through SLURM: none waits for this machine's GPUs")
    progress.set_defaults(func=cmd_progress)


def _add_run_cell(sub) -> None:
    run = sub.add_parser("run-cell", help="run one cell and write its metrics.json (the train_cell rule)")
    run.add_argument("--study", required=True)
    run.add_argument("--cell", required=True)
    run.add_argument("--params", required=True, help="the cell's canonical parameters (JSON)")
    run.add_argument("--output", required=True)
    run.add_argument("--runtime-min", type=float, default=30)
    run.add_argument("--retries", type=int, default=1)
    run.add_argument("--cpus-per-rank", type=positive(int), default=4,
                     help="CPU cores of each rank (OMP threads)")
    run.add_argument("--timing", default="",
                     help="the study's timing settings: min_windows=6,target_ci=0.02,...")
    run.add_argument("--search-probe", action="store_true",
                     help="a max-batch probe: run even where the memory model predicts no fit "
                          "(the search measures it)")
    run.set_defaults(func=cmd_run_cell)


def _add_predict(sub) -> None:
    predict = sub.add_parser("predict",
                             help="predict every cell's memory and step time on given hardware (CSV)",
                             description="Predict per-GPU and per-node host memory of every cell of the "
                                         "given studies (default: all) on the hardware described, whether "
                                         "it fits, and (with --gpu) its step time, samples/s and MFU: the "
                                         "memory model and the time model (docs/memory-model.md, "
                                         "docs/time-model.md).")
    predict.add_argument("studies", nargs="*")
    predict.add_argument("--config", default="config.yaml")
    predict.add_argument("--gpu", help=f"GPU type: {', '.join(GPUS)} (src/trainbench/registry/hardware.py)")
    predict.add_argument("--gpu-mem-gib", type=positive(float),
                         help="memory per GPU in GiB (instead of --gpu)")
    predict.add_argument("--gpus-per-node", type=positive(int), default=8)
    predict.add_argument("--host-mem-gib", type=positive(float), required=True,
                         help="host memory per node in GiB")
    predict.set_defaults(func=cmd_predict)


def _add_profile(sub) -> None:
    profile = sub.add_parser("profile", help="run one cell again with its steps profiled (torch.profiler)",
                             description="Run a cell of config.yaml on this machine with PROFILE steps "
                                         "profiled after its timed ones (timing's profile_steps): its "
                                         "result is replaced, every rank's trace kept under profile/ "
                                         "beside it, and metrics.breakdown says where a step's time went "
                                         "(docs/profiles.md).")
    profile.add_argument("study")
    profile.add_argument("cell", help="the cell's id (`trainbench cells STUDY` lists them)")
    profile.add_argument("--steps", type=positive(int), default=3, help="steps to profile (default 3)")
    profile.add_argument("--memory", action="store_true",
                         help="also record the GPU allocator's history and keep a snapshot (timing's "
                              "memory_snapshot)")
    profile.add_argument("--config", default="config.yaml")
    profile.set_defaults(func=cmd_profile)


def _add_query(sub) -> None:
    query = sub.add_parser("query", help="rows of the dataset of every cell matching a pandas query",
                           description="Select rows of results/dataset/cells.parquet (every cell of every "
                                       "study, one row per figure; docs/dataset.md) with a pandas query, "
                                       "e.g. \"metric == 'mfu' and p_strategy == 'zero3'\".")
    query.add_argument("where", nargs="?", default="", help="a pandas query expression (all rows: none)")
    query.add_argument("--columns", default=QUERY_COLUMNS, help=f"columns to show (default {QUERY_COLUMNS})")
    query.add_argument("--csv", action="store_true", help="CSV on stdout instead of a table")
    query.add_argument("--dataset", default="results/dataset/cells.parquet")
    query.set_defaults(func=cmd_query)


def _add_breakdown(sub) -> None:
    reread = sub.add_parser("breakdown", help="read profiled results' breakdowns again from their traces",
                            description="Recompute metrics.breakdown of each result from the traces kept "
                                        "beside it (docs/profiles.md): after a change to how traces are "
                                        "read, the measurement stays, its reading follows the code.")
    reread.add_argument("results", nargs="+", help="metrics.json files of profiled cells")
    reread.set_defaults(func=cmd_breakdown)


def _add_fit(sub) -> None:
    fit = sub.add_parser("fit", help="run one rank of a cell's world on this machine's GPU: does it fit, "
                                     "and at what micro batch?",
                         description="Run a cell of config.yaml as one emulated rank of its world on this "
                                     "machine's GPU (a CPU process for a CPU cell), held to --gpu-mem-gib "
                                     "where given, and print whether it trains, its memory per GPU and per "
                                     "node, and the memory model's prediction beside them "
                                     "(docs/emulation.md). Results: results/fit/<study>/<cell>/.")
    fit.add_argument("study")
    fit.add_argument("cell", help="a cell id (`trainbench cells STUDY` lists them)")
    fit.add_argument("--config", default="config.yaml")
    fit.add_argument("--rank", type=int, help="the rank to run (default: the heaviest, by the memory model)")
    fit.add_argument("--gpu-mem-gib", type=positive(float),
                     help="hold the rank to a GPU of this size (40 or 80 for an A100)")
    fit.add_argument("--search", action="store_true", help="find the largest micro batch that trains")
    fit.add_argument("--max-micro-batch", type=positive(int), default=256, help="the search's bound")
    fit.add_argument("--tolerance", type=float, default=0.0,
                     help="stop bisecting within this share of the largest batch that trained")
    fit.add_argument("--root", default="results/fit", help="where the runs' metrics.json files go")
    fit.add_argument("--force", action="store_true", help="run again what results/fit already has")
    fit.add_argument("--runtime-min", type=positive(float), default=60, help="each run's time limit")
    fit.set_defaults(func=cmd_fit)


def _add_commbench(sub) -> None:
    comm = sub.add_parser("commbench", help="bus bandwidth and latency of each collective on this host",
                          description="Time all-reduce, all-gather, reduce-scatter, broadcast, send/recv and "
                                      "all-to-all through torch.distributed on --ranks GPUs of this host (or "
                                      "CPU ranks with gloo), from --min-bytes to --max-bytes, and write "
                                      "algorithm and bus bandwidth as nccl-tests reports them, with the "
                                      "host's provenance (docs/communication.md). Results: "
                                      "results/comm/<name>.json and .csv.")
    comm.add_argument("--ranks", type=positive(int),
                      help="GPUs (or CPU ranks) to span, on each node (default: 2); with --from-nccl-tests, "
                           "the ranks of the outputs where they do not say")
    comm.add_argument("--nodes", type=positive(int),
                      help="span this many nodes of the SLURM allocation it runs in, started by srun "
                           "(default: this host alone)")
    comm.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    comm.add_argument("--name", help="the interconnect's name (default: the GPU type and ranks, h200-x2)")
    comm.add_argument("--out", help="the JSON file to write (default: results/comm/<name>.json)")
    comm.add_argument("--collectives", nargs="+", default=["all_reduce", "all_gather", "reduce_scatter",
                                                           "broadcast", "send_recv", "all_to_all"])
    comm.add_argument("--min-bytes", default="1K")
    comm.add_argument("--max-bytes", help="the largest message (default: 1G on GPUs, 4M on CPU ranks)")
    comm.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    comm.add_argument("--warmup", type=positive(int), default=5)
    comm.add_argument("--iters", type=positive(int), default=20, help="operations timed back to back")
    comm.add_argument("--repeats", type=positive(int), default=5, help="timed rounds per size (median kept)")
    comm.add_argument("--from-nccl-tests", nargs="+", metavar="OUTPUT",
                      help="measure nothing: make the table from these outputs of nccl-tests (one run of "
                           "all_reduce_perf, all_gather_perf, ... each), run on the cluster it describes")
    comm.add_argument("--source", help="with --from-nccl-tests: where the figures come from (kept in the "
                                       "table's provenance)")
    comm.set_defaults(func=cmd_commbench)


def _add_search_summary(sub) -> None:
    search = sub.add_parser("search-summary", help="write a max-batch search's result from its probes")
    search.add_argument("--output", required=True)
    search.add_argument("--tolerance", type=float, default=0.0,
                        help="the study's search tolerance (recorded)")
    search.add_argument("--max-micro-batch", type=int, required=True,
                        help="the study's bound on the micro batch")
    search.add_argument("probes", nargs="+", help="the probes' metrics.json files")
    search.set_defaults(func=cmd_search_summary)


def _add_compare(sub) -> None:
    compare = sub.add_parser("compare", help="compare two result trees cell by cell (did a rerun reproduce?)",
                             description="Match the metrics.json files of two results/runs folders by "
                                         "study and cell, and print the relative change of step time, "
                                         "samples/s and peak memory for every cell that ran in both with "
                                         "the same parameters on the same GPU model, and "
                                         "which changes are significant (intervals apart and at least "
                                         "--min-change). A cell run on another GPU model is a cross-GPU "
                                         "comparison: its step time and samples/s ratios beside the time "
                                         "model's for the two GPUs, never significant nor gated. Exit "
                                         "status: 0, or 1 when --fail-on's gate fails, "
                                         "2 for bad input or no cell in common.")
    compare.add_argument("first", type=Path, help="a results/runs folder (the published one)")
    compare.add_argument("second", type=Path, nargs="?", help="another (the rerun)")
    compare.add_argument("--history", action="store_true",
                         help="set FIRST's cells against their last earlier runs on the same GPU model, "
                              "from their histories (results/history/)")
    compare.add_argument("--study", action="append", default=[], help="only this study (repeatable)")
    compare.add_argument("--cells", action="append", default=[], metavar="PATTERN",
                         help="only cells matching this shell pattern of study/cell (repeatable)")
    compare.add_argument("--min-change", type=float, default=0.02,
                         help="the smallest change called significant, as a fraction (default 0.02)")
    compare.add_argument("--fail-on", metavar="GATE",
                         help="exit 1 if a cell got significantly worse beyond a tolerance, on the "
                              "same GPU model: 'slower:5%%,memory:5%%'")
    compare.add_argument("--json", action="store_true", help="machine-readable output")
    compare.set_defaults(func=cmd_compare)


def _add_references(sub) -> None:
    refs = sub.add_parser("references", help="a study's cells against its reference figures (exit 1: one "
                                             "outside its tolerance)",
                          description="Check a study's measured cells against the reference figures it "
                                      "declares (config.yaml: references), as the table does; exit status "
                                      "1 where a figure is outside its band: a gate for CI.")
    refs.add_argument("study")
    refs.add_argument("--config", default="config.yaml")
    refs.set_defaults(func=cmd_references)


def _add_history(sub) -> None:
    history = sub.add_parser("history", help="a study's runs, cell by cell (results/history/)",
                             description="List every run of each cell of a study, as its history keeps it "
                                         "(commit, host, GPU, when, status, step time); --seed adds results "
                                         "made before histories were kept.")
    history.add_argument("study", nargs="?")
    history.add_argument("--results", default="results", help="the results folder (default results)")
    history.add_argument("--seed", action="store_true", help="add every result not yet in its history")
    history.set_defaults(func=cmd_history)


def _add_cost(sub) -> None:
    cost = sub.add_parser("cost", help="device hours of each study's results and the timed steps' share",
                          description="For the results on disk of each study (default: all): runs, device "
                                      "hours (wall time x GPUs, or CPU ranks), the timed windows' share of "
                                      "them, and where the rest went in runs that recorded their phases.")
    cost.add_argument("studies", nargs="*")
    cost.add_argument("--config", default="config.yaml")
    cost.add_argument("--root", default=".", help="the directory results/ lives in")
    cost.add_argument("--slurm-efficiency", metavar="CSV",
                      help="the SLURM plugin's efficiency report to summarise (default: the newest in "
                           ".snakemake/slurm_efficiency, which profiles/slurm has it write after each run)")
    cost.set_defaults(func=cmd_cost)


def _add_headline(sub) -> None:
    headline = sub.add_parser("headline", help="the README's results, from the published metrics.json files",
                              description="The headline figures (the baseline's one-GPU cells, its scaling, "
                                          "the campaigns' verdicts) and its scaling plot, each linked to its "
                                          "table, read from results/.")
    headline.add_argument("--write", metavar="PAGE",
                          help="replace PAGE's headline section (README.md) with it")
    headline.add_argument("--config", default="config.yaml")
    headline.add_argument("--root", default=".", help="the directory results/ lives in")
    headline.set_defaults(func=cmd_headline)


def _add_check_models(sub) -> None:
    add_check_models(sub).set_defaults(func=cmd_check_models)


def _add_schema(sub) -> None:
    schema = sub.add_parser("schema", help="print, write or check workflow/schemas/config.schema.yaml")
    group = schema.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH")
    group.add_argument("--check", metavar="PATH")
    schema.set_defaults(func=cmd_schema)


def _add_vocabularies(sub) -> None:
    for name, text in (("strategies", "strategies by framework"),
                       ("models", "models: the registry's, and your own from the config's `models`"),
                       ("columns", "report columns a study can put in its table")):
        vocabulary = sub.add_parser(name, help=f"list {text}")
        vocabulary.set_defaults(func=cmd_vocabulary)
        if name == "models":
            vocabulary.add_argument("--config", default="config.yaml",
                                    help="whose `models` to list too (where the file exists)")
        if name == "columns":
            vocabulary.add_argument("--markdown", action="store_true",
                                    help="as the documentation's page of columns (docs/columns.md)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainbench", description="Benchmark distributed training set-ups.")
    sub = p.add_subparsers(dest="command", required=True)
    # in the order --help lists them
    for add in (_add_cells, _add_progress, _add_run_cell,
                _add_predict, _add_advise, _add_profile, _add_query, _add_breakdown, _add_fit,
                _add_commbench, _add_search_summary, _add_compare, _add_references, _add_history,
                _add_cost, _add_headline, _add_check_models, _add_schema, _add_vocabularies):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `trainbench cells | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
