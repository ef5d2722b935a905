"""A tuning run's preparation: the inputs checked, the machine profiled, the study opened.

:func:`prepare` does everything before the first trial (bad input is an AutotuneError before anything
is measured); the stages of :mod:`tuner.search.stages` then run trials through :mod:`tuner.search.step`
on the :class:`tuner.search.state.Run` it returns.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any


from .. import backends
from ..backends.capabilities import Health
from ..config import objectives
from ..config.model import ModelInfo, resolve_model
from ..config.workloads import get_workload, with_depth
from ..errors import AutotuneError
from ..machine.profile import MachineProfile, detect_profile, measure_memory_bandwidth
from ..measure import load as machine_load
from ..measure.runner import remove_orphan_trial_dirs
from ..results.storage import Storage, open_storage
from ..results.studies import StudyKey, fail_orphans, open_study, sibling_studies
from ..selection import asked, candidates as select, targets
from ..util.files import remove_orphan_temps
from ..util.paths import cache_dir, check_locations, default_storage_url
from . import informed, refine, serving
from .options import WRAP_UP_S, TuneOptions, default_memory_ceiling, grace_s, make_pruner, make_sampler, speed_only
from .progress import Progress
from .repetitions import timed_cap_s
from .space import ResolvedSpace, load_space
from .state import Run, TrialContext
from .weights import check_ceiling, check_memory_target, smallest_weights
from ..config.hf_folder import check_gguf_beside
from ..machine.similarity import scale_threads
from .prior import predict, stored_results

WARM_ATTR = "autotune_warm_start"  # the profile a queued warm-start config came from


def prepare(options: TuneOptions, progress: Progress) -> Run:
    """Check the inputs, profile the machine, open (or resume) the study: a :class:`Run` ready to measure."""
    start = time.monotonic()
    options = serving.resolve_options(options)
    objectives.get(options.objective)  # an unknown name is an AutotuneError before anything runs
    if options.budget_s <= 0:
        raise AutotuneError("the budget must be more than zero, e.g. --budget 2m")
    check_locations()
    space = load_space(options.space)
    workload = serving.with_users(with_depth(get_workload(options.workload, space.workloads,
                                                          f"search space {space.path}"), options.depth),
                                  options.users, options.max_ttft_s, options.max_tpot_s)
    options = serving.resolve_options(options, workload)  # the objective: goodput for a serve workload
    model = resolve_model(options.model)
    gguf = None
    if options.gguf:  # the GGUF of a model folder: llama.cpp runs it, transformers the folder
        gguf = resolve_model(options.gguf)
        check_gguf_beside(model, gguf)
    options, speed_note = speed_only(options, (model, gguf))  # random weights: no quality guard
    variants = {}
    if options.model_dir:
        source = gguf or model
        variants = backends.for_format(source.format).find_variants(options.model_dir, source)
    ceiling = options.memory_ceiling or default_memory_ceiling()
    for each in (model, gguf):
        if each is not None:
            check_ceiling(each, ceiling)
    profile = detect_profile(options.profile, options.cpus)
    load = machine_load.probe(profile.n_cpus)  # before anything of this run loads the CPUs
    resolved = space.resolve(profile.n_cpus, workload.needed_ctx(), model.context_length or None,
                             workload.prefill_tokens(), (model.format, *((gguf.format,) if gguf else ())))
    resolved, start = serving.ready(resolved, workload, progress, start)  # a server built: not on the budget
    _refuse_unreachable(options, resolved, variants, (model, *((gguf,) if gguf else ())))
    _refuse_ephemeral(options)
    storage = open_storage(options.storage)
    profile, health, latest = _profiled(storage, profile)
    key = StudyKey(profile=profile, model=model, workload=workload, space=resolved, objective=options.objective)
    # Constraint violations (memory ceiling, quality) reach TPE through Trial.set_constraint.
    study, resumed = open_study(storage, key, make_sampler(options.seed), make_pruner())
    ctx = TrialContext(storage=storage, study=study, model=model, workload=workload, objective=options.objective,
                       repetitions=options.repetitions, memory_ceiling=ceiling,
                       timeout_s=options.trial_timeout_s, progress=progress,
                       max_quality_loss=options.max_quality_loss, max_kl=options.max_kl,
                       targets=targets.for_run(options.targets, study, workload.rank_at_depth),
                       bandwidth_for=profile.bandwidth_for,
                       quality_guard="quant" in resolved.distributions, variants=variants,
                       deadline=start + options.budget_s + grace_s(options.budget_s) - WRAP_UP_S, health=health,
                       gguf=gguf, load=load.public(), timed_cap_s=timed_cap_s(options.budget_s))
    asked.store_ceiling(study, ceiling)  # with the targets (targets.for_run): every later pick applies them
    run = Run(options=options, ctx=ctx, start=start, resolved=resolved, profile=profile, key=key, resumed=resumed,
              notes=[*resolved.notes, *filter(None, [speed_note])], latest=latest,
              stage=f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}")
    _keep_back_for_capacity(run, model.sha256)
    if load.busy:  # said first: it explains a slow run
        run.notes.insert(0, load.text(options.budget_s))
    _resume_notes(run)
    for note in run.notes:
        progress.status(note)
    return run


def _keep_back_for_capacity(run: Run, model_sha: str) -> None:
    """A serve run keeps time back for the pick's capacity sweep and, when this machine's profile has a
    single-request pick of the model, for that pick served the same way (``Run.reference``)."""
    if run.workload.kind != "serve":
        return
    run.reference = serving.single_request_pick(run.storage, run.profile.name, model_sha, run.resolved)
    serving.remember_reference(run.study, run.reference)
    run.reserve_s = serving.capacity_reserve_s(run.options.budget_s, run.reference is not None)


def _refuse_unreachable(options: TuneOptions, resolved: ResolvedSpace, variants: dict[str, Any],
                        models: tuple[ModelInfo, ...]) -> None:
    """A memory target below the smallest weights of every model the run could measure is one line before
    anything runs (as a memory ceiling below the model file is), never a budget of trials that all miss it."""
    wanted = options.targets.max_memory if options.targets is not None else None
    if wanted is None:
        return
    dist = resolved.distributions.get("quant")
    quants = list(getattr(dist, "choices", ()) or ())
    floors = [(smallest_weights(m, quants, variants), m) for m in models]
    floor, model = min(floors, key=lambda fm: fm[0])
    check_memory_target(wanted, floor, model)


def _refuse_ephemeral(options: TuneOptions) -> None:
    """A database that cannot persist (SQLite in memory) loses every trial when the run ends: refused
    unless asked for with ``ephemeral``."""
    from sqlalchemy.engine import make_url

    url = options.storage or default_storage_url()
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - open_storage says what is wrong with the URL
        return
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:") and not options.ephemeral:
        raise AutotuneError(f"--storage {url} keeps every trial in memory and loses it when the run ends: give a "
                            "file (e.g. sqlite:///results/autotune.db), or pass --ephemeral to run without keeping "
                            "anything")


def _profiled(storage: Storage, profile: MachineProfile
              ) -> tuple[MachineProfile, Health | None, dict[str, MachineProfile]]:
    """The profile with its bandwidth and the engine's stored health, saved; the health keeps the
    stored profile up to date as it learns (``latest["profile"]``)."""
    known = {p.name: p for p in storage.profiles()}.get(profile.name)
    profile = _with_bandwidth(profile, known)
    health = backends.open_health(known.extra if known and known.id == profile.id else {}, profile.public())
    if health is not None:
        profile = replace(profile, extra={**profile.extra, health.extra_key: health.public()})
    storage.save_profile(profile)
    latest = {"profile": profile}
    if health is None:
        return profile, health, latest
    key = health.extra_key

    def save_engine(engine: dict[str, Any]) -> None:
        latest["profile"] = replace(latest["profile"], extra={**latest["profile"].extra, key: engine})
        storage.save_profile(latest["profile"])

    health.on_change = save_engine
    return profile, health, latest


def _resume_notes(run: Run) -> None:
    """What a resumed or new study says first: a changed space, orphans repaired, a warm start; and the
    setting effects a similar machine measured (the screening order)."""
    if not run.resumed and (old := sibling_studies(run.storage, run.key)):
        run.notes.append(f"the search space differs from the one of study {old[-1]}: started a new study "
                         f"{run.key.name}")
    remove_orphan_trial_dirs()
    remove_orphan_temps(cache_dir())  # a variant half-written by a killed quantizer
    orphans = fail_orphans(run.storage, run.study)
    if orphans:
        run.notes.append(f"marked {len(orphans)} trial(s) left running by a stopped run as failed: {orphans}")
    mixing = _load_note(run)
    if mixing:
        run.notes.append(mixing)
    if not run.study.get_trials(deepcopy=False):
        run.warm, note = _warm_start(run)
        if note:
            run.notes.append(note)
    run.effects = _similar_effects(run)


def _load_note(run: Run) -> str | None:
    """A resumed study measured under another load than this run's (a busy run's trials, now a quiet machine,
    or the other way round): one line, since the two runs' figures pool (:func:`tuner.measure.load.mixed_text`)."""
    if run.load is None:
        return None
    before = machine_load.classes([rec for _, rec in select.records(run.study)])
    if not before or before == {run.busy}:
        return None
    then, now = ("busy", "quiet") if run.busy is False else ("quiet", "busy")
    return (f"this study's earlier trials were measured on a {then} machine and this run's machine is {now}: "
            "their figures pool with this run's (the confirmation stage re-measures its configs side by side "
            "under this run's load); the recommendation says when its figures mix the two")


