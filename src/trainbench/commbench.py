"""`trainbench commbench`: how fast this host's GPUs (or CPU ranks) move data, collective by collective.

Each collective the strategies use is timed through torch.distributed, with the environment the cells
launch with, from small messages (where latency rules) to GiB ones (where bandwidth does), and written
as nccl-tests reports it:

- `size`: the bytes of the operation as nccl-tests counts them: the buffer of an all-reduce or a
  broadcast, the gathered output of an all-gather, the scattered input of a reduce-scatter, one rank's
  send buffer of an all-to-all, the message of a send/recv;
- `algbw = size / time`, and the bus bandwidth `busbw = algbw x factor`, the factor making the figure
  comparable with the link's own speed whatever the number of ranks: 2(n-1)/n for an all-reduce,
  (n-1)/n for an all-gather, a reduce-scatter and an all-to-all, 1 for a broadcast and a send/recv
  (nccl-tests' doc/PERFORMANCE.md derives them).

A size's time is the mean over `iters` operations issued back to back (after `warmup` of them), the
slowest rank's, as nccl-tests times them; that is repeated `repeats` times and the median kept with the
spread, so that a table can say how steady it is. The send/recv passes a message around a ring of
every rank at once (each sends to the next, receives from the previous).

Across nodes (`--nodes`), the ranks start through srun on every node of the SLURM allocation the command
runs in, `--ranks` on each, and meet in a c10d rendezvous on the first, as a multi-node cell's do.

The result, one JSON file (rows and the provenance of the host and run) and a CSV of the rows beside
it, is what the time model's communication terms are to read for that interconnect.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from trainbench.errors import UsageError
from trainbench.execute.gpus import NotEnoughGpus, devices_for_cell, under_slurm
from trainbench.execute.launch import (FIXED_ENVIRONMENT, Rendezvous, free_port, multinode_command,
                                      srun_fan_out)
from trainbench.paths import INTERCONNECT_NAME

SCHEMA_VERSION = 1
DEFAULT_MIN_BYTES = 1 << 10
# GPUs' links reach their bandwidth near a GiB; gloo's CPU ranks take a second an operation there
DEFAULT_MAX_BYTES = {"cuda": 1 << 30, "cpu": 4 << 20}


@dataclass(frozen=True)
class Collective:
    name: str
    # busbw / algbw for n ranks (nccl-tests' doc/PERFORMANCE.md)
    bus_factor: Callable[[int], float]
    what: str


COLLECTIVES = {c.name: c for c in (
    Collective("all_reduce", lambda n: 2 * (n - 1) / n,
               "DDP's gradient buckets, ZeRO-1/2's gradients, tensor parallelism's activations"),
    Collective("all_gather", lambda n: (n - 1) / n,
               "FSDP's and ZeRO-3's parameters before use, ZeRO-1/2's updated parameters"),
    Collective("reduce_scatter", lambda n: (n - 1) / n, "FSDP's and ZeRO-2/3's gradients"),
    Collective("broadcast", lambda n: 1.0, "parameters from rank 0 at start-up"),
    Collective("send_recv", lambda n: 1.0, "a pipeline's activations and their gradients between stages"),
    Collective("all_to_all", lambda n: (n - 1) / n, "expert parallelism's tokens, sequence parallelism"),
)}


@dataclass
class Row:
    collective: str
    size_bytes: int
    ranks: int
    time_us: float  # median over the repeats of the slowest rank's mean time per operation
    time_us_min: float
    time_us_max: float
    algbw_gb_s: float
    busbw_gb_s: float
    repeats: int
    iters: int


def sizes_between(low: int, high: int, factor: int = 4) -> list[int]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def parse_bytes(text: str) -> int:
    """'1K', '64M', '1G' (powers of 1024) or a number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise UsageError(f"not a size in bytes: {text!r} (for example 1K, 64M, 1G)") from None


# --- one rank --------------------------------------------------------------------------------------------

