"""Findings: relations between a study's cells, judged on real published metrics files and on small
synthetic cases (a claim that must fail is not reproduced, one whose cells are missing is not yet
measured, planned cells are judged on the models' figures only as "predicted")."""

from __future__ import annotations

import copy
import math

import pandas
import pytest

from trainbench.study.config import load_config
from trainbench.reporting.findings import Finding, evaluate, judge, pairs
from trainbench.contract.result import read_search
from trainbench.reporting.documents import current, read_reported
from trainbench.reporting.tables import write_tables

from conftest import PROJECT_CONFIG, REPO, timed_three_steps

GPT2 = "results/runs/gpt2_zero/strategy~{s}__precision~{p}__offload_optimizer~{o}__ort~false/metrics.json"


def gpt2_cell(strategy: str, precision: str = "fp16", offload: str = "false") -> dict:
    return read_reported(REPO / GPT2.format(s=strategy, p=precision, o=offload))


ID_KEYS = ["strategy", "precision", "offload_optimizer", "ort"]


def test_which_ranks_memory_a_finding_reads_decides_its_verdict_in_the_published_gpt2_zero_cells():
    docs = [gpt2_cell(s) for s in ("zero0", "zero1", "zero2", "zero3")]
    spec = {"claim": "at fp16, ZeRO stages 1-3 use less GPU memory than stage 0",
            "compare": {"metric": "gpu_mem_rank0_gib", "less": {"strategy": ["zero1", "zero2", "zero3"]},
                        "than": {"strategy": "zero0"}}}
    [rank0] = evaluate([spec], docs, ID_KEYS)
    assert rank0.verdict == "partly" and rank0.summary == "partly (2 of 3 pairs)"
    # ZeRO-3 keeps more on rank 0 than ZeRO-0: shown first, by how much
    assert rank0.evidence.startswith("zero3 vs zero0: 5.62 vs 5.56, +1.1% (does not hold)")
    assert "zero1 vs zero0: 4.89 vs 5.56, -12.1% (holds)" in rank0.evidence
    worst = copy.deepcopy(spec)
    # the worst rank: ZeRO-0's 5.85 GiB above every other stage's 5.59-5.62, ZeRO-3's included
    worst["compare"]["metric"] = "gpu_mem_max_gib"
    assert evaluate([worst], docs, ID_KEYS)[0].summary == "reproduced (3 of 3 pairs)"
    allocated = copy.deepcopy(spec)
    allocated["compare"]["metric"] = "torch_alloc_rank0_gib"  # what the strategy controls: 2.2-2.3 < 2.9
    assert evaluate([allocated], docs, ID_KEYS)[0].verdict == "reproduced"


def test_timed_figures_are_judged_with_their_intervals_or_said_to_be_medians():
    lightning = {s: read_reported(REPO / f"results/runs/lightning/strategy~{s}/metrics.json")
                 for s in ("deepspeed_stage_2", "deepspeed_stage_2_offload")}
    spec = {"claim": "offload costs about 3x", "compare": {
        "metric": "step_time_ms", "more": {"strategy": "deepspeed_stage_2_offload"},
        "than": {"strategy": "deepspeed_stage_2"}, "factor": {"min": 2.25, "max": 3.75}}}
    [about3] = evaluate([spec], list(lightning.values()), ["strategy"])
    assert about3.verdict == "not reproduced"  # 1.68-2.00x measured: clearly outside
    assert "123.6 (120.9-126.5) vs 67.1 (63.4-72.1), +84.4% (does not hold)" in about3.evidence
    spec["compare"]["factor"] = {"min": 1.5, "max": 2.25}  # the whole interval inside: a hold
    [about2] = evaluate([spec], list(lightning.values()), ["strategy"])
    assert about2.verdict == "reproduced" and "+84.4% (holds)" in about2.evidence
    spec["compare"]["factor"] = {"min": 1.8}  # the interval straddles 1.8: undecided, not a hold
    [straddle] = evaluate([spec], list(lightning.values()), ["strategy"])
    assert straddle.verdict == "not reproduced"
    assert "1 pair within the intervals (undecided)" in straddle.evidence
    # cells timed three steps have no interval: judged on the medians and said so
    docs = [current(timed_three_steps(gpt2_cell("zero1", offload=o))) for o in ("false", "true")]
    offload = {"claim": "offload slows", "compare": {
        "metric": "step_time_ms", "more": {"offload_optimizer": True}, "than": {"offload_optimizer": False}}}
    [slower] = evaluate([offload], docs, ID_KEYS)
    assert slower.summary == "reproduced (1 of 1 pair, on medians alone)"
    assert slower.pairs[0].medians_only


