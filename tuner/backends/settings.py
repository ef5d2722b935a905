"""The settings model (:mod:`tuner.backends.settings_model`, every public name re-exported here) and what
needs the backends themselves: each config's engine rules (normalize), why it cannot run, the defaults."""

from __future__ import annotations

from .. import backends
from .settings_model import (  # noqa: F401 - the settings model and its readers, public here as before
    BACKENDS,
    DEFAULT,
    TrialSettings,
    applicable,
    config_key,
    param_backend,
    params_for_backend,
)


def normalize(settings: TrialSettings) -> tuple[TrialSettings, list[str]]:
    """What the engine will really run, and a note for every value it changes.

    llama-cpp-python, for one, clamps ``n_batch`` to ``n_ctx`` and ``n_ubatch`` to ``n_batch``
    without saying so; autotune applies the same rules first so the stored trial says what ran.
    """
    return backends.get(settings.backend).normalize(settings)


def infeasible_reason(settings: TrialSettings, needed_ctx: int) -> str | None:
    """Why the config's engine cannot run ``settings`` for a workload needing ``needed_ctx`` tokens."""
    return backends.get(settings.backend).infeasible_reason(settings, needed_ctx)


def defaults(backend: str, cpus: int, needed_ctx: int, serving: bool = False) -> TrialSettings:
    """What ``backend`` runs when a user passes nothing, on ``cpus`` CPUs (``serving``: its server, for the
    serve workload)."""
    return backends.get(backend).defaults(cpus, needed_ctx, serving)
