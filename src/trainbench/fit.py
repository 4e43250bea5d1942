"""`trainbench fit`: will a cell fit its GPUs, and at what micro batch? Measured before a job is queued.

The cell runs as one emulated rank of its world on this machine's GPU (or a CPU process, for a CPU
cell), held to the GPU memory asked for: the same run as a study's emulated cell (emulation.py),
written as a metrics.json under results/fit/. What it prints beside the measurement is the memory
model's prediction for the same rank and GPU. With a search, the micro batch doubles then bisects
(batch_search.py) until the largest that trains is known.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from trainbench import paths
from trainbench.errors import UsageError
from trainbench.study.grid import Cell, check_cell, make_cell_id, named_keys
from trainbench.study.params import CellParams

FIT_ROOT = "results/fit"


def emulated_cell(cell: Cell, *, rank: int | None, gpu_mem_gib: float | None,
                  micro_batch: int | None = None) -> Cell:
    """The cell as one emulated rank (the one asked for, or the heaviest), held to `gpu_mem_gib`."""
    p = cell.params
    if p.gpus == 1:
        raise UsageError(f"{cell.study}/{cell.cell_id} runs one rank: it runs for real on one device "
                         f"(`snakemake {cell.target}`); emulation is for cells of several ranks")
    changes: dict[str, Any] = {"emulate": True, "emulate_rank": rank}
    if gpu_mem_gib is not None:
        changes["gpu_mem_limit_gib"] = gpu_mem_gib
    if micro_batch is not None:
        changes["micro_batch"] = micro_batch
    params = p.replace(**changes)
    errors, unsupported = check_cell(params)
    if errors:
        raise UsageError("; ".join(f"{key}: {message}" for key, message in errors))
    keys = named_keys(params, cell.id_keys)
    cell_id = make_cell_id(params, keys)
    return replace(cell, cell_id=cell_id, params=params, id_keys=keys, unsupported=unsupported, measured=True)


def target(cell: Cell, root: str = FIT_ROOT) -> Path:
    return Path(root) / cell.study / cell.cell_id / Path(paths.RUN).name


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def report(doc: dict[str, Any]) -> list[str]:
    """What a user asks of a fit: did it train, the memory per GPU and per node, the model's view."""
    from trainbench.reporting.columns import result_text

    m, p, emulated = doc["metrics"], CellParams.from_dict(doc["params"]), doc.get("emulation") or {}
    limit = p.gpu_mem_limit_gib
    held = f", held to {limit:g} GiB" if limit else ""
    lines = [f"{doc['study']}/{doc['cell_id']}",
             f"  as rank {emulated.get('rank')} of {p.gpus} ({p.gpus_per_node} per node){held}: "
             f"{'fits' if doc['status'] == 'ok' else 'does not fit'} ({result_text(doc)})"]
    used = max(m.get("gpu_mem_used_mib") or [0]) or None
    if used is not None:
        nccl = (emulated.get("modelled") or {}).get("nccl_buffers_mib") or 0
        allocated = max(m.get("torch_peak_allocated_mib") or [0]) or None
        lines.append(f"  GPU memory per GPU: {_gib(used)} used as nvidia-smi shows it ({_gib(nccl)} of NCCL "
                     f"buffers modelled), torch's peak allocation {_gib(allocated)}")
    rank_host = (emulated.get("measured") or {}).get("host_rss_peak_mib")
    if rank_host is not None:
        lines.append(f"  host memory: {_gib(rank_host)} this rank, {_gib(m.get('host_mem_peak_mib'))} "
                     f"per node of {p.gpus_per_node} ranks (derived)")
    predicted = doc.get("predicted") or {}
    if predicted.get("gpu_mem_mib") is not None or predicted.get("host_mem_mib") is not None:
        verdict = {True: "fits", False: f"does not fit ({predicted.get('why_not')})",
                   None: "-"}[predicted.get("fits")]
        lines.append(f"  memory model: {_gib(predicted.get('gpu_mem_mib'))} per GPU, "
                     f"{_gib(predicted.get('host_mem_mib'))} per node: {verdict}")
    if m.get("step_time_s"):
        lines.append(f"  step time: {m['step_time_s']:.3f} s of this rank's compute (no communication)")
        lines += _whole_step_lines(doc, p, m["step_time_s"])
    return lines


