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
from trainbench.registry.models import known_models, register_user_models
from trainbench.study.grid import Study, expand_study
from trainbench.study.models import parse_models
from trainbench.study.params import PARAMS_BY_NAME
from trainbench.study.schema import build_schema
from trainbench.study.timing import TimingSettings

STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
CONFIG_NAME = "config.yaml"  # what a config given as a mapping (Snakemake's `config`) is called


@dataclass
class Config:
    studies: dict[str, Study]
    default_studies: dict[str, list[str]] = field(default_factory=dict)
    placement: str = "local"  # where cells run: this machine, or a cluster executor
    origins: dict[str, str] = field(default_factory=dict)  # study -> the file that defines it
    models: dict[str, Any] = field(default_factory=dict)  # the user's models by name (ModelSpec)
    base: Path = Path(".")  # the folder of config.yaml: its study files, models and results are under it
    model_origins: dict[str, str] = field(default_factory=dict)  # model -> the file that defines it
    source: str = CONFIG_NAME  # the config file's own name, as its problems are prefixed with

    def place(self, problems: list[str]) -> list[str]:
        """Problems found after loading (a model that cannot be built, a report column, a cell without
        a runner), each prefixed with the file it is in."""
        return placed(problems, self.origins, self.model_origins, self.source)

    def study(self, name: str) -> Study:
        if name not in self.studies:
            raise ConfigError(f"unknown study {name!r}; studies: {', '.join(self.studies)} (config.yaml and "
                              "its study_files)")
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


def read_study_files(config: dict[str, Any], base: Path, own: str = CONFIG_NAME
                     ) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """config.yaml with the studies and models of its `study_files` merged in, and where each study and
    each model came from (`own`: config.yaml's, or a study file's path relative to `base`).

    Each pattern is a glob relative to `base` (the folder of config.yaml); a pattern that matches no
    file is no error (a user's own folder may be empty). A file holds a `studies` mapping and, beside
    it, a `models` one of its own; a study or model defined twice is refused, naming both places."""
    patterns = config.get("study_files") or []
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"{own}: study_files: must be a list of glob patterns, not {patterns!r}")
    if any(config.get(key) is not None and not isinstance(config[key], dict)
           for key in ("studies", "models")):
        return config, {}, {}  # the schema says what is wrong with it
    studies = dict(config.get("studies") or {})
    origins = {name: own for name in studies}
    models = dict(config.get("models") or {})
    model_origins = {name: own for name in models}
    problems: list[str] = []
    seen: set[Path] = set()
    for pattern in patterns:
        for path in sorted(base.glob(pattern)):
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            shown = str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
            try:
                with open(path) as f:
                    content = yaml.safe_load(f) or {}
            except yaml.YAMLError as error:
                problems.append(f"{shown}: not valid YAML: {error}")
                continue
            if not isinstance(content, dict) or not isinstance(content.get("studies"), dict):
                problems.append(f"{shown}: a study file holds a `studies` mapping (studies: {{name: ...}})")
                continue
            extra = sorted(set(content) - {"studies", "models"})
            if extra:
                problems.append(f"{shown}: unknown key {extra[0]!r}; a study file holds `studies` and "
                                "`models`")
            if not isinstance(content.get("models") or {}, dict):
                problems.append(f"{shown}: models: a mapping of model name to its definition")
                continue
            for name, entry in (content.get("models") or {}).items():
                if name in models:
                    problems.append(f"{shown}: model {name!r} is already defined in {model_origins[name]}")
                    continue
                models[name] = entry
                model_origins[name] = shown
            for name, spec in content["studies"].items():
                if name in studies:
                    problems.append(f"{shown}: study {name!r} is already defined in {origins[name]}")
                    continue
                studies[name] = spec
                origins[name] = shown
    if problems:
        raise ConfigError(problems)
    return {**config, "studies": studies, **({"models": models} if models else {})}, origins, model_origins


def _file_of(problem: str, origins: dict[str, str], model_origins: dict[str, str]) -> str | None:
    """The file that defines the study or model a problem is about (`studies.<name>...`, `study '<name>'`,
    `models.<name>...`), or None. A model's name may hold dots (`qwen-1.5b`), so it is looked up whole
    rather than cut at the first dot."""
    match = re.match(r"^(?:studies\.|study ')([A-Za-z0-9_-]+)", problem)
    if match:
        return origins.get(match.group(1))
    if problem.startswith("models."):
        rest = problem[len("models."):]
        named = [name for name in model_origins
                 if rest.startswith(name) and rest[len(name):][:1] in ("", ".", ":")]
        return model_origins[max(named, key=len)] if named else None
    return None


