"""A study's answer: what a reader takes away before any table, in a few lines, and one narrow table of
the cells with a result. Both read the documents the study's tables read (tables.study_markdown passes
them with the models' current predictions, plots.with_scaling's efficiencies and the findings as
findings.evaluate judged them); the README's headline is made the same way from the published results
(`trainbench headline`).

The answer, a line each:

- per model and GPU model: the fastest set-up by measured tokens/s per GPU, with its 95% interval and
  MFU; the set-ups whose intervals overlap it are named as tied; noisy ones (an interval wider than the
  study's target, or none: too few timed windows) are not ranked, and the answer says so, naming the
  highest median among them where it is above the fastest's; and the set-up that held the least GPU
  memory (its busiest GPU's peak). Cells on different GPU models are never ranked against each other;
- how throughput per GPU holds as GPUs are added, against the same model's one-GPU cell on the same
  machine (the table's scaling efficiency);
- what did not train or was not run, counted by outcome with the reasons' first words;
- the findings' verdicts, as findings.evaluate gave them (not judged again here).

Only measured figures are ranked. An emulated rank (one rank of a larger world, measured alone) is
named as one: its memory is measured, its timed figures are that rank's compute, so it is never ranked
for speed. Where nothing is measured yet, the planned cells' figures are the models', each said to be
predicted.

The summary table (SUMMARY, columns.SUMMARY_COLUMNS say what each column means): one row per cell with
a result, ordered by model, then GPUs, then throughput, highest first.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from trainbench.contract.result import sanity_problems
from trainbench.registry.hardware import gpu_label
from trainbench.reporting.columns import (
    COLUMNS,
    SUMMARY_COLUMNS,
    emulated,
    escape,
    metric,
    noisy_text,
    outcome_text,
)
from trainbench.reporting.predictions import Doc, prediction, time_prediction
from trainbench.study.words import value_label

NOT_MEASURED = ("planned", "not run")
# what every set-up says (framework and strategy, model, precision, micro batch x accumulation) or the
# GPUs column says; a study's other keys are said where it varies them
SAID_ALWAYS = ("framework", "strategy", "model", "precision", "micro_batch", "grad_accum", "gpus", "nodes",
               "emulate", "emulate_rank", "gpu_mem_limit_gib")
NAMED_MODELS = 4  # models the answer gives a line each; the others are in the table
NAMED_TIES = 3  # tied set-ups named; more are counted
NAMED_REASONS = 3  # reasons named per outcome; more are counted
SUMMARY = tuple(SUMMARY_COLUMNS)
SHORT_REASON = 24  # characters of a reason the summary's result column holds; longer ones go under it


# --- figures --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rate:
    """A cell's measured tokens/s per GPU: its median and 95% interval (None: too few timed windows)."""

    value: float
    low: float | None = None
    high: float | None = None

    def overlaps(self, other: "Rate") -> bool:
        return (self.low is not None and other.low is not None and self.low <= other.high
                and other.low <= self.high)

    def text(self) -> str:
        half = f" ± {(self.high - self.low) / 2:,.0f}" if self.low is not None else ""
        return f"{self.value:,.0f}{half}"


def tokens_per_gpu(doc: Doc) -> Rate | None:
    """Tokens/s per GPU (per rank on CPUs) of a cell that ran to the end, with its interval."""
    tokens, gpus = metric(doc, "tokens_per_s"), doc["params"].get("gpus") or 1
    if doc["status"] != "ok" or not tokens:
        return None
    bounds = metric(doc, "tokens_per_s_ci")
    return Rate(tokens / gpus, *((bounds[0] / gpus, bounds[1] / gpus) if bounds else (None, None)))


def gpu_of(doc: Doc) -> str:
    """The GPU model a cell ran on (H200), or planned for; "CPU ranks" for a run without GPUs."""
    if doc["status"] in NOT_MEASURED:
        return (doc.get("planned_for_gpu") or "the planning hardware").upper()
    name = (doc.get("provenance") or {}).get("gpu_name")
    return gpu_label(name) if name else "CPU ranks"


