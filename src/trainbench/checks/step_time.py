"""How good is the time model? Step time predicted leave-one-out against every measured cell
(`trainbench check-models time [FOLDER ...] [--held-out FOLDER ...] [--csv FILE] [--write]`).

For every cell that trained (status ok) on a GPU the hardware table knows, under the folders (default:
the published runs, and the max-batch searches, whose probes run the same cells at larger micro batches;
inputs.published): the time model's constants are fitted per GPU type on every other cell of that type,
and the held-out cell's step time predicted from that fit (leave-one-out: no cell is predicted by a fit
that saw it). Prints one line per cell (measured, predicted leave-one-out, its error, and the all-cells
fit's prediction), the error distribution (median and worst absolute error, by study), how often the
predictions rank the strategies of a group of cells that differ only in strategy (and, second, in
strategy and its offload settings) the way the measurements do, and the constants fitted on all the
cells. `--held-out FOLDER ...`: cells the fits never see, predicted by the all-cells fit (default:
validation/results/bench/threads, three offloaded cells, each at 1 to 16 CPU threads, curves no fit is
given). `--write` stores the constants in src/trainbench/predict/time_model_constants.json, which
`trainbench predict`, the tables and the plots read. The thread exponent's choice: thread_curves.

Every fit starts from the same starting values (time_model.Constants()), which are not data, so the
held-out cell reaches its prediction by no path.
"""

from __future__ import annotations

import collections
import csv
import itertools
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from trainbench.checks.inputs import counted_params
from trainbench.checks.inputs import metrics_files, published
from trainbench.contract.result import Result, read_result
from trainbench.predict import time_model
from trainbench.registry.frameworks import registry
from trainbench.registry.hardware import gpu_type_of
from trainbench.reporting.compare import shorten

# Studies timed too briefly to trust (noted beside their errors; none now). Frameworks whose windows
# hold more than the step say so themselves (TimeFacts.window_holds)
CAVEATS: dict[str, str] = {}


def measured_cells(folders: list[Path]) -> list[dict]:
    """Every cell that trained on a known GPU type, with its work on that GPU (not emulated ranks: their
    steps time one rank's compute alone, training.emulation)."""
    cells = []
    for path in metrics_files(folders):
        result = read_result(path)  # checked, in the current shape (optional parameters filled in)
        gpu = gpu_type_of(result.gpu_name)
        step = result.metrics.step_time_s
        if not result.ok or result.params.get("device") != "cuda" or gpu is None or not step:
            continue
        if result.emulated:  # one rank of a world alone: its step holds no communication
            continue
        params = counted_params(result.params)
        if (why := time_model.outside(params)) is not None:  # a step the model does not describe
            print(f"left out {result.study}/{result.cell_id}: {why}", file=sys.stderr)
            continue
        threads = time_model.threads_of_result(result)
        try:
            work = time_model.work(params, gpu, threads)
        except (KeyError, ValueError) as error:
            print(f"skipped {result.study}/{result.cell_id}: {error}", file=sys.stderr)
            continue
        cells.append({"result": result, "gpu": gpu.key, "work": work, "measured_s": step,
                      "search": "search" in path.parts, "threads": threads,
                      "path": path})
    return cells


def fit_cells(cells: list[dict]) -> time_model.Constants:
    """The constants that best predict `cells` (measured_cells' entries, of one GPU type)."""
    return time_model.fit(time_model.stack([c["work"] for c in cells]),
                          np.array([c["measured_s"] for c in cells]))


def leave_one_out(works: dict, measured: np.ndarray,
                  everything: time_model.Constants | None = None) -> np.ndarray:
    """Each cell's step time from a fit of all the others. `everything`, the fit of all cells, is only
    where each search begins: the held-out cell's fit minimises its own objective."""
    predicted = np.empty(len(measured))
    for i in range(len(measured)):
        keep = np.arange(len(measured)) != i
        constants = time_model.fit({k: v[keep] for k, v in works.items()}, measured[keep], initial=everything)
        predicted[i] = time_model.step_time({k: v[i:i + 1] for k, v in works.items()}, constants)[0]
    return predicted


def leave_study_out(works: dict, measured: np.ndarray, studies: list[str],
                    everything: time_model.Constants | None = None) -> np.ndarray:
    """Each study's cells from a fit of the other studies' cells alone. A study ran in runs of its
    own, on a host of that run: leaving one cell out keeps its run's host in the fit through
    its neighbours, leaving its study out does not (host-bound cells move a quarter between hosts,
    docs/time-model.md), so this is the nearer figure to cells the model never saw."""
    predicted = np.empty(len(measured))
    names = np.array(studies)
    for study in dict.fromkeys(studies):
        out = names == study
        constants = time_model.fit({k: v[~out] for k, v in works.items()}, measured[~out], initial=everything)
        predicted[out] = time_model.step_time({k: v[out] for k, v in works.items()}, constants)
    return predicted


