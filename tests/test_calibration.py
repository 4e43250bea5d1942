"""The code says why; the record says on what. Measured and fitted figures keep their history (the
cells, the date, the evidence) in src/trainbench/calibration.yaml, checked against the code here; the
package's source names no commit and cites no run log, and the two models stay mostly code."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest
import yaml

from conftest import REPO

SRC = REPO / "src" / "trainbench"
RECORD = SRC / "calibration.yaml"
FIELDS = {"what", "measured_on", "date", "evidence", "why"}
FIGURE = ("value", "value_in", "measured")  # exactly one: the figure, where it lives, or what was measured

# A commit named in prose: a 7-40 hex token beside a word that points at history ("at", "fix of", ...).
COMMIT = re.compile(r"\b(?:commits?|fix(?:es|ed)?|at|of|since|before|after|reruns?|ran|from|until)"
                    r"[\s#`(]+([0-9a-f]{7,40})\b", re.I)
# A run's log or the archive of the runs: the record's, cited from calibration.yaml, not from code.
RUN_LOG = re.compile(r"results/provenance|gpu-runs|[\w./-]+\.log\b")
PROSE_BUDGET = 0.20
MODELS = ("predict/memory_model.py", "predict/time_model.py")
# Module-level figures of the models that no measurement set, and why (every other one has a record).
NOT_MEASURED = {
    "predict.memory_model.DS_MAX_LIVE_PARAMETERS": "DeepSpeed's default stage3_max_live_parameters",
    "predict.memory_model.MIB": "a unit",
    "predict.time_model.DEFAULT_CPU_THREADS": "a default, where a cell does not say",
    "predict.time_model.OPTIMIZER_BYTES": "counted: Adam's reads and writes per parameter",
    "predict.time_model.SHARPNESS": "the shape of the host-device blend, chosen",
}


def commits_named(text: str) -> list[str]:
    return [m.group(1) for m in COMMIT.finditer(text)]


def prose_lines(text: str) -> set[int]:
    """Lines holding a comment, or part of a module's, class's or function's docstring."""
    lines = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.COMMENT}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines |= set(range(first.lineno, first.end_lineno + 1))
    return lines


def prose_share(text: str) -> float:
    """Comment and docstring lines over all non-blank lines."""
    filled = {n for n, line in enumerate(text.splitlines(), 1) if line.strip()}
    return len(prose_lines(text) & filled) / len(filled)


def prose_of(text: str) -> str:
    lines = text.splitlines()
    return "\n".join(lines[n - 1] for n in sorted(prose_lines(text)))


def test_the_checks_find_what_they_look_for():
    assert commits_named("the fix of b222dfd; reruns of c7c5ed6; windowed at\n# fbc3ff2; at 2755225") == [
        "b222dfd", "c7c5ed6", "fbc3ff2", "2755225"]
    assert commits_named("0123456789abcdef, at 1024 tokens, 1979e12 FLOP/s, of 50,257 words") == []
    code = '"""Doc,\ntwo lines."""\n\nX = 1  # why\n# more\n\ndef f():\n    """One."""\n    return "x.log"\n'
    assert prose_share(code) == 5 / 7
    assert RUN_LOG.findall(prose_of(code)) == []  # a path in a string of code is no citation
    assert RUN_LOG.search(prose_of("# see results/provenance/gpu-runs/a-1.log\nX = 1\n"))


def test_the_source_names_no_commit():
    named = {str(p.relative_to(SRC)): commits_named(p.read_text())
             for p in sorted(SRC.rglob("*")) if p.suffix in (".py", ".yaml", ".json")}
    assert {path: found for path, found in named.items() if found} == {}


def test_the_code_cites_no_run_log():
    """Evidence is calibration.yaml's; a module's comments say why."""
    cited = {}
    for path in sorted(SRC.rglob("*.py")):
        found = RUN_LOG.findall(prose_of(path.read_text()))
        if found:
            cited[str(path.relative_to(SRC))] = found
    assert cited == {}


@pytest.mark.parametrize("module", MODELS)
def test_the_models_are_mostly_code(module):
    share = prose_share((SRC / module).read_text())
    assert share < PROSE_BUDGET, f"{module}: {share:.0%} comments and docstrings (docs/ states the model)"


def resolve(what: str):
    """The object a record's `what` names: module.NAME, module.Class.attribute or field, NAME[key]."""
    name, _, key = what.partition("[")
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module("trainbench." + ".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            fields = {f.name: f for f in dataclasses.fields(found)} if dataclasses.is_dataclass(found) else {}
            found = fields[attribute] if attribute in fields else getattr(found, attribute)
        return found[key.rstrip("]")] if key else found
    raise LookupError(what)


def record() -> list[dict]:
    return yaml.safe_load(RECORD.read_text())


def test_every_record_names_code_that_exists_and_evidence_in_the_repository():
    for entry in record():
        what = entry.get("what")
        assert FIELDS <= set(entry) and sum(k in entry for k in FIGURE) == 1, (what, sorted(entry))
        assert set(entry) <= FIELDS | set(FIGURE), (what, sorted(set(entry) - FIELDS - set(FIGURE)))
        found = resolve(what)
        if "value" in entry:
            assert found == entry["value"], f"{what}: the code has {found!r}, the record {entry['value']!r}"
        if "value_in" in entry:
            assert (REPO / entry["value_in"]).is_file(), what
        assert isinstance(entry["date"], datetime.date), what
        evidence = entry["evidence"] if isinstance(entry["evidence"], list) else [entry["evidence"]]
        assert all((REPO / path).exists() for path in evidence), (what, evidence)
        assert "\n" not in entry["why"].strip() and len(entry["why"]) <= 160, what


def test_every_measured_figure_of_the_models_has_a_record():
    recorded = {entry["what"].partition("[")[0] for entry in record()}
    missing = []
    for module in MODELS:
        name = "predict." + Path(module).stem
        tree = ast.parse((SRC / module).read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.Dict)):
                for target in node.targets:
                    constant = f"{name}.{target.id}"
                    if target.id.isupper() and not isinstance(getattr(node.value, "value", 0), str) \
                            and constant not in recorded and constant not in NOT_MEASURED:
                        missing.append(constant)
    assert missing == [], "record them in calibration.yaml, or say in NOT_MEASURED why nothing measured them"
