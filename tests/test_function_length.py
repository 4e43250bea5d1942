"""Every function in the package fits on a screen: none over 80 lines (a declarative table belongs in
data, a longer function splits along its seams)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src/trainbench"
LONGEST = 80


def long_functions(source: str) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST]


def test_the_finder_sees_a_long_function_and_passes_a_short_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    assert long_functions(f"def long():\n{body}") == [("long", LONGEST + 1)]
    assert long_functions("def short():\n    return 1\n") == []


def test_no_function_in_the_package_is_longer_than_a_screen():
    found = {f"{path.relative_to(PACKAGE)}:{name}": lines for path in sorted(PACKAGE.rglob("*.py"))
             for name, lines in long_functions(path.read_text())}
    assert not found, f"functions over {LONGEST} lines (split them along their seams): {found}"