def _operation(name: str, size: int, world: int, rank: int, dtype, device) -> Callable[[], None] | None:
    """One operation of `size` bytes (nccl-tests' count), ready to issue again and again; None where the
    size does not split into whole elements per rank."""
    import torch
    import torch.distributed as dist

    element = torch.tensor([], dtype=dtype).element_size()
    count = size // element
    if count == 0 or (name in ("all_gather", "reduce_scatter", "all_to_all") and count % world):
        return None
    full = torch.ones(count, dtype=dtype, device=device)
    if name == "all_reduce":
        return lambda: dist.all_reduce(full)
    if name == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    part = torch.ones(count // world, dtype=dtype, device=device)
    if name == "all_gather":  # the *_single names are torch 2.13's; older ones have the *_tensor ones
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part)
    if name == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full)
    if name == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if name == "send_recv":
        received = torch.empty_like(full)
        following, previous = (rank + 1) % world, (rank - 1) % world

        def ring() -> None:
            ops = [dist.P2POp(dist.isend, full, following), dist.P2POp(dist.irecv, received, previous)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        return ring
    raise ValueError(name)


def _timed(operation: Callable[[], None], warmup: int, iters: int, device) -> float:
    """The mean seconds per operation of `iters` issued back to back, on the slowest rank."""
    import torch
    import torch.distributed as dist

    def settle() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        operation()
    settle()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        operation()
    settle()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item()) / iters


def measure(collectives: list[str], sizes: list[int], *, warmup: int, iters: int, repeats: int,
            dtype_name: str, progress: Callable[[str], None] = lambda line: None
            ) -> tuple[list[Row], list[dict]]:
    """Every collective at every size on the process group this rank is in: the rows, and what could
    not be measured (with why)."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    rows, skipped = [], []
    for name in collectives:
        for size in sizes:
            try:
                operation = _operation(name, size, world, rank, dtype, device)
            except torch.OutOfMemoryError:
                skipped.append({"collective": name, "size_bytes": size, "reason": "out of GPU memory"})
                continue
            if operation is None:
                skipped.append({"collective": name, "size_bytes": size,
                                "reason": f"not a whole number of {dtype_name} elements per rank"})
                continue
            try:
                times = [_timed(operation, warmup, iters, device) for _ in range(repeats)]
            except (RuntimeError, NotImplementedError) as error:  # a backend without the operation
                skipped.append({"collective": name, "size_bytes": size,
                                "reason": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"})
                break
            finally:
                del operation
            seconds = statistics.median(times)
            algbw = size / seconds / 1e9
            rows.append(Row(name, size, world, round(seconds * 1e6, 3), round(min(times) * 1e6, 3),
                            round(max(times) * 1e6, 3), round(algbw, 4),
                            round(algbw * COLLECTIVES[name].bus_factor(world), 4), repeats, iters))
            progress(f"{name:>14} {_size_text(size):>8}: {seconds * 1e6:11.1f} us  "
                     f"busbw {rows[-1].busbw_gb_s:8.2f} GB/s")
    return rows, skipped


def _size_text(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def worker(args: argparse.Namespace) -> int:
    """One rank, started by torchrun: measure, and rank 0 writes the result."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if args.device == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group(backend)
    rank = dist.get_rank()
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    nodes = len(set(hosts))
    say = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
    say(f"commbench: {dist.get_world_size()} ranks on {nodes} node(s), {backend}, {args.dtype}")
    started = time.time()
    rows, skipped = measure(args.collectives, [int(s) for s in args.sizes], warmup=args.warmup,
                            iters=args.iters, repeats=args.repeats, dtype_name=args.dtype, progress=say)
    if rank == 0:
        doc = {"schema_version": SCHEMA_VERSION, "interconnect": args.name, "backend": backend,
               "device": args.device, "ranks": dist.get_world_size(), "nodes": nodes, "dtype": args.dtype,
               "wall_time_s": round(time.time() - started, 2), "rows": [asdict(r) for r in rows],
               "not_measured": skipped,
               "provenance": {**_provenance(args.device, int(os.environ.get("LOCAL_WORLD_SIZE",
                                                                              dist.get_world_size()))),
                              "hosts": sorted(set(hosts))}}
        write(doc, Path(args.out))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _provenance(device: str, ranks: int) -> dict[str, Any]:
    from trainbench.execute.provenance import (gpu_facts, host_facts, now_iso, slurm_facts,
                                               steering_environment)

    facts = host_facts()
    facts.pop("packages", None)  # the versions of the main packages are enough for a bandwidth table
    leased = os.environ.get("CUDA_VISIBLE_DEVICES")  # as NVML names them: the lease's, or every GPU's
    devices = leased.split(",") if leased else [str(i) for i in range(ranks)]
    gpus = {**gpu_facts(devices), "cuda_visible_devices": leased} if device == "cuda" else {}
    import torch

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else None
    # under SLURM, the job and the step srun started the ranks in
    slurm = {**slurm_facts(), "slurm_step_id": os.environ.get("SLURM_STEP_ID")} if under_slurm() else {}
    return {"finished_at": now_iso(), **facts, **gpus, "nccl": nccl, "environment": steering_environment(),
            **slurm, "command": " ".join(sys.argv)}


