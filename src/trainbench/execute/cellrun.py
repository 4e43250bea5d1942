"""Run one cell and write its metrics.json: what the Snakemake rule `train_cell` calls.

Launch the ranks (with GPUs from the slot pool or SLURM), retry unexpected failures, stop the run at
its time limit, and classify what happened: ok, OOM (at init or at step k), timeout, or failed after
the retries with the error from the log. Each of those outcomes is a result and is written; only a
cell this version cannot run (no runner yet, not enough GPUs here) stops with an error and no file.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainbench.study.params import CellParams
from trainbench.training import emulation, register_cell_model
from trainbench.registry import frameworks
from trainbench.predict import memory_model
from trainbench.execute import history, provenance, watch
from trainbench.study.grid import Cell
from trainbench.execute.gpus import NotEnoughGpus, devices_for_cell, machine_devices, timed_alone, under_slurm
from trainbench.execute.watch import driver_pid, runner_environment, wait_for_an_exit, when_gone
from trainbench.execute.launch import (WORKER_MODULE, Rendezvous, free_port, launch_environment,
                                      multinode_command,
                              node_command, srun_command, worker_args)
from trainbench.registry.hardware import gpu_type_of, host_memory_mib
from trainbench.execute.profiling import PROFILE_DIR
from trainbench.contract.result import (SCHEMA_VERSION, Result, empty_metrics, empty_predicted,
                                        sanity_problems, write_json_atomic)
from trainbench.execute.results import node_memory, partial_metrics, summarize

TERMINATE_GRACE_S = 15
PEER_EXIT_GRACE_S = 30  # after one node's launcher fails, how long the others get to notice
# Run a multi-node CPU cell's nodes as processes on this machine, each its own torchrun joining one
# c10d rendezvous: the multi-node launch path without a cluster (tests, laptops).
SIMULATE_NODES_ENV = "TRAINBENCH_SIMULATE_NODES"
# Run cells the memory model predicts will not fit (to measure where it is wrong).
FORCE_ENV = "TRAINBENCH_FORCE_INFEASIBLE"
# Plan against less memory than the machine has: "gpu=40,host=64" (GiB; either may be left out).
MEMORY_LIMITS_ENV = "TRAINBENCH_MEMORY_LIMITS"


def memory_limits_override() -> dict[str, float]:
    text = os.environ.get(MEMORY_LIMITS_ENV, "").strip()
    limits = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in ("gpu", "host") or not value:
            raise CellCannotRun(f"{MEMORY_LIMITS_ENV}={text!r}: expected 'gpu=GiB,host=GiB'")
        try:
            limits[key] = float(value) * 1024
        except ValueError:
            raise CellCannotRun(f"{MEMORY_LIMITS_ENV}={text!r}: {value!r} is not a number of GiB") from None
    return limits


def _missing_package(params: CellParams) -> str | None:
    """What a cell needs that this environment lacks: torchao for float8 cells."""
    if params.float8:
        import importlib.util

        if importlib.util.find_spec("torchao") is None:
            return "float8 trains through torchao, which is not installed here (pip install torchao)"
    return None


def no_float8_here(params: CellParams, gpu_name: str | None) -> str | None:
    """Why a float8 cell cannot run on these GPUs: they have no FP8 tensor cores (the hardware table's
    FP8 peak; compute capability 8.9, Ada and Hopper, has them). None where it can, or where the GPU
    type is unknown (the run then says)."""
    if not params.float8 or params.device != "cuda":
        return None
    gpu = gpu_type_of(gpu_name)
    if gpu is not None and gpu.peak_flops.get("fp8") is None:
        return (f"float8 matmuls need FP8 tensor cores (compute capability 8.9 or later: Ada, Hopper); "
                f"{gpu_name} has none")
    return None


def cpu_computes_fp16() -> bool:
    """Whether this CPU computes fp16 through oneDNN (AVX512-FP16 or AMX-FP16: Intel's Sapphire Rapids
    and later; not AMD's EPYC up to Zen 5), the test DeepSpeed's CPU accelerator makes."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


def no_fp16_here(params: CellParams) -> str | None:
    """Why a CPU cell cannot train under DeepSpeed's engine in fp16 on this CPU: deepspeed.initialize
    refuses ('Type fp16 is not supported on your device') where the CPU does not compute fp16. None
    where it can, and for every cell that does not ask DeepSpeed for fp16 on CPU ranks."""
    if (params.device != "cpu" or params.precision != "fp16"
            or frameworks.strategy_of(params).zero_stage is None or cpu_computes_fp16()):
        return None
    return ("DeepSpeed's CPU accelerator trains fp16 only on a CPU that computes it (AVX512-FP16 or "
            "AMX-FP16, which oneDNN reports); this CPU does not: use bf16 or fp32, or such a CPU")


def not_on_this_hardware(params: CellParams, gpu_name: str | None) -> str | None:
    """Why a cell cannot run on the devices it got, which its result says (status unsupported)."""
    return no_float8_here(params, gpu_name) or no_fp16_here(params)


def gpus_here(devices: list[str] | None, device_type: str) -> dict[str, Any]:
    """NVML's facts of the GPUs a cell gets on this node (a SLURM node: all it gave), read once per run."""
    if device_type != "cuda":
        return provenance.gpu_facts(None)
    return {**provenance.gpu_facts(devices if devices is not None else machine_devices()),
            "devices": devices if devices is not None else machine_devices()}


def hardware_here(gpu: dict[str, Any], device_type: str,
                  params: CellParams | None = None) -> memory_model.Hardware:
    """The memory a cell gets on this node: its GPUs' (`gpu`, from gpus_here) and this host's, less any
    override or the cell's own GPU limit (`gpu_mem_limit_gib`). An emulated cell's node is the world's:
    its ranks per node, each with this host's memory (the one rank it runs must fit here)."""
    gpu_mib, name, gpus = None, "CPU", 0
    if device_type == "cuda":
        gpu_mib, name, gpus = gpu["gpu_memory_mib"], gpu["gpu_name"] or "GPU", len(gpu["devices"])
    host_mib = host_memory_mib()
    limits = memory_limits_override()
    if "gpu" in limits and device_type == "cuda":
        gpu_mib = min(gpu_mib, limits["gpu"]) if gpu_mib else limits["gpu"]
    host_mib = min(host_mib, limits.get("host", host_mib))
    if params is not None and device_type == "cuda" and params.gpu_mem_limit_gib is not None:
        gpu_mib = memory_model.held_gpu_mib(gpu_mib, params)
        name = f"{name} held to {params.gpu_mem_limit_gib:g} GiB"
    if params is not None and params.emulate:
        return memory_model.emulated_node(gpu_mib, host_mib, params,
                                          f"{name}, emulated node of {params.gpus_per_node} rank(s) "
                                          "with this host's memory each")
    return memory_model.Hardware(gpu_mib, host_mib, gpus, name)


def stop_time_s(runtime_min: float) -> float:
    """When to stop a run given its time limit: early enough to write the result before SLURM
    kills the job at the limit (10% of it, at most a minute)."""
    limit = runtime_min * 60
    return limit - min(60.0, 0.1 * limit)


class CellCannotRun(Exception):
    """This cell cannot run here or in this version; no result is written."""


@dataclass
class Outcome:
    status: str
    reason: str | None
    result: dict[str, Any] | None = None
    rank_records: list[dict[str, Any]] = field(default_factory=list)
    # the infrastructure's failure (a rank lost to a signal, a freeze), not the cell's: it runs again
    infrastructure: bool = False


@dataclass(frozen=True)
class Attempt:
    """The cell's last launch: its outcome, its number, its commands, and when it ran (wall clock)."""

    outcome: Outcome
    number: int
    commands: list[list[str]]
    wall_time_s: float
    launched: float
    exited: float


def _read_rank_records(work_dir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(work_dir.glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a rank killed while writing: the others still tell the story
    return sorted(records, key=lambda r: r.get("rank", 0))


def classify(work_dir: Path, returncode: int | None, timed_out: bool, timeout_s: float,
             warmup_steps: int, verdict: watch.Verdict | None = None, launcher_output: str = "",
             ranks_per_node: int = 0) -> Outcome:
    """What happened to one attempt, from the files the ranks left, what the watch saw, and what the
    launcher said and how it exited."""
    records = _read_rank_records(work_dir)
    result_file = work_dir / "result.json"
    if returncode == 0 and result_file.exists():
        return Outcome("ok", None, json.loads(result_file.read_text()), records)
    ooms = [r for r in records if r.get("event") == "oom"]
    if ooms:
        at_init = [r for r in ooms if r["phase"] == "init"]
        if at_init:
            reason = "OOM at init (cannot even initialize the model)"
        else:
            step = min(r["step"] for r in ooms)
            # how many steps a cell times is decided as it runs (timing windows): say which phase
            reason = f"OOM at step {step} ({'warm-up' if step <= warmup_steps else 'timed'})"
        ranks = ", ".join(str(r["rank"]) for r in ooms)
        return Outcome("oom", f"{reason} on rank {ranks}: {ooms[0]['message'][:300]}", None, records)
    lost = lost_rank(work_dir, verdict, launcher_output, records, ranks_per_node)
    if lost is not None:
        return lost
    if timed_out:
        return Outcome("timeout", f"stopped at the time limit of {timeout_s:.0f} s", None, records)
    errors = [r for r in records if r.get("event") == "error"]
    if errors:
        return Outcome("failed", f"rank {errors[0]['rank']}: {errors[0]['message'][:500]}", None, records)
    if returncode is not None and returncode < 0:
        return Outcome("failed",
                       f"launcher killed by signal {-returncode} ({signal.Signals(-returncode).name})",
                       None, records)
    return Outcome("failed", f"launcher exited with status {returncode} and no rank reported why (see log)",
                   None, records)


def lost_rank(work_dir: Path, verdict: watch.Verdict | None, launcher_output: str,
              records: list[dict[str, Any]], ranks_per_node: int = 0) -> Outcome | None:
    """A rank the watch saw die, freeze or stall, or one the launcher says a signal ended: the outcome
    naming it, how it ended and its last lines; a rank that failed and said why (its record) is not
    lost, it failed. An infrastructure failure (a signal, a freeze) is marked so: it runs again."""
    reported = {r.get("rank") for r in records}
    # ranks the launcher says a signal ended without a word, its root cause first: what the others
    # reported after (a peer gone, a collective broken) follows from it
    signalled = [(rank, code) for rank, code in watch.failures(launcher_output)
                 if code < 0 and rank not in reported]
    if verdict is not None and verdict.kind != "dead":  # stopped, or stalled: the watch ended it
        reason, infrastructure, rank = verdict.reason, verdict.infrastructure, verdict.rank
    elif signalled:
        rank, code = signalled[0]
        seen = watch.Progress.read(work_dir / watch.PROGRESS_DIR / f"rank{rank}")
        where = f" on {seen.host}" if seen is not None else ""
        reason, infrastructure = f"rank {rank}{where} ended by {watch.describe_exit(code)}", True
    elif verdict is not None and not records:  # gone, and no launcher report nor any rank's word
        rank, reason, infrastructure = verdict.rank, f"{verdict.reason}, saying nothing", True
    else:
        return None
    lines = watch.last_lines(work_dir, rank, ranks_per_node)
    if lines:
        reason += "; its last lines: " + " | ".join(lines)
    outcome = Outcome("failed", reason[:900], None, records)
    outcome.infrastructure = infrastructure
    return outcome


def model_section(params) -> dict[str, Any]:
    """What a result says of a model of the config's `models` (its facts, counted from the model, which
    its predictions used) and of the token file it trained on (its size and a fingerprint: the path
    alone is the cell's parameter)."""
    section: dict[str, Any] = {}
    if params.model_definition:
        from trainbench.registry.models import get_model

        facts = get_model(params.model).facts
        section["facts"] = {k: v for k, v in facts.__dict__.items() if k != "traces"}
        section["activations"] = "traced on fake tensors (trainbench.training.user_models)"
    if params.tokens:
        import hashlib

        path = Path(params.tokens)
        with open(path, "rb") as f:
            head = f.read(64 * 2**20)
        section["tokens"] = {"path": params.tokens, "bytes": path.stat().st_size,
                             "sha256_first_64_mib": hashlib.sha256(head).hexdigest()}
    return section


class CellRun:
    def __init__(self, cell: Cell, output: Path, *, runtime_min: float, retries: int,
                 python: str = sys.executable, search_probe: bool = False):
        self.cell = cell
        register_cell_model(cell.params)
        # A max-batch probe runs whatever the memory model predicts: the search measures the boundary.
        self.search_probe = search_probe
        self.host_alone: bool | None = None  # whether a GPU cell held its machine alone (gpus.py)
        self.params = cell.params
        self.output = output
        self.work_dir = output.parent / ".work"
        self.timeout_s = stop_time_s(runtime_min)
        self.retries = retries
        self.python = python
        self._children: list[subprocess.Popen] = []
        self.finishing = threading.RLock()  # held while a result is written: a stop waits for it
        self.launch_environment: dict[str, str] | None = None  # the ranks' environment, for provenance
        self.predicted: dict[str, Any] | None = None  # the memory model's, once: see _prediction
        self.host_facts = provenance.HostFacts()  # read while the ranks start: see _launch

    def _say(self, text: str) -> None:
        print(f"[trainbench {self.cell.study}/{self.cell.cell_id}] {text}", flush=True)

    def _base_document(self, status: str, reason: str | None) -> dict[str, Any]:
        doc = {"schema": SCHEMA_VERSION, "study": self.cell.study, "cell_id": self.cell.cell_id,
               "params": self.params.as_dict(), "params_hash": self.params.params_hash, "status": status,
               "reason": reason, "metrics": empty_metrics(), "predicted": self._prediction(),
               "provenance": {}}
        if self.params.emulate:  # which rank it stands for, whatever became of it (account() adds more)
            doc["emulation"] = emulation.section(self.params)
        if self.params.model_definition or self.params.tokens:
            doc["model"] = model_section(self.params)
        return doc

    def _prediction(self) -> dict[str, Any]:
        """The prediction the run was judged by (with its hardware), or, for a cell that never got
        hardware (unsupported), the model's figures alone."""
        if self.predicted is None:
            self.predicted = {**empty_predicted(), **memory_model.predict(self.params).as_dict()}
        return self.predicted

    def _write(self, doc: dict[str, Any], *, started: str, asked: str | None = None, devices=None,
               gpu: dict[str, Any] | None = None, command: str = "", result: dict[str, Any] | None = None,
               ranks: list[dict[str, Any]] | None = None, gpus_total: int = 0) -> dict[str, Any]:
        """Fill a document's provenance and write it, atomically, as the cell's result."""
        result = result or {}
        doc["provenance"] = provenance.collect(
            gpu=gpu or provenance.gpu_facts(None), devices=devices,
            nodes=1 if self.params.emulate else self.params.nodes,
            gpus_total=gpus_total, cuda=result.get("torch_cuda"), nccl=result.get("nccl"),
            started=started, ended=provenance.now_iso(),
            command=command, run_gpus=node_memory([r.get("node_memory") for r in ranks or []]),
            environment=self.launch_environment, host=self.host_facts.get())
        if asked is not None:
            doc["provenance"]["asked"] = asked  # when the cell asked for its devices (it may have waited)
        if self.host_alone is not None:
            doc["provenance"]["host_alone"] = self.host_alone
        with self.finishing:
            self._keep_profile()
            write_json_atomic(self.output, doc)
            try:
                # kept when a rerun replaces it (history.py)
                history.append(Result.from_document(doc), self.output)
            except OSError as error:  # the result stands without its history line: say so, lose nothing
                self._say(f"could not add the result to its history ({error}); "
                          "`trainbench history --seed` adds it later")
            shutil.rmtree(self.work_dir, ignore_errors=True)
        return doc

    def _keep_profile(self) -> None:
        """The ranks' traces and memory snapshots (profiling.py) beside metrics.json, in place of an
        earlier run's: what is there always belongs to the result next to it."""
        kept = self.output.parent / PROFILE_DIR
        shutil.rmtree(kept, ignore_errors=True)
        made = self.work_dir / PROFILE_DIR
        if made.is_dir() and any(made.iterdir()):
            shutil.move(made, kept)

    def run(self) -> dict[str, Any]:
        started = provenance.now_iso()
        if self.cell.unsupported:
            self._say(f"unsupported: {self.cell.unsupported}")
            return self._write(self._base_document("unsupported", self.cell.unsupported), started=started)
        missing = frameworks.not_implemented(self.params) or _missing_package(self.params)
        if missing:
            raise CellCannotRun(f"{missing}; this cell can be listed and dry-run, not run")
        if self.params.nodes > 1 and not self.params.emulate:
            if under_slurm():
                return self._run_attempts(None, started)
            if os.environ.get(SIMULATE_NODES_ENV) == "1" and self.params.device == "cpu":
                return self._run_attempts(None, started)
            raise CellCannotRun(f"a {self.params.nodes}-node cell runs inside a SLURM allocation "
                                "(see docs/slurm.md); CPU cells can simulate nodes "
                                f"with {SIMULATE_NODES_ENV}=1")
        # an emulated cell is one process on one device, whatever its world
        ranks_here = self.params.ranks_here
        count = ranks_here if self.params.device == "cuda" else 0
        try:
            if count:
                alone = timed_alone(self.search_probe)
                # under SLURM the allocation decides what else runs on the node: not known here
                self.host_alone = None if under_slurm() else alone
                waiting = f"waiting for {count} free GPU(s)" + (" and the machine to itself" if alone else "")
                with devices_for_cell(count, on_wait=lambda: self._say(waiting), alone=alone) as devices:
                    return self._run_attempts(devices, started)
            return self._run_attempts(None, started)
        except NotEnoughGpus as error:
            raise CellCannotRun(f"{error}; run it on a machine with more GPUs or through SLURM") from None

    def _run_attempts(self, devices: list[str] | None, asked: str) -> dict[str, Any]:
        # `started` is when the run had its devices; waiting for free GPUs is recorded apart
        started = provenance.now_iso()
        if devices is not None:
            self._say(f"GPUs {','.join(devices)}")
        gpu = gpus_here(devices, self.params.device)
        without = not_on_this_hardware(self.params, gpu.get("gpu_name"))
        if without:
            self._say(f"unsupported: {without}")
            return self._write(self._base_document("unsupported", without), started=started, asked=asked,
                               devices=devices, gpu=gpu)
        infeasible = self._memory_verdict(gpu)
        if infeasible:
            self._say(f"infeasible: {infeasible}")
            return self._write(self._base_document("infeasible", infeasible), started=started, asked=asked,
                               devices=devices, gpu=gpu)
        run = self._attempt(devices)
        outcome = run.outcome
        return self._write(self._outcome_document(run), started=started, asked=asked, devices=devices,
                           gpu=gpu, command=" & ".join(shlex.join(c) for c in run.commands),
                           result=outcome.result,
                           ranks=outcome.result["ranks"] if outcome.result else outcome.rank_records,
                           # the GPUs it ran on: one for an emulated rank, whatever its world
                           gpus_total=(1 if self.params.emulate else self.params.gpus)
                           if self.params.device == "cuda" else 0)

    def _memory_verdict(self, gpu: dict[str, Any]) -> str | None:
        """The memory model's verdict on this cell here (kept in self.predicted): why it is not run
        (infeasible), or None where it runs: it fits, it is an emulated rank that runs to measure
        whether it fits, or it is forced (a max-batch probe, FORCE_ENV)."""
        hardware = hardware_here(gpu, self.params.device, self.params)
        prediction = memory_model.predict(self.params, hardware)
        self.predicted = {**prediction.as_dict(), "hardware": hardware.describe()}
        # An emulated rank runs to measure whether it fits its GPU: only a host that cannot hold the
        # rank's share stops it (emulation.py; the hardware is the emulated node's)
        measuring = self.params.emulate and "host memory" not in prediction.short_of
        if not prediction.fits and measuring:
            self._say(f"{prediction.why_not} ({hardware.describe()}); "
                      "running the emulated rank to measure it")
        elif not prediction.fits:
            if os.environ.get(FORCE_ENV) != "1" and not self.search_probe:
                reason = (f"{prediction.why_not} ({self.predicted['hardware']}); not run "
                          f"(set {FORCE_ENV}=1 to run it)")
                if self.params.emulate:  # what stops it is this host, not the hardware it stands for
                    per_node = self.params.gpus_per_node
                    reason = ("one rank's share of host memory "
                              f"({prediction.host_mem_mib / per_node / 1024:.1f} GiB predicted: "
                              f"{prediction.host_mem_mib / 1024:.1f} GiB per node of {per_node}) "
                              f"is more than this host's {hardware.host_mem_mib / per_node / 1024:.1f} GiB; "
                              f"the emulated rank needs a host with more memory (set {FORCE_ENV}=1 to run "
                              "it here anyway)")
                return reason
            self.predicted["forced"] = True
            why = "a max-batch probe" if self.search_probe else f"{FORCE_ENV}=1"
            self._say(f"{prediction.why_not} ({hardware.describe()}); running anyway ({why})")
        return None

    def _attempt(self, devices: list[str] | None) -> Attempt:
        """Launch the cell until an attempt ends other than `failed`, or its retries are spent."""
        attempts = self.retries + 1
        # One deadline for all attempts: the job's time limit (SLURM's) covers them all.
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(1, attempts + 1):
            commands = self._prepare_attempt(devices, attempt)
            for command in commands:
                self._say(f"attempt {attempt}/{attempts}: {shlex.join(command)}")
            attempt_start, launched = time.monotonic(), time.time()
            returncode, timed_out = self._launch(commands, devices, deadline)
            wall_time_s = time.monotonic() - attempt_start
            outcome = classify(self.work_dir, returncode, timed_out, self.timeout_s,
                               self.params.warmup_steps, self.verdict, "".join(self.launcher_tail),
                               self.params.gpus_per_node or 0)
            self._say(f"attempt {attempt}: {outcome.status}"
                      + (f" ({outcome.reason})" if outcome.reason else ""))
            if outcome.status != "failed":
                break
        return Attempt(outcome, attempt, commands, wall_time_s, launched, launched + wall_time_s)

    def _outcome_document(self, run: Attempt) -> dict[str, Any]:
        """metrics.json of the last attempt, but for what _write adds (provenance)."""
        outcome = run.outcome
        doc = self._base_document(outcome.status, outcome.reason)
        if outcome.status == "ok":
            doc["metrics"] = summarize(self.params, outcome.result, run.wall_time_s, self.cell.timing,
                                       launched=run.launched, exited=run.exited)
            doc["sanity"] = sanity_problems(doc)  # what the tables check too: sane training, or why not
            framework_config = outcome.result.get("framework_config")
            if framework_config:  # the framework's own config as it ran (DeepSpeed's JSON, FSDP's settings)
                write_json_atomic(self.output.parent / framework_config["file"], framework_config["config"])
        else:
            doc["metrics"] = partial_metrics(outcome.rank_records, run.wall_time_s)
        # how the rank was measured (worker.Worker._measured_as): emulated, held to a smaller GPU
        reports = [outcome.result] if outcome.result else outcome.rank_records
        measured_as = next((r for r in reports if "emulated" in r or "device_limit" in r), {})
        if measured_as.get("emulated"):
            doc["emulation"] = emulation.account(doc["metrics"], measured_as["emulated"], self.params)
        if self.params.gpu_mem_limit_gib is not None:
            doc["device_limit"] = measured_as.get("device_limit")
        doc["attempts"] = run.number
        if outcome.infrastructure:
            doc["failure"] = "infrastructure"  # freshness.py: the next run runs the cell again
        return doc

    def _prepare_attempt(self, devices: list[str] | None, attempt: int) -> list[list[str]]:
        """The commands to start on this machine for one attempt: one per local launcher."""
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(parents=True)
        cell_file = self.work_dir / "cell.json"
        cell_file.write_text(json.dumps({"study": self.cell.study, "cell_id": self.cell.cell_id,
                                         "params": self.params.as_dict(),
                                         "timing": self.cell.timing.as_dict()}, indent=2))
        p = self.params
        if p.emulate:  # one process joins the world as its rank (worker.py, emulation.py)
            return [[self.python, "-m", WORKER_MODULE, *worker_args(cell_file, self.work_dir)]]
        if p.nodes == 1:
            return [node_command(p, cell_file, self.work_dir, python=self.python,
                                 devices_given=devices is not None)]
        run_id = f"{self.cell.study}-{p.params_hash}-{attempt}"
        if under_slurm():
            # This runs on the allocation's first node (the batch host): it hosts the rendezvous.
            rendezvous = Rendezvous(socket.gethostname(), free_port(), run_id, p.nodes)
            node_argv = multinode_command(p.gpus_per_node, rendezvous,
                                          worker_args(cell_file, self.work_dir), python=self.python,
                                          work_dir=self.work_dir)
            return [srun_command(p, node_argv, cpus_per_task=self.cell.resources()["cpus_per_task"])]
        rendezvous = Rendezvous("127.0.0.1", free_port(), run_id, p.nodes)
        node_argv = multinode_command(p.gpus_per_node, rendezvous, worker_args(cell_file, self.work_dir),
                                      python=self.python, work_dir=self.work_dir)
        return [node_argv] * p.nodes

    def _launch(self, commands: list[list[str]], devices: list[str] | None,
                deadline: float) -> tuple[int | None, bool]:
        """Start the commands and wait for all; stop them all at the deadline, soon after one fails, or
        as soon as the watch finds a rank dead, stopped or stalled (watch.py). Whatever way the attempt
        ends, no process of it is left (watch.sweep)."""
        env = launch_environment(self.params, cpus_per_rank=self.cell.execution["cpus_per_rank"],
                                 devices=devices)
        env.update(runner_environment())  # every rank on this host stops if this runner is gone
        token = env[watch.CELL_TOKEN_ENV] = f"{os.getpid()}-{time.time_ns()}"
        self.launch_environment = {k: v for k, v in env.items() if k != watch.CELL_TOKEN_ENV}
        self.verdict, self.launcher_tail = None, collections.deque(maxlen=400)
        # Each in a session of its own, so a launcher's whole tree can be stopped together; its stderr
        # read through here (and passed on to the log), where torchrun says which rank failed and how.
        self._children = [subprocess.Popen(c, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True, errors="replace")
                          for c in commands]
        readers = [threading.Thread(target=self._pass_on, args=(child.stderr,), daemon=True)
                   for child in self._children]
        for reader in readers:
            reader.start()
        self.host_facts.start()  # the provenance the result will need, read while the launchers start
        ranks = watch.RankWatch(self.work_dir, self.cell.timing.stall_s or None)
        try:
            return self._wait(ranks, deadline)
        finally:
            left = watch.sweep(token)
            if left:
                self._say(f"killed {len(left)} process(es) of the cell still running (pids "
                          f"{', '.join(map(str, left))})")
            for reader in readers:
                reader.join(timeout=5)

    def _wait(self, ranks: watch.RankWatch, deadline: float) -> tuple[int | None, bool]:
        first_failure: int | None = None
        failed_at = dead_at = None
        checked = 0.0
        while True:
            codes = [child.poll() for child in self._children]
            for code in codes:
                if code not in (None, 0) and first_failure is None:
                    first_failure, failed_at = code, time.monotonic()
            if all(code is not None for code in codes):
                return (first_failure if first_failure is not None else 0), False
            if time.monotonic() > deadline:
                self._say(f"time limit of {self.timeout_s:.0f} s reached; stopping the run")
                self.stop_children()
                return first_failure if first_failure is not None else self._children[0].returncode, True
            if failed_at is not None and time.monotonic() - failed_at > PEER_EXIT_GRACE_S:
                self._say("a node's launcher failed and the others did not stop; stopping them")
                self.stop_children()
                return first_failure, False
            if time.monotonic() - checked >= 1.0:
                checked = time.monotonic()
                verdict = ranks.check()
                if verdict is not None and verdict.kind != "dead":
                    self.verdict = verdict
                    self._say(f"{verdict.reason}; stopping the cell")
                    self.stop_children(grace_s=0)
                    return first_failure, False
                if verdict is not None and dead_at is None:
                    self.verdict, dead_at = verdict, time.monotonic()
                    self._say(f"{verdict.reason}; waiting {watch.DEAD_GRACE_S:.0f} s for its launcher")
                if dead_at is not None and time.monotonic() - dead_at > watch.DEAD_GRACE_S:
                    self._say("the launcher did not stop the other ranks; stopping them")
                    self.stop_children(grace_s=0)
                    return first_failure, False
            wait_for_an_exit([child.pid for child, code in zip(self._children, codes) if code is None], 0.1)

    def _pass_on(self, stream) -> None:
        """A launcher's stderr, line by line, to this process's (the cell's log), its end kept."""
        for line in stream:
            sys.stderr.write(line)
            self.launcher_tail.append(line)
        sys.stderr.flush()

    def stop_children(self, grace_s: float = TERMINATE_GRACE_S) -> None:
        """SIGTERM to each launcher's process group, SIGKILL after `grace_s` (none: a rank that is
        frozen or stalled will not act on SIGTERM). Ranks a launcher started in sessions of their own
        are swept after (watch.sweep)."""
        for child in self._children:
            if child.poll() is not None:
                continue
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
                try:
                    os.killpg(child.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    child.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue


def run_cell(cell: Cell, output: Path, *, runtime_min: float, retries: int,
             search_probe: bool = False) -> int:
    """CLI entry: 0 when a result was written; 2 when the cell cannot run here (message on stderr)."""
    run = CellRun(cell, output, runtime_min=runtime_min, retries=retries, search_probe=search_probe)

    def stop(why: str, code: int) -> None:
        # Snakemake or SLURM is stopping us, or is gone: stop the ranks and leave no metrics.json behind
        # (a result being written when this comes is finished first: it is complete, so it stands).
        with run.finishing:
            run._say(f"{why}; stopping the run, writing no result")
            run.stop_children()
            shutil.rmtree(run.work_dir, ignore_errors=True)
            os._exit(code)

    signal.signal(signal.SIGTERM,
                  lambda signum, _: stop(f"received {signal.Signals(signum).name}", 128 + signum))
    signal.signal(signal.SIGINT,
                  lambda signum, _: stop(f"received {signal.Signals(signum).name}", 128 + signum))
    driver = driver_pid()
    when_gone(driver, lambda: stop(f"the process that started this cell (pid {driver}) is gone", 1),
              "driver-watch")
    try:
        doc = run.run()
    except CellCannotRun as error:
        print(f"error: {cell.study}/{cell.cell_id}: {error}", file=sys.stderr, flush=True)
        return 2
    run._say(f"wrote {output} (status {doc['status']})")
    return 0
