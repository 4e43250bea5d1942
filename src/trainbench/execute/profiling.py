"""Where a cell's step time goes: torch.profiler over a few steps after the timed ones, on every rank,
and each rank's step split into parts that add up to it, read from its trace.

Asked for by the timing setting `profile_steps` (study/timing.py; `trainbench profile STUDY CELL` for
one cell). The profiled steps run after the timed windows have ended, so a cell's figures are those
of unprofiled steps; one more step before them warms the profiler up (its first step records its own
start-up). Each rank keeps its trace, `profile/rank<r>.json.gz` beside the cell's metrics.json: a
Chrome trace that Perfetto (ui.perfetto.dev) and chrome://tracing open.

`breakdown` sweeps a rank's timeline over the profiled steps, from the first step's start to the last
one's end (the device synchronised there), and gives each instant to the first of these parts that is
active, so the parts add up to the step:

  matmul, attention, other_kernels, optimizer_kernels
                          compute: the device's kernels (a CPU rank's ops, each op's own time
                          outside the ops it calls), by name; the optimizer's are those named like
                          it (multi-tensor Adam) and those the host launched inside an optimizer step
                          (torch's `Optimizer.step#...`, the runners' OPTIMIZER_RANGE), except in a
                          step that runs forward and backward in its closure (Lightning's)
  exposed_communication   a collective runs and no compute does: what overlap failed to hide
  exposed_copies          a host-device copy runs and neither compute nor a collective does
  optimizer_host          the host is inside an optimizer step and the device has nothing to do:
                          an offloaded optimizer's CPU Adam, or a CPU rank's optimizer outside aten ops
  idle                    none of these: the device waits for the host (launches, Python, syncs)

Beside the parts: all collective and copy time, hidden or not, and the share of collective time that
compute hid (torchtitan's overlap analysis, pytorch/torchtitan RFC #2408, measures the same). A CPU
rank's timeline is its main thread (the one that ran the steps); its collectives run on gloo's threads.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from trainbench.contract.result import PARTS
from trainbench.training import OPTIMIZER_RANGE

PROFILE_DIR = "profile"  # beside metrics.json: every rank's trace, and the memory snapshots

# The parts of a step (PARTS, and what each means) are the result contract's: metrics.breakdown's keys.

# GPU kernels by name, first match wins (validation/scripts/mfu.py's profiles use the same list).
KERNEL_CLASSES = [
    ("attention", re.compile(r"flash|fmha|sdpa|attention|attn", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|wgmma|sm90_|sm80_", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
    ("loss", re.compile(r"log_softmax|nll_loss|cross_entropy|softmax", re.I)),
    ("embedding", re.compile(r"embedding|index_put|scatter|indexing_backward", re.I)),
    ("fused (compiler)", re.compile(r"^triton_", re.I)),
    ("copies and fills", re.compile(r"memcpy|memset|copy|fill", re.I)),
]
COLLECTIVE = re.compile(r"nccl|^gloo:", re.I)
# a CPU rank's compute, by aten op
CPU_MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|_addmm_activation|linear)$")
CPU_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention")
CPU_OPTIMIZER = re.compile(r"_foreach_|adam|addcdiv_|addcmul_|lerp_")
BACKWARD = "autograd::engine::evaluate_function"


def classify(kernel: str) -> str:
    """A GPU kernel's class by its name (KERNEL_CLASSES), "other" where none matches."""
    return next((name for name, pattern in KERNEL_CLASSES if pattern.search(kernel)), "other")


def _span(event: dict) -> tuple[float, float]:
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def _sweep(intervals: list[tuple[float, float, int]], start: float, end: float, classes: int) -> list[float]:
    """Time in [start, end] per class, each instant to the lowest-numbered class active then; the
    last entry is the time no class was active."""
    points = []
    for s, e, c in intervals:
        s, e = max(s, start), min(e, end)
        if e > s:
            points += [(s, 1, c), (e, -1, c)]
    points.sort()
    active, out, now = [0] * classes, [0.0] * (classes + 1), start
    for at, change, c in points:
        if at > now:
            out[next((i for i in range(classes) if active[i]), classes)] += at - now
            now = at
        active[c] += change
    out[classes] += max(0.0, end - now)
    return out


