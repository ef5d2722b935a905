"""What a run does differently for the serve workload (several users on llama-server, issue 43).

The serve workload is ranked by goodput (the output tokens/s of requests that met the latency targets), searched
in its own space (slots, unified KV, batch sizes, threads, weights: ``search_spaces/serve.yaml``) unless a
space is given, with the engine's server made ready (built once per llama.cpp version) before the budget's clock
starts, its build time said and not charged.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import optuna

from .. import backends
from ..config import objectives
from ..config.workloads import Workload, get_workload
from ..backends.settings import TrialSettings, config_key, normalize
from ..errors import AutotuneError
from ..recommend.query import load_view, newest_first
from ..recommend.summary import SINGLE_PICK_ATTR
from ..results.studies import find_studies
from ..selection.candidates import Candidate
from ..results.storage import Storage
from ..util.paths import SEARCH_SPACES_DIR
from .options import TuneOptions
from .progress import Progress
from .space import ResolvedSpace

SERVE_SPACE = SEARCH_SPACES_DIR / "serve.yaml"
SERVE_OBJECTIVE = "goodput"


def resolve_options(options: TuneOptions, workload: Workload | None = None) -> TuneOptions:
    """``options`` with the space (``serve.yaml`` for a shipped serve workload without ``--space``) and, once
    ``workload`` is known, the objective filled in: goodput for a serve workload, else the default."""
    if workload is None:
        serve = options.space is None and _shipped_kind(options.workload) == "serve"
        return replace(options, space=str(SERVE_SPACE) if serve else options.space)
    return replace(options, objective=options.objective or (
        SERVE_OBJECTIVE if workload.kind == "serve" else objectives.DEFAULT))


def _shipped_kind(name: str) -> str | None:
    """The kind of the shipped workload ``name`` (None when it is not one: a space may define it)."""
    try:
        return get_workload(name).kind
    except AutotuneError:
        return None


def with_users(workload: Workload, users: int | None, max_ttft_s: float | None = None,
               max_tpot_s: float | None = None) -> Workload:
    """``workload`` with ``users`` users (``--users``) and latency targets (``--max-ttft``, ``--max-tpot``);
    other users or targets are another study, so the name says them (``serve@16users``,
    ``serve@ttft0.5s``). AutotuneError for a workload that is not a server's."""
    asked = {"users": users, "max_ttft_s": max_ttft_s, "max_tpot_s": max_tpot_s}
    changes = {k: v for k, v in asked.items() if v is not None and getattr(workload, k) != v}
    if any(v is not None for v in asked.values()) and workload.kind != "serve":
        raise AutotuneError(f"--users, --max-ttft and --max-tpot are for a serve workload; {workload.name!r} is a "
                            f"{workload.kind} one: use --workload serve")
    for key, value in changes.items():
        if value <= 0:
            raise AutotuneError(f"--{key.replace('_s', '').replace('_', '-')} must be more than zero")
    if not changes:
        return workload
    label = {"users": "@{:g}users", "max_ttft_s": "@ttft{:g}s", "max_tpot_s": "@tpot{:g}s"}
    suffix = "".join(label[key].format(value) for key, value in changes.items())
    return workload.model_copy(update={**changes, "name": workload.name + suffix})


def fit_space(space: ResolvedSpace, workload: Workload) -> ResolvedSpace:
    """``space`` without slot counts above the workload's users (a slot no user fills holds KV cache for
    nothing; the smallest count is kept when all are above)."""
    from optuna.distributions import CategoricalDistribution

    dist = space.distributions.get("n_parallel")
    if not isinstance(dist, CategoricalDistribution):
        return space
    kept = [c for c in dist.choices if int(c) <= workload.users] or [min(dist.choices)]  # type: ignore[call-overload]
    if len(kept) == len(dist.choices):
        return space
    dropped = [str(c) for c in dist.choices if c not in kept]
    return replace(space, distributions={**space.distributions, "n_parallel": CategoricalDistribution(kept)},
                   notes=(*space.notes, f"n_parallel {', '.join(dropped)} left out: more slots than the "
                          f"{workload.users} users"))


def ready(space: ResolvedSpace, workload: Workload, progress: Progress, start: float) -> tuple[ResolvedSpace, float]:
    """For the serve workload: ``space`` fitted to it (:func:`fit_space`, the server's defaults for what is not
    sampled) with its server made ready (:func:`prepare_engine`), and the run's ``start`` moved on by the time
    that took (a build is not charged to the budget); anything else as it is."""
    if workload.kind != "serve":
        return space, start
    space = fit_space(replace(space, serving=True), workload)
    return space, start + prepare_engine(space, progress)


