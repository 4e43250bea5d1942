"""The sweep's second half, and what needs the whole of it: at least 95% of the causal LMs that plain
transformers trains are accepted, and docs/architectures.md is what the sweep finds (the first half runs
in test_architectures.py, on the other test worker)."""

from __future__ import annotations

import pytest
import transformers

from trainbench.checks.architectures import PAGE, markdown, summary

from conftest import REPO
from test_architectures import assert_each_accepted_type_counted_right, sweep_half, trained_and_mixtures


@pytest.fixture(scope="module")
def second_half(tmp_path_factory):
    return sweep_half(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def rows(tmp_path_factory, second_half):
    """Every type's row in the sweep's order (its types sorted): the first half's waited for where the
    other worker is making it."""
    return sorted([*sweep_half(tmp_path_factory, 0), *second_half], key=lambda row: row.model_type)


def test_every_causal_lm_of_the_second_half_that_transformers_trains_is_counted_right(second_half):
    assert_each_accepted_type_counted_right(second_half)


def test_most_causal_lms_that_transformers_trains_are_accepted_every_mixture_among_them(rows):
    """At least 95% of the types plain transformers trains are accepted, every mixture of experts among
    them (each half's test holds each accepted one counted right)."""
    total = summary(rows)
    assert total["trained"] >= 140, "the sweep's tiny configs no longer train: its shrinking broke"
    assert total["accepted"] >= 0.95 * total["trained"], [(r.model_type, r.reason) for r in rows
                                                         if r.status == "refused"]
    _, mixtures = trained_and_mixtures(rows)
    assert len(mixtures) >= 30


def test_the_coverage_page_is_what_the_sweep_finds(rows):
    expected = markdown(rows, transformers.__version__)
    assert (REPO / PAGE).read_text() == expected, (
        "docs/architectures.md is stale: run `trainbench check-models architectures --write`")