def union_length(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """How long at least one of `intervals` is active within [start, end] (the GPU busy at all)."""
    return _sweep([(s, e, 0) for s, e in intervals], start, end, 1)[0]


def _inside(ranges: list[tuple[float, float]], at: float) -> bool:
    return any(s <= at <= e for s, e in ranges)


def self_spans(events: list[dict]) -> list[tuple[dict, float, float]]:
    """The time each event of one thread spends outside the events nested in it (a CPU rank's op by
    op: a matrix multiply's own time, not its argument checks')."""
    ordered = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
    children: dict[int, list[tuple[float, float]]] = {}
    stack: list[int] = []
    for index, event in enumerate(ordered):
        start, end = _span(event)
        while stack and _span(ordered[stack[-1]])[1] <= start:
            stack.pop()
        if stack and end <= _span(ordered[stack[-1]])[1]:
            children.setdefault(stack[-1], []).append((start, end))
        stack.append(index)
    out = []
    for index, event in enumerate(ordered):
        now, end = _span(event)
        for child_start, child_end in sorted(children.get(index, [])):
            if child_start > now:
                out.append((event, now, child_start))
            now = max(now, child_end)
        if end > now:
            out.append((event, now, end))
    return out


def profiled_steps(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The host's ranges of the profiled steps among a trace's complete events (a GPU trace repeats
    them on the device's timeline, as gpu_user_annotation: counted once)."""
    steps = [e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        raise ValueError("the trace has no ProfilerStep# ranges: not a torch.profiler trace of steps")
    return steps


def breakdown(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A rank's profiled steps split into PARTS (seconds per step), from its Chrome trace's events."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = profiled_steps(spans)
    start = min(_span(e)[0] for e in steps)
    end = max(_span(e)[1] for e in steps)
    main = steps[0].get("tid")
    stepping = [_span(e) for e in spans if e.get("tid") == main and e.get("cat") == "user_annotation"
                and (str(e["name"]).startswith("Optimizer.step#") or e["name"] == OPTIMIZER_RANGE)]
    # Lightning steps its optimizer with a closure that runs forward and backward inside the step: a
    # range with backward work in it is not the optimizer's alone (only its kernels by name are)
    backward = [_span(e)[0] for e in spans if str(e.get("name", "")).startswith(BACKWARD)]
    optimizer = [r for r in stepping if not any(r[0] <= at <= r[1] for at in backward)]
    device = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    collectives = [_span(e) for e in spans if COLLECTIVE.search(str(e.get("name", "")))
                   and (e.get("cat") == "kernel" or not device)]
    index = {part: i for i, part in enumerate(PARTS)}
    intervals: list[tuple[float, float, int]] = []
    if device:
        # a kernel is the optimizer's when its launch (same correlation id) was inside an optimizer step
        launched_by_optimizer = {e["args"]["correlation"] for e in spans
                                 if e.get("cat") in ("cuda_runtime", "cuda_driver")
                                 and e.get("tid") == main and "correlation" in e.get("args", {})
                                 and _inside(optimizer, float(e["ts"]))}
        copies = []
        for e in device:
            if e.get("cat") != "kernel":
                copies.append(_span(e))
                continue
            name = str(e.get("name", ""))
            if COLLECTIVE.search(name):
                continue
            kind = classify(name)
            if kind == "optimizer" or e.get("args", {}).get("correlation") in launched_by_optimizer:
                part = "optimizer_kernels"
            else:
                part = {"matmul": "matmul", "attention": "attention"}.get(kind, "other_kernels")
            intervals.append((*_span(e), index[part]))
        timeline = "cuda"
    else:
        ops = [e for e in spans if e.get("tid") == main and e.get("cat") == "cpu_op"]
        copies = []
        for e, begins, ends in self_spans(ops):
            name = str(e["name"])
            if COLLECTIVE.search(name) or name.startswith("c10d::") or name == "record_param_comms":
                continue  # a collective's launch, or a wait for one: its work is gloo's
            if _inside(optimizer, float(e["ts"])) or (_inside(stepping, float(e["ts"]))
                                                      and CPU_OPTIMIZER.search(name)):
                part = "optimizer_kernels"
            elif CPU_ATTENTION.search(name):
                part = "attention"
            elif CPU_MATMUL.search(name):
                part = "matmul"
            else:
                part = "other_kernels"
            intervals.append((begins, ends, index[part]))
        timeline = "cpu"
    intervals += [(s, e, index["exposed_communication"]) for s, e in collectives]
    intervals += [(s, e, index["exposed_copies"]) for s, e in copies]
    intervals += [(s, e, index["optimizer_host"]) for s, e in optimizer]
    seconds = _sweep(intervals, start, end, len(PARTS) - 1)
    count = len(steps)
    per_step = {part: round(us / count / 1e6, 7) for part, us in zip(PARTS, seconds)}
    communication = union_length(collectives, start, end)
    return {
        "timeline": timeline, "steps": count, "step_s": round((end - start) / count / 1e6, 7),
        "parts_s": per_step,
        "communication_s": round(communication / count / 1e6, 7),
        "communication_hidden": (round(1 - seconds[index["exposed_communication"]] / communication, 4)
                                 if communication else None),
        "copies_s": round(union_length(copies, start, end) / count / 1e6, 7),
    }


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def trace_name(rank: int) -> str:
    return f"rank{rank}.json.gz"


class StepProfiler:
    """torch.profiler over `steps` steps, after one that warms it up; `step()` after every step. When
    the last one is done, the trace is written and `result` holds its breakdown."""

    def __init__(self, steps: int, directory: Path, rank: int, cuda: bool):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.steps, self.path = steps, directory / trace_name(rank)
        self.result: dict[str, Any] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        # the last step's kernels inside its range
        self.synchronize = torch.cuda.synchronize if cuda else (lambda: None)
        self.profiler = profile(activities=activities,
                                schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(str(self.path)))
        self.left = steps + 1

    def start(self) -> None:
        self.profiler.start()

    def step(self) -> bool:
        """After a step; True once the last profiled step is done and its breakdown read."""
        self.left -= 1
        if self.left == 0:
            self.synchronize()
        self.profiler.step()
        if self.left:
            return False
        self.profiler.stop()
        self.result = {**breakdown(read_trace(self.path)), "trace": f"{PROFILE_DIR}/{self.path.name}"}
        return True


# --- memory: the GPU allocator's snapshots -------------------------------------------------------------

# what a snapshot's blocks hold, matched by address against the runner's tensors (Runner.memory_tensors)
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations_and_other")
HISTORY_ENTRIES = 200_000  # allocator events kept: a few steps of a large model


def memory_snapshot_name(rank: int, why: str) -> str:
    return f"memory_rank{rank}_{why}.pickle"


def _live_at_peak(snapshot: dict) -> tuple[dict[int, int], int, int]:
    """The blocks live when the most memory was allocated, {address: bytes}, that peak, and how many of
    the history's events had happened by then: from the blocks live at the snapshot, walking its
    allocator history backwards (an allocation was not live before it, a freed block was). Without
    history, the snapshot's own blocks."""
    live = {block["address"]: block["size"] for segment in snapshot.get("segments", [])
            for block in segment.get("blocks", []) if block.get("state") == "active_allocated"}
    total = best = sum(live.values())
    events = [e for trace in snapshot.get("device_traces", []) for e in trace]
    best_index = len(events)  # walking back from the end: the index at the peak
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.get("action") == "alloc":
            total -= event["size"]
        elif event.get("action") == "free_completed":
            total += event["size"]
        if total > best:
            best, best_index = total, index
    for event in reversed(events[best_index:]):
        if event.get("action") == "alloc":
            live.pop(event["addr"], None)
        elif event.get("action") == "free_completed":
            live[event["addr"]] = event["size"]
    return live, best, best_index


def summarise_memory(snapshot: dict, tensors: dict[str, set[int]]) -> dict[str, Any]:
    """A snapshot's allocated and reserved bytes, and its peak's blocks by category: those whose address
    is the storage of one of `tensors` (category -> storage addresses), the rest activations and other
    (activations, temporaries, communication buffers)."""
    live, peak, _ = _live_at_peak(snapshot)
    by_category = dict.fromkeys(MEMORY_CATEGORIES, 0)
    for address, size in live.items():
        category = next((c for c, addresses in tensors.items() if address in addresses),
                        "activations_and_other")
        by_category[category] += size
    segments = snapshot.get("segments", [])
    mib = 1 << 20
    return {"peak_allocated_mib": round(peak / mib, 1),
            "allocated_mib": round(sum(s.get("allocated_size", 0) for s in segments) / mib, 1),
            "reserved_mib": round(sum(s.get("total_size", 0) for s in segments) / mib, 1),
            "history": bool(snapshot.get("device_traces") and any(snapshot["device_traces"])),
            "peak_by_category_mib": {c: round(v / mib, 1) for c, v in by_category.items()}}


class MemoryRecorder:
    """A GPU rank's allocator snapshots (`torch.cuda.memory`): at an out-of-memory error always (the
    observer runs inside the allocator, before the error unwinds anything), at the end where the study
    asks (timing's memory_snapshot, which also records the allocator's history from the start, so the
    snapshot's peak is the run's). Each kept as a pickle that pytorch.org/memory_viz opens, with its
    summary (summarise_memory) in `summaries`, by why it was taken."""

    def __init__(self, directory: Path, rank: int, history: bool, tensors):
        import torch

        self.directory, self.rank, self.tensors = directory, rank, tensors
        self.summaries: dict[str, dict[str, Any]] = {}
        if history:
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)

    def _on_oom(self, device: int, requested: int, device_allocated: int, device_free: int) -> None:
        summary = self.keep("oom")
        summary["requested_mib"] = round(requested / (1 << 20), 1)
        summary["device_free_mib"] = round(device_free / (1 << 20), 1)

    def keep(self, why: str) -> dict[str, Any]:
        import pickle

        import torch

        snapshot = torch.cuda.memory._snapshot()
        self.directory.mkdir(parents=True, exist_ok=True)
        name = memory_snapshot_name(self.rank, why)
        with open(self.directory / name, "wb") as f:
            pickle.dump(snapshot, f)
        try:
            addresses = {category: {t.untyped_storage().data_ptr() for t in found if t.is_cuda}
                         for category, found in self.tensors().items()}
        except Exception:  # noqa: BLE001 - a runner half built (an OOM while building): addresses unknown
            addresses = {}
        summary = {**summarise_memory(snapshot, addresses), "snapshot": f"{PROFILE_DIR}/{name}"}
        self.summaries[why] = summary
        return summary


def reread(result: Path) -> dict[str, Any]:
    """A result's breakdowns read again from the traces kept beside it (after a change to `breakdown`:
    the traces are the measurement, the parts a reading of them); the metrics.json rewritten."""
    from trainbench.contract.result import read_json
    from trainbench.contract.result import write_json_atomic

    doc = read_json(result)
    metrics = doc["metrics"]
    if not metrics.get("breakdown"):
        raise ValueError(f"{result}: no breakdown (the cell was not profiled)")
    ranks = metrics.get("breakdown_per_rank") or [metrics["breakdown"]]
    fresh = []
    for old in ranks:
        trace = result.parent / old["trace"]
        fresh.append({**breakdown(read_trace(trace)), "trace": old["trace"]})
    reporting = metrics["breakdown"]["trace"]
    metrics["breakdown"] = next(b for b, old in zip(fresh, ranks) if old["trace"] == reporting)
    if metrics.get("breakdown_per_rank"):
        metrics["breakdown_per_rank"] = fresh
    write_json_atomic(result, doc)
    return metrics["breakdown"]
