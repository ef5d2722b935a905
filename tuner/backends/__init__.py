"""Inference backends, one module each, and the registry that names them.

Each backend is a :class:`tuner.backends.base.Backend`; everything engine-specific lives in its
module. The rest of autotune asks the registry (:func:`get`) instead of comparing backend names.
A new backend is one new package under ``tuner/backends/`` (its ``Backend`` subclass and a ``fields``
module declaring its settings) and its name in :data:`tuner.backends.registry.ENGINES`.
"""

from __future__ import annotations

from ..errors import AutotuneError
from . import registry
from .base import Backend

_BACKENDS: tuple[Backend, ...] = tuple(cls() for cls in registry.backend_classes())
REGISTRY: dict[str, Backend] = {b.name: b for b in _BACKENDS}
DEFAULT = _BACKENDS[0].name  # the backend of a config that names none (and of older records)


def get(name: str | None) -> Backend:
    """The backend called ``name`` (the default one for None); AutotuneError for an unknown name."""
    try:
        return REGISTRY[name or DEFAULT]
    except KeyError:
        raise AutotuneError(f"unknown backend {name!r}: autotune has {', '.join(REGISTRY)}") from None


def loading(*formats: str) -> tuple[str, ...]:
    """The registered backends that load a model given in any of ``formats`` (``ModelInfo.format``), the default first."""
    return tuple(b.name for b in _BACKENDS if set(formats) & set(b.model_formats))


def names() -> tuple[str, ...]:
    """Every registered backend name, the default first."""
    return tuple(REGISTRY)
