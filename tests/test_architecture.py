"""The rules the package's layout promises, checked on the source: backend specifics stay in their
backend's module, the chat workload depends on no backend, and every backend implements the interface."""

from __future__ import annotations

import ast
from pathlib import Path

from tuner import backends
from tuner.backends.base import Backend

PACKAGE = Path(backends.__file__).resolve().parent.parent
REQUIRED = ("defaults", "memory_needed", "measure")


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _sources(folder: Path) -> list[Path]:
    """The package's modules outside tuner/backends/, and the benchmark scripts."""
    return sorted([p for p in folder.rglob("*.py") if "backends" not in p.relative_to(PACKAGE).parts]
                  + list(BENCHMARKS.glob("*.py")))


def test_no_backend_name_is_compared_outside_the_backends() -> None:
    found = []
    for path in _sources(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for op in operands:
                    elts = op.elts if isinstance(op, (ast.Tuple, ast.List, ast.Set)) else [op]
                    if any(isinstance(e, ast.Constant) and e.value in backends.REGISTRY for e in elts):
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, f"backend names compared outside tuner/backends/: {found}"


def test_the_chat_workload_depends_on_no_backend() -> None:
    tree = ast.parse((PACKAGE / "backends" / "chat.py").read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert not {m for m in imported if m.split(".")[-1] in backends.REGISTRY}, imported


def test_every_backend_implements_the_interface_and_owns_its_settings() -> None:
    from tuner.backends.settings import TrialSettings, param_backend

    for name, backend in backends.REGISTRY.items():
        assert backend.name == name and backend.label and backend.summary_keys
        for method in REQUIRED:
            assert getattr(type(backend), method) is not getattr(Backend, method), f"{name} lacks {method}"
        assert all(param_backend(field) == name for field in backend.fields)
        assert set(backend.summary_keys) <= set(backend.fields)
        assert backend.defaults(4, 600).backend == name
    assert set(TrialSettings.model_fields) == {"backend"} | {f for b in backends.REGISTRY.values() for f in b.fields}
