"""Load config.yaml, validate it against the schema, and expand every study into cells.

Errors are collected and raised together as one ConfigError whose lines each name the place
(`studies.smoke.axes.micro_batch[1]`, or a study and cell) and what is allowed, so the Snakefile can
print them and stop before any job starts.
"""

from __future__ import annotations

import copy
import decimal
import difflib
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from trainbench.errors import ConfigError
from trainbench.study.grid import Study, expand_study
from trainbench.study.params import PARAMS_BY_NAME
from trainbench.study.schema import build_schema
from trainbench.study.timing import TimingSettings

STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass
class Config:
    studies: dict[str, Study]
    default_studies: dict[str, list[str]] = field(default_factory=dict)
    placement: str = "local"  # where cells run: this machine, or a cluster executor

    def study(self, name: str) -> Study:
        if name not in self.studies:
            raise ConfigError(f"unknown study {name!r}; studies in config.yaml: {', '.join(self.studies)}")
        return self.studies[name]

    def default_targets_studies(self, have_gpus: bool) -> list[str]:
        return self.default_studies["with_gpus" if have_gpus else "without_gpus"]


def _path_text(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _path_text(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        parts = []
        for key in extra:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            parts.append(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}")
        return "\n".join(parts)
    if error.validator == "type" and error.validator_value == "object":
        return (f"{where}: must be a mapping (key: value, ...), not a {_yaml_kind(error.instance)}: "
                f"{error.instance!r}")[:300]
    key = next((p for p in reversed(list(error.absolute_path)) if isinstance(p, str)), None)
    param = PARAMS_BY_NAME.get(key) if key else None
    allowed = f"; {key} must be {param.allowed()}" if param else ""
    if error.validator == "enum":
        return (f"{where}: {error.instance!r} is not allowed"
                f"{allowed or '; allowed: ' + repr(error.validator_value)}")
    if error.validator == "type" and _float_text(error.instance) is not None:
        # a number YAML 1.1 read as a string, where no coercion applies (an integer's place)
        plain = format(decimal.Decimal(error.instance.strip()), "f")
        return (f"{where}: {error.instance!r} is a string to YAML, not a number (YAML 1.1 reads an "
                f"exponent without a dot and a sign as text): write {plain}{allowed}")
    return f"{where}: {error.message}{allowed}"


def _yaml_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), "value")


def _float_text(value: Any) -> float | None:
    """A string YAML 1.1 left unread that is a float to Python and JSON (`5e-5`, `1e-09`)."""
    if not isinstance(value, str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


# the `timing` fields that take a fraction or seconds (study/timing.py)
_TIMING_NUMBERS = {f.name for f in fields(TimingSettings) if f.metadata["type"] == "number"}


def _coerce_numbers(node: Any) -> Any:
    """YAML 1.1 reads `5e-5` (no dot in the mantissa) as a string; accept such spellings where a float
    is expected: float parameters, and timing's fractions and seconds."""

    def fix(key: str, value: Any, floats=None) -> Any:
        param = PARAMS_BY_NAME.get(key)
        wants_float = key in floats if floats is not None else bool(param and param.kind == "float")
        number = _float_text(value) if wants_float else None
        return value if number is None else number

    def fix_mapping(mapping: Any, lists: bool = False, floats=None) -> None:
        if not isinstance(mapping, dict):
            return
        for key, value in mapping.items():
            if lists and isinstance(value, list):
                mapping[key] = [fix(key, v, floats) for v in value]
            else:
                mapping[key] = fix(key, value, floats)

    studies = node.get("studies") if isinstance(node, dict) else None
    for study in studies.values() if isinstance(studies, dict) else ():
        if not isinstance(study, dict):
            continue
        fix_mapping(study.get("settings"))
        fix_mapping(study.get("axes"), lists=True)
        for section in ("include", "exclude"):
            for entry in study.get(section) or []:
                fix_mapping(entry)
        for override in [*(study.get("execution_overrides") or []), *(study.get("timing_overrides") or [])]:
            if isinstance(override, dict):
                fix_mapping(override.get("when"))
        fix_mapping(study.get("timing"), floats=_TIMING_NUMBERS)
        for override in study.get("timing_overrides") or []:
            if isinstance(override, dict):
                fix_mapping(override.get("set"), floats=_TIMING_NUMBERS)
    return node


def validate_structure(raw: dict[str, Any]) -> dict[str, Any]:
    """Schema-validate a config mapping; return a copy with top-level defaults filled in."""
    if not isinstance(raw, dict):
        raise ConfigError("config.yaml must be a mapping with a 'studies' key")
    data = _coerce_numbers(copy.deepcopy(raw))
    schema = build_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    problems = [_describe(e) for e in errors]
    for name in data.get("studies", {}) if isinstance(data.get("studies"), dict) else ():
        if not STUDY_NAME.match(str(name)):
            problems.append(f"studies.{name}: study names use letters, digits, '_' and '-' only")
    if problems:
        raise ConfigError(problems)
    defaults = schema["properties"]["default_studies"]["default"]
    data["default_studies"] = {**defaults, **(data.get("default_studies") or {})}
    return data


def load_config(source: dict[str, Any] | str | Path) -> Config:
    """Validate a config (a mapping, or a YAML file's path) and expand all its studies.

    The study definition alone: what a study reports (its columns and findings) is checked by the
    reporting stage, through trainbench.workflow.load_checked, which the workflow and the command line
    use."""
    if isinstance(source, (str, Path)):
        with open(source) as f:
            source = yaml.safe_load(f) or {}
    data = validate_structure(source)
    problems: list[str] = []
    studies: dict[str, Study] = {}
    for name, spec in data["studies"].items():
        try:
            studies[name] = expand_study(name, spec)
        except ConfigError as e:
            problems.extend(e.problems)
    for machine, names in data["default_studies"].items():
        for name in names:
            if name not in data["studies"]:
                problems.append(f"default_studies.{machine}: unknown study {name!r}; "
                                f"studies: {', '.join(data['studies'])}")
    if problems:
        raise ConfigError(problems)
    return Config(studies=studies, default_studies=data["default_studies"],
                  placement=data.get("placement", "local"))
