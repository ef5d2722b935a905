"""What a server runs against what was measured: the served context, and the lines that say what differs.

A recommendation is measured at the smallest context its workload needs (1024 tokens for the default
workload), which is rarely what a server wants: a chat grows. ``autotune serve`` serves the model's
trained context by default, clipped to what the memory ceiling holds (the weights plus the KV cache of
that many tokens, as the trial's own memory precheck counts it), or ``--ctx``; and it says so, since
figures taken at one context are not those of another.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import backends
from ..backends.settings import TrialSettings
from ..config.model import ModelInfo, resolve_model
from ..errors import AutotuneError
from .appconfig import AutoConfig
from ..search.state import MEMORY_OVERHEAD  # what the trial's memory precheck adds to weights and KV cache

CTX_STEP = 256          # a served context is a multiple of this (llama.cpp pads its KV cache alike)
MEASURED_ENGINE = "llama-cpp-python"  # every llama.cpp trial runs under it


def served_context(model: ModelInfo, settings: TrialSettings, weights_path: str, ceiling: int,
                   asked: int | None = None) -> tuple[int, str]:
    """The context to serve and why: ``asked`` (``--ctx``; refused above the trained context or when it
    does not fit ``ceiling``), else the model's trained context, clipped to the largest multiple of
    ``CTX_STEP`` whose KV cache fits ``ceiling``, never below the measured one."""
    engine = backends.get(settings.backend)
    trained = model.context_length or settings.n_ctx
    weights = Path(weights_path).stat().st_size if os.path.exists(weights_path) else model.size_bytes

    def fits(n_ctx: int) -> bool:
        need = engine.memory_needed(model, settings.model_copy(update={"n_ctx": n_ctx}), weights)
        return need + MEMORY_OVERHEAD <= ceiling

    if asked is not None:
        if asked > trained:
            raise AutotuneError(f"--ctx {asked} is more than the {trained} tokens {model.name} was trained on: "
                                f"give --ctx {trained} or less")
        if not fits(asked):
            raise AutotuneError(f"--ctx {asked} does not fit the memory ceiling ({ceiling // 2**20} MiB with the "
                                "weights): give a smaller --ctx or a lower KV cache type")
        return asked, "--ctx"
    if fits(trained):
        return trained, "the model's trained context"
    n_ctx = trained // CTX_STEP * CTX_STEP
    while n_ctx > settings.n_ctx and not fits(n_ctx):
        n_ctx -= CTX_STEP
    n_ctx = max(n_ctx, settings.n_ctx)
    return n_ctx, f"the model's trained context ({trained}) clipped to what the memory ceiling holds"


def differences(measured: dict[str, Any], served: dict[str, Any], engine: str,
                measured_engine: str = MEASURED_ENGINE) -> list[str]:
    """One line per way the server differs from the measured config (nothing when it is the same)."""
    lines = [f"{key}: measured {measured.get(key)!r}, served {served.get(key)!r}"
             for key in sorted(set(measured) | set(served)) if measured.get(key) != served.get(key)]
    if engine != measured_engine:
        lines.append(f"engine: measured under {measured_engine}, served by {engine} (the same llama.cpp settings; "
                     "its own build may differ)")
    return lines


def with_served_context(config: AutoConfig, model: str | None, ctx: int | None,
                        ceiling: int) -> tuple[AutoConfig, str]:
    """``config`` (a llama.cpp one, its weights made: :func:`tuner.service.appconfig.weights_for`) with the
    context to serve (:func:`served_context` for ``model``), and why that context."""
    n_ctx, why = served_context(resolve_model(model), TrialSettings(**config.settings), config.model_path, ceiling, ctx)
    return replace(config, settings={**config.settings, "n_ctx": n_ctx}), why