def write(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(doc, indent=1) + "\n")
    partial.replace(out)
    header = list(Row.__dataclass_fields__)
    lines = [",".join(header)] + [",".join(str(row[k]) for k in header) for row in doc["rows"]]
    out.with_suffix(".csv").write_text("\n".join(lines) + "\n")


# --- a table from nccl-tests' output ------------------------------------------------------------------------

# nccl-tests' binaries, by the collective each times (all_reduce_perf, ..., alltoall_perf)
NCCL_TESTS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
              "broadcast": "broadcast", "sendrecv": "send_recv", "alltoall": "all_to_all"}
NCCL_TESTS_DTYPES = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64"}
# "#  Rank  3 Group  0 Pid  12 on  node-1 device  3 [0x3a] NVIDIA H100 80GB HBM3"
NCCL_TESTS_RANK = re.compile(r"^#\s*Rank\s+(\d+).*?\son\s+(\S+)\s+device\s+\d+\s+\[[^]]*\]\s+(.+?)\s*$")


def parse_nccl_tests(text: str, where: str) -> tuple[str, list[Row], dict[str, Any]]:
    """The collective, the rows and what the output says of its ranks (their count, nodes, GPU name) in
    one nccl-tests run's output (`all_reduce_perf -b 1K -e 1G -f 4 -g 8`, pasted from a terminal or
    a log): each data row's out-of-place time, algorithm and bus bandwidth, as nccl-tests printed them."""
    binaries = "(all_reduce|all_gather|reduce_scatter|broadcast|sendrecv|alltoall)"
    # named in the output, else in the file's name, as NVIDIA's recipes name their logs
    # (1_1_LOG_all_reduce_env1_...txt)
    named = re.findall(rf"\b{binaries}_perf", text) or re.findall(binaries, Path(where).name)
    if not named:
        raise UsageError(f"{where}: no nccl-tests binary named (all_reduce_perf, all_gather_perf, ...): "
                         f"keep the command that ran it in the output, or name the file after the collective")
    collective = NCCL_TESTS[named[0]]
    ranks = {int(m[1]): (m[2], m[3]) for m in map(NCCL_TESTS_RANK.match, text.splitlines()) if m}
    iters = re.search(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)", text)
    rows, dtype = [], None
    for line in text.splitlines():
        fields = line.split()
        if (len(fields) < 6 or not (fields[0].isdigit() and fields[1].isdigit())
                or fields[2] not in NCCL_TESTS_DTYPES):
            continue
        dtype = NCCL_TESTS_DTYPES[fields[2]]
        # after the type: a reduction's name and the root where the version prints them, then time,
        # algbw, busbw and #wrong out of place, and the same in place
        rest = [f for f in fields[3:] if f not in ("sum", "prod", "min", "max", "avg", "none")]
        rest = rest[1:] if len(rest) % 4 == 1 else rest  # the root
        try:
            time_us, algbw, busbw = (float(f) for f in rest[:3])
        except ValueError:
            raise UsageError(f"{where}: not a row of nccl-tests' output: {line.strip()!r}") from None
        size = int(fields[0])
        if size == 0:  # a size too small to give each rank an element: nccl-tests moved nothing
            continue
        rows.append(Row(collective, size, len(ranks) or 0, time_us, time_us, time_us, algbw, busbw, 1,
                        int(iters[1]) if iters else 0))
    if not rows:
        raise UsageError(f"{where}: no rows of nccl-tests' output (size, count, type, ..., time, algbw, "
                         f"busbw)")
    facts = {"ranks": len(ranks) or None, "nodes": len({host for host, _ in ranks.values()}) or None,
             "gpu_name": next(iter(ranks.values()))[1] if ranks else None, "dtype": dtype}
    return collective, rows, facts


