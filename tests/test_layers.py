"""The package's layers, checked on the source: an import never climbs to a higher layer, the engines'
libraries (llama_cpp, torch, transformers) are imported only in their backend's folder, and a backend's package
is imported only inside ``tuner/backends/`` (the rest of autotune reaches a backend through the registry).
Every import counts: module-level, deferred (inside a function) and TYPE_CHECKING ones."""

from __future__ import annotations

from pathlib import Path

from import_graph import ROOT, Import, all_imports, imports_of, modules

from tuner import backends
from tuner.backends.registry import ENGINES
from tuner.measure import records as R

# Lowest first: a module may import from its own layer and the layers below it.
LAYERS = ("util", "config", "measure", "backends", "machine", "results", "selection", "recommend", "search",
          "service", "cli")
BASE = {"tuner", "tuner.errors", "tuner.search_spaces"}  # below every layer
ENTRY = {"tuner.entry", "tuner.__main__", "tuner.cli.__main__"}  # the console script (and `python -m`): above the cli
ENGINE_HOMES = {"llama_cpp": "tuner.backends.llama_cpp", "torch": "tuner.backends.transformers",
                "transformers": "tuner.backends.transformers", "accelerate": "tuner.backends.transformers"}
# Engine imports outside their folder that are still to move, with why they are where they are.
ENGINE_EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer(module: str) -> int | None:
    """The layer index of a module (None: not autotune's); benchmarks and the compat names sit on top."""
    parts = module.split(".")
    if parts[0] == "benchmarks" or module in ENTRY:
        return len(LAYERS)
    if parts[0] != "tuner":
        return None
    if module in BASE or ".".join(parts[:2]) in BASE:
        return -1
    return LAYERS.index(parts[1])


def backend_package(module: str) -> str | None:
    """The backend package ``module`` is in or is (``tuner.backends.llama_cpp``), None for any other module."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["tuner", "backends"] and len(parts) > 2 and parts[2] in ENGINES \
        else None


def violations(imports: list[Import]) -> list[str]:
    """Each import that climbs a layer, loads an engine's library outside that engine's folder, or names a
    backend's package from a tuner module outside ``tuner/backends/`` (no exceptions: use the registry)."""
    found = []
    for imp in imports:
        src, dst = layer(imp.source), layer(imp.target)
        if dst is not None and src is not None and dst > src:
            found.append(f"{imp.path}:{imp.line}: {imp.source} ({LAYERS[src] if src < len(LAYERS) else 'top'}) "
                         f"imports {imp.target} ({LAYERS[dst]}), a higher layer")
        package = backend_package(imp.target)
        if package and imp.source.startswith("tuner.") and not imp.source.startswith("tuner.backends."):
            found.append(f"{imp.path}:{imp.line}: {imp.source} imports {imp.target}, a backend's package, from "
                         "outside tuner/backends/ (reach it through tuner.backends.get)")
        home = ENGINE_HOMES.get(imp.target.split(".")[0])
        if (home and imp.source.startswith("tuner.") and not imp.source.startswith(home)
                and (imp.source, imp.target) not in ENGINE_EXCEPTIONS):
            found.append(f"{imp.path}:{imp.line}: {imp.source} imports {imp.target} outside {home}")
    return found


def test_every_module_has_a_layer() -> None:
    for name in modules():
        if name.startswith("tuner"):
            assert layer(name) is not None, name


def test_no_import_climbs_a_layer_or_leaves_its_engine_folder() -> None:
    found = violations(all_imports())
    assert not found, "\n".join(found)


def test_the_check_catches_a_climbing_import_and_a_stray_engine_import() -> None:
    known = set(modules())
    text = ("from typing import TYPE_CHECKING\n"
            "from ..errors import AutotuneError\n"          # down: fine
            "if TYPE_CHECKING:\n    from ..search.tune import TuneOptions\n"  # climbs, type-only
            "def f():\n    from tuner.recommend import query\n"  # climbs, deferred
            "    import torch\n")                            # an engine outside its folder
    imports = imports_of("tuner.util.fake", Path("tuner/util/fake.py"), known, text)
    found = violations(imports)
    assert len(found) == 3, found
    assert any("tuner.search.tune" in f for f in found) and any("tuner.recommend.query" in f for f in found)
    assert any("torch" in f for f in found)


