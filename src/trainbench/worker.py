"""One rank of a cell's training run: the loop, the clock and the outcome, for every framework.

Started by a launcher (plain python, torchrun, the DeepSpeed launcher) with the cell's JSON and a work
directory. Each rank that fails writes `rank<N>.json` there saying how (an OOM at init or at step k,
or an error with its traceback) and exits; the launcher then stops the other ranks, which would
otherwise wait forever in a collective. On success rank 0 gathers every rank's memory figures and
writes `result.json`. The cell runner (cellrun.py) turns these files into metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from trainbench.launch import free_port
from trainbench.metrics import MIB, MemorySampler, StepClock, process_peak_rss_mib
from trainbench.results import write_json_atomic
from trainbench.runners import RunContext, make_runner, params_per_module

# Test hook: TRAINBENCH_FAIL_AT_STEP=k makes every rank raise an ordinary error at step k (0 = init),
# to exercise the failure path (retries, 'failed' with the error) with the real launchers.
FAIL_AT_STEP_ENV = "TRAINBENCH_FAIL_AT_STEP"
# Testing aid: a memory boundary, "B:k" = any micro batch above B runs out of memory at step k
# (0 = while initialising), through the same real allocation as inject_oom_at_step.
OOM_ABOVE_BATCH_ENV = "TRAINBENCH_OOM_ABOVE_MICRO_BATCH"
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


class Worker:
    def __init__(self, cell: dict, work_dir: Path):
        _single_process_environment()
        self.params = cell["params"]
        self.label = f"{cell['study']}/{cell['cell_id']}"
        self.work_dir = work_dir
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.phase, self.step = "init", 0
        self.sampler: MemorySampler | None = None

    def _device(self) -> torch.device:
        if self.params["device"] == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def _inject_faults(self, device: torch.device) -> None:
        boundary = os.environ.get(OOM_ABOVE_BATCH_ENV)
        if boundary:
            batch, _, step = boundary.partition(":")
            if self.params["micro_batch"] > int(batch) and self.step == int(step or 1):
                torch.empty(IMPOSSIBLE_ALLOCATION, dtype=torch.uint8, device=device)
        if self.params["inject_oom_at_step"] == self.step:
            torch.empty(IMPOSSIBLE_ALLOCATION, dtype=torch.uint8, device=device)
        if os.environ.get(FAIL_AT_STEP_ENV) == str(self.step):
            raise RuntimeError(f"injected failure at step {self.step} ({FAIL_AT_STEP_ENV})")

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(f"[{self.label}] {text}", flush=True)

    def run(self) -> None:
        torch.manual_seed(self.params["seed"])
        if self.params["tf32"]:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        device = self._device()
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        if self.local_rank == 0:  # one sampler per node sees all of the node's GPUs
            self.sampler = MemorySampler(use_gpus=device.type == "cuda").start()
        context = RunContext(self.params, self.rank, self.world_size, self.local_rank, device, self.work_dir)

        self._say(f"building {self.params['model']} with {self.params['framework']} {self.params['strategy']} "
                  f"on {self.world_size} rank(s) ({device.type})")
        self._inject_faults(device)
        runner = make_runner(context)
        runner.setup()

        self.phase = "step"
        steps = StepRecorder(self, context.synchronize, device)
        if hasattr(runner, "train"):  # a framework that owns its loop calls the recorder around steps
            runner.train(steps)
        else:
            for _ in range(steps.total):
                steps.begin()
                steps.end(runner.train_step().item())
        extra = runner.evaluate() if hasattr(runner, "evaluate") else {}
        self._finish(runner, device, steps.losses, steps.step_times, extra)

    def _rank_figures(self, device: torch.device) -> dict:
        figures = {"rank": self.rank, "local_rank": self.local_rank, "host": socket.gethostname(),
                   "host_rss_peak_mib": process_peak_rss_mib(),
                   "torch_peak_allocated_mib": None, "torch_peak_reserved_mib": None, "node_memory": None}
        if device.type == "cuda":
            figures["torch_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
            figures["torch_peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
        if self.sampler is not None:
            figures["node_memory"] = vars(self.sampler.stop())
        return figures

    def _finish(self, runner, device, losses, step_times, extra: dict) -> None:
        figures = self._rank_figures(device)
        per_module = params_per_module(runner)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, figures)
        if self.rank == 0:
            result = {
                "losses": losses, "step_times_s": step_times, "ranks": gathered,
                "params_total": runner.params_total(), "params_per_module_rank0": per_module,
                "torch_version": torch.__version__, "torch_cuda": torch.version.cuda, **extra,
            }
            config = getattr(runner, "config", None)
            if config is not None:  # DeepSpeed: keep the exact JSON config this run used
                result["deepspeed_config"] = config
            write_json_atomic(self.work_dir / "result.json", result)
        dist.barrier()
        dist.destroy_process_group()

    def record_failure(self, error: BaseException) -> None:
        oom = is_oom(error)
        record = {"rank": self.rank, "event": "oom" if oom else "error", "phase": self.phase,
                  "step": self.step if self.phase == "step" else None,
                  "message": f"{type(error).__name__}: {error}"[:2000], "traceback": traceback.format_exc(),
                  "host_rss_peak_mib": process_peak_rss_mib(), "torch_peak_allocated_mib": None,
                  "node_memory": vars(self.sampler.stop()) if self.sampler else None}
        if self.params["device"] == "cuda" and torch.cuda.is_initialized():
            record["torch_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / MIB
        write_json_atomic(self.work_dir / f"rank{self.rank}.json", record)


class StepRecorder:
    """Times optimizer steps (device synchronised at both ends), records losses, reports progress,
    and injects test faults at the step they name. Used by the worker's own loop and, from a
    callback, by frameworks that run their own loop (Lightning)."""

    def __init__(self, worker: Worker, synchronize, device: torch.device):
        self.worker, self.device = worker, device
        self.warmup = worker.params["warmup_steps"]
        self.total = self.warmup + worker.params["timed_steps"]
        self.losses: list[float] = []
        self.step_times: list[float] = []
        self._clock = StepClock(synchronize)
        self._report_every = max(1, self.total // 20)
        self._last_report = time.monotonic()

    def begin(self) -> None:
        self.worker.step += 1
        self.worker._inject_faults(self.device)
        self._clock.start()

    def end(self, loss: float) -> None:
        elapsed = self._clock.stop()
        step = self.worker.step
        self.losses.append(loss)
        if step > self.warmup:
            self.step_times.append(elapsed)
        # about 20 progress lines a run, and one at least every 30 s of a long one
        if step % self._report_every == 0 or step in (1, self.total) or time.monotonic() - self._last_report > 30:
            self._last_report = time.monotonic()
            kind = "warm-up" if step <= self.warmup else "timed"
            self.worker._say(f"step {step}/{self.total} ({kind}) loss {loss:.4f} time {elapsed * 1e3:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainbench.worker", description=__doc__)
    parser.add_argument("--cell", required=True, type=Path, help="the cell's JSON (study, cell_id, params)")
    parser.add_argument("--work-dir", required=True, type=Path)
    args, _ = parser.parse_known_args(argv)  # the DeepSpeed launcher adds --local_rank; LOCAL_RANK has it
    with open(args.cell) as f:
        cell = json.load(f)
    worker = Worker(cell, args.work_dir)
    try:
        worker.run()
    except BaseException as error:  # noqa: BLE001 - every failure is recorded before the rank exits
        worker.record_failure(error)
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