def strategy_groups(results: list[Result], keys: tuple[str, ...]) -> list[list[int]]:
    """Indices of cells of one study whose parameters differ only in `keys`."""
    groups = collections.defaultdict(list)
    for i, result in enumerate(results):
        rest = {k: v for k, v in result.params.items() if k not in keys}
        groups[(result.study, json.dumps(rest, sort_keys=True, default=str))].append(i)
    return [members for members in groups.values() if len(members) > 1]


def apart_by(min_gap: float):
    """Pairs whose measured step times differ by more than `min_gap` (a fraction)."""
    return lambda docs, measured, i, j: abs(measured[i] / measured[j] - 1) > min_gap


def step_interval(result: Result) -> list[float] | None:
    """The step time's 95% interval: the timed windows', or for a result from before them, what its
    per-step times give (Result.per_step_figures)."""
    return result.metrics.step_time_s_ci or (result.per_step_figures or {}).get("step_time_s_ci")


def told_apart(results, measured, i, j) -> bool:
    """Pairs the measurement itself tells apart: both have a 95% interval and the two do not overlap."""
    a, b = (step_interval(results[k]) for k in (i, j))
    return bool(a and b) and (a[1] < b[0] or b[1] < a[0])


def ranking(docs, measured, predicted, keys, counts=apart_by(0.0)) -> tuple[int, int, list]:
    """Pairs of a group ranked as measured: (right, pairs, the wrong ones), over the pairs `counts`
    selects."""
    right = total = 0
    wrong = []
    for members in strategy_groups(docs, keys):
        for i, j in itertools.combinations(members, 2):
            if not counts(docs, measured, i, j):
                continue
            total += 1
            if (measured[i] < measured[j]) == (predicted[i] < predicted[j]):
                right += 1
            else:
                wrong.append((i, j))
    return right, total, wrong


def label(result: Result) -> str:
    p = result.params
    parts = [p["model"], p["strategy"]]
    offload = "+".join(k.split("_")[1] for k in ("offload_optimizer", "offload_param") if p.get(k))
    if offload:
        parts.append(f"offload {offload}")
    parts.append(f"{p['gpus']}g")
    parts += [f"{k}{p[k]}" for k in ("tp", "pp") if p[k] > 1]
    parts += [f"mb{p['micro_batch']}x{p['grad_accum']}", p["precision"]]
    return " ".join(parts)


def collective_wait_shares(cells: list[dict], constants: time_model.Constants
                           ) -> dict[str, tuple[float, int, float, float]]:
    """By number of ranks, over the profiled real multi-GPU cells: the share of the model's host part
    (`framework`) that, moved into its communication part, best matches the profiles' exposed
    communication (the least median |difference|, on a grid of 0.01 from 0 to 1), with the cells, and
    that median difference in seconds without and with it. Ranks waiting in a collective for a slower
    rank's host show in a profile as the collective's kernel running, not as the GPU idle."""
    plain = replace(constants, collective_wait_share={})
    by_ranks: dict[int, list[tuple[float, float, float]]] = {}
    for c in cells:
        breakdown = c["result"].metrics.breakdown or {}
        exposed = (breakdown.get("parts_s") or {}).get("exposed_communication")
        if exposed is None or c["work"].ranks < 2:
            continue
        parts = time_model.parts(c["work"], plain)
        by_ranks.setdefault(int(c["work"].ranks), []).append(
            (float(parts["communication"]), float(parts["framework"]), exposed))
    shares = {}
    for ranks, found in sorted(by_ranks.items()):
        comm, host, exposed = (np.array(column) for column in zip(*found))
        grid = np.linspace(0, 1, 101)
        off = [float(np.median(np.abs(comm + share * host - exposed))) for share in grid]
        best = int(np.argmin(off))
        shares[str(ranks)] = (round(float(grid[best]), 2), len(found), off[0], off[best])
    return shares


