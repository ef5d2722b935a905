"""One typed model for every setting autotune can tune, with bounds and descriptions.

The fields come from the backends (:mod:`tuner.backends`): each registers the settings it adds,
and a field belongs to the backend that declared it (``param_backend``). The same model checks
search-space files and every stored config; each backend turns a config into what its engine
takes (``llama_cpp.Llama`` keywords, ``llama-server`` flags, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from .. import backends

BACKENDS = backends.names()


def _settings_model() -> type[BaseModel]:
    fields: dict[str, Any] = {"backend": (Literal[BACKENDS], Field(  # type: ignore[valid-type]
        backends.DEFAULT, description="Inference engine: " + ", ".join(
            f"{b.name} ({b.label})" for b in backends.REGISTRY.values()) + "."))}
    for backend in backends.REGISTRY.values():
        for name, (kind, spec) in backend.fields.items():
            if name in fields:
                raise TypeError(f"setting {name!r} of backend {backend.name} is declared twice")
            fields[name] = (kind, Field(**spec, json_schema_extra={"backend": backend.name}))
    return create_model("TrialSettings", __config__=ConfigDict(extra="forbid", frozen=True),
                        __doc__="A complete inference configuration: what one trial measures.", **fields)


TrialSettings = _settings_model()


def param_backend(name: str) -> str | None:
    """The backend a parameter belongs to, or None for a parameter of every backend."""
    field = TrialSettings.model_fields.get(name)
    if field is None:
        raise KeyError(name)
    extra = field.json_schema_extra or {}
    return extra.get("backend")  # type: ignore[union-attr]


def params_for_backend(backend: str) -> list[str]:
    """The setting names that apply to ``backend`` (in model order)."""
    return [n for n in TrialSettings.model_fields if param_backend(n) in (None, backend)]


def applicable(settings: TrialSettings) -> dict[str, Any]:
    """Only the settings that mean something for the config's backend."""
    full = settings.model_dump()
    return {k: full[k] for k in params_for_backend(settings.backend)}


def normalize(settings: TrialSettings) -> tuple[TrialSettings, list[str]]:
    """What the engine will really run, and a note for every value it changes.

    llama-cpp-python, for one, clamps ``n_batch`` to ``n_ctx`` and ``n_ubatch`` to ``n_batch``
    without saying so; autotune applies the same rules first so the stored trial says what ran.
    """
    return backends.get(settings.backend).normalize(settings)


def infeasible_reason(settings: TrialSettings, needed_ctx: int) -> str | None:
    """Why the config's engine cannot run ``settings`` for a workload needing ``needed_ctx`` tokens."""
    return backends.get(settings.backend).infeasible_reason(settings, needed_ctx)


def config_key(settings: TrialSettings) -> str:
    """A stable text key of the applicable settings: equal keys run the same real config."""
    items = sorted(applicable(settings).items())
    return ";".join(f"{k}={v}" for k, v in items)


def defaults(backend: str, cpus: int, needed_ctx: int) -> TrialSettings:
    """What ``backend`` runs when a user passes nothing, on ``cpus`` CPUs."""
    return backends.get(backend).defaults(cpus, needed_ctx)
