"""Every repository path the package, the docs, the benchmarks and the tools name exists: a file that
moved or went leaves no reference behind in what a reader follows."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

TOP_FOLDERS = ("bench", "docs", "envs", "examples", "profiles", "results", "src", "studies", "tests", "tools",
               "validation", "workflow", ".ci")
PATH = re.compile(r"(?<![\w./~-])((?:%s)/[\w.<>{}*~+/-]*[\w>}*])" % "|".join(map(re.escape, TOP_FOLDERS)))
PLACEHOLDER = re.compile(r"[<>{}*]|\.\.\.")  # results/tables/<study>.md: a pattern, not a path
SCANNED = ("src", "docs", "bench", "tools", "README.md", "pyproject.toml")
# Paths named that are not in the repository, by design, and why.
NOT_IN_THE_REPOSITORY = {
    "results/comm/h200-n2x8.json": "the table a two-node commbench run makes (communication.md's example)",
    "results/.gitignore": "written by the workflow where a study file is git-ignored (a user's own)",
    "results/tables/mine.md": "a table of a user's study (config.md's example)",
    "results/tables/sweep.md": "a table of a user's study (slurm.md's example)",
    "results/tables/try-cpu.md": "a table of a user's study (your-model.md's example)",
    "results/tables/qwen-strategies.md": "a table of a user's study (your-model.md's example)",
    "results/runs/float8/strategy~fsdp__model~gpt-5.8b__gpus~8__micro_batch~4__float8~tensorwise__compile~true/"
    "metrics.json": "a planned cell, the target float8.md submits to a cluster",
    "workflow/bare": "a ratio in plan_scaling's report (the workflow's time over the bare Snakefile's)",
}


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(text) if not PLACEHOLDER.search(m.group(1))]


def scanned_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", *SCANNED], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()
    return [REPO / name for name in listed if not name.endswith((".png", ".gz", ".xz", ".parquet"))]


def git_ignores(paths: list[str]) -> set[str]:
    """Those of `paths` git ignores (a run's outputs, a user's own files), as files or as folders."""
    asked = [p for path in paths for p in (path, path + "/")]
    found = subprocess.run(["git", "check-ignore", "--no-index", "--", *asked], cwd=REPO, capture_output=True,
                           text=True).stdout.split()
    return {p.rstrip("/") for p in found}


def exists(path: str) -> bool:
    """In the repository, or in the validation workspace (commands run there with -d validation), or
    named without its extension (results/comm/h200-n4x8: its .json and .csv)."""
    for candidate in (REPO / path, REPO / "validation" / path):
        if candidate.exists() or any(candidate.parent.glob(candidate.name + ".*")):
            return True
    return False


def test_the_path_finder_finds_paths_and_leaves_patterns():
    text = ("see `bench/overhead.py`, tools/gpu-host-run.sh. results/tables/<study>.md, "
            "src/trainbench/{a,b}.py and ../tools/x.sh; plain words/like this")
    assert named_paths(text) == ["bench/overhead.py", "tools/gpu-host-run.sh"]
    assert exists("results/comm/h200-n4x8") and exists("results/tables/holdout_unchanged.md")
    assert not exists("tools/gpu-runs/holdout-2.sh")


def test_every_path_named_exists():
    named = {(str(f.relative_to(REPO)), path) for f in scanned_files() for path in named_paths(f.read_text())}
    missing = {(where, path) for where, path in named
               if not exists(path) and path not in NOT_IN_THE_REPOSITORY}
    ignored = git_ignores(sorted({path for _, path in missing}))
    assert sorted((where, path) for where, path in missing if path not in ignored) == []


@pytest.mark.parametrize("path", sorted(NOT_IN_THE_REPOSITORY))
def test_every_path_allowed_missing_is_still_named(path):
    assert any(path in f.read_text() for f in scanned_files()), f"{path}: no longer named; drop it here"