def trained(doc: Doc) -> bool:
    """Ran to the end and trained sanely: its figures count."""
    return doc["status"] == "ok" and not sanity_problems(doc)


def gpu_mem_gib(doc: Doc) -> float | None:
    return COLUMNS["gpu_mem_max_gib"].value(doc)


def _percent(value: float | None) -> str:
    return COLUMNS["mfu"].text(value) if value is not None else ""


# --- set-ups in words -----------------------------------------------------------------------------------

def varying_keys(docs: list[Doc], id_keys: list[str], said: Iterable[str] = SAID_ALWAYS) -> list[str]:
    """The keys telling these cells apart that a set-up does not always say."""
    return [k for k in id_keys if k not in said and len({repr(d["params"].get(k)) for d in docs}) > 1]


SAYS_ITSELF = ("precision", "framework", "strategy", "model")  # a value that needs no key: bf16, zero3


def _said(key: str, value: Any) -> str:
    """A key's value in short words; a bare name says which key it is ("fsdp reshard after_step")."""
    text = value_label(key, value)
    named = isinstance(value, str) and text == value and key not in SAYS_ITSELF
    return f"{key.replace('_', ' ')} {text}" if named else text


def setup_text(doc: Doc, keys: list[str]) -> str:
    """The set-up in words: framework and strategy, the `keys` it varies in, model, precision, micro batch
    x accumulation ("torch ddp, gpt2-124m, bf16, 32 x 4")."""
    p = doc["params"]
    parts = [f"{p.get('framework')} {p.get('strategy')}", *(_said(k, p.get(k)) for k in keys), p.get("model"),
             p.get("precision"), f"{p.get('micro_batch')} x {p.get('grad_accum')}"]
    return ", ".join(str(part) for part in parts if part)


def gpus_text(doc: Doc) -> str:
    """The cell's GPUs, its nodes where more than one, and "emulated" for one rank measured alone."""
    p = doc["params"]
    text = str(p.get("gpus"))
    if (p.get("nodes") or 1) > 1:
        text += f" ({p['nodes']} nodes)"
    if doc.get("emulation") or p.get("emulate"):
        text += ", emulated"
    if p.get("gpu_mem_limit_gib"):
        text += f", {p['gpu_mem_limit_gib']:g} GiB cap"
    return text


def _on_gpus(doc: Doc) -> str:
    gpus, nodes = doc["params"].get("gpus") or 1, doc["params"].get("nodes") or 1
    text = f"on {gpus} GPU{'s' if gpus != 1 else ''}" + (f" of {nodes} nodes" if nodes > 1 else "")
    return text + (f" ({emulated(doc)})" if emulated(doc) else "")


def namer(docs: list[Doc], id_keys: list[str], strategy: bool = True):
    """How the answer names a set-up among `docs`: its framework and strategy (with `strategy`) and what
    else tells them apart, not its model or GPUs."""
    keys = varying_keys(docs, id_keys, said=("model", "gpus", "nodes", "framework", "strategy", "emulate",
                                             "emulate_rank"))

    def name(doc: Doc) -> str:
        p = doc["params"]
        words = [f"{p.get('framework')} {p.get('strategy')}" if strategy else "",
                 *(_said(k, p.get(k)) for k in keys)]
        return ", ".join(w for w in words if w)

    return name


def full_namer(docs: list[Doc], id_keys: list[str]):
    """A set-up's name and its GPUs ("torch ddp on 4 GPUs")."""
    name = namer(docs, id_keys)
    return lambda doc: f"{name(doc)} {_on_gpus(doc)}"


# --- the summary table ----------------------------------------------------------------------------------

def summary_order(docs: list[Doc]) -> list[Doc]:
    """By model (in the grid's order), then GPUs, then throughput per GPU, highest first; an emulated rank
    after the real cells of its size, and cells without a figure last."""
    models = list(dict.fromkeys(d["params"].get("model") for d in docs))

    def key(doc: Doc):
        p, rate = doc["params"], tokens_per_gpu(doc)
        return (models.index(p.get("model")), p.get("gpus") or 1, p.get("nodes") or 1,
                bool(doc.get("emulation")), rate is None, -(rate.value if rate else 0.0))

    return sorted(docs, key=key)


