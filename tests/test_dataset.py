"""Every cell of every study as one dataset (reporting/dataset.py), the rule that writes it and
`trainbench query`."""

from __future__ import annotations

import math

import pyarrow.parquet
import pytest

from trainbench.cli import main
from trainbench.reporting.documents import read_cells
from trainbench.reporting import dataset

from conftest import REPO, Workflow, published_results

# the benchmarks' results and the validation workspace's (whose profiled cells give breakdown rows)
PUBLISHED = published_results() + published_results(REPO / "validation")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    docs = read_cells(PUBLISHED)
    path = tmp_path_factory.mktemp("dataset") / "cells.parquet"
    dataset.write(docs, path)
    return docs, path


def test_every_published_cell_is_in_the_dataset_with_its_figures_and_intervals(published):
    docs, path = published
    table = dataset.read(path)
    assert list(table.columns) == list(dataset.SCHEMA)
    assert set(zip(table.study, table.cell_id)) == {(d["study"], d["cell_id"]) for d in docs}
    measured = table[(table.metric == "step_time_s") & (table.source == "measured")]
    for doc in docs:
        if doc["status"] != "ok":
            continue
        mine = measured[(measured.study == doc["study"]) & (measured.cell_id == doc["cell_id"])]
        [row] = mine.itertuples()
        assert row.value == doc["metrics"]["step_time_s"]
        interval = doc["metrics"].get("step_time_s_ci")
        if interval:
            assert [row.low, row.high] == interval
        else:
            assert math.isnan(row.low) and math.isnan(row.high)
        assert row.p_model == doc["params"]["model"] and row.gpu_name == doc["provenance"]["gpu_name"]


def test_a_cell_that_did_not_train_keeps_its_rows(published):
    docs, path = published
    table = dataset.read(path)
    oom = next(d for d in docs if d["status"] == "oom")
    rows = table[(table.study == oom["study"]) & (table.cell_id == oom["cell_id"])]
    assert set(rows.status) == {"oom"} and "step_time_s" not in set(rows[rows.source == "measured"].metric)
    assert "gpu_mem_mib" in set(rows[rows.source == "predicted"].metric)  # what the model said of it
    profiled = table[table.metric == "breakdown.matmul_s"]
    assert set(profiled.study) >= {"holdout_frameworks"}  # a profile's parts are rows too


def test_a_dataset_of_another_schema_version_is_refused(published, tmp_path):
    _, path = published
    table = pyarrow.parquet.read_table(path)
    meta = dict(table.schema.metadata)
    meta[dataset.METADATA_KEY] = b'{"version": 0}'
    old = tmp_path / "old.parquet"
    pyarrow.parquet.write_table(table.replace_schema_metadata(meta), old)
    with pytest.raises(ValueError, match="dataset schema 0"):
        dataset.read(old)


def test_trainbench_query_answers_all_cells_where_in_one_line(published, capsys):
    _, path = published
    assert main(["query", "metric == 'mfu' and p_strategy == 'zero3' and source == 'measured'",
                 "--dataset", str(path), "--csv", "--columns", "study,p_strategy,value"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "study,p_strategy,value" and len(lines) > 5
    assert all(line.split(",")[1] == "zero3" for line in lines[1:])
    assert main(["query", "nonsense == 1", "--dataset", str(path)]) != 0
    assert "nonsense" in capsys.readouterr().err


def test_the_published_dataset_holds_every_published_cell():
    """results/dataset/cells.parquet is made again whenever published results change
    (`snakemake -c1 results/dataset/cells.parquet`): a result without its rows fails here."""
    table = dataset.read(REPO / "results" / "dataset" / "cells.parquet")
    benchmarks = published_results()  # the validation workspace's are its own
    assert set(zip(table.study, table.cell_id)) == {(p.parent.parent.name, p.parent.name) for p in benchmarks}


def test_the_dataset_rule_writes_it_on_a_fresh_clone(tmp_path):
    clone = Workflow(tmp_path, clone=True)
    (clone.root / "results" / "dataset" / "cells.parquet").unlink(missing_ok=True)
    clone.snakemake("results/dataset/cells.parquet")
    table = dataset.read(clone.path("results/dataset/cells.parquet"))
    # the benchmarks' cells: the validation workspace makes its own (snakemake -d validation)
    published = published_results()
    assert len(set(zip(table.study, table.cell_id))) == len(published)
