"""Size limits, checked on the source: no module of tuner/ over 300 lines, no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60
# Over the limits today and still to split (each is being changed on another branch as well, so the split
# follows the merges); the test fails when one of them grows or anything else crosses a limit.
KNOWN_MODULES: dict[str, int] = {}
KNOWN_FUNCTIONS: dict[str, int] = {}


def sizes(root: Path = ROOT) -> tuple[dict[str, int], dict[str, int]]:
    """Lines per module of tuner/ and per function (from ``def`` to its last line, nested ones too)."""
    modules, functions = {}, {}
    for path in sorted((root / "tuner").rglob("*.py")):
        rel = str(path.relative_to(root))
        text = path.read_text()
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{rel}:{node.name}"
                functions[key] = max(functions.get(key, 0), node.end_lineno - node.lineno + 1)
    return modules, functions


def over(measured: dict[str, int], limit: int, known: dict[str, int]) -> list[str]:
    """The entries over ``limit`` that are not known, or have grown past their known size."""
    return [f"{k}: {n} lines (limit {limit})" for k, n in sorted(measured.items())
            if n > limit and n > known.get(k, limit)]


def test_no_module_over_300_lines_and_no_function_over_60() -> None:
    modules, functions = sizes()
    found = over(modules, MAX_MODULE_LINES, KNOWN_MODULES) + over(functions, MAX_FUNCTION_LINES, KNOWN_FUNCTIONS)
    assert not found, "\n".join(found)


def test_the_known_oversized_still_exist() -> None:
    modules, functions = sizes()
    assert set(KNOWN_MODULES) <= set(modules) and set(KNOWN_FUNCTIONS) <= set(functions)


def test_the_check_catches_a_long_function_and_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "tuner").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (tmp_path / "tuner" / "big.py").write_text(f"def long():\n{body}\n" + "\n" * 250)
    modules, functions = sizes(tmp_path)
    assert over(functions, MAX_FUNCTION_LINES, {}) == ["tuner/big.py:long: 62 lines (limit 60)"]
    assert over(modules, MAX_MODULE_LINES, {}) == ["tuner/big.py: 312 lines (limit 300)"]