def prepare_engine(space: ResolvedSpace, progress: Progress) -> float:
    """Make the server of every backend of ``space`` ready (a build is said as it goes); the seconds it took,
    which the run does not charge to its budget. AutotuneError for a backend without such a server."""
    started = time.monotonic()
    for name in space.backends:
        facts: dict[str, Any] = backends.get(name).serving_engine(progress.status)
        built = facts.get("build_s")
        how = f"built in {built:.0f} s, not charged to the budget" if built else f"from the {facts.get('source')}"
        progress.status(f"llama-server {facts.get('version', '')}: {facts['binary']} ({how})")
    return time.monotonic() - started


CAPACITY_RESERVE_S = 90.0    # a trial of one window and a sweep of the users (1, 2, 4, ... 2x) on a small model
CAPACITY_SHARE = 0.2         # ... at most this share of the budget
REFERENCE_RESERVE_S = 60.0   # the single-request pick's trial and sweep (it misses the targets sooner)
REFERENCE_SHARE = 0.1        # ... at most this share more
SINGLE_WORKLOAD = "default"  # the single-request workload: its pick is what a serve run compares with
SERVER_OWN = ("n_parallel", "kv_unified", "n_ctx")  # what the server sets for its users, not the single pick


def capacity_reserve_s(budget_s: float, reference: bool = False) -> float:
    """Seconds a serve run keeps back for the pick's capacity sweep (:func:`tuner.search.stages.capacity`) and,
    with ``reference``, the single-request pick's."""
    own = min(CAPACITY_RESERVE_S, CAPACITY_SHARE * budget_s)
    return own + (min(REFERENCE_RESERVE_S, REFERENCE_SHARE * budget_s) if reference else 0.0)


def single_request_pick(storage: Storage, profile: str, model_sha: str, space: ResolvedSpace) -> TrialSettings | None:
    """The single-request pick of this model on this profile (the newest study of a workload of one request at a
    time, ``default`` first, chosen by the one decision rule under its stored targets and ceiling) served the way
    a user would serve it: its settings on llama-server's defaults for the users (slots, unified KV) with
    context for every slot. None when no such study has a pick, or its pick runs on a backend the serve space
    does not hold."""
    single = [s for s in find_studies(storage, profile, model_sha) if s.user_attrs["workload"].get("kind") == "single"]
    if not single:
        return None
    newest = sorted(newest_first(single), key=lambda s: s.user_attrs["workload"].get("name") != SINGLE_WORKLOAD)[0]
    chosen = load_view(storage, newest).pick_among()
    if chosen is None or chosen.backend not in space.backends:
        return None
    served = space.defaults(chosen.backend)
    own = {key: value for key, value in chosen.settings.items() if key not in SERVER_OWN}
    settings = TrialSettings(**{**served.model_dump(), **own, "n_ctx": max(int(chosen.settings.get("n_ctx") or 0),
                                                                           served.n_ctx)})
    return normalize(settings)[0]  # as a trial stores it: its config key names it


def remember_reference(study: optuna.Study, reference: TrialSettings | None) -> None:
    """Store which config of ``study`` is the single-request pick served the same way (the recommendation's
    comparison, :func:`tuner.recommend.summary.served_single_pick`), or that there is none now."""
    study.set_user_attr(SINGLE_PICK_ATTR, {"config_key": config_key(reference)} if reference is not None else None)


def check_targets_met(candidates: list[Candidate], workload: Workload) -> None:
    """AutotuneError (one line) when no measured config served a single request within the serve workload's
    targets, naming the closest config (the least p90 time to first token) and its figures."""
    if workload.kind != "serve" or not candidates:
        return
    if any(c.goodput is not None and c.goodput.median > 0 for c in candidates):
        return
    measured = [c for c in candidates if (c.extra.get("serving") or {}).get("ttft_p90_s") is not None]
    if not measured:
        return
    closest = min(measured, key=lambda c: c.extra["serving"]["ttft_p90_s"])
    figures = closest.extra["serving"]
    tpot = figures.get("tpot_p90_s")
    raise AutotuneError(
        f"no config met the targets for {workload.users} users (first token within {workload.max_ttft_s:g} s, "
        f"then {workload.max_tpot_s * 1000:g} ms per token): the closest, {_settings_line(closest.settings)}, had "
        f"p90 time to first token {figures['ttft_p90_s']:.2f} s and p90 {(tpot or 0) * 1000:.0f} ms per token; "
        "loosen --max-ttft / --max-tpot or serve fewer --users")


SHOWN = ("quant", "n_parallel", "kv_unified", "n_threads", "n_threads_batch", "n_batch", "n_ubatch", "flash_attn")


def _settings_line(settings: dict[str, Any]) -> str:
    """The settings that matter most for serving, on one line."""
    return " ".join(f"{key}={settings[key]}" for key in SHOWN if key in settings)
