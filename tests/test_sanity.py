"""Sanity before performance: a timed result is a result only if the training it timed was sane. A cell
whose loss is not finite, diverged, or whose optimizer skipped timed steps is marked in its table, and
findings leave it out."""

from __future__ import annotations

import copy
import json
import math

import pytest

from trainbench.contract.result import sanity_problems
from trainbench.reporting.columns import result_text
from trainbench.reporting.findings import evaluate

from conftest import REPO

SANE = [6.2, 5.1, 4.0, 3.2, 2.9, 2.7, 2.6, 2.55, 2.5, 2.52, 2.49, 2.51]


def doc(curve, skipped=None, status="ok"):
    metrics = {"loss_curve": curve, "loss_first": curve[0], "loss_last": curve[-1],
               "optimizer_steps_skipped": skipped}
    return {"status": status, "cell_id": "c", "params": {}, "metrics": metrics}


@pytest.mark.parametrize("curve, skipped, words", [
    (SANE, None, None),
    (SANE, 0, None),
    (SANE[:4] + [math.nan] + SANE[5:], None, "the loss is nan at step 5"),
    # zero3_pipeline's tp-4 cell as published: it fell to 0.03 and climbed back
    ([10.4, 6.0, 2.0, 0.5, 0.1, 0.03, 0.2, 1.5, 2.9, 3.3, 3.1, 3.2], None,
     "diverged: the loss fell to 0.03 and its last quarter averages 3.2"),
    (SANE[:-1] + [4.0], None, "diverged: the loss fell to 2.49 and ended at 4"),
    (SANE, 3, "the optimizer skipped 3 timed step(s) (fp16 overflow)"),
    (SANE[:3], None, None),  # three steps say too little to judge divergence
])
def test_what_sane_training_is(curve, skipped, words):
    problems = sanity_problems(doc(curve, skipped))
    assert (problems == []) if words is None else (words in "; ".join(problems)), problems


def test_a_cell_that_did_not_run_has_no_sanity_to_judge():
    assert sanity_problems(doc([math.nan] * 10, status="oom")) == []


def test_an_insane_cell_is_marked_in_its_table_and_left_out_of_findings():
    published = next(d for d in (json.loads(p.read_text())
                                  for p in sorted((REPO / "results/runs/megatron").glob("*/metrics.json")))
                     if d["status"] == "ok" and len(d["metrics"].get("loss_curve") or []) >= 8
                     and not d.get("emulation"))
    assert not sanity_problems(published)
    diverged = copy.deepcopy(published)
    diverged["cell_id"] += "-diverged"
    curve = diverged["metrics"]["loss_curve"]
    diverged["metrics"]["loss_curve"] = curve[:-1] + [min(curve) + 5]
    assert result_text(diverged).startswith("ok, not sane: diverged: the loss fell to")
    finding = {"claim": "c", "fits": {}}
    [sane] = evaluate([finding], [published], [])
    [insane] = evaluate([finding], [diverged], [])
    assert sane.verdict == "reproduced" and insane.verdict != "reproduced"
    assert "not sane" in json.dumps([p.__dict__ for p in insane.pairs])


def test_warm_up_goes_on_while_fp16_loss_scaling_skips_steps(tmp_path, monkeypatch):
    """An fp16 loss scale still too large when warm-up ends makes the optimizer skip timed steps (DeepSpeed's
    and torch's start at 2^16): the cell would be timed on steps that do not train, and be marked not sane.
    Warm-up goes on until its last 3 steps trained. Two data-parallel CPU ranks, torch's own GradScaler,
    some steps' gradients made infinite."""
    from trainbench.execute.cellrun import run_cell
    from trainbench.training.runners.torch_native import OVERFLOW_STEPS_ENV

    from conftest import make_cell

    monkeypatch.chdir(tmp_path)
    # the first 3 steps skipped, one warm-up step asked: 3 skipped, then 3 that trained;
    # steps 1 and 3 skipped, 2 asked: the second step trained, but the scale had not settled
    for overflowing, asked in (("3", 1), ("1,3", 2)):
        monkeypatch.setenv(OVERFLOW_STEPS_ENV, overflowing)
        output = tmp_path / f"results/runs/t/c{asked}/metrics.json"
        cell = make_cell(precision="fp16", strategy="ddp", gpus=2, warmup_steps=asked, timed_steps=6)
        assert run_cell(cell, output, runtime_min=5, retries=0) == 0
        result = json.loads(output.read_text())
        metrics = result["metrics"]
        assert metrics["warmup_steps"] == 6 and len(metrics["warmup_step_times_s"]) == 6, overflowing
        assert metrics["optimizer_steps_skipped"] == 0 and sanity_problems(result) == []
        assert all(math.isfinite(loss) for loss in metrics["loss_curve"])
