"""Emulated ranks against the real ranks of their number: the same cell run whole and as one rank
(`trainbench check-models emulation [FOLDER ...] [--json FILE]`).

Every emulated result (metrics.json with `emulation`) under the folders (default: the emulation_check
study's published runs, validation/results/runs/emulation_check) is paired with the real run of the
same cell (the same parameters but `emulate` and `emulate_rank`), and its rank set beside the real
world's rank of that number: torch's peak allocated and reserved memory, the device memory NVML reports
for the rank's GPU (one node: rank r on GPU r), the rank's peak host memory, the tensors it keeps
between steps and its parameter shard (CPU and GPU ranks alike), and the step time: the emulated rank's
is compute alone (its collectives complete at once), so emulated / real is the share of the real step
that is not waiting for the others. Where the real cell was profiled, its exposed communication is
shown beside it, and the emulated step is also set against the real step less that communication (what
emulation claims to measure: the rank's compute).

The device memory a real rank uses beyond what its emulated twin measured is what the emulated rank
does not have: NCCL's buffers and communicators, mostly. Its median for each layout (the communicators
its ranks open: memory_model.nccl_layout) is printed against what the memory model adds to an emulated
rank's measured figure (memory_model.emulated_rank_shortfall_mib; the measured figure stays in the
result's `emulation` section, and memory_model.completed_gpu_mem_used_mib completes it as the model
does now: that is what the real rank's is set against). Goal: each emulated
rank's device memory within 5% of the real rank's. A rank whose outcome differs (one fits, the other
runs out of memory) is listed with both statuses.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

from trainbench.checks.inputs import counted_params
from trainbench.checks.inputs import first_present, metrics_files, published
from trainbench.predict import time_model
from trainbench.registry.hardware import gpu_type_of
from trainbench.contract.result import Result, read_result
from trainbench.predict.memory_model import emulated_rank_shortfall_mib, gpu_mem_used_now_mib, nccl_layout
from trainbench.reporting.compare import shorten

EMULATION_KEYS = ("emulate", "emulate_rank")
# per-rank memory of a result, MiB: (label, metrics key); lists with one entry per rank (per GPU for NVML)
MEMORY = (("allocated", "torch_peak_allocated_mib"), ("reserved", "torch_peak_reserved_mib"),
          ("device", "gpu_mem_used_mib"), ("host", "host_rss_peak_mib_per_rank"))
GOAL_DEVICE_PCT = 5.0
GOAL_WHOLE_PCT = 10.0


def twin_key(result: Result) -> str:
    """What a cell is, emulated or not: its parameters without the emulation's."""
    return json.dumps({k: v for k, v in result.params.items() if k not in EMULATION_KEYS}, sort_keys=True)


def rank_figure(metrics: dict, key: str, index: int) -> float | None:
    values = metrics.get(key) or []
    return values[index] if index < len(values) and values[index] is not None else None


def held_bytes(metrics: dict, index: int) -> float | None:
    per_rank = metrics.get("tensors_held_bytes_per_rank") or []
    return float(sum(per_rank[index].values())) if index < len(per_rank) and per_rank[index] else None


def exposed_share(metrics: dict, rank: int) -> float | None:
    """The share of rank `rank`'s profiled step that its exposed communication took. A share, not
    seconds: the profiled steps run slower than the timed ones (the profiler's own cost)."""
    per_rank = metrics.get("breakdown_per_rank") or [metrics.get("breakdown")]
    breakdown = per_rank[rank] if rank < len(per_rank) else None
    if not breakdown or not breakdown.get("step_s"):
        return None
    exposed = (breakdown.get("parts_s") or {}).get("exposed_communication")
    return None if exposed is None else exposed / breakdown["step_s"]