def _step_text(doc: Doc) -> str:
    step = COLUMNS["step_time_ms"].value(doc) if doc["status"] == "ok" else None
    if step is None:
        return "—"
    predicted = time_prediction(doc).get("step_time_s")
    text = f"{step:,.1f}" + (" compute" if doc.get("emulation") else "")
    return text + (f" (pred. {predicted * 1e3:,.1f})" if predicted else "")


def summary_row(doc: Doc, keys: list[str], notes: list[str]) -> dict[str, str]:
    """One cell as the summary shows it, column by column (SUMMARY)."""
    rate, compute = tokens_per_gpu(doc), " (compute)" if doc.get("emulation") else ""
    mfu, memory = metric(doc, "mfu") if doc["status"] == "ok" else None, gpu_mem_gib(doc)
    texts = [setup_text(doc, keys), gpus_text(doc), outcome_text(doc, notes, footnote_after=SHORT_REASON),
             rate.text() + compute if rate else "—", _percent(mfu) + compute if mfu is not None else "—",
             f"{memory:,.2f}" if memory is not None else "—", _step_text(doc)]
    return dict(zip(SUMMARY, texts))


def summary_markdown(docs: list[Doc], id_keys: list[str]) -> list[str]:
    """The cells with a result as one narrow table, and the long reasons under it."""
    keys = varying_keys(docs, id_keys)
    notes: list[str] = []
    rows = [summary_row(doc, keys, notes) for doc in summary_order(docs)]
    lines = ["| " + " | ".join(SUMMARY) + " |", "|" + "|".join(" --- " for _ in SUMMARY) + "|"]
    lines += ["| " + " | ".join(escape(row[h]) for h in SUMMARY) + " |" for row in rows]
    if notes:
        lines.append("")
        lines += [f"[{i}] {escape(note)}" + ("  " if i < len(notes) else "")
                  for i, note in enumerate(notes, 1)]
    return lines


# --- the answer -----------------------------------------------------------------------------------------

def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else "".join(items)


def _grouped(docs: list[Doc], key) -> dict[Any, list[Doc]]:
    groups: dict[Any, list[Doc]] = {}
    for doc in docs:
        groups.setdefault(key(doc), []).append(doc)
    return groups


def _noisy(doc: Doc) -> bool:
    """Timed without an interval, or with one wider than its study's target: its rank is not known."""
    return bool(metric(doc, "noisy")) or tokens_per_gpu(doc).low is None


