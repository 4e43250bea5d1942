"""One rank of a cell's training run: the loop, the clock and the outcome, for every framework.

Started by a launcher (plain python, torchrun, the DeepSpeed launcher) with the cell's JSON and a work
directory. Each rank that fails writes `rank<N>.json` there saying how (an OOM at init or at step k,
or an error with its traceback) and exits; the launcher then stops the other ranks, which would
otherwise wait forever in a collective. On success rank 0 gathers every rank's memory figures and
writes `result.json`. The cell runner (cellrun.py) turns these files into metrics.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from trainbench.training import emulation, register_cell_model
from trainbench.training.gpt import hold_attention_kernel
from trainbench.execute.gpus import EnergyCounter
from trainbench.execute.launch import free_port
from trainbench.execute.watch import ProgressWriter, runner_to_watch, when_gone
from trainbench.execute.memory_sampler import MemorySampler
from trainbench.registry.hardware import MIB
from trainbench.execute.metrics import process_peak_rss_mib, tensors_held_bytes
from trainbench.execute.profiling import PROFILE_DIR, MemoryRecorder, StepProfiler
from trainbench.contract.result import write_json_atomic
from trainbench.study.cell_view import CellView, view_of
from trainbench.study.params import CellParams
from trainbench.training.runners import LoopRunner, RunContext, Runner, StepRunner, params_per_module
from trainbench.training.runners.load import runner_class
from trainbench.study.timing import TimingSettings, fixed_step_count, steps_per_window, summarize_windows

# Test hook: TRAINBENCH_FAIL_AT_STEP=k makes every rank raise an ordinary error at step k (0 = init),
# to exercise the failure path (retries, 'failed' with the error) with the real launchers.
FAIL_AT_STEP_ENV = "TRAINBENCH_FAIL_AT_STEP"
# Testing aid: "RANK:STEP", that rank hangs at that step (sleeps, alive and never stopped), as a rank
# stuck in a collective does: what the watch's stall limit is for (watch.py)
HANG_AT_STEP_ENV = "TRAINBENCH_HANG_AT_STEP"
# Testing aid: a memory boundary, "B:k" = any micro batch above B runs out of memory at step k
# (0 = while initialising), through the same real allocation as inject_oom_at_step.
OOM_ABOVE_BATCH_ENV = "TRAINBENCH_OOM_ABOVE_MICRO_BATCH"
# "fast" (the default): a rank that finished leaves without the interpreter's shutdown; "interpreter":
# the usual exit, to measure the difference
WORKER_EXIT_ENV = "TRAINBENCH_WORKER_EXIT"
# fp16 loss scaling settles in warm-up (DeepSpeed's and torch's scales start at 2^16 and halve at each
# overflow, skipping that step): where the worker owns the loop, warm-up goes on until its last
# WARMUP_SETTLED_STEPS steps trained, this many steps more at most, so that the timed steps are steps
# that train. One step that trained is not enough: DeepSpeed's scaler halves only at the second
# overflow in a row (its hysteresis), and early gradients grow, so a scale skips again after a step
# that trained (trainbench/calibration.yaml has the cells that showed it).
EXTRA_WARMUP_MAX = 30
WARMUP_SETTLED_STEPS = 3
OOM_EXIT_CODE = 75  # distinct from Python's 1 so a reader of the launcher's log can tell
IMPOSSIBLE_ALLOCATION = 1 << 60  # 1 EiB: more than any machine has, so the allocator must refuse


def is_oom(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, the CPU allocator's refusal, or Python's MemoryError."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _single_process_environment() -> None:
    """A one-rank run started by plain python still gets a process group: one code path for all."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def rank_view(params: CellParams) -> CellView:
    """The rank's one view of its cell, handed to its runner (a model of the config's own registered
    first, from the definition the cell carries)."""
    register_cell_model(params)
    return view_of(params)


