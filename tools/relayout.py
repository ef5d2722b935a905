"""One-off helper for merging branches made before issue 26's layout: rewrites imports of old module paths
(``tuner.trial``, ``from .records import ...``, ``from tuner import select``) to the new ones, in place.

    python tools/relayout.py                 # every .py file under tuner/, benchmarks/, tests/
    python tools/relayout.py --check         # only list the files it would change
    python tools/relayout.py --mapping       # print old module -> new module

An import that already resolves in the new tree is left alone, so running it twice changes nothing. A
relative import that does not resolve is read as written from the file's old place (its new place mapped
back through MAP), then written relative to its new place. Delete this file once the merges are done.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = {  # old module (under tuner.) -> new module
    "files": "util.files", "yamlio": "util.yamlio", "units": "util.units", "paths": "util.paths",
    "workloads": "config.workloads", "objectives": "config.objectives", "model": "config.model",
    "profile": "machine.profile", "similarity": "machine.similarity",
    "records": "measure.records", "runner": "measure.runner", "disturbance": "measure.disturbance",
    "child": "backends.child", "settings": "backends.settings",
    "backends.llama_cpp": "backends.llama_cpp.backend",
    "engine": "backends.llama_cpp.engine", "health": "backends.llama_cpp.health",
    "quant": "backends.llama_cpp.quant", "quality": "backends.llama_cpp.quality",
    "variants": "backends.llama_cpp.variants", "gguf": "backends.llama_cpp.gguf",
    "storage": "results.storage", "studies": "results.studies",
    "select": "selection.candidates", "decision": "selection.decision",
    "recommend": "recommend.document", "summary": "recommend.summary", "report": "recommend.report",
    "report_plots": "recommend.report_plots", "compare": "recommend.compare", "check": "recommend.check",
    "export": "recommend.export", "query": "recommend.query",
    "search": "search.tune", "trial": "search.trial", "space": "search.space", "informed": "search.informed",
    "refine": "search.refine", "composite": "search.composite", "remeasure": "search.remeasure",
    "progress": "search.progress",
    "appconfig": "service.appconfig", "serve": "service.serve",
    "targets": "selection.targets", "kl": "backends.llama_cpp.kl",
}
FULL = {f"tuner.{k}": f"tuner.{v}" for k, v in MAP.items()}
BACK = {v: k for k, v in FULL.items()}
FOLDERS = ("tuner", "benchmarks", "tests")


def module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return (".".join(parts[:-1]), True) if parts[-1] == "__init__" else (".".join(parts), False)


def existing() -> set[str]:
    found = {"tuner.search_spaces"}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            found.add(module_of(path)[0])
    return found


def _package(module: str, is_package: bool) -> str:
    return module if is_package else module.rsplit(".", 1)[0]


def _resolve(package: str, level: int, name: str | None) -> str | None:
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, *([name] if name else [])])


def _new(old: str) -> str:
    """The new name of an old module path (a longer path under a moved module keeps its tail)."""
    for key in sorted(FULL, key=len, reverse=True):
        if old == key or old.startswith(key + "."):
            return FULL[key] + old[len(key):]
    return old


def _relative(target: str, package: str) -> str:
    p, t = package.split("."), target.split(".")
    n = 0
    while n < min(len(p), len(t)) and p[n] == t[n]:
        n += 1
    return "." * (len(p) - n + 1) + ".".join(t[n:])


def _dotted(text: str, known: set[str]) -> str:
    """``tuner.a.b`` chains in code, strings and docs: mapped unless they already name a new module."""
    def one(m: re.Match[str]) -> str:
        chain = m.group(0)
        parts = chain.split(".")
        for n in range(len(parts), 1, -1):  # the longest prefix that names a module of the new tree
            if ".".join(parts[:n]) in known and ".".join(parts[:n]) not in FULL:
                return chain
            if ".".join(parts[:n]) in FULL:
                return _new(".".join(parts[:n])) + chain[len(".".join(parts[:n])):]
        return chain
    return re.sub(r"(?<![\w.])tuner(?:\.\w+)+", one, text)


SKIP = {"tuner/engine.py", "tuner/child.py", "tuner/backends/llama_cpp/__init__.py", "tests/test_layers.py"}


def _names(base: str, old_base: str | None, names: list[ast.alias], known: set[str]) -> dict[str, list[str]]:
    """``from base import names`` split by where each name now lives (old submodules moved)."""
    groups: dict[str, list[str]] = {}
    for alias in names:
        new_sub, old_sub = f"{base}.{alias.name}", f"{old_base or base}.{alias.name}"
        if new_sub not in known and old_sub in FULL:
            parent, leaf = FULL[old_sub].rsplit(".", 1)
            as_name = alias.asname or (alias.name if leaf != alias.name else None)
            groups.setdefault(parent, []).append(f"{leaf} as {as_name}" if as_name else leaf)
        else:
            groups.setdefault(base, []).append(f"{alias.name} as {alias.asname}" if alias.asname else alias.name)
    return groups


def _absolute_base(module: str, names: list[ast.alias], known: set[str]) -> str:
    if module in known and module not in FULL:
        return module
    if module in FULL and module in known:  # an old module that is a new package too (tuner.search)
        return module if all(f"{module}.{a.name}" in known for a in names) else FULL[module]
    return module if module in known else _new(module)


def rewrite(text: str, path: Path, known: set[str]) -> str:
    """The file's text with every old import path written the new way."""
    module, is_package = module_of(path)
    in_tuner = module.startswith("tuner")
    new_package = _package(module, is_package) if in_tuner else None
    old_package = _package(BACK.get(module, module), is_package) if in_tuner else None
    tree = ast.parse(text)
    lines = text.split("\n")
    edits, import_lines = [], set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            import_lines.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.Import):
            names = [a.name if a.name in known else _new(a.name) for a in node.names]
            if names == [a.name for a in node.names]:
                continue
            out = [", ".join(f"{n} as {a.asname}" if a.asname else n for n, a in zip(names, node.names))]
            prefix = "import "
        elif isinstance(node, ast.ImportFrom):
            if node.level and new_package:
                here = _resolve(new_package, node.level, node.module)
                there = _resolve(old_package, node.level, node.module)
                if node.module is None:
                    groups = {}
                    for alias in node.names:
                        g = _names(here, there, [alias], known) if f"{here}.{alias.name}" not in known and there \
                            else {here: [f"{alias.name} as {alias.asname}" if alias.asname else alias.name]}
                        if list(g) == [here] and there and f"{here}.{alias.name}" not in known:
                            g = {there: g[here]}  # an attribute of the old package
                        for k, v in g.items():
                            groups.setdefault(k, []).extend(v)
                    if list(groups) == [here]:
                        continue
                elif here in known:
                    groups = _names(here, None, node.names, known)
                    if list(groups) == [here]:
                        continue
                elif there is not None:
                    groups = _names(_new(there), there, node.names, known)
                else:
                    continue
                rendered = {_relative(k, new_package): v for k, v in groups.items()}
            else:
                if node.level:
                    continue
                base = _absolute_base(node.module or "", node.names, known)
                groups = _names(base, node.module, node.names, known)
                if list(groups) == [node.module]:
                    continue
                rendered = groups
            first = lines[node.lineno - 1]
            indent = first[: len(first) - len(first.lstrip())]
            out = [f"{indent}from {k} import {', '.join(v)}" for k, v in rendered.items()]
            prefix = None
        else:
            continue
        tail = lines[node.end_lineno - 1][node.end_col_offset:]
        if prefix:
            first = lines[node.lineno - 1]
            out = [first[: len(first) - len(first.lstrip())] + prefix + out[0]]
        out[-1] += tail
        edits.append((node.lineno, node.end_lineno, out))
    lines = [line if n in import_lines else _dotted(line, known) for n, line in enumerate(lines, 1)]
    for start, end, out in sorted(edits, reverse=True):
        lines[start - 1:end] = out
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--mapping" in argv:
        for old, new in FULL.items():
            print(f"{old} -> {new}")
        return 0
    known = existing()
    changed = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if str(path.relative_to(ROOT)) in SKIP:
                continue
            text = path.read_text()
            new = rewrite(text, path, known)
            if new != text:
                changed.append(str(path.relative_to(ROOT)))
                if "--check" not in argv:
                    path.write_text(new)
    print("\n".join(changed) or "nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