def report(cells: list[dict], gpu: str) -> tuple[time_model.Constants, dict]:
    docs = [c["result"] for c in cells]
    works = time_model.stack([c["work"] for c in cells])
    measured = np.array([c["measured_s"] for c in cells])
    constants = time_model.fit(works, measured)
    constants.gpu = gpu
    fitted = time_model.step_time(works, constants)
    predicted = leave_one_out(works, measured, constants)
    errors = 100 * (predicted - measured) / measured
    print(f"{'study':<15} {'cell':<52} {'measured':>10} {'predicted':>10} {'error':>7} {'all-fit':>10}")
    for c, m, p, e, f in sorted(zip(cells, measured, predicted, errors, fitted),
                                key=lambda t: (t[0]["result"].study, t[0]["search"], label(t[0]["result"]))):
        study = c["result"].study + (" (search)" if c["search"] else "")
        print(f"{study:<15} {shorten(label(c['result']), 52):<52} {m * 1e3:>8.1f}ms {p * 1e3:>8.1f}ms "
              f"{e:>+6.1f}% {f * 1e3:>8.1f}ms")
    absolute = np.abs(errors)
    print()
    print(f"{gpu}: {len(cells)} cells, leave-one-out |error|: median {np.median(absolute):.1f}%, worst "
          f"{absolute.max():.1f}%, within 15%: {int((absolute <= 15).sum())}, within 25%: "
          f"{int((absolute <= 25).sum())}, within 50%: {int((absolute <= 50).sum())} "
          f"(goals: median <= 15%, worst <= 50%)")
    in_sample = np.abs(100 * (fitted - measured) / measured)
    print(f"  the all-cells fit on the same cells (in sample): median {np.median(in_sample):.1f}%, worst "
          f"{in_sample.max():.1f}%")
    studies = sorted({d.study for d in docs})
    for study in studies:
        chosen = np.array([d.study == study for d in docs])
        note = f"  [{CAVEATS[study]}]" if study in CAVEATS else ""
        print(f"  {study:<15} {int(chosen.sum()):>3} cells: median {np.median(absolute[chosen]):5.1f}%, "
              f"worst {absolute[chosen].max():5.1f}%{note}")
    for framework in sorted({d.params["framework"] for d in docs}):
        holds = registry()[framework].time.window_holds if framework in registry() else ""
        if holds:
            print(f"  note: {framework}'s windows include {holds} (fitted: its loop's fixed cost)")
    summary = {"cells": len(cells), "median_abs_error_pct": float(np.median(absolute)),
               "worst_abs_error_pct": float(absolute.max())}
    if len(studies) > 1:  # with one study, its fit would see no cell at all
        names = np.array([d.study for d in docs])
        by_study = leave_study_out(works, measured, list(names), constants)
        apart = np.abs(100 * (by_study - measured) / measured)
        print(f"  leave-one-study-out (each study predicted by a fit of the others): median "
              f"{np.median(apart):.1f}%, worst {apart.max():.1f}%, within 15%: {int((apart <= 15).sum())}, "
              f"within 25%: {int((apart <= 25).sum())}; by study, median / worst:")
        print("    " + "; ".join(f"{study} {np.median(apart[names == study]):.0f}% / "
                                 f"{apart[names == study].max():.0f}%" for study in studies))
        summary["leave_study_out"] = {"median_abs_error_pct": float(np.median(apart)),
                                      "worst_abs_error_pct": float(apart.max())}
    summary.update(print_rankings(docs, measured, predicted))
    summary["collective_wait_share"] = print_collective_waits(cells, constants)
    print()
    print(f"constants fitted on all {len(cells)} {gpu} cells (time_model.Constants; docs/time-model.md):")
    for name, value in zip(constants.names(), constants.vector()):
        print(f"  {name:<24} {value:.4g}")
    summary["constants"] = constants.as_dict()
    summary["per_cell"] = [{"study": c["result"].study, "cell": c["result"].cell_id, "search": c["search"],
                            "measured_s": float(m), "predicted_loo_s": float(p), "error_pct": float(e),
                            "predicted_all_fit_s": float(f)}
                           for c, m, p, e, f in zip(cells, measured, predicted, errors, fitted)]
    return constants, summary