def _fastest(group: list[Doc], name, unit: str) -> str | None:
    """The fastest of a model's cells on one GPU model, by its interval, and the ones tied with it; the
    noisy ones are not ranked, and the answer says so (naming the highest median among them where it is
    above the fastest's)."""
    timed = [d for d in group if trained(d) and not d.get("emulation") and tokens_per_gpu(d)]
    steady = [d for d in timed if not _noisy(d)]
    noisy = sorted((d for d in timed if _noisy(d)), key=lambda d: -tokens_per_gpu(d).value)

    def figure(doc: Doc) -> str:  # "noisy (±9.2%)" as "noisy: ±9.2%", inside the answer's own brackets
        said = noisy_text(doc).replace("noisy (", "noisy: ").removesuffix(")")
        return f"{name(doc)}, {tokens_per_gpu(doc).text()} tokens/s {unit}, {said}"

    if not steady:
        if noisy:
            every = "all " if len(noisy) > 1 else ""
            return (f"{_count(len(noisy), 'timed cell')}, {every}noisy: not ranked for speed (highest "
                    f"median: {figure(noisy[0])})")
        if any(trained(d) for d in group):
            return ("only emulated ranks trained: their timed figures are one rank's compute, not ranked "
                    "for speed")
        return None
    best = max(steady, key=lambda d: tokens_per_gpu(d).value)
    rate, mfu = tokens_per_gpu(best), metric(best, "mfu")
    text = f"fastest: {name(best)}, {rate.text()} tokens/s {unit}" + (f", MFU {_percent(mfu)}" if mfu
                                                                        else "")
    tied = [d for d in steady if d is not best and tokens_per_gpu(d).overlaps(rate)]
    if tied:
        named = [f"{name(d)} ({tokens_per_gpu(d).text()})" for d in tied[:NAMED_TIES]]
        if len(tied) > NAMED_TIES:
            named.append(f"{len(tied) - NAMED_TIES} more")
        text += f"; tied within their 95% intervals with {_and(named)}"
    if noisy:
        above = noisy[0] if tokens_per_gpu(noisy[0]).value > rate.value else None
        text += (f"; {_count(len(noisy), 'noisy cell')} not ranked"
                 + (f" (highest median: {figure(above)})" if above else ""))
    return text


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _least_memory(group: list[Doc], name) -> str | None:
    held = [d for d in group if trained(d) and gpu_mem_gib(d) is not None]
    if not held:
        return None
    least = min(held, key=gpu_mem_gib)
    text = f"least GPU memory: {name(least)}, {gpu_mem_gib(least):,.2f} GiB (peak of its busiest GPU)"
    tied = [d for d in held if d is not least and round(gpu_mem_gib(d), 2) == round(gpu_mem_gib(least), 2)]
    return text + (f", tied with {_and([name(d) for d in tied[:NAMED_TIES]])}" if tied else "")


def _model_lines(measured: list[Doc], id_keys: list[str]) -> list[str]:
    """A line per model and GPU model that has a cell that ran: its fastest and its least memory."""
    ran = [d for d in measured if d["status"] not in ("unsupported", "infeasible")]
    groups = _grouped(ran, lambda d: (d["params"].get("model"), gpu_of(d)))
    lines = []
    for (model, gpu), group in list(groups.items())[:NAMED_MODELS]:
        name, unit = full_namer(group, id_keys), "per GPU" if gpu != "CPU ranks" else "per rank"
        said = [s for s in (_fastest(group, name, unit), _least_memory(group, name)) if s]
        if not said:
            outcomes = Counter(outcome_text(d).split(" (")[0].split(":")[0] for d in group)
            said = ["no cell trained: " + ", ".join(f"{n} {o}" for o, n in outcomes.most_common())]
        lines.append(f"**{model}** on {gpu}: " + "; ".join(said) + ".")
    if len(groups) > NAMED_MODELS:
        lines.append(f"{len(groups) - NAMED_MODELS} more models (or GPU models) are in the table below.")
    return lines


def _scaling_line(docs: list[Doc], id_keys: list[str]) -> str | None:
    """Each set-up's scaling efficiency at its most GPUs, against its model's one-GPU cell on the same
    machine (plots.with_scaling's, as the table shows it); never across GPU models or hosts."""
    by_id = {d["cell_id"]: d for d in docs}
    scaled = [d for d in docs if trained(d) and (d.get("scaling") or {}).get("efficiency") is not None
              and d["scaling"].get("same_host") is not False and d["scaling"]["reference"] in by_id
              and gpu_of(by_id[d["scaling"]["reference"]]) == gpu_of(d)]
    if not scaled:
        return None
    references = _grouped(scaled, lambda d: d["scaling"]["reference"])
    # a model with several one-GPU cells (with and without a setting) says which one each is held against
    models = _grouped([by_id[r] for r in references], lambda d: d["params"].get("model"))
    contexts = {d["cell_id"]: namer(refs, id_keys, strategy=False)(d)
                for refs in models.values() for d in refs}
    several_gpus = len({gpu_of(d) for d in scaled}) > 1
    parts = []
    for reference, cells in references.items():
        ref, name = by_id[reference], namer(cells, id_keys)
        largest = {name(d): d for d in sorted(cells, key=lambda d: d["params"]["gpus"])}
        said = "; ".join(f"{series} keeps {_percent(d['scaling']['efficiency'])} {_on_gpus(d)}"
                         + (" (noisy)" if metric(d, "noisy") or metric(ref, "noisy") else "")
                         for series, d in largest.items())
        where = [w for w in (contexts[reference], gpu_of(ref) if several_gpus else "") if w]
        model = ref["params"].get("model")
        parts.append(f"{model}" + (f" ({', '.join(where)})" if where else "") + f": {said}")
    on = "" if several_gpus else f" on {gpu_of(scaled[0])}"
    return (f"Scaling{on}, throughput per GPU as a share of the same model's one-GPU cell on the same "
            "machine (100%: linear), at the most GPUs measured. " + ". ".join(parts) + ".")


