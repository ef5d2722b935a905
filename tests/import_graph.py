"""Every import in tuner/ and benchmarks/, read from the source: module-level, deferred (inside a function) and
TYPE_CHECKING ones alike. The layer test and the cycle test build on it."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("tuner", "benchmarks")


@dataclass(frozen=True)
class Import:
    """One import statement's target as seen from the module that makes it."""

    source: str   # importing module, dotted (tuner.search.tune, benchmarks.common)
    target: str   # imported module, dotted, resolved (relative imports made absolute)
    path: str     # the importing file, relative to the checkout
    line: int


def module_name(path: Path) -> str:
    """The dotted module name of a file in the checkout (a package's __init__ is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of tuner/ and benchmarks/ by dotted name."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _base(source: str, is_package: bool, level: int, module: str | None) -> str:
    parts = source.split(".") if is_package else source.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, *([module] if module else [])])


def imports_of(source: str, path: Path, known: set[str], text: str | None = None) -> list[Import]:
    """The imports one module makes; ``from pkg import name`` targets ``pkg.name`` when that is a module."""
    tree = ast.parse(text if text is not None else path.read_text(), str(path))
    rel = str(path.relative_to(ROOT)) if path.is_absolute() else str(path)
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(source, a.name, rel, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(source, is_package, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append(Import(source, sub if sub in known else base, rel, node.lineno))
    return out


def all_imports() -> list[Import]:
    """Every import of every module of tuner/ and benchmarks/."""
    mods = modules()
    known = set(mods)
    return [imp for name, path in mods.items() for imp in imports_of(name, path, known)]
