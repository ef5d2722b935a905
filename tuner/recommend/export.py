"""A recommendation in the forms other tools read.

``yaml`` and ``json`` are the versioned recommendation document itself; the others carry its settings to
another program, each written by the backend that exports it (llama.cpp's: ``llama-server``,
``llama-cpp-server``, ``ollama``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import backends
from ..errors import AutotuneError
from ..util.files import atomic_write_text
from ..util.yamlio import dump_yaml

FORMATS = ("yaml", "json", *backends.export_formats())


def render(doc: dict[str, Any], fmt: str) -> str:
    """``doc`` (a recommendation document) as text in format ``fmt``."""
    if fmt == "yaml":
        return dump_yaml(doc)
    if fmt == "json":
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    exporter = backends.exporting(fmt)
    if exporter is not None:
        return exporter.render_export(doc, fmt)
    raise AutotuneError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")


def caveats(doc: dict[str, Any], fmt: str) -> list[str]:
    """Settings of ``doc`` that format ``fmt`` cannot carry, one line each (the CLI prints them)."""
    exporter = backends.exporting(fmt)
    return exporter.export_caveats(doc, fmt) if exporter is not None else []


def write(doc: dict[str, Any], fmt: str, path: Path) -> Path:
    """Write ``doc`` in format ``fmt`` to ``path`` (atomically: a temp file renamed over it)."""
    return atomic_write_text(path, render(doc, fmt))