STATUS_WORDS = {"oom": "ran out of memory", "insane": "ran but did not train sanely",
                "unsupported": "unsupported by the stack", "infeasible": "predicted not to fit, so not run",
                "failed": "failed", "timeout": "timed out"}


def reason_words(doc: Doc) -> str:
    """Why a cell did not train, in its reason's first words."""
    if doc["status"] == "oom":
        return outcome_text(doc)
    if doc["status"] == "ok":  # ran, not sanely: which check, without its figures
        first = sanity_problems(doc)[0].split(":")[0]
        return re.sub(r"\s+", " ", re.sub(r"\b\d+(\.\d+)?\b", "", first)).strip()
    if doc["status"] == "infeasible":
        short = (doc.get("predicted") or {}).get("short_of") or []
        return "predicted short of " + " and ".join(short) if short else "predicted not to fit"
    clause = re.split(r": |; | \(|, which ", doc.get("reason") or doc["status"], maxsplit=1)[0]
    return clause if len(clause) <= 80 else clause[:77].rsplit(" ", 1)[0] + " ..."


def _outcomes_line(measured: list[Doc]) -> str | None:
    """What did not train: counted by outcome, with the reasons' words."""
    reasons: dict[str, Counter] = {}
    emulated_ranks: Counter = Counter()
    for doc in measured:
        if trained(doc):
            continue
        kind = "insane" if doc["status"] == "ok" else doc["status"]
        reasons.setdefault(kind, Counter())[reason_words(doc)] += 1
        emulated_ranks[kind] += bool(doc.get("emulation"))
    if not reasons:
        return None
    parts = []
    for kind, counted in reasons.items():
        n = sum(counted.values())
        named = [f"{count} {words}" if len(counted) > 1 else words
                 for words, count in counted.most_common(NAMED_REASONS)]
        if len(counted) > NAMED_REASONS:
            named.append(f"{len(counted) - NAMED_REASONS} other reasons")
        alone = (" (all emulated ranks)" if emulated_ranks[kind] == n else
                 f" ({emulated_ranks[kind]} of them emulated ranks)" if emulated_ranks[kind] else "")
        parts.append(f"{n} {STATUS_WORDS.get(kind, kind)}{alone}: {', '.join(named)}")
    ok = sum(trained(d) for d in measured)
    lead = "Did not train" if ok else f"No cell of the {len(measured)} with a result trained"
    return f"{lead}: " + "; ".join(parts) + "."


def _not_measured_line(docs: list[Doc], plan_for: dict[str, Any] | None) -> str | None:
    """The cells without a result: planned (with the memory model's verdict, predicted) and not run."""
    planned = [d for d in docs if d["status"] == "planned"]
    short = [d for d in docs if d["status"] == "not run"]
    parts = []
    if planned:
        fits = Counter((d.get("predicted_now") or prediction(d)).get("fits") for d in planned)
        where = f" for {plan_for['name']}" if plan_for and plan_for.get("name") else ""
        said = (f"all {fits[True]} fit" if not fits[False] else "none fits" if not fits[True]
                else f"{fits[True]} fit and {fits[False]} do not")
        verdict = (f": the memory model predicts {said}{where} (predicted)" if fits[True] or fits[False]
                   else "")
        parts.append(f"{len(planned)} planned, not measured{verdict}")
    if short:  # "needs 8 GPUs, more than the machine that made this table has"
        needs = Counter((d.get("reason") or "").split(", ")[0] for d in short)
        parts.append(f"{len(short)} not run on the machine that made this table: "
                     + ", ".join(f"{n} {words}" if len(needs) > 1 else words
                                 for words, n in needs.most_common()))
    return ("Without a result: " + "; ".join(parts) + ".") if parts else None


