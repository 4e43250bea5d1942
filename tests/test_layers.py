"""The package's shape: stages import only the stages before them, no module imports itself round a
cycle, loading a config pulls in no later stage, and no stage folder grows past what a reader maps.

Imports are read from the source (every `import` and `from ... import`, inside functions too), so a
lazy import that would close a cycle counts as much as one at the top of a module; only imports for
type annotations (under `if TYPE_CHECKING:`) are left out, as they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trainbench

PACKAGE = Path(trainbench.__file__).parent
SHARED = {"errors", "paths"}  # imported by every stage; import no stage themselves
TOP = {"cli", "fit", "commbench", "workflow", "__main__", "__init__"}  # sit on all stages


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


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known, typing_too) for name, path in known.items()}


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
            assert count <= 12, f"{folder.relative_to(PACKAGE)} holds {count} modules"


def test_loading_a_config_imports_no_later_stage():
    code = ("import sys; from trainbench.study.config import load_config; load_config('config.yaml'); "
            "print(*(m for m in sorted(sys.modules) if m.startswith(('trainbench', 'pandas', 'torch'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=PACKAGE.parents[1]).stdout.split()
    later = [m for m in loaded if m.split(".")[0] in ("pandas", "torch")
             or (m.count(".") and stage_of(m) in {"predict", "training", "execute", "reporting"})]
    assert later == []
    assert "trainbench.study.grid" in loaded  # the check saw a real load
