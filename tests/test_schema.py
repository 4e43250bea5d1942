"""The config schema: generated from the parameter table, documented key by key."""

from __future__ import annotations

import yaml

from trainbench.cli import main as trainbench
from trainbench.study.schema import build_schema


def test_committed_schema_is_the_generated_one(repo, capsys):
    assert trainbench(["schema", "--check", str(repo / "workflow/schemas/config.schema.yaml")]) == 0
    committed = yaml.safe_load((repo / "workflow/schemas/config.schema.yaml").read_text())
    assert committed == build_schema()


def test_schema_check_detects_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "schema.yaml"
    stale.write_text("type: object\n")
    assert trainbench(["schema", "--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err


def _keys(schema, path=""):
    """Every named key of the schema with its definition."""
    for name, definition in (schema.get("properties") or {}).items():
        yield f"{path}.{name}".lstrip("."), definition
        yield from _keys(definition, f"{path}.{name}")
        if isinstance(definition.get("items"), dict):
            yield from _keys(definition["items"], f"{path}.{name}[]")
        if isinstance(definition.get("additionalProperties"), dict):
            yield from _keys(definition["additionalProperties"], f"{path}.{name}.*")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _keys(schema["additionalProperties"], f"{path}.*")


def test_every_key_has_a_description_and_a_default():
    keys = list(_keys(build_schema()))
    assert len(keys) > 100  # parameters appear under settings, axes, include, exclude, ...
    missing = [(k, field) for k, d in keys for field in ("description", "default") if field not in d]
    assert not missing, missing[:10]