def _claim(text: str) -> str:
    text = text.strip().removeprefix("...").removesuffix("...").strip()
    return text if len(text) <= 80 else text[:77].rsplit(" ", 1)[0] + " ..."


def _findings_line(judged: list) -> str | None:
    """The findings' verdicts as judged (findings.Result), naming those that did not fully hold."""
    if not judged:
        return None
    counts = Counter(r.verdict for r in judged)
    order = ("reproduced", "partly", "not reproduced", "not yet measured")
    text = "Findings: " + ", ".join(f"{counts[v]} {v}" for v in order if counts[v])
    for verdict in ("not reproduced", "partly"):
        named = [f"“{_claim(r.finding.claim)}” (#{r.index})" for r in judged if r.verdict == verdict]
        text += f". {verdict.capitalize()}: {'; '.join(named)}" if named else ""
    waiting = [f"#{r.index} ({r.summary.split('; ', 1)[1]})" for r in judged
               if r.verdict == "not yet measured" and "; predicted" in r.summary]
    text += f". Not yet measured, predicted: {'; '.join(waiting)}" if waiting else ""
    return text + "."


def _predicted_lines(planned: list[Doc], id_keys: list[str]) -> list[str]:
    """Nothing measured yet: per model, the planned set-up the models predict fastest per GPU."""
    lines = []
    fitting = [d for d in planned if (d.get("predicted_now") or prediction(d)).get("fits")
               and time_prediction(d).get("samples_per_s")]
    for (model, gpu), group in list(_grouped(fitting, lambda d: (d["params"].get("model"),
                                                                 gpu_of(d))).items())[:NAMED_MODELS]:
        name = full_namer(group, id_keys)

        def per_gpu(doc: Doc) -> float:
            return time_prediction(doc)["samples_per_s"] * doc["params"]["seq_len"] / doc["params"]["gpus"]

        best = max(group, key=per_gpu)
        mfu = time_prediction(best).get("mfu")
        lines.append(f"**{model}**, predicted on {gpu}: fastest {name(best)}, {per_gpu(best):,.0f} tokens/s "
                     "per GPU" + (f" at MFU {_percent(mfu)}" if mfu else "")
                     + " (predicted: the time model's).")
    return lines


def answer_lines(docs: list[Doc], id_keys: list[str], judged: list | None = None,
                 plan_for: dict[str, Any] | None = None) -> list[str]:
    """The answer as lines of a list: per model, the fastest and the least memory; scaling; what did not
    train; what has no result; the findings. `docs` carry their current predictions."""
    measured = [d for d in docs if d["status"] not in NOT_MEASURED]
    lines: list[str] = []
    if not measured:
        lines.append(f"Nothing measured yet: the study's {len(docs)} cells have no result.")
        lines += _predicted_lines([d for d in docs if d["status"] == "planned"], id_keys)
    elif not any(trained(d) for d in measured):
        lines.append(_outcomes_line(measured))
    else:
        lines += _model_lines(measured, id_keys)
        lines.append(_scaling_line(measured, id_keys))
        lines.append(_outcomes_line(measured))
    gpus = sorted({gpu_of(d) for d in measured if d["status"] not in ("unsupported", "infeasible")})
    if len(gpus) > 1:
        lines.append(f"Cells ran on {' and '.join(gpus)}: each is ranked among its own GPU model's, never "
                     "against another's.")
    lines += [_not_measured_line(docs, plan_for), _findings_line(judged or [])]
    return [line for line in lines if line]