def print_rankings(docs: list[dict], measured: np.ndarray, predicted: np.ndarray) -> dict:
    """How often the model orders right the cells that differ only in strategy (and its offloads):
    printed, and as the summary's entries."""
    summary = {}
    print()
    for keys, what in ((("strategy",), "differ only in strategy"),
                       (("strategy", "offload_optimizer", "offload_param"),
                        "differ only in strategy and its offload settings")):
        right, total, wrong = ranking(docs, measured, predicted, keys)
        big_right, big_total, _ = ranking(docs, measured, predicted, keys, apart_by(0.10))
        sure_right, sure_total, _ = ranking(docs, measured, predicted, keys, told_apart)
        print(f"ranking, cells that {what}: {right} of {total} pairs right "
              f"({100 * right / max(total, 1):.0f}%; goal "
              f">= 90%); of the {big_total} pairs measured more than 10% apart: {big_right} "
              f"({100 * big_right / max(big_total, 1):.0f}%); of the {sure_total} whose 95% intervals do not "
              f"overlap: {sure_right} ({100 * sure_right / max(sure_total, 1):.0f}%)")
        summary[f"ranking {what}"] = {"right": right, "pairs": total, "right_10pct_apart": big_right,
                                      "pairs_10pct_apart": big_total, "right_told_apart": sure_right,
                                      "pairs_told_apart": sure_total}
        if keys == ("strategy",):
            for i, j in wrong:
                print(f"  wrong: {docs[i].study}: {label(docs[i])} {measured[i] * 1e3:.0f} ms vs "
                      f"{docs[j].params['strategy']} {measured[j] * 1e3:.0f} ms; predicted "
                      f"{predicted[i] * 1e3:.0f} vs {predicted[j] * 1e3:.0f} ms")
    return summary


def print_collective_waits(cells: list[dict], constants: time_model.Constants) -> dict:
    """The share of the slowest rank's host part that ranks wait in collectives, by ranks, fitted on the
    profiled real cells (set in `constants`): printed, and as the summary's entry."""
    waits = collective_wait_shares(cells, constants)
    constants.collective_wait_share = {ranks: share for ranks, (share, *_) in waits.items()}
    print()
    print("waiting in collectives for the slowest rank's host (profiled real cells): the share of the "
          "host's part it takes, by ranks")
    for ranks, (share, count, before, after) in waits.items():
        print(f"  {ranks} ranks: {share:.2f} ({count} cells; the model's exposed communication off the "
              f"profiles' by a median {before * 1e3:.1f} ms without it, {after * 1e3:.1f} ms with it)")
    return {ranks: {"share": share, "cells": count, "median_off_s_without": before,
                    "median_off_s_with": after}
            for ranks, (share, count, before, after) in waits.items()}


def held_out_report(cells: list[dict], constants: time_model.Constants) -> None:
    """Cells no fit saw, predicted by the all-cells fit: what the model says beyond its data."""
    print("\nheld out (never fitted), predicted by the all-cells fit:")
    print(f"{'cell':<52} {'threads':>7} {'measured':>10} {'95% interval':>17} {'predicted':>10} "
          f"{'error':>7}  file")
    errors = []
    for c in sorted(cells, key=lambda c: (label(c["result"]), c["threads"], str(c["path"]))):
        predicted = float(time_model.step_time(c["work"], constants))
        measured, interval = c["measured_s"], step_interval(c["result"])
        error = 100 * (predicted - measured) / measured
        shown = f"[{interval[0]:.3f}, {interval[1]:.3f}] s" if interval else "-"
        print(f"{shorten(label(c['result']), 52):<52} {c['threads']:>7} {measured:>8.3f} s {shown:>17} "
              f"{predicted:>8.3f} s {error:>+6.1f}%  {c['path']}")
        errors.append(abs(error))
    print(f"held out: {len(errors)} cells, |error| median {statistics.median(errors):.1f}%, "
          f"worst {max(errors):.1f}%")


def run(args) -> int:
    folders = args.folders or published("runs", "search")
    cells = measured_cells(folders)
    if not cells:
        print(f"no measured GPU cells under {', '.join(map(str, folders))}", file=sys.stderr)
        return 1
    held_out = measured_cells(args.held_out) if args.held_out else []
    table, rows = {}, []
    for gpu in sorted({c["gpu"] for c in cells}):
        chosen = [c for c in cells if c["gpu"] == gpu]
        constants, summary = report(chosen, gpu)
        if any(c["gpu"] == gpu for c in held_out):
            held_out_report([c for c in held_out if c["gpu"] == gpu], constants)
        constants.fitted_on = (f"{len(chosen)} cells "
                               f"({', '.join(sorted({c['result'].study for c in chosen}))}), "
                               "by trainbench check-models time")
        table[gpu] = constants.as_dict()
        rows += summary["per_cell"]
    if args.write:
        time_model.CONSTANTS_FILE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"\nwrote {time_model.CONSTANTS_FILE}")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    print(f"\n{statistics.median([abs(r['error_pct']) for r in rows]):.1f}% median |error| leave-one-out "
          f"over {len(rows)} cells")
    return 0
