"""One typed model for every setting autotune can tune, with bounds and descriptions.

The fields come from the backends (:mod:`tuner.backends`): each registers the settings it adds,
and a field belongs to the backend that declared it (``param_backend``). The same model checks
search-space files and every stored config; each backend turns a config into what its engine
takes (``llama_cpp.Llama`` keywords, ``llama-server`` flags, ...).

The fields are read from each backend's declarations (its ``fields`` module) without loading any backend,
so the backends can build their settings with this model; :mod:`tuner.backends.settings` adds what needs them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from . import registry

# Every backend's declared settings, the default backend first, in the registry's order
# (:mod:`tuner.backends.registry`; tests/test_layers.py checks it).
DECLARED = registry.fields_modules()
BACKENDS = tuple(d.NAME for d in DECLARED)
DEFAULT = BACKENDS[0]


def _settings_model() -> type[BaseModel]:
    fields: dict[str, Any] = {"backend": (Literal[BACKENDS], Field(  # type: ignore[valid-type]
        DEFAULT, description="Inference engine: " + ", ".join(
            f"{d.NAME} ({d.LABEL})" for d in DECLARED) + "."))}
    for declared in DECLARED:
        for name, (kind, spec) in declared.FIELDS.items():
            if name in fields:
                raise TypeError(f"setting {name!r} of backend {declared.NAME} is declared twice")
            fields[name] = (kind, Field(**spec, json_schema_extra={"backend": declared.NAME}))
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


# Settings a backend leaves out of a config while they hold their defaults (its fields' OMITTED_AT_DEFAULT):
# llama-server's slots mean nothing to one request, and configs stored before them keep their keys.
OMITTED_AT_DEFAULT = {name: TrialSettings.model_fields[name].default
                      for declared in DECLARED for name in getattr(declared, "OMITTED_AT_DEFAULT", ())}


def applicable(settings: TrialSettings) -> dict[str, Any]:
    """Only the settings that mean something for the config's backend (those a backend omits at their
    defaults left out while they hold them)."""
    full = settings.model_dump()
    return {k: full[k] for k in params_for_backend(settings.backend)
            if k not in OMITTED_AT_DEFAULT or full[k] != OMITTED_AT_DEFAULT[k]}


def config_key(settings: TrialSettings) -> str:
    """A stable text key of the applicable settings: equal keys run the same real config."""
    items = sorted(applicable(settings).items())
    return ";".join(f"{k}={v}" for k, v in items)