def test_a_searched_largest_batch_is_a_range_and_a_claim_it_contradicts_is_not_reproduced():
    cell = "strategy~{s}__model~gpt-2.5b__gpus~2__tp~2__offload_optimizer~false"
    docs = [{**read_reported(REPO / f"results/runs/megatron/{cell.format(s=s)}/metrics.json"),
             "search": read_search(REPO / f"results/search/megatron/{cell.format(s=s)}/max_batch.json")}
            for s in ("zero0", "zero3")]
    spec = {"claim": "ZeRO-3 raises tensor parallel's largest batch", "compare": {
        "metric": "max_global_batch", "more": {"strategy": "zero3"}, "than": {"strategy": "zero0"}}}
    [result] = evaluate([spec], docs, ["strategy", "model", "gpus", "tp", "offload_optimizer"])
    assert result.verdict == "not reproduced"  # 40 (44 failed) against 44 (48 failed)
    assert result.evidence == "zero3 vs zero0: 40 (40-43) vs 44 (44-47), -9.1% (does not hold)"


def doc(cell_id: str, status: str = "ok", **params) -> dict:
    """A synthetic table row: a cell's parameters and what it measured (metrics) or was predicted."""
    metrics = params.pop("metrics", {})
    predicted = params.pop("predicted", {})
    return {"cell_id": cell_id, "status": status, "reason": None, "params": params, "metrics": metrics,
            "predicted": predicted, "predicted_now": predicted, "predicted_time": {}, "provenance": {}}


def memory(mib: float) -> dict:
    return {"gpu_mem_used_mib": [mib, mib]}


LESS = {"claim": "zero3 uses less GPU memory than zero0", "compare": {
    "metric": "gpu_mem_max_mib", "less": {"strategy": "zero3"}, "than": {"strategy": "zero0"}}}


def test_pairs_are_cells_that_differ_only_in_the_named_keys():
    cells = [{"strategy": s, "gpus": g, "seed": 0} for s in ("zero0", "zero3") for g in (2, 4)]
    assert pairs(Finding.parse(LESS), cells, ["strategy", "gpus"]) == [(2, 0), (3, 1)]
    rising = Finding.parse({"claim": "c", "compare": {"metric": "gpu_mem_max_mib", "rises_with": "gpus"}})
    assert pairs(rising, cells, ["strategy", "gpus"]) == [(1, 0), (3, 2)]
    where = Finding.parse({**LESS, "compare": {**LESS["compare"], "where": {"gpus": 4}}})
    assert pairs(where, cells, ["strategy", "gpus"]) == [(3, 1)]


def test_a_claim_the_cells_contradict_is_not_reproduced_by_how_much():
    docs = [doc("a", strategy="zero0", metrics=memory(1000)),
            doc("b", strategy="zero3", metrics=memory(1500))]
    [result] = evaluate([LESS], docs, ["strategy"])
    assert result.verdict == "not reproduced" and result.summary == "not reproduced (0 of 1 pair)"
    assert result.evidence == "zero3 vs zero0: 1,500 vs 1,000, +50.0% (does not hold)"


def test_missing_and_planned_cells_are_not_yet_measured_and_predictions_are_labelled():
    docs = [doc("a", "planned", strategy="zero0", predicted={"gpu_mem_mib": 2000, "fits": True}),
            doc("b", "planned", strategy="zero3", predicted={"gpu_mem_mib": 900, "fits": True})]
    [result] = evaluate([LESS], docs, ["strategy"])
    assert result.verdict == "not yet measured"
    assert result.summary == "not yet measured; predicted: reproduced (1 of 1 pair)"
    assert result.evidence == "zero3 vs zero0: predicted 900 vs 2,000, 0.45x (holds)"
    assert result.pairs[0].outcome is None and result.pairs[0].predicted_outcome == "holds"
    # without predictions, nothing but the count
    docs = [doc("a", "planned", strategy="zero0"), doc("b", "planned", strategy="zero3")]
    [result] = evaluate([LESS], docs, ["strategy"])
    assert (result.summary, result.evidence) == ("not yet measured",
                                                  "1 pair not yet measured, without a prediction")
    # a measured pair decides; the planned ones are counted beside it
    docs = [doc("a", strategy="zero0", gpus=2, metrics=memory(1000)),
            doc("b", strategy="zero3", gpus=2, metrics=memory(500)),
            doc("c", "planned", strategy="zero0", gpus=4, predicted={"gpu_mem_mib": 900}),
            doc("d", "planned", strategy="zero3", gpus=4, predicted={"gpu_mem_mib": 950})]
    [result] = evaluate([LESS], docs, ["strategy", "gpus"])
    assert result.summary == "reproduced (1 of 1 pair)"
    assert result.evidence.endswith("; 1 pair not yet measured (predicted: 0 of 1 hold)")


