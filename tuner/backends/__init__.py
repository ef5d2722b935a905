"""Inference backends, one module each, and the registry that names them.

Each backend is a :class:`tuner.backends.base.Backend`; everything engine-specific lives in its
module. The rest of autotune asks the registry (:func:`get`) instead of comparing backend names.
A new backend is one new package under ``tuner/backends/`` (its ``Backend`` subclass and a ``fields``
module declaring its settings) and its name in :data:`tuner.backends.registry.ENGINES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import AutotuneError
from ..measure import runner
from . import registry
from .base import Backend
from .capabilities import Health, QualityLimits, Verdicts, WeightFile  # noqa: F401 - the capabilities' types

runner.set_child_entry(f"{__name__}.child")  # the runner starts tuner.backends.child as every trial's child

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


def for_format(fmt: str) -> Backend:
    """The first registered backend that loads a model of format ``fmt`` (``ModelInfo.format``)."""
    return next((b for b in _BACKENDS if fmt in b.model_formats), _BACKENDS[0])


def system_info() -> str:
    """The engine build's features line for the machine profile: the first backend's that tells one."""
    return next((info for b in _BACKENDS if (info := b.system_info())), "")


def open_health(extra: Mapping[str, Any], profile: Mapping[str, Any]) -> Health | None:
    """The engine health stored in a profile's ``extra`` (``profile``: its public facts), of the first
    backend that keeps one; None when none does."""
    return next((h for b in _BACKENDS if (h := b.open_health(extra, profile)) is not None), None)


def health_lines(extra: Mapping[str, Any]) -> list[str]:
    """Human lines for every backend's engine health stored in a profile's ``extra``."""
    return [line for b in _BACKENDS for line in b.health_lines(extra)]


def health_sections(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The recommendation document's sections on every backend's engine health stored in a profile's ``extra``."""
    return {k: v for b in _BACKENDS for k, v in b.health_sections(extra).items()}


def export_formats() -> tuple[str, ...]:
    """Every format some backend exports a recommendation to, in registry order."""
    return tuple(f for b in _BACKENDS for f in b.export_formats)


def exporting(fmt: str) -> Backend | None:
    """The backend that exports format ``fmt`` (None: no backend does)."""
    return next((b for b in _BACKENDS if fmt in b.export_formats), None)


def child_faults() -> tuple[str, ...]:
    """AUTOTUNE_FAULT kinds a backend's engine acts on in every child (not faults of one trial)."""
    return tuple(f for b in _BACKENDS for f in b.child_faults)