def placed(problems: list[str], origins: dict[str, str], model_origins: dict[str, str],
           own: str = CONFIG_NAME) -> list[str]:
    """Each problem prefixed with the file it is in: a study's or a model's with the file that defines it
    (config.yaml or one of its study files), any other (default_studies, study_files, ...) with `own`,
    config.yaml's name. So a reader never has to guess which file a line is about."""
    return [f"{_file_of(problem, origins, model_origins) or own}: {problem}" for problem in problems]


def _read_token_file(path: Path, dtype: str) -> tuple[int | None, int | str]:
    """A token file's id count and its largest id among the first million; (None, why) where it cannot
    feed a cell. Its size is looked at before it is mapped: numpy cannot map an empty file, nor one that
    is not a whole number of ids, and says so without naming the file."""
    import numpy

    if not path.is_file():
        return None, f"no such file: {path}"
    size, width = path.stat().st_size, numpy.dtype(dtype).itemsize
    if size == 0:
        return None, f"{path} is empty (0 bytes): it holds no token ids"
    if size % width:
        return None, (f"{path} holds {size} bytes, not a whole number of {dtype} ids ({width} bytes each); "
                      "is tokens_dtype the file's?")
    ids = numpy.memmap(path, dtype=numpy.dtype(dtype), mode="r")
    return len(ids), int(ids[:1_000_000].max())


def check_token_files(studies: dict[str, Study], base: Path) -> list[str]:
    """Each token file the cells name (`tokens`): there, long enough for a window, and holding ids the
    model has (its first million read): a mistake here is found before any cell starts."""
    problems, checked = [], {}
    for study in studies.values():
        for cell in study.cells:
            p = cell.params
            if p.tokens is None:
                continue
            where = f"study {study.name!r}, cell {cell.cell_id!r}: tokens"
            path = Path(p.tokens) if Path(p.tokens).is_absolute() else base / p.tokens
            key = (path, p.tokens_dtype)
            if key not in checked:
                checked[key] = _read_token_file(path, p.tokens_dtype)
            count, top = checked[key]
            if count is None:
                problems.append(f"{where}: {top}")
            elif count < p.seq_len + 1:
                problems.append(f"{where}: {path} holds {count} {p.tokens_dtype} ids, fewer than a window of "
                                f"seq_len + 1 = {p.seq_len + 1}")
            elif top >= known_models()[p.model].vocab_size:
                problems.append(f"{where}: {path} holds id {top}, beyond {p.model}'s vocabulary of "
                                f"{known_models()[p.model].vocab_size} (is tokens_dtype {p.tokens_dtype!r} "
                                "the file's?)")
    return problems


def load_config(source: dict[str, Any] | str | Path, base: str | Path | None = None) -> Config:
    """Validate a config (a mapping, or a YAML file's path) and expand all its studies, those of its
    `study_files` included (relative to `base`: the file's folder, or the working directory for a
    mapping, as Snakemake's working directory holds config.yaml).

    The study definition alone: what a study reports (its columns and findings) is checked by the
    reporting stage, through trainbench.workflow.load_checked, which the workflow and the command line
    use."""
    own = CONFIG_NAME
    if isinstance(source, (str, Path)):
        base = Path(source).parent if base is None else base
        own = Path(source).name
        with open(source) as f:
            source = yaml.safe_load(f) or {}
    if not isinstance(source, dict):
        raise ConfigError(f"{own} must be a mapping with a 'studies' key")
    base = Path.cwd() if base is None else Path(base)
    source, origins, model_origins = read_study_files(source, base, own)
    try:
        data = validate_structure(source)
        user_models = parse_models(data.get("models"), base)
    except ConfigError as error:
        raise ConfigError(placed(error.problems, origins, model_origins, own)) from None
    # before the studies expand: their cells name these models, and carry their definitions
    register_user_models(user_models)
    problems: list[str] = []
    if not data["studies"]:
        problems.append("no studies: none under `studies`, and no file its "
                        f"study_files name ({', '.join(data.get('study_files') or []) or 'none'}) holds one")
    studies: dict[str, Study] = {}
    for name, spec in data["studies"].items():
        try:
            studies[name] = expand_study(name, spec)
        except ConfigError as e:
            problems.extend(e.problems)
    problems += check_token_files(studies, base)
    for machine, names in data["default_studies"].items():
        for name in names:
            if name not in data["studies"]:
                problems.append(f"default_studies.{machine}: unknown study {name!r}; "
                                f"studies: {', '.join(data['studies'])}")
    if problems:
        raise ConfigError(placed(problems, origins, model_origins, own))
    return Config(studies=studies, default_studies=data["default_studies"],
                  placement=data.get("placement", "local"), origins=origins, models=user_models,
                  base=base, model_origins=model_origins, source=own)