def import_nccl_tests(files: list[Path], *, name: str | None = None, ranks: int | None = None,
                      source: str | None = None) -> dict[str, Any]:
    """A bandwidth table (as `trainbench commbench` writes one) from nccl-tests' outputs, one run per
    file: the ranks, nodes and GPU type the outputs name, `ranks` and `name` where they do not (or to
    say otherwise), and `source`, where the figures come from, in its provenance."""
    from trainbench.registry.hardware import gpu_type_of

    tables = [parse_nccl_tests(Path(f).read_text(), str(f)) for f in files]
    seen = {facts["ranks"] for _, _, facts in tables if facts["ranks"]}
    ranks = ranks or (seen.pop() if len(seen) == 1 else None)
    if not ranks:
        raise UsageError("the outputs do not say how many ranks ran (their '#  Rank' lines): give --ranks")
    nodes = max((facts["nodes"] or 1 for _, _, facts in tables), default=1)
    gpu_name = next((facts["gpu_name"] for _, _, facts in tables if facts["gpu_name"]), None)
    if name is None:
        gpu = gpu_type_of(gpu_name)
        if gpu is None:
            raise UsageError(f"the outputs name no GPU type trainbench knows ({gpu_name!r}): give --name, "
                             f"as <gpu>-x<ranks> (h200-x8) or <gpu>-n<nodes>x<ranks per node>")
        name = f"{gpu.key}-x{ranks}" if nodes == 1 else f"{gpu.key}-n{nodes}x{ranks // nodes}"
    if not INTERCONNECT_NAME.fullmatch(name):
        raise UsageError(f"--name {name}: a table's name is <gpu>-x<ranks> (h200-x8) or "
                         f"<gpu>-n<nodes>x<ranks per node> (h200-n2x8)")
    collectives = [collective for collective, _, _ in tables]
    if len(set(collectives)) < len(collectives):
        raise UsageError(f"two outputs of one collective: {', '.join(sorted(collectives))}")
    rows = [asdict(Row(**{**asdict(row), "ranks": ranks})) for _, found, _ in tables for row in found]
    from trainbench.execute.provenance import now_iso

    return {"schema_version": SCHEMA_VERSION, "interconnect": name, "backend": "nccl", "device": "cuda",
            "ranks": ranks, "nodes": nodes, "dtype": tables[0][2]["dtype"], "wall_time_s": None,
            "rows": rows, "not_measured": [],
            "provenance": {"imported_at": now_iso(), "imported_from": [Path(f).name for f in files],
                           "source": source, "gpu_name": gpu_name,
                           "command": "trainbench " + shlex.join(sys.argv[1:])}}


# --- the command -----------------------------------------------------------------------------------------

def default_name(device: str, ranks: int, nodes: int | None = None) -> str:
    """The interconnect's name from this host: its GPU type and rank count ("h200-x2", "cpu-x2"), and
    across nodes their count and the ranks on each ("h200-n2x4")."""
    span = f"x{ranks}" if nodes is None else f"n{nodes}x{ranks}"
    if device != "cuda":
        return f"cpu-{span}"
    from trainbench.execute.provenance import gpu_facts
    from trainbench.registry.hardware import gpu_type_of

    gpu = gpu_type_of(gpu_facts(["0"]).get("gpu_name"))
    return f"{gpu.key if gpu else 'gpu'}-{span}"