def answer_markdown(docs: list[Doc], id_keys: list[str], judged: list | None = None,
                    plan_for: dict[str, Any] | None = None) -> list[str]:
    return ["## Answer", "", *(f"- {line}" for line in answer_lines(docs, id_keys, judged, plan_for)), ""]


# --- the README's headline ------------------------------------------------------------------------------

HEADLINE_STUDY = "baseline"
HEADLINE_START = ("<!-- headline: written by `trainbench headline --write README.md` from the published "
                  "results -->")
HEADLINE_END = "<!-- end of headline -->"


def headline_markdown(root: Path | str, loaded) -> str:
    """The README's results: the headline study's one-GPU cells (tokens/s and MFU), its scaling, the
    campaigns' verdicts, and its scaling plot, each linked to its table; read from `root`'s published
    metrics.json files (and its findings CSVs, which the pipeline made from them). `loaded`: the
    workspace's config (study.config.Config)."""
    from trainbench.reporting.documents import read_cells
    from trainbench.reporting.plots import with_scaling

    root = Path(root)
    study = loaded.study(HEADLINE_STUDY)
    table = f"results/tables/{HEADLINE_STUDY}.md"
    docs = with_scaling(read_cells(sorted(root.glob(f"results/runs/{HEADLINE_STUDY}/*/metrics.json"))),
                        study.id_keys)
    lines = [HEADLINE_START, "## Results", "",
             "Measured by the pipeline, read from its published results ([all of them](results/README.md)); "
             "each figure links to its table.", ""]
    for doc in (d for d in docs if d["params"].get("gpus") == 1 and trained(d)):
        rate, mfu = tokens_per_gpu(doc), metric(doc, "mfu")
        p = doc["params"]
        lines.append(f"- {p['model']} on one {gpu_of(doc)} ({p['framework']}, {p['precision']}, micro batch "
                     f"{p['micro_batch']} x {p['grad_accum']}): "
                     f"**{rate.text()} tokens/s**" + (f", MFU {_percent(mfu)}" if mfu else "")
                     + f" ([{HEADLINE_STUDY}]({table})).")
    scaling = _scaling_line(docs, study.id_keys)
    if scaling:
        lines.append(f"- {scaling[:-1]} ([{HEADLINE_STUDY}]({table})).")
    lines.append(_campaigns_line(root, loaded))
    plot = f"results/plots/{HEADLINE_STUDY}/scaling.png"
    if (root / plot).exists():
        lines += ["", f"[![{HEADLINE_STUDY}: throughput per GPU against one GPU]({plot})]({table})"]
    return "\n".join([*lines, HEADLINE_END])


def _campaigns_line(root: Path, loaded) -> str:
    """The campaigns' findings, their verdicts counted over every study that declares some."""
    import csv

    counts: Counter = Counter()
    for name in loaded.studies:
        path = root / f"results/tables/{name}.findings.csv"
        if loaded.study(name).findings and path.exists():
            with open(path) as f:
                counts.update({row["finding"]: row["verdict"] for row in csv.DictReader(f)}.values())
    order = ("reproduced", "partly", "not reproduced", "not yet measured")
    return (f"- The campaigns' {sum(counts.values())} conclusions, checked on their cells: "
            + ", ".join(f"{counts[v]} {v}" for v in order if counts[v])
            + " ([verdicts](docs/results.md#verdicts-of-the-campaigns-findings)).")


def with_headline(text: str, headline: str) -> str:
    """A page with its headline section replaced by `headline` (where the page has none, an error)."""
    if HEADLINE_START not in text or HEADLINE_END not in text:
        raise ValueError(f"no headline section: give the page the lines {HEADLINE_START!r} and "
                         f"{HEADLINE_END!r}")
    before, rest = text.split(HEADLINE_START, 1)
    return before + headline + rest.split(HEADLINE_END, 1)[1]


def headline_of(text: str) -> str:
    """A page's headline section, as written."""
    return HEADLINE_START + text.split(HEADLINE_START, 1)[1].split(HEADLINE_END, 1)[0] + HEADLINE_END