def _whole_step_lines(doc: dict[str, Any], params: CellParams, step_s: float) -> list[str]:
    """The rank's measured step plus the time model's wait of its world on the GPU type it ran on
    (time_model.waiting_s), and the range measured worlds that wait alike stepped at
    (time_model.whole_step_band); nothing on a CPU rank or a GPU the hardware table does not know."""
    from trainbench.predict import time_model
    from trainbench.reporting.predictions import counted
    from trainbench.registry.hardware import gpu_type_of

    gpu = gpu_type_of((doc.get("provenance") or {}).get("gpu_name"))
    if gpu is None or params.device != "cuda":
        return []
    counted_params = counted(params)
    wait = time_model.waiting_s(counted_params, gpu, cpu_threads=time_model.threads_of_run(doc))
    if wait is None:
        return []
    whole = step_s + wait
    lines = [f"  whole step: {whole:.3f} s with what its world adds as the time model has it "
             f"({wait:.3f} s: exposed collectives, a pipeline's bubble, the node's shared host)"]
    band = time_model.whole_step_band(counted_params)
    if band is not None:
        lines.append(f"  measured worlds that wait as this one ({time_model.wait_kind(counted_params)}, "
                     f"{band['ranks']} ranks) stepped {band['low']:.2f}-{band['high']:.2f} x their whole "
                     f"step: {whole * band['low']:.3f}-{whole * band['high']:.3f} s here")
    return lines


def run(cell: Cell, *, root: str = FIT_ROOT, force: bool = False, runtime_min: float = 60,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or read, unless forced) one emulated cell's result under `root`."""
    from trainbench.execute.cellrun import run_cell
    from trainbench.contract.result import result_problem
    from trainbench.reporting.documents import read_reported

    output = target(cell, root)
    if output.exists() and not force and result_problem(output) is None:
        doc = read_reported(output)
        if doc["params_hash"] == cell.params_hash:
            say(f"(already measured: {output}; --force runs it again)")
            return doc
    code = run_cell(cell, output, runtime_min=runtime_min, retries=0)
    if code != 0:
        raise UsageError(f"{cell.study}/{cell.cell_id} could not run here (see above)")
    return read_reported(output)


def search(cell: Cell, *, max_micro_batch: int, tolerance: float, root: str = FIT_ROOT, force: bool = False,
           runtime_min: float = 60, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The largest micro batch the emulated rank trains, each probe a run of its own; returns the
    search's summary (batch_search.summary) with the probes' documents."""
    from trainbench.predict.batch_search import model_bounds, summary, walk
    from trainbench.predict.memory_model import Hardware

    from trainbench.predict.memory_model import held_gpu_mib

    p = cell.params
    gpu = None
    if p.device == "cuda":
        from trainbench.execute.gpus import machine_devices
        from trainbench.execute.provenance import gpu_facts

        gpu = held_gpu_mib(gpu_facts(machine_devices()[:1]).get("gpu_memory_mib"), p)
    start, upper = model_bounds(p, Hardware(gpu, float("inf"), p.gpus_per_node) if gpu else None,
                                max_micro_batch)
    docs: dict[int, dict[str, Any]] = {}

    def status_of(batch: int) -> str:
        probe = emulated_cell(cell, rank=p.emulate_rank, gpu_mem_gib=p.gpu_mem_limit_gib,
                              micro_batch=batch)
        probe = replace(probe, cell_id=paths.probe_id(cell.cell_id, batch))  # a folder of its own
        doc = run(probe, root=root, force=force, runtime_min=runtime_min, say=say)
        docs[batch] = doc
        say(f"  micro batch {batch}: {doc['status']}"
            + (f" ({doc['reason'][:100]})" if doc.get("reason") else "")
            + (f", {max(doc['metrics']['gpu_mem_used_mib']) / 1024:.1f} GiB used"
               if doc["metrics"].get("gpu_mem_used_mib") else ""))
        return doc["status"]

    walk(status_of, start, upper, tolerance)
    return {**summary(docs, tolerance, max_micro_batch), "documents": docs}


def main(args, config) -> int:
    """`trainbench fit STUDY CELL [--rank R] [--gpu-mem-gib G] [--search]`, on a loaded config."""
    cell = config.study(args.study).cell(args.cell)
    emulated = emulated_cell(cell, rank=args.rank, gpu_mem_gib=args.gpu_mem_gib)
    if not args.search:
        doc = run(emulated, root=args.root, force=args.force, runtime_min=args.runtime_min)
        print("\n".join(report(doc)))
        return 0 if doc["status"] in ("ok", "oom") else 1
    print(f"searching the largest micro batch of {args.study}/{emulated.cell_id} "
          f"(up to {args.max_micro_batch})")
    found = search(emulated, max_micro_batch=args.max_micro_batch, tolerance=args.tolerance, root=args.root,
                   force=args.force, runtime_min=args.runtime_min)
    largest = found["max_micro_batch"]
    if largest is None:
        print("  not even micro batch 1 trains on this GPU")
        return 1
    print(f"  largest micro batch that trains: {largest} (global batch {found['max_global_batch']})"
          + (f"; {found['first_failure']['micro_batch']} does not" if found["first_failure"] else
             f"; none failed up to {found['bound']}"))
    print("\n".join(report(found["documents"][largest])))
    return 0