class Worker:
    def __init__(self, cell: dict, work_dir: Path, imported: float | None = None):
        params = CellParams.from_dict(cell["params"])  # as cellrun wrote it (CellParams.as_dict)
        self.view = rank_view(params)
        self.emulated = emulation.rank_of(params) if params.emulate else None
        if self.emulated is not None:
            # one process stands in for one rank of the world: the variables a launcher would set
            os.environ.update(emulation.environment(self.emulated, free_port()))
            os.environ[emulation.EMULATED_ENV] = "1"
        _single_process_environment()
        # When each phase of the run ended, in wall-clock seconds (contract.result.PHASES names them): the
        # cell's cost beyond its timed steps, read from rank 0's.
        self.marks = {"process_start": psutil.Process().create_time(), "imported": imported or time.time()}
        self.params = params
        self.timing = TimingSettings(**cell.get("timing", {}))
        self.label = f"{cell['study']}/{cell['cell_id']}"
        self.work_dir = work_dir
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.phase, self.step = "init", 0
        self.sampler: MemorySampler | None = None
        # the rank that reports: rank 0, or the one rank an emulated world has
        self.reporting = self.rank == 0 or self.emulated is not None
        self.device_limit: emulation.DeviceLimit | None = None
        self.filled_collectives: list[str] = []
        self.breakdown: dict | None = None  # where a profiled step's time went (profiling.py)
        self.runner: Runner | None = None
        self.memory: MemoryRecorder | None = None  # a GPU rank's allocator snapshots (profiling.py)
        # what the cell runner watches (watch.py): this rank's pid, step and phase, once a second
        rank = self.emulated.rank if self.emulated is not None else self.rank
        self.progress = ProgressWriter(work_dir, rank)
        self.beat("start", force=True)

    def beat(self, phase: str | None = None, force: bool = False) -> None:
        # the first steps each, then once a second: what a stalled rank was doing is exact early on
        self.progress.beat(self.step, phase or self.phase, force=force or self.step <= 10)

    def _device(self) -> torch.device:
        if self.params.device == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def _inject_faults(self, device: torch.device) -> None:
        boundary = os.environ.get(OOM_ABOVE_BATCH_ENV)
        if boundary:
            batch, _, step = boundary.partition(":")
            if self.params.micro_batch > int(batch) and self.step == int(step or 1):
                torch.empty(IMPOSSIBLE_ALLOCATION, dtype=torch.uint8, device=device)
        if self.params.inject_oom_at_step == self.step:
            torch.empty(IMPOSSIBLE_ALLOCATION, dtype=torch.uint8, device=device)
        if os.environ.get(FAIL_AT_STEP_ENV) == str(self.step):
            raise RuntimeError(f"injected failure at step {self.step} ({FAIL_AT_STEP_ENV})")
        if os.environ.get(HANG_AT_STEP_ENV) == f"{self.rank}:{self.step}":
            while True:
                time.sleep(60)

    def _say(self, text: str) -> None:
        if self.reporting:
            print(f"[{self.label}] {text}", flush=True)

    def _prepare_framework(self) -> type[Runner]:
        """The cell's runner class, after what its framework does once per process (compiling or
        loading its ops) before anything else, so that the cost report tells that work apart from the
        cell's set-up (the `builds` phase)."""
        runner = runner_class(self.view)
        runner.prepare_process(self.params)
        self.marks["ops_loaded"] = time.time()
        return runner

    def run(self) -> None:
        torch.manual_seed(self.params.seed)
        if self.params.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        runner_type = self._prepare_framework()
        device = self._device()
        if self.params.gpu_mem_limit_gib is not None:
            self.device_limit = emulation.device_limit(self.params.gpu_mem_limit_gib,
                                                       emulation.device_total_mib(device), self.params)
            emulation.hold_to(self.device_limit, device)
        if device.type == "cuda":
            self.memory = MemoryRecorder(self.work_dir / PROFILE_DIR, self.rank,
                                         history=bool(self.timing.memory_snapshot),
                                         tensors=lambda: self.runner.memory_tensors() if self.runner else {})
        hold_attention_kernel(self.params.attention)
        if self.emulated is not None:
            self.filled_collectives = emulation.init_process_group(self.emulated)
        else:
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        if self.local_rank == 0:  # one sampler per node sees all of the node's GPUs
            self.sampler = MemorySampler(use_gpus=device.type == "cuda").start()
        self.marks["group_ready"] = time.time()
        self.beat("build", force=True)
        context = RunContext(self.params, self.rank, self.world_size, self.local_rank, device, self.work_dir,
                             self.timing, self.view)

        on = (f"as {self.emulated.describe()} (emulated)" if self.emulated is not None
              else f"on {self.world_size} rank(s)")
        self._say(f"building {self.params.model} with {self.params.framework} "
                  f"{self.params.strategy} {on} ({device.type})")
        self._inject_faults(device)
        runner = self.runner = runner_type(context)
        runner.setup()
        self.marks["built"] = time.time()

        self.phase = "step"
        self.beat(force=True)
        # a framework that owns its loop calls the recorder around each step, for a fixed number of them
        steps = StepRecorder(self, context.synchronize, device, adaptive=isinstance(runner, StepRunner))
        if isinstance(runner, LoopRunner):
            runner.train(steps)
        else:
            while not steps.done:
                steps.begin()
                steps.end(runner.train_step())
        self._finish(runner, device, steps)

    def _rank_figures(self, device: torch.device, runner: Runner, steps: StepRecorder) -> dict:
        figures = {"rank": self.rank, "local_rank": self.local_rank, "host": socket.gethostname(),
                   "host_rss_peak_mib": process_peak_rss_mib(),
                   # what a CPU rank keeps between steps (it has no allocator statistics; the census of
                   # live tensors, 47 ms once on a 2-core box with DeepSpeed and transformers imported,
                   # is left out of GPU cells' teardown) and the parameters it holds: compared rank for
                   # rank between emulated and real worlds
                   "tensors_held_bytes": (tensors_held_bytes(emulation.VISIBLE_ONLY_HERE)
                                          if device.type == "cpu" else None),
                   "params_per_module": params_per_module(runner),
                   "torch_peak_allocated_mib": None, "torch_peak_reserved_mib": None, "node_memory": None,
                   "breakdown": self.breakdown,
                   "gpu_energy_j": None, "gpu_energy_timed_s": None,
                   "memory_snapshot": (self.memory.keep("end") if self.memory and self.timing.memory_snapshot
                                       else None)}
        if device.type == "cuda":
            figures["torch_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
            figures["torch_peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
        if steps.energy is not None and steps.energy.energy_j is not None:
            # the timed windows' energy and time (the windows' steps times their mean step time)
            figures["gpu_energy_j"] = steps.energy.energy_j
            figures["gpu_energy_timed_s"] = steps.timed_s
        if self.sampler is not None:
            figures["node_memory"] = vars(self.sampler.stop())
        return figures

    def _finish(self, runner: Runner, device, steps: StepRecorder) -> None:
        collected = steps.end_gc()
        figures = self._rank_figures(device, runner, steps)
        per_module = figures["params_per_module"]
        if self.emulated is not None:
            gathered = [figures]  # a fake all-gather would hand back this rank's figures N times
        else:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, figures)
        if self.reporting:
            result = {
                "phase_marks": self.marks,
                "losses": steps.losses, "step_times_s": steps.window_step_times, "ranks": gathered,
                "steps_per_window": steps.steps_per_window, "warmup_step_times_s": steps.warmup_times,
                "timing_stopped": steps.stopped, "gc": collected,
                "params_total": runner.params_total(), "params_per_module_rank0": per_module,
                "optimizer_steps_skipped": _difference(runner.optimizer_steps_skipped(),
                                                       steps.skipped_at_warmup),
                "torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
                **runner.results(),
                **self._measured_as(),
            }
            config = runner.framework_config()
            if config is not None:  # kept beside metrics.json: the framework's own config as this run used it
                result["framework_config"] = {"file": runner.CONFIG_FILE, "config": config}
            write_json_atomic(self.work_dir / "result.json", result)
        written = time.time()
        self.beat("done", force=True)
        dist.barrier()
        dist.destroy_process_group()
        self._say("teardown: results gathered and written in "
                  f"{written - self.marks.get('timed', written):.2f} s, "
                  f"process group closed in {time.time() - written:.2f} s")

    def _measured_as(self) -> dict:
        """How the rank was measured, where not as one rank of a real world on its own GPU: the
        emulated rank and the collectives trainbench wrote (emulation.py), the GPU it was held to."""
        out = {}
        if self.emulated is not None:
            out["emulated"] = {"rank": self.emulated.rank, "world_size": self.emulated.world_size,
                               "ranks_per_node": self.emulated.ranks_per_node,
                               "outputs_written_by_trainbench": self.filled_collectives}
        if self.device_limit is not None:
            out["device_limit"] = self.device_limit.as_dict()
        return out

    def record_failure(self, error: BaseException) -> None:
        oom = is_oom(error)
        record = {"rank": self.rank, "event": "oom" if oom else "error", "phase": self.phase,
                  "step": self.step if self.phase == "step" else None,
                  "message": f"{type(error).__name__}: {error}"[:2000], "traceback": traceback.format_exc(),
                  "host_rss_peak_mib": process_peak_rss_mib(), "torch_peak_allocated_mib": None,
                  "node_memory": vars(self.sampler.stop()) if self.sampler else None}
        if self.params.device == "cuda" and torch.cuda.is_initialized():
            record["torch_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / MIB
        if self.memory is not None and "oom" in self.memory.summaries:
            record["memory_snapshot"] = self.memory.summaries["oom"]
        record.update(self._measured_as())
        write_json_atomic(self.work_dir / f"rank{self.rank}.json", record)


def _difference(now: int | None, before: int | None) -> int | None:
    return None if now is None or before is None else now - before


def agree_through_store(value: int, rank: int, key: str) -> int:
    """Rank 0's `value` on every rank, through the process group's key-value store (the rendezvous's),
    not a collective: a broadcast on the default group makes NCCL build a communicator for it, 288 MiB
    a GPU on 4 x H200, where a framework trains on groups of its own (DeepSpeed's ZeRO stages 0-2 and
    its pipeline engine), and that memory was counted as the cell's. Each `key` once per run."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set(key, str(value))
        return value
    return int(store.get(key))


class StepRecorder:
    """Runs the cell's steps through warm-up and timed windows, keeps the losses, reports progress,
    and injects test faults at the step they name (timing.py says how and why). Used by the
    worker's own loop and, from a callback, by frameworks that run their own loop (Lightning, the
    Hugging Face Trainer).

    Warm-up steps are synchronised one by one (untimed; the last ones size the windows). A timed
    window synchronises the device at its two ends only, and its losses stay on the device until
    its end. Where the worker owns the loop, windows continue until the step time's interval is
    tight or the time cap is reached (rank 0 decides, every rank follows); a framework that owns
    its loop must be told its step count up front, so it runs `min_windows` windows.
    """

    def __init__(self, worker: Worker, synchronize, device: torch.device, *, adaptive: bool):
        self.worker, self.device = worker, device
        self.settings = worker.timing
        self.adaptive = adaptive
        self._agreements = 0  # keys of agree_through_store
        self.warmup = worker.params.warmup_steps
        self.extra_warmup = 0  # steps warm-up went on while fp16 loss scaling still skipped
        self.last_skipped_step = 0  # the last warm-up step the optimizer skipped (0: none)
        # the optimizer's skipped steps by the last warm-up step (fp16 loss scaling settles in warm-up):
        # those after are the timed steps' (the sanity check, contract.result.sanity_problems)
        self.skipped_at_warmup = 0
        self.timed_steps = worker.params.timed_steps
        self.steps_per_window = steps_per_window(self.timed_steps, self.settings.min_windows, None,
                                                 self.settings.min_window_s)
        self.losses: list[float] = []
        self.warmup_times: list[float] = []
        self.window_step_times: list[float] = []  # each window's mean step time
        self.stopped = ""
        self.done = False
        self._synchronize = synchronize
        self._pending: list = []  # this window's losses, still on the device
        self._started = 0.0
        self._timed_s = 0.0
        self._last_report = time.monotonic()
        self.profiler: StepProfiler | None = None  # over the steps after the timed ones, where asked
        # the rank's GPU's energy over the timed windows (None on CPU ranks, or without NVML's counter)
        self.energy = EnergyCounter.for_device(device.type, device.index)
        # params.gc_every: Python's automatic collection off, a generation-1 collection every N steps
        self.gc_every = worker.params.gc_every
        self.gc_collections: list[float] = []  # seconds each of those collections took

    @property
    def total(self) -> int:
        """The step count of a loop that must know it up front (Lightning, the Trainer)."""
        return fixed_step_count(self.warmup, self.timed_steps, self.settings)

    @property
    def timed_s(self) -> float:
        """Seconds spent in the timed windows so far."""
        return self._timed_s

    def _in_warmup(self) -> bool:
        return self.worker.step <= self.warmup

    def _timed_index(self) -> int:
        return self.worker.step - self.warmup  # 1 for the first timed step

    def begin(self) -> None:
        self.worker.step += 1
        self.worker._inject_faults(self.device)
        self.worker.beat()  # the step begun (a rank made to hang at it never says so)
        if self._in_warmup() or (self._timed_index() - 1) % self.steps_per_window == 0:
            self._synchronize()
            if self.energy is not None and not self._in_warmup():
                self.energy.window_started()  # before the clock starts: the read is not the window's
            self._started = time.perf_counter()
        if self.gc_every:
            self._collect_garbage()

    def _collect_garbage(self) -> None:
        """torchtitan's GC: automatic collection off from the first step, so that it does not pause a
        step wherever Python's thresholds fall; a young-generation collection every `gc_every` steps,
        inside the step it begins (a timed step pays for it)."""
        if self.worker.step == 1:
            gc.disable()
            gc.collect(1)
        elif self.worker.step % self.gc_every == 0:
            started = time.perf_counter()
            gc.collect(1)
            self.gc_collections.append(time.perf_counter() - started)

    def end_gc(self) -> dict | None:
        """Python's automatic collection back on (every rank), and what the cell's collections did
        (timing's `gc`); None where Python collected by itself."""
        if not self.gc_every:
            return None
        gc.enable()
        return {"every": self.gc_every, "collections": len(self.gc_collections),
                "collected_s": round(sum(self.gc_collections), 6)}

    def end(self, loss) -> None:
        """`loss`: the step's mean loss, a tensor on the device (read at the window's end) or a float."""
        if self.profiler is not None:  # a profiled step: after the timed ones, its loss not kept
            if self.profiler.step():
                self.worker.breakdown = self.profiler.result
                self.worker.marks["profiled"] = time.time()
                self.done = True
            return
        self._pending.append(loss)
        if self._in_warmup():
            self._synchronize()
            self.warmup_times.append(time.perf_counter() - self._started)
            if self.worker.step == 1:  # compilation and every other first-call cost end here
                self.worker.marks["first_step"] = time.time()
            skipped = self._skipped_this_step()
            if skipped:
                self.last_skipped_step = self.worker.step
            if self.worker.step == self.warmup and self._warm_up_more(skipped):
                self.warmup += 1
                self.extra_warmup += 1
            if self.worker.step == self.warmup:
                self.worker.marks["warmed_up"] = time.time()
            self._read_losses()
            if self.worker.step == self.warmup and self.adaptive:
                self.steps_per_window = self._agree(steps_per_window(
                    self.timed_steps, self.settings.min_windows, self.warmup_times[-1],
                    self.settings.min_window_s))
            self._report(f"step {self.worker.step}/{self.warmup} (warm-up) loss {self.losses[-1]:.4f} "
                         f"time {self.warmup_times[-1] * 1e3:.1f} ms", force=self.worker.step == self.warmup)
            return
        if self._timed_index() % self.steps_per_window:
            return  # inside a window: nothing touches the device
        self._synchronize()
        elapsed = time.perf_counter() - self._started
        if self.energy is not None:
            self.energy.window_ended()
        self.window_step_times.append(elapsed / self.steps_per_window)
        self._timed_s += elapsed
        self._read_losses()
        self.done = self._decide()
        if self.done and self.settings.profile_steps:
            self._start_profiling()
        windows = len(self.window_step_times)
        self._report(f"window {windows} ({self.steps_per_window} steps): "
                     f"{self.window_step_times[-1] * 1e3:.2f} ms/step, "
                     f"loss {self.losses[-1]:.4f}" + (f"; done: {self.stopped}" if self.done else ""),
                     force=self.done or windows <= self.settings.min_windows)

    def _skipped_this_step(self) -> bool | None:
        """Whether the optimizer skipped the (warm-up) step just ended, fp16 loss scaling having found an
        overflow; None where the framework does not count its skipped steps."""
        skipped = self.worker.runner.optimizer_steps_skipped()
        if skipped is None:
            return None
        before, self.skipped_at_warmup = self.skipped_at_warmup, skipped
        return skipped > before

    def _warm_up_more(self, skipped: bool | None) -> bool:
        """Whether warm-up goes on for a step: one of its last WARMUP_SETTLED_STEPS steps was skipped
        (rank 0's answer; ranks skip together, the overflow found on gradients they all-reduced). Only
        where the worker owns the loop: a framework's own loop was told its step count."""
        if not self.adaptive or skipped is None or self.extra_warmup >= EXTRA_WARMUP_MAX:
            return False
        unsettled = self.last_skipped_step > 0 and (
            self.worker.step - self.last_skipped_step < WARMUP_SETTLED_STEPS)
        return bool(self._agree(int(unsettled)))

    def _start_profiling(self) -> None:
        """Profile the steps after the timed ones (profiling.py): the loop goes on until they are done."""
        self.profiler = StepProfiler(self.settings.profile_steps, self.worker.work_dir / PROFILE_DIR,
                                     self.worker.rank, cuda=self.device.type == "cuda")
        self.profiler.start()
        self.done = False
        self._report(f"profiling {self.settings.profile_steps} step(s) after the timed ones", force=True)

    def _read_losses(self) -> None:
        values = [v for v in self._pending]
        tensors = [v.detach().float().reshape(()) for v in values if isinstance(v, torch.Tensor)]
        read = iter(torch.stack(tensors).tolist()) if tensors else iter(())
        self.losses += [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]
        self._pending = []

    def _decide(self) -> bool:
        """Whether timing is done; rank 0's answer, which every rank follows."""
        windows = len(self.window_step_times)
        if windows < self.settings.min_windows:
            return False
        summary = summarize_windows(self.window_step_times)
        if not self.adaptive:
            stop, why = True, f"{windows} windows (the framework's loop has a fixed length)"
        elif summary.tight(self.settings.target_ci):
            stop, why = True, f"interval within ±{summary.half_width:.2%} after {windows} windows"
        elif self._timed_s >= self.settings.max_timed_s:
            stop, why = True, f"time cap of {self.settings.max_timed_s:g} s reached after {windows} windows"
        else:
            stop, why = False, ""
        if self.adaptive:
            stop = bool(self._agree(int(stop)))
            why = why or "rank 0's interval"
        if stop:
            self.stopped = why
            self.worker.marks["timed"] = time.time()
        return stop

    def _agree(self, value: int) -> int:
        """Rank 0's value on every rank: window sizes and stopping must match, or a collective of one
        rank would wait for one the others never start. (Outside the timed windows.) An emulated rank
        is its world's rank 0's twin: its own value is rank 0's."""
        if self.worker.world_size == 1 or self.worker.emulated is not None:
            return value
        self._agreements += 1
        return agree_through_store(value, self.worker.rank, f"trainbench/agree/{self._agreements}")

    def _report(self, text: str, force: bool = False) -> None:
        # every window while there are few; then one line at least every 30 s
        if force or time.monotonic() - self._last_report > 30:
            self._last_report = time.monotonic()
            self.worker._say(text)


def main(argv: list[str] | None = None) -> int:
    imported = time.time()  # this module's imports (torch's among them) are done
    parser = argparse.ArgumentParser(prog="python -m trainbench.execute.worker", description=__doc__)
    parser.add_argument("--cell", required=True, type=Path, help="the cell's JSON (study, cell_id, params)")
    parser.add_argument("--work-dir", required=True, type=Path)
    args, _ = parser.parse_known_args(argv)  # the DeepSpeed launcher adds --local_rank; LOCAL_RANK has it
    runner = runner_to_watch()
    if runner is not None:  # the cell runner gone (even by SIGKILL): this rank has no one to report to
        when_gone(runner, lambda: (print(f"rank {os.environ.get('RANK', 0)}: the cell runner "
                                         f"(pid {runner}) is gone; stopping", file=sys.stderr, flush=True),
                                   os._exit(1)), "runner-watch")
    with open(args.cell) as f:
        cell = json.load(f)
    worker = Worker(cell, args.work_dir, imported)
    try:
        worker.run()
        if os.environ.get(WORKER_EXIT_ENV, "fast") == "fast":
            # Everything the run produced is written and its process group closed: skip the
            # interpreter's shutdown, whose exit handlers (torch.compile's worker pool, the CUDA
            # context's teardown) cost a GPU cell seconds of its teardown phase (docs/measurement.md, "What a
            # study costs"). WORKER_EXIT_ENV=interpreter keeps them, to measure what this saves.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    except BaseException as error:  # noqa: BLE001 - every failure is recorded before the rank exits
        worker.record_failure(error)
        worker.beat("failed", force=True)
        if is_oom(error):
            print(f"rank {worker.rank}: out of memory during {worker.phase}"
                  f"{f' at step {worker.step}' if worker.phase == 'step' else ''}: {error}", file=sys.stderr,
                  flush=True)
            # Skip interpreter shutdown: collectives with peers that did not fail could block it.
            os._exit(OOM_EXIT_CODE)
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
