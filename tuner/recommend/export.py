"""A recommendation in the forms other tools read.

``yaml`` and ``json`` are the versioned recommendation document itself; the others carry its llama.cpp
settings to another program (:mod:`tuner.backends.llama_cpp.export_formats`: ``llama-server``,
``llama-cpp-server``, ``ollama``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..backends.llama_cpp import export_formats as llama_formats
from ..backends.llama_cpp.export_formats import caveats  # noqa: F401 - public here too
from ..errors import AutotuneError
from ..util.files import atomic_write_text
from ..util.yamlio import dump_yaml

FORMATS = ("yaml", "json", *llama_formats.FORMATS)


def render(doc: dict[str, Any], fmt: str) -> str:
    """``doc`` (a recommendation document) as text in format ``fmt``."""
    if fmt == "yaml":
        return dump_yaml(doc)
    if fmt == "json":
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if fmt in llama_formats.FORMATS:
        return llama_formats.render(doc, fmt)
    raise AutotuneError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")


def write(doc: dict[str, Any], fmt: str, path: Path) -> Path:
    """Write ``doc`` in format ``fmt`` to ``path`` (atomically: a temp file renamed over it)."""
    return atomic_write_text(path, render(doc, fmt))
