"""The backends autotune has: one entry per backend package under ``tuner/backends/``, the default first.

A backend is a package ``tuner/backends/<name>/`` whose ``__init__`` names its
:class:`tuner.backends.base.Backend` subclass as ``BACKEND`` and whose ``fields`` module declares the
settings it adds (read without loading the backend, :mod:`tuner.backends.settings_model`). Adding one
is that package and its name in ``ENGINES``: nothing else in autotune names a backend, and no module
outside ``tuner/backends/`` imports a backend's package (tests/test_layers.py checks it). The files a new
backend touches:

- ``tuner/backends/<name>/__init__.py``: ``BACKEND = <the Backend subclass>``;
- ``tuner/backends/<name>/fields.py``: ``NAME``, ``LABEL``, ``FIELDS`` (its settings);
- ``tuner/backends/<name>/backend.py`` (and whatever modules it needs there): ``defaults``, ``memory_needed``,
  ``measure``, and the capabilities it has (:class:`tuner.backends.capabilities.Capabilities`: weights,
  quality, engine health, exports, a tuned model loaded or served);
- this file: its name in ``ENGINES``; and its engine library in ``ENGINE_HOMES`` of tests/test_layers.py.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import Any

ENGINES = ("llama_cpp", "transformers")


def fields_modules() -> tuple[ModuleType, ...]:
    """Each backend's ``fields`` module (its ``NAME``, ``LABEL`` and ``FIELDS``), in registry order."""
    return tuple(import_module(f"{__package__}.{name}.fields") for name in ENGINES)


def backend_classes() -> tuple[Any, ...]:
    """Each backend's :class:`tuner.backends.base.Backend` subclass, in registry order."""
    return tuple(import_module(f"{__package__}.{name}").BACKEND for name in ENGINES)
