"""Inference backends, one module each, and the registry that names them.

Each backend is a :class:`tuner.backends.base.Backend`; everything engine-specific lives in its
module. The rest of autotune asks the registry (:func:`get`) instead of comparing backend names.
A new backend is one new module and one entry in ``_BACKENDS`` below, plus its declared settings (a ``fields``
module and one entry in ``DECLARED`` of :mod:`tuner.backends.settings_model`, in the same order).
"""

from __future__ import annotations

from ..errors import AutotuneError
from .base import Backend
from .llama_cpp.backend import LlamaCpp
from .transformers import Transformers

_BACKENDS: tuple[Backend, ...] = (LlamaCpp(), Transformers())
REGISTRY: dict[str, Backend] = {b.name: b for b in _BACKENDS}
DEFAULT = LlamaCpp.name  # the backend of a config that names none (and of older records)


def get(name: str | None) -> Backend:
    """The backend called ``name`` (the default one for None); AutotuneError for an unknown name."""
    try:
        return REGISTRY[name or DEFAULT]
    except KeyError:
        raise AutotuneError(f"unknown backend {name!r}: autotune has {', '.join(REGISTRY)}") from None


def names() -> tuple[str, ...]:
    """Every registered backend name, the default first."""
    return tuple(REGISTRY)