def test_the_check_catches_a_backend_package_imported_from_outside_the_backends() -> None:
    known = set(modules())
    text = ("from .. import backends\n"                          # the registry: fine
            "from ..backends.settings import TrialSettings\n"     # backend-neutral: fine
            "def f():\n    from ..backends.llama_cpp.quant import ensure_variant\n"  # a backend's package, deferred
            "import tuner.backends.transformers\n")                # a backend's package
    found = violations(imports_of("tuner.search.fake", Path("tuner/search/fake.py"), known, text))
    assert len(found) == 2, found
    assert any("tuner.backends.llama_cpp.quant" in f for f in found)
    assert any("tuner.backends.transformers" in f for f in found)
    inside = imports_of("tuner.backends.llama_cpp.fake", Path("tuner/backends/llama_cpp/fake.py"), known,
                        "from .quant import ensure_variant\n")
    assert not violations(inside)


# Where Optuna may be imported: where studies are stored (results/), run (search/) and plotted (the report).
OPTUNA_HOMES = ("tuner.results", "tuner.search", "tuner.recommend.report")


def optuna_violations(imports: list[Import]) -> list[str]:
    """Each import of optuna by a tuner module outside ``OPTUNA_HOMES``."""
    return [f"{i.path}:{i.line}: {i.source} imports {i.target}" for i in imports
            if i.target.split(".")[0] == "optuna" and i.source.startswith("tuner.")
            and not i.source.startswith(OPTUNA_HOMES)]


def test_optuna_is_imported_only_where_studies_are_stored_run_or_plotted() -> None:
    found = optuna_violations(all_imports())
    assert not found, "\n".join(found)
    caught = optuna_violations(imports_of("tuner.selection.fake", Path("tuner/selection/fake.py"), set(modules()),
                                          "def f():\n    from optuna.trial import TrialState\n"))
    assert len(caught) == 1 and "optuna.trial" in caught[0]


def test_the_exceptions_are_still_needed() -> None:
    seen = {(i.source, i.target) for i in all_imports()}
    assert set(ENGINE_EXCEPTIONS) <= seen, set(ENGINE_EXCEPTIONS) - seen


def test_an_unnamed_backend_is_the_default_one() -> None:
    assert R.UNNAMED_BACKEND == backends.DEFAULT


def test_the_declared_settings_follow_the_registry() -> None:
    from tuner.backends import settings_model

    assert settings_model.BACKENDS == backends.names() and settings_model.DEFAULT == backends.DEFAULT
    for declared, backend in zip(settings_model.DECLARED, backends.REGISTRY.values()):
        assert (declared.NAME, declared.LABEL, declared.FIELDS) == (backend.name, backend.label, backend.fields)


def test_the_checked_folders_exist() -> None:
    assert (ROOT / "tuner" / "util").is_dir() and (ROOT / "benchmarks").is_dir()


# Private names of the libraries autotune adapts, and the only modules allowed to use them.
PRIVATE_HOMES = {
    "system_attrs": ("tuner/results/storage.py",),  # Optuna's queued params ("fixed_params")
    "_ctx": ("tuner/backends/llama_cpp/",),  # llama-cpp-python's context (the logits)
    "_llama_proxy": ("tuner/backends/llama_cpp/",),  # llama_cpp.server's loaded model
    "_attn_implementation": ("tuner/backends/transformers/",),
}


def test_private_library_names_stay_in_their_adapter() -> None:
    import ast

    found = []
    for name, path in modules().items():
        if not name.startswith("tuner"):
            continue
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_HOMES:
                if not rel.startswith(PRIVATE_HOMES[node.attr]):
                    found.append(f"{rel}:{node.lineno}: .{node.attr}")
    assert not found, found
