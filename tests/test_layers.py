"""The package's shape: stages import only the stages before them, no module imports itself round a
cycle, loading a config pulls in no later stage, and no stage folder grows past what a reader maps.

Imports are read from the source (every `import` and `from ... import`, inside functions too), so a
lazy import that would close a cycle counts as much as one at the top of a module; only imports for
type annotations (under `if TYPE_CHECKING:`) are left out, as they never run.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import trainbench

PACKAGE = Path(trainbench.__file__).parent
SHARED = {"errors", "paths"}  # imported by every stage; import no stage themselves
TOP = {"cli", "fit", "commbench", "workflow", "__main__", "__init__"}  # sit on all stages
# Modules loaded by name rather than imported: the framework registry names each runner "module:Class"
# (Framework.runner), and this module imports it with importlib. Counted as this module's imports.
STRING_LOADER = "trainbench.training.runners.load"
# Modules a folder may hold: a stage that would hold more moves a group of its modules that belong
# together into a sub-package (as training/runners/), which holds as many at most (ARCHITECTURE.md).
MAX_MODULES = 16
LOADED_NAME = re.compile(r"(trainbench(?:\.\w+)+):\w+")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: dict[str, Path], typing_too: bool = False) -> set[str]:
    """The trainbench modules `name` imports (a package's `from p import m` names module p.m); with
    typing_too, those it imports for annotations alone as well."""
    found = set()
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    # an import for type annotations alone (under `if TYPE_CHECKING:`) is no dependency at run time
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only and not typing_too:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "trainbench"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "trainbench":
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def loaded_by_name(known: dict[str, Path]) -> set[str]:
    """The modules a "module:Class" string of the package names (the registry's runners)."""
    return {match.group(1) for path in known.values() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (match := LOADED_NAME.fullmatch(node.value))}


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    known = modules()
    graph = {name: imports_of(name, path, known, typing_too) for name, path in known.items()}
    graph[STRING_LOADER] |= loaded_by_name(known)
    return graph


def stage_of(module: str) -> str:
    """The stage folder a module sits in, or its own name for a top-level module."""
    return module.split(".")[1] if module.count(".") else "__init__"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_runners_loaded_by_name_are_edges_of_the_graph():
    """The registry's runner names are modules that exist, and the loader imports them by name."""
    known = modules()
    loaded = loaded_by_name(known)
    runners = "trainbench.training.runners."
    assert {runners + "torch_native", runners + "deepspeed_engine", runners + "hf_trainer"} <= loaded
    assert loaded <= set(known) and loaded <= import_graph()[STRING_LOADER]
    assert "importlib.import_module" in known[STRING_LOADER].read_text()


def test_the_cycle_finder_finds_one():
    # the check above passes only if this one can fail
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_stage_imports_only_the_stages_before_it():
    """Types for annotations included: a stage that names a later stage's type depends on it too."""
    order = {stage: i for i, stage in enumerate(trainbench.LAYERS)}
    wrong = []
    for module, targets in import_graph(typing_too=True).items():
        stage = stage_of(module)
        for target in targets:
            to = stage_of(target)
            if stage in TOP or to == stage:
                continue
            if stage in SHARED:
                wrong.append(f"{module} -> {target} (errors and paths import no stage)")
            elif to in order and order[to] > order[stage]:
                wrong.append(f"{module} ({stage}) -> {target} ({to}, a later stage)")
            elif to in TOP:
                wrong.append(f"{module} -> {target} (the command line sits on the stages, not under them)")
    assert wrong == []


def test_every_stage_folder_is_declared_and_small():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(trainbench.LAYERS)
    for stage in trainbench.LAYERS:
        package = PACKAGE / stage
        assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), f"{stage}: no docstring"
        for folder in [package, *[p for p in package.iterdir() if (p / "__init__.py").exists()]]:
            count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
            assert count <= MAX_MODULES, (f"{folder.relative_to(PACKAGE)} holds {count} modules: move a "
                                          "group that belongs together into a sub-package")


def test_loading_a_config_imports_no_later_stage():
    code = ("import sys; from trainbench.study.config import load_config; load_config('config.yaml'); "
            "print(*(m for m in sorted(sys.modules) if m.startswith(('trainbench', 'pandas', 'torch'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=PACKAGE.parents[1]).stdout.split()
    later = [m for m in loaded if m.split(".")[0] in ("pandas", "torch")
             or (m.count(".") and stage_of(m) in {"predict", "training", "execute", "reporting"})]
    assert later == []
    assert "trainbench.study.grid" in loaded  # the check saw a real load


# --- ARCHITECTURE.md: the map and the imports, as they are ------------------------------------------

ARCHITECTURE = PACKAGE.parents[1] / "ARCHITECTURE.md"
TOP_LABELS = ("shared", "on top")  # the map's lines of top-level modules


def fenced_block(text: str, first_line: str) -> list[str]:
    """The lines of the fenced block of `text` that starts with `first_line`."""
    blocks = re.findall(r"^```\n(.*?)^```", text, re.S | re.M)
    return next(b.splitlines() for b in blocks if b.startswith(first_line))


def module_map(text: str) -> dict[str, set[str]]:
    """The map's modules by folder ("" for the package's top level): in each folder's lines, the names
    outside parentheses, separated by commas or semicolons."""
    groups: dict[str, str] = {}
    group = None
    for line in fenced_block(text, "src/trainbench/")[1:]:
        line = line.strip().lstrip("▲│").strip()
        folder = re.match(r"([a-z_]+(?:/[a-z_]+)*)/\s+(.*)", line)
        label = next((t for t in TOP_LABELS if line.startswith(t + " ")), None)
        if folder or label:  # a folder's (or the top level's) first line: a list of its own
            group, line = (folder.group(1), folder.group(2)) if folder else ("", line[len(label):])
            groups[group] = groups.get(group, "") + ","
        groups[group] += " " + line
    found = {}
    for group, words in groups.items():
        while re.search(r"\([^()]*\)", words):
            words = re.sub(r"\([^()]*\)", "", words)
        found[group] = {name.strip() for name in re.split(r"[,;]", words) if name.strip()}
    return found


def package_map() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, path in modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        folder = path.parent.relative_to(PACKAGE).as_posix()
        found.setdefault("" if folder == "." else folder, set()).add(path.stem)
    return found


def stage_imports() -> dict[str, set[str]]:
    """Each stage's (or top module's) imports of other stages and top modules, as the code has them."""
    found: dict[str, set[str]] = {}
    for module, targets in import_graph(typing_too=True).items():
        stage = stage_of(module)
        found.setdefault(stage, set())
        found[stage] |= {stage_of(t) for t in targets if stage_of(t) != stage}
    return {stage: targets for stage, targets in found.items() if targets}


def test_the_map_parser_reads_names_outside_parentheses():
    text = ("```\nsrc/trainbench/\n  a/   x (one, two), y,\n      ▲       z (three (3)); w\n"
            "  a/b/  v\n  shared      p, q (shared)\n```\n")
    assert module_map(text) == {"a": {"x", "y", "z", "w"}, "a/b": {"v"}, "": {"p", "q"}}


def test_architecture_names_every_module_in_its_folder_and_none_that_is_not():
    assert module_map(ARCHITECTURE.read_text()) == package_map()


def test_architecture_lists_the_imports_as_they_are():
    lines = fenced_block(ARCHITECTURE.read_text(), "study ")
    listed = {}
    for line in lines:
        stage, targets = re.fullmatch(r"(\S+)\s+─▶\s+(.+)", line).groups()
        listed[stage] = set(targets.split(", "))
    assert listed == stage_imports()