def _warm_start(run: Run) -> tuple[dict[str, Any], str | None]:
    """For a study with no trials: the params (and the user attributes to queue them with) of the best
    config of the most similar stored profile, and a note; ({}, None) when none is similar enough."""
    guess = predict(run.profile, stored_results(run.storage, run.ctx.model, run.workload.name))
    if guess is None:
        return {}, None
    (view, cand), score = guess
    params = informed.allowed_params(run.resolved, scale_threads(cand.settings, view.profile.n_cpus,
                                                                 run.profile.n_cpus))
    if not params:
        return {}, None
    return ({"params": params, "user_attrs": {informed.INFORMED_ATTR: True, WARM_ATTR: view.profile.name}},
            f"warm start: the first search trial is the best config of profile {view.profile.name} "
            f"(similarity {score:.2f}), threads scaled to this machine")


def _similar_effects(run: Run) -> dict[str, float]:
    """The effect of each setting in the stored study of the most similar other machine (what to screen
    first, :func:`tuner.search.refine.screen_order`); empty when no stored machine is similar enough."""
    guess = predict(run.profile, stored_results(run.storage, run.ctx.model, run.workload.name))
    if guess is None:
        return {}
    (view, _), _ = guess
    return refine.setting_effects(view.candidates, run.options.objective)


def _with_bandwidth(profile: MachineProfile, known: MachineProfile | None) -> MachineProfile:
    """``profile`` with measured 1-thread and all-CPU bandwidth, each the best ever seen for it.

    Bandwidth is a best-of figure: a busy moment only lowers it, so a stored figure of the same
    machine (same id) is kept when it is higher.
    """
    same = known is not None and known.id == profile.id
    one = max(measure_memory_bandwidth(), (same and known.memory_bandwidth_gbs) or 0.0)
    all_cpus = one
    if profile.n_cpus > 1:
        all_cpus = max(measure_memory_bandwidth(threads=profile.n_cpus),
                       (same and known.memory_bandwidth_all_gbs) or 0.0)
    return replace(profile, memory_bandwidth_gbs=one, memory_bandwidth_all_gbs=all_cpus)
