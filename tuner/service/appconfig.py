"""Autoconfig for applications: the tuned settings for the machine this process runs on.

``autoconfig()`` answers "which settings should this model use here?" from the results database:

1. ``measured``: the stored recommendation of the profile detected now, matched by the profile's
   hardware fingerprint (so a renamed profile or a copied results folder still matches);
2. ``predicted``: else the best config of the most similar stored profile that tuned the same
   model and workload (:mod:`tuner.machine.similarity`), its thread counts scaled to this machine;
3. ``defaults``: else the engine's own defaults.

``load()`` returns what that names, every setting carried: a ready ``llama_cpp.Llama`` (weights
variant, threads apart, batch sizes, KV types, flash attention, repacking) or, for a transformers
pick, a :class:`tuner.backends.transformers.loaded.TransformersModel` (dtype, threads, attention, cache). Neither tunes unless
``tune_budget`` (seconds) is given.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import backends
from ..errors import AutotuneError
from ..config.model import ModelInfo, resolve_model
from ..machine.profile import detect_profile
from ..backends.settings import TrialSettings, applicable, defaults, normalize
from ..machine.similarity import scale_threads
from ..config.workloads import get_workload
from ..search.prior import of_backend, predict, stored_views
from ..recommend.document import figures
from ..recommend.query import open_results
from ..search.tune import TuneOptions, tune



@dataclass(frozen=True)
class AutoConfig:
    """Settings for this machine and where they came from."""

    source: str                      # "measured", "predicted" or "defaults"
    profile: str | None              # the profile whose trials stand behind the settings
    settings: dict[str, Any]         # applicable settings (TrialSettings fields)
    model_path: str                  # the GGUF file the settings run on (a quant variant, or the model), or the model folder
    figures: dict[str, Any] = field(default_factory=dict)  # what was measured (empty for defaults)
    similarity: float | None = None  # for a prediction: how alike that profile is to this machine
    study: str | None = None

    @property
    def backend(self) -> str:
        """The engine the settings are for ("llama_cpp" or "transformers")."""
        return str(self.settings.get("backend", backends.DEFAULT))

    def describe(self) -> str:
        """One line: where the settings come from."""
        if self.source == "measured":
            return f"measured on this machine (profile {self.profile}, study {self.study})"
        if self.source == "predicted":
            return (f"predicted from profile {self.profile} (similarity {self.similarity:.2f}), "
                    "threads scaled to this machine; run `autotune run` to measure")
        return "the engine's defaults: nothing stored for this machine or a similar one; run `autotune run`"


@contextlib.contextmanager
def _affinity_kept() -> Iterator[None]:
    """Detecting a profile restricted to some CPUs pins this process; an application keeps its own."""
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


def _stored(storage: str | None, model: ModelInfo, workload: str) -> list[Any]:
    """The view of every stored study of ``model`` and ``workload``, newest first."""
    try:
        db = open_results(storage)
    except AutotuneError:
        return []  # no results yet: predictions and measurements both need some
    return stored_views(db, model, workload)


def _result(source: str, view: Any, cand: Any, model: ModelInfo, settings: dict[str, Any],
            score: float | None = None) -> AutoConfig:
    path = cand.model.get("path") or model.path
    return AutoConfig(source=source, profile=view.profile.name, settings=settings,
                      model_path=path if Path(path).is_file() else model.path, figures=figures(cand),
                      similarity=score, study=view.name)


def autoconfig(model: str | None = None, workload: str = "default", storage: str | None = None,
               cpus: list[int] | None = None, tune_budget: float | None = None,
               backend: str | None = None) -> AutoConfig:
    """The settings for ``model`` (default: the bundled one) on the machine this process runs on.

    ``cpus`` restricts the machine as ``autotune run --cpus`` does (this process's own CPU affinity
    is left as it was); ``backend`` limits the answer to one engine; ``tune_budget`` runs
    ``autotune run`` for that many seconds first.
    """
    info = resolve_model(model)
    with _affinity_kept():
        if tune_budget:
            tune(TuneOptions(budget_s=tune_budget, model=model, workload=workload, storage=storage, cpus=cpus))
        here = detect_profile(None, cpus)
    views = _stored(storage, info, workload)
    mine = _measured(views, here.id, backend)
    if mine is not None:
        view, cand = mine
        return _result("measured", view, cand, info, cand.settings)
    stored = [(v, c) for v in views if (c := v.pick_among(of_backend(backend))) is not None]
    able = backends.loading(info.format)  # the backends that load this model as given (a folder: transformers)
    # A prediction must run here: of another machine's configs, only those of a backend in ``able`` (a
    # llama.cpp config measured on a folder's GGUF names a file this machine lacks).
    guess = predict(here, [(v, c) for v, c in stored if c.backend in able])
    if guess is not None:
        (view, cand), score = guess
        settings = scale_threads(cand.settings, view.profile.n_cpus, here.n_cpus)
        return _result("predicted", view, cand, info, settings, score)
    base = defaults(backend or able[0], here.n_cpus, get_workload(workload).needed_ctx())
    real, _ = normalize(base)

    return AutoConfig(source="defaults", profile=None, settings=applicable(real), model_path=info.path)


def _measured(views: list[Any], profile_id: str, backend: str | None) -> tuple[Any, Any] | None:
    """(view, config) of this machine's newest study with a config of ``backend`` (any without one): the
    config its recommendation file and ``autotune best`` name, chosen by the one decision rule under the
    targets and memory ceiling its run stored; None when this machine has measured none. A study whose
    configs meet none of its targets is the AutotuneError ``autotune best`` gives, not another config."""
    keep = of_backend(backend)
    for view in views:
        if view.profile.id == profile_id and any(keep is None or keep(c) for c in view.candidates):
            return view, view.chosen(among=keep)
    return None


def load(model: str | None = None, workload: str = "default", storage: str | None = None,
         cpus: list[int] | None = None, tune_budget: float | None = None, backend: str | None = None,
         **overrides: Any) -> Any:
    """The model :func:`autoconfig` recommends for this machine, loaded with exactly those settings.

    A llama.cpp pick gives a ready ``llama_cpp.Llama``; a transformers pick gives a
    :class:`tuner.backends.transformers.loaded.TransformersModel` (model, tokenizer, ``generate``). ``backend`` limits
    the choice to one engine (``"llama_cpp"`` for a ``Llama`` whatever won). ``overrides`` are
    ``Llama`` keywords that replace the tuned ones (``verbose=True``, ...), or ``max_tokens`` for
    transformers.
    """
    config = weights_for(autoconfig(model, workload, storage, cpus, tune_budget, backend=backend), model)
    settings = TrialSettings(**config.settings)
    return backends.get(settings.backend).load_tuned(settings, config.model_path, **overrides)


def weights_for(config: AutoConfig, model: str | None = None) -> AutoConfig:
    """``config`` made runnable here as measured, by its backend: e.g. the llama.cpp weight variant file it
    names (made if this machine lacks it) and, for settings not measured here, repacking probed on this machine."""
    settings, path = backends.get(config.backend).runnable_here(
        TrialSettings(**config.settings), config.model_path, lambda: resolve_model(model), config.source == "measured")
    changed = {k: v for k, v in settings.model_dump().items() if config.settings.get(k, v) != v}
    return replace(config, model_path=str(path), settings={**config.settings, **changed})