def test_fits_and_oom_judge_each_cell_and_out_of_memory_is_above_every_cell_that_fit():
    docs = [doc("a", strategy="zero3", tp=1, metrics=memory(1000)),
            doc("b", "oom", strategy="zero3", tp=2, metrics=memory(3000)),
            doc("c", "planned", strategy="zero3", tp=4,
                predicted={"fits": False, "short_of": ["GPU memory"]}),
            doc("d", "unsupported", strategy="zero3", tp=8)]
    docs[1]["reason"] = "OOM at step 2 (timed) on rank 0: CUDA out of memory"
    fits = {"claim": "every tp trains", "fits": {"strategy": "zero3"}}
    [result] = evaluate([fits], docs, ["tp"])
    assert result.summary == "partly (1 of 2 cells)"  # the unsupported cell takes no part
    assert result.evidence.startswith("tp 2: OOM at step 2 (timed) (does not hold); tp 1: trains (holds)")
    assert "1 cell not yet measured (predicted: 0 of 1 hold)" in result.evidence
    rising = {"claim": "memory rises with tp", "compare": {"metric": "gpu_mem_max_mib", "rises_with": "tp"}}
    [result] = evaluate([rising], docs, ["tp"])
    assert result.verdict == "reproduced" and "tp 2 vs tp 1: OOM vs 1,000 (holds)" in result.evidence


def test_same_within_a_tolerance():
    docs = [doc("a", strategy="ddp", metrics={"test_accuracy": 0.90}),
            doc("b", strategy="fsdp", metrics={"test_accuracy": 0.895}),
            doc("c", strategy="zero2", metrics={"test_accuracy": 0.85})]
    spec = {"claim": "accuracy within a point", "compare": {
        "metric": "test_accuracy", "same": {"strategy": ["fsdp", "zero2"]}, "as": {"strategy": "ddp"},
        "within": 0.01}}
    [result] = evaluate([spec], docs, ["strategy"])
    assert result.summary == "partly (1 of 2 pairs)"
    assert "zero2 vs ddp: 85.0% vs 90.0%, apart by 5.0% (does not hold)" in result.evidence


@pytest.mark.parametrize(("a", "b", "outcome"), [
    ((1.0, 2.0), (3.0, 4.0), "holds"), ((3.0, 4.0), (1.0, 2.0), "fails"),
    ((1.0, 3.0), (2.0, 4.0), "unresolved"),
    ((2.0, 2.0), (2.0, 2.0), "fails"), ((math.inf, math.inf), (5.0, 5.0), "fails"),
    ((math.inf, math.inf), (math.inf, math.inf), "unresolved")])
def test_less_is_decided_only_where_the_ranges_leave_no_doubt(a, b, outcome):
    assert judge(Finding.parse(LESS), a, b) == outcome


def test_every_published_study_declares_findings_and_its_table_shows_them_as_its_csv_says(tmp_path):
    config = load_config(PROJECT_CONFIG)
    for name in ("gpt2_zero", "lightning", "llama", "megatron", "zero3_pipeline"):
        assert config.study(name).findings, name
        md = (REPO / "results" / "tables" / f"{name}.md").read_text()
        csv = pandas.read_csv(REPO / "results" / "tables" / f"{name}.findings.csv")
        section = md.split("## Findings", 1)[1].split("\n## ", 1)[0]  # up to the next section (References)
        rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ") and
                not line.startswith("| #") and not line.startswith("| ---")]
        assert len(rows) == len(config.study(name).findings) == csv.finding.nunique()
        for row, (_, first) in zip(rows, csv.groupby("finding", sort=True).first().iterrows()):
            expected = [first.claim, first.checked_as, first.summary, first.evidence]
            assert [c.strip().replace("\\|", "|") for c in row[1:]] == expected


def test_write_tables_writes_the_findings_csv_and_section_from_one_computation(tmp_path):
    docs = [doc("a", strategy="zero0", metrics=memory(1000)), doc("b", strategy="zero3", metrics=memory(500))]
    for d in docs:
        d["params"].update(model="gpt2-tiny", device="cpu", gpus=2, global_batch=4)
        d.pop("predicted_now"), d.pop("predicted_time")
    write_tables(docs, study="t", description="d", id_keys=["strategy"], report=["gpu_mem_max_mib"],
                 csv_path=tmp_path / "t.csv", md_path=tmp_path / "t.md", findings=[LESS],
                 findings_path=tmp_path / "t.findings.csv")
    md = (tmp_path / "t.md").read_text()
    assert "## Findings" in md and "| 1 | zero3 uses less GPU memory than zero0 |" in md
    assert "reproduced (1 of 1 pair)" in md
    row = pandas.read_csv(tmp_path / "t.findings.csv").to_dict("records")[0]
    expected = {"finding": 1, "verdict": "reproduced", "cell": "b", "against": "a", "basis": "measured",
                "outcome": "holds"}
    assert {key: row[key] for key in expected} == expected
    assert row["summary"] in md and row["evidence"] in md