def run(*, ranks: int, device: str, out: Path | None, collectives: list[str],
        min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int | None = None, warmup: int = 5, iters: int = 20,
        repeats: int = 5, dtype: str = "float32", name: str | None = None, nodes: int | None = None) -> int:
    """Start `ranks` ranks with torchrun on this host and wait for their table; with `nodes`, `ranks` on
    each of that many nodes of this SLURM allocation, started by srun."""
    max_bytes = DEFAULT_MAX_BYTES[device] if max_bytes is None else max_bytes
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise UsageError(f"--collectives: no collective {', '.join(unknown)} "
                         f"(known: {', '.join(COLLECTIVES)})")
    if ranks * (nodes or 1) < 2:
        raise UsageError("--ranks: a collective needs 2 ranks or more")
    if nodes is not None and not under_slurm():
        raise UsageError(f"--nodes {nodes}: ranks on several nodes start through SLURM; run it inside an "
                         f"allocation of {nodes} node(s) (snakemake --profile profiles/slurm "
                         f"results/comm/<gpu>-n{nodes}x{ranks}.json asks for one)")
    if min_bytes > max_bytes:
        raise UsageError(f"--min-bytes {min_bytes} is above --max-bytes {max_bytes}")
    from trainbench.registry.hardware import GPUS

    here = default_name(device, ranks, nodes)
    name = name or here
    named, ours = (m["hardware"] if (m := INTERCONNECT_NAME.fullmatch(n)) else n for n in (name, here))
    if named in {*GPUS, "cpu"} and named != ours:  # a table named for other hardware than it measured
        raise UsageError(f"{name} names {named} ranks, and this host's are {ours}: measure it where they are")
    out = out or Path("results/comm") / f"{name}.json"
    args = ["--device", device, "--out", str(out.resolve()), "--name", name, "--dtype", dtype,
            "--warmup", str(warmup), "--iters", str(iters), "--repeats", str(repeats),
            "--collectives", *collectives, "--sizes", *map(str, sizes_between(min_bytes, max_bytes))]
    # the cells' fixed settings (NCCL's and CUDA's among them): the table speaks for what they run with
    env = {**os.environ, **FIXED_ENVIRONMENT}
    if nodes is not None:
        # as a multi-node cell starts: one torchrun per node, meeting on this (the batch) host; the
        # allocation's GPUs are the ranks', so nothing is leased
        rendezvous = Rendezvous(socket.gethostname(), free_port(), f"commbench-{os.getpid()}", nodes)
        node_argv = multinode_command(ranks, rendezvous, args, module="trainbench.commbench")
        if device == "cpu":
            env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or ranks)
        done = subprocess.run(srun_fan_out(nodes, ranks if device == "cuda" else 0, node_argv,
                                           cpus_per_task=cpus), env=env)
        return _said(done.returncode, out)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "-m", "trainbench.commbench", *args]
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
        done = subprocess.run(command, env=env)
    else:
        # GPUs leased as a cell leases them, with the machine to itself: no cell shares its links
        try:
            with devices_for_cell(ranks, alone=True,
                                  on_wait=lambda: print(f"commbench: waiting for {ranks} free GPUs and the "
                                                        "machine to itself", flush=True)) as devices:
                done = subprocess.run(command, env={**env, "CUDA_VISIBLE_DEVICES": ",".join(devices)})
        except NotEnoughGpus as error:
            raise UsageError(f"--ranks {ranks}: {error}") from None
    return _said(done.returncode, out)


def _said(returncode: int, out: Path) -> int:
    if returncode == 0 and out.exists():
        print(f"commbench: {out} and {out.with_suffix('.csv')}")
    return returncode


def main(argv: list[str] | None = None) -> int:
    """The ranks' entry point (`python -m trainbench.commbench`, under torchrun)."""
    p = argparse.ArgumentParser(prog="trainbench.commbench")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--collectives", nargs="+", default=list(COLLECTIVES))
    p.add_argument("--sizes", nargs="+", required=True)
    return worker(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
