"""What the package imports, it declares: every third-party package a module of src/trainbench imports
is a dependency in pyproject.toml or pinned in envs/requirements.txt (torch: installed first, by
envs/bootstrap.sh, for the machine's GPUs or none)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from conftest import REPO

INSTALLED_FIRST = {"torch": "envs/bootstrap.sh installs the build for the machine (CUDA or CPU)"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_packages() -> set[str]:
    """The top-level packages src/trainbench imports, outside the standard library and itself."""
    found = set()
    for path in (REPO / "src" / "trainbench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "trainbench"}


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [line for line in (REPO / "envs" / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    return {normalise(re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0]) for spec in [*project, *pinned]}


def test_every_package_the_package_imports_is_declared():
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for package in imported_packages():
        names = {normalise(d) for d in distributions.get(package, [package])}
        if package not in INSTALLED_FIRST and not names & declared():
            undeclared[package] = sorted(names)
    assert undeclared == {}, "declare them in pyproject.toml and pin them in envs/requirements.txt"