def pairs(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """(one row per emulated rank whose real twin ran, whatever either's outcome; the emulated results
    whose twin has no result). A rank that fits emulated and not for real, or the reverse, is a row
    with both statuses: what the comparison exists to find."""
    results = [read_result(p) for p in paths]
    real = {twin_key(r): r for r in results if not r.emulated}
    rows, alone = [], []
    for result in results:
        if not result.emulated:
            continue
        twin = real.get(twin_key(result))
        if twin is None:
            alone.append(f"{result.study}/{result.cell_id}")
            continue
        rank, world = result.emulation.rank, result.emulation.world_size
        # the emulated rank's device memory as the memory model completes it now (its measured figure
        # plus the NCCL buffers a real rank has beyond it): what the real rank's is set against
        em = {**result.metrics, "gpu_mem_used_mib": gpu_mem_used_now_mib(result)}
        real_m = twin.metrics
        row = {"cell": f"{twin.study}/{twin.cell_id}", "rank": rank, "world": world,
               "status_real": twin.status, "status_emulated": result.status}
        for label, key in MEMORY:
            row[f"{label}_real"] = rank_figure(real_m, key, rank)
            row[f"{label}_emulated"] = rank_figure(em, key, 0)
        # the device memory the emulated rank itself used
        measured = result.emulation.measured.get("gpu_mem_used_mib") or []
        row["device_emulated_measured"] = measured[0] if measured else None
        params = counted_params(result.params)
        row["layout"], row["modelled_mib"] = nccl_layout(params), emulated_rank_shortfall_mib(params)
        row["held_real"], row["held_emulated"] = held_bytes(real_m, rank), held_bytes(em, 0)
        row["shard_real"] = rank_figure(real_m, "params_held_per_rank", rank)
        row["shard_emulated"] = rank_figure(em, "params_held_per_rank", 0)
        row["step_real_s"], row["step_emulated_s"] = real_m.step_time_s, result.metrics.step_time_s
        row["real_exposed_comm_share"] = exposed_share(real_m, rank)
        # what the time model needs for the rank's wait: the real cell's parameters, GPU and threads
        row["study"], row["params"] = twin.study, counted_params(twin.params)
        row["emulated_cell"] = f"{result.study}/{result.cell_id}"
        row["gpu"] = gpu_type_of(twin.gpu_name)
        row["threads"] = time_model.threads_of_result(twin)
        rows.append(row)
    return rows, alone


def committed_waits(path: Path) -> dict[str, float]:
    """The waits a predictions file (`trainbench predict`, committed before the cells ran) gives its
    emulated cells, by study/cell."""
    with path.open() as f:
        return {f"{r['study']}/{r['cell']}": float(r["emulated_wait_s"]) for r in csv.DictReader(f)
                if r.get("emulated_wait_s")}


def add_whole_steps(rows: list[dict], waits: dict[str, float] | None = None) -> None:
    """Each emulated step plus the time model's wait of its real rank (time_model.waiting_s): the whole
    step an emulated rank publishes, `whole_s`. The wait is the one `waits` committed for the cell
    before it ran, or else the model's with constants fitted without the twin's study (whose real cells
    are in the published fit): either way out of sample for the real step it is held against."""
    from trainbench.checks.step_time import fit_cells, measured_cells

    fitted = None
    constants: dict[tuple[str, str], time_model.Constants] = {}
    for row in rows:
        if row["gpu"] is None or not row["step_emulated_s"] or row["status_emulated"] != "ok":
            row["whole_s"] = None
            continue
        if waits is not None:
            wait = waits.get(row["emulated_cell"])
            row["whole_s"] = None if wait is None else row["step_emulated_s"] + wait
            continue
        if fitted is None:
            fitted = [c for c in measured_cells(published("runs", "search")) if not c["search"]]
        key = (row["gpu"].key, row["study"])
        if key not in constants:
            gpu, study = key
            constants[key] = fit_cells([c for c in fitted if c["gpu"] == gpu and c["result"].study != study])
        waiting = time_model.waiting_s(row["params"], row["gpu"], constants[key], row["threads"])
        row["whole_s"] = None if waiting is None else row["step_emulated_s"] + waiting


def error_pct(emulated: float | None, real: float | None) -> float | None:
    return None if emulated is None or not real else 100.0 * (emulated - real) / real


def memory_error(row: dict, label: str) -> float | None:
    return error_pct(row[f"{label}_emulated"], row[f"{label}_real"])


def ratio(row: dict) -> float | None:
    """The emulated rank's step over the real one's."""
    real, emulated = row["step_real_s"], row["step_emulated_s"]
    return emulated / real if real and emulated else None


def compute_ratio(row: dict) -> float | None:
    """The emulated rank's step over the real one's less its exposed communication (profiled cells: the
    real step times the share of its profiled step that was not exposed communication)."""
    real, emulated, share = row["step_real_s"], row["step_emulated_s"], row["real_exposed_comm_share"]
    if not (real and emulated) or share is None or share >= 1:
        return None
    return emulated / (real * (1 - share))


ERR = "+11.1f"  # an error's format in the table


def _f(value, fmt: str = "9.0f") -> str:
    return format(value, fmt) if value is not None else "-".rjust(len(format(0, fmt)))


def _pct(value, fmt: str) -> str:
    return _f(value, fmt) + ("%" if value is not None else " ")


def print_rows(rows: list[dict]) -> None:
    labels = [label for label, _ in MEMORY]
    header = "  ".join(f"{label + ' real / emulated, err':>32}" for label in labels)
    print(f"{'cell':<60} {'rank':>8}  {header}  {'held err':>9} {'shard':>5}  "
          f"{'step real / emulated ms':>23} {'ratio':>6} {'exposed comm':>12} {'whole ms, err':>16}")
    for r in rows:
        if r["status_real"] != "ok" or r["status_emulated"] != "ok":
            print(f"{shorten(r['cell'], 60):<60} {r['rank']:>2} of {r['world']:<2}  "
                  f"real: {r['status_real']}, emulated: {r['status_emulated']}")
            continue
        memory = "  ".join(f"{_f(r[m + '_real'])} {_f(r[m + '_emulated'])} {_pct(memory_error(r, m), ERR)}"
                           for m in labels)
        shard = "same" if r["shard_real"] == r["shard_emulated"] else "DIFF"
        held = _pct(error_pct(r["held_emulated"], r["held_real"]), "+8.3f")
        steps = [None if s is None else s * 1e3 for s in (r["step_real_s"], r["step_emulated_s"])]
        print(f"{shorten(r['cell'], 60):<60} {r['rank']:>2} of {r['world']:<2} {memory}  {held} {shard:>5}  "
              f"{_f(steps[0], '11.1f')} {_f(steps[1], '11.1f')} {_f(ratio(r), '6.3f')} "
              f"{_pct(r['real_exposed_comm_share'] and 100 * r['real_exposed_comm_share'], '11.1f')} "
              f"{_f(r.get('whole_s') and r['whole_s'] * 1e3, '8.1f')} "
              f"{_pct(error_pct(r.get('whole_s'), r['step_real_s']), '+6.1f')}")


def print_summary(rows: list[dict], waits_committed: bool = False) -> None:
    print()
    differ = [r for r in rows if r["status_real"] != r["status_emulated"]]
    print(f"outcomes: {len(rows) - len(differ)} of {len(rows)} ranks the same emulated and real"
          + "".join(f"; {r['cell']} rank {r['rank']}: real {r['status_real']}, "
                    f"emulated {r['status_emulated']}" for r in differ))
    rows = [r for r in rows if r["status_real"] == r["status_emulated"] == "ok"]
    for label, _ in MEMORY:
        errors = [abs(e) for r in rows if (e := memory_error(r, label)) is not None]
        if not errors:
            continue
        within = sum(e <= GOAL_DEVICE_PCT for e in errors)
        goal = (f" (goal: within {GOAL_DEVICE_PCT:.0f}%: {within} of {len(errors)})"
                if label == "device" else "")
        print(f"{label} memory: {len(errors)} ranks, |emulated - real| median "
              f"{statistics.median(errors):.1f}%, worst {max(errors):.1f}%{goal}")
    held = [abs(e) for r in rows if (e := error_pct(r["held_emulated"], r["held_real"])) is not None]
    if held:
        same = sum(r["shard_real"] == r["shard_emulated"] for r in rows)
        print(f"tensors kept between steps: {len(held)} ranks, worst |error| {max(held):.4f}%; "
              f"parameter shards the same on {same} of {len(rows)}")
    beyond: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["device_real"] is not None and r["device_emulated_measured"] is not None:
            beyond.setdefault(r["layout"], []).append((r["device_real"] - r["device_emulated_measured"],
                                                       r["modelled_mib"]))
    for layout, pairs_ in sorted(beyond.items()):
        print(f"device memory a real rank uses beyond its emulated twin (NCCL's buffers, mostly), {layout}: "
              f"median {statistics.median(b for b, _ in pairs_):.0f} MiB over {len(pairs_)} ranks "
              f"({min(b for b, _ in pairs_):.0f}-{max(b for b, _ in pairs_):.0f}); the model adds "
              f"{statistics.median(m for _, m in pairs_):.0f}")
    ratios = [x for r in rows if (x := ratio(r)) is not None]
    if ratios:
        print(f"step time, emulated / real: median {statistics.median(ratios):.3f} over {len(ratios)} ranks "
              f"(the emulated rank's step is its compute alone)")
    computes = [x for r in rows if (x := compute_ratio(r)) is not None]
    if computes:
        print(f"emulated / (real less its exposed communication, profiled): median "
              f"{statistics.median(computes):.3f} over {len(computes)} ranks")
    wholes = [(r, e) for r in rows if (e := error_pct(r.get("whole_s"), r["step_real_s"])) is not None]
    if wholes:
        alone = [abs(error_pct(r["step_emulated_s"], r["step_real_s"])) for r, _ in wholes]
        errors = [abs(e) for _, e in wholes]
        source = "committed before the run" if waits_committed else "fitted without the cell's study"
        print(f"whole step (emulated + the time model's wait, {source}) against the "
              f"real step: |error| median {statistics.median(errors):.1f}%, worst {max(errors):.1f}% over "
              f"{len(errors)} ranks (the emulated step alone: median {statistics.median(alone):.1f}%, worst "
              f"{max(alone):.1f}%; goal: median within {GOAL_WHOLE_PCT:.0f}%)")


DEFAULT_FOLDERS = ("validation/results/runs/emulation_check", "results/runs/emulation_check")


def whole_step_bands(rows: list[dict]) -> dict[str, dict[str, float | int]]:
    """Real steps over their emulated rank's whole step, grouped by what the world waits on
    (time_model.wait_kind): how many ranks, the lowest, median and highest ratio."""
    ratios: dict[str, list[float]] = {}
    for row in rows:
        if row.get("whole_s") and row["step_real_s"]:
            kind = time_model.wait_kind(row["params"])
            ratios.setdefault(kind, []).append(row["step_real_s"] / row["whole_s"])
    return {kind: {"ranks": len(found), "low": round(min(found), 3),
                   "median": round(statistics.median(found), 3), "high": round(max(found), 3)}
            for kind, found in sorted(ratios.items())}


def write_bands(rows: list[dict], folders: list[Path], path: Path) -> None:
    bands = whole_step_bands(rows)
    doc = {"made_by": "trainbench check-models emulation " + " ".join(map(str, folders)) + " --write-bands",
           "what": "real steps over their emulated rank's whole step (the time model's wait fitted without "
                   "the real cell's study), by what the world waits on",
           "bands": bands}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for kind, band in bands.items():
        print(f"{kind}: real / whole step {band['low']:.2f}-{band['high']:.2f} (median {band['median']:.2f}, "
              f"{band['ranks']} ranks)")
    print(f"written: {path}")


def run(args) -> int:
    folders = args.folders or first_present(*DEFAULT_FOLDERS)
    rows, alone = pairs(metrics_files(folders))
    for cell in alone:
        print(f"no real run of {cell}: not compared", file=sys.stderr)
    if not rows:
        print(f"no emulated rank with a real twin under {', '.join(map(str, folders)) or DEFAULT_FOLDERS[0]}",
              file=sys.stderr)
        return 1
    add_whole_steps(rows, committed_waits(args.predictions) if args.predictions else None)
    print_rows(rows)
    print_summary(rows, waits_committed=args.predictions is not None)
    if args.json:
        shown = [{k: v for k, v in r.items() if k not in ("params", "gpu")} for r in rows]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(shown, indent=1) + "\n")
    if args.write_bands:
        if args.predictions:  # the bands are of one kind of wait: the model's, out of sample by study
            print("--write-bands takes the waits fitted without each study, not --predictions",
                  file=sys.stderr)
            return 2
        write_bands(rows, folders, time_model.WHOLE_STEP_BANDS_FILE)
    return 0
