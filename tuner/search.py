"""``tune()``: a budgeted, resumable Optuna search that ends in a recommendation file.

Flow: profile -> model -> space -> study (resumed if it exists) -> baselines -> informed
starts (:mod:`tuner.informed`) -> ask/tell search until the budget (minus a reserve) is
spent: composites (:mod:`tuner.composite`), the best config's neighbours (:mod:`tuner.refine`)
and, at a local optimum, TPE's samples -> the confirmation stage (:mod:`tuner.remeasure`: the top
configs re-measured side by side, the recommendation chosen on those figures) -> recommendation YAML.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import psutil

from . import backends, composite, decision, informed, objectives, recommend, refine, remeasure, select
from .remeasure import REMEASURE_TOP, reserve_seconds
from . import records as R
from .errors import AutotuneError
from .health import ENGINE_EXTRA, EngineHealth, engine_key
from .model import resolve_model
from .paths import check_locations
from .profile import MachineProfile, detect_profile, measure_memory_bandwidth
from .progress import Progress
from .settings import TrialSettings, config_key, defaults
from .space import load_space
from .storage import open_storage, redact
from .runner import remove_orphan_trial_dirs
from .studies import StudyKey, baseline_running, fail_orphans, open_study, sibling_studies
from .trial import TrialContext, check_ceiling, run_trial, weight_type
from . import targets
from .workloads import get_workload, with_depth

GRACE_SHARE, MIN_GRACE_S = 0.1, 30.0  # a run ends by budget + max(10% of it, 30 s)
WARM_ATTR = "autotune_warm_start"  # the profile a queued warm-start config came from
WRAP_UP_S = 3.0               # kept before the deadline for storing the last trial and the recommendation
MIN_TRIAL_TIMEOUT_S = 60.0    # a trial's timeout is 3x what its backend cost so far, at least this

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# autotune records heartbeats itself around each ask/tell trial.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class TuneOptions:
    """Everything a tuning run needs; every field has a sensible default."""

    model: str | None = None
    budget_s: float = 1800.0
    space: str | None = None
    storage: str | None = None
    memory_ceiling: int | None = None
    profile: str | None = None
    objective: str = objectives.DEFAULT
    workload: str = "default"
    repetitions: int = 3
    trial_timeout_s: float = 300.0
    seed: int | None = None
    cpus: list[int] | None = None
    max_quality_loss: float | None = 0.05
    remeasure: int = REMEASURE_TOP
    output: str | None = None
    model_dir: str | None = None
    max_kl: float | None = None  # issue 29: --max-kl (None: no KL guard; the CLI's default is kl.DEFAULT_MAX_KL)
    targets: Any = None  # issue 29: tuner.targets.Targets (min decode / prefill, max memory)
    explain: bool = False  # issue 29: on a missed target, list the setting changes that would help
    depth: str | None = None  # issue 29: decode-at-depth of N tokens or "75%" of n_ctx (None: the workload's end)


@dataclass
class TuneResult:
    """What a run produced."""

    study_name: str
    recommendation_path: Path | None
    recommendation: dict[str, Any] | None
    trials_run: int
    elapsed_s: float
    resumed: bool
    notes: list[str] = field(default_factory=list)


def make_sampler(seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler every run uses: multivariate TPE over conditional groups, 8 random startup trials."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=8)


def make_pruner() -> optuna.pruners.BasePruner:
    """The pruner of search trials: Optuna's median rule on the repetitions done so far, once four
    trials are complete (a config whose first repetitions are slower than the median at that step
    is not measured further; it still counts as measured, with the figures it had)."""
    return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=0)


def default_memory_ceiling() -> int:
    """A safe share of this machine's memory: 75% of what is available now."""
    return int(psutil.virtual_memory().available * 0.75)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so the running trial is stopped and marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _best_so_far(study: optuna.Study, objective: str) -> dict[str, float]:
    """The figures of the study's best config so far by ``objective`` (the progress line shows them)."""
    best = decision.best(select.candidates(study), objective)
    if best is None:
        return {"prefill": 0.0, "decode": 0.0}
    return {"prefill": best.prefill.median, "decode": best.decode.median}


def tune(options: TuneOptions = TuneOptions(), progress: Progress | None = None) -> TuneResult:
    """Run a tuning session and write the recommendation; resumes the study if it exists.

    Raises :class:`AutotuneError` for bad input (model, space, ceiling, storage); crashed or
    hung trials are recorded, not raised. Ctrl-C / SIGTERM stop the running trial, mark it
    interrupted and propagate ``KeyboardInterrupt``.
    """
    start = time.monotonic()
    progress = progress or Progress()
    objectives.get(options.objective)  # an unknown name is an AutotuneError before anything runs
    if options.budget_s <= 0:
        raise AutotuneError("the budget must be more than zero, e.g. --budget 2m")
    check_locations()
    space = load_space(options.space)
    workload = with_depth(get_workload(options.workload, space.workloads, f"search space {space.path}"),
                          options.depth)
    model = resolve_model(options.model)
    variants = {}
    if options.model_dir:
        from .variants import find_variants

        variants = find_variants(options.model_dir, model)
    ceiling = options.memory_ceiling or default_memory_ceiling()
    check_ceiling(model, ceiling)
    profile = detect_profile(options.profile, options.cpus)
    resolved = space.resolve(profile.n_cpus, workload.needed_ctx(), model.context_length or None,
                             workload.prefill_tokens())
    storage = open_storage(options.storage)
    known = {p.name: p for p in storage.profiles()}.get(profile.name)
    profile = _with_bandwidth(profile, known)
    health = EngineHealth.from_extra(known.extra if known and known.id == profile.id else {},
                                     engine_key(profile.llama_cpp_python, profile.llama_cpp_system_info))
    profile = replace(profile, extra={**profile.extra, ENGINE_EXTRA: health.public()})
    storage.save_profile(profile)
    latest = {"profile": profile}

    def save_engine(engine: dict[str, Any]) -> None:
        latest["profile"] = replace(latest["profile"], extra={**latest["profile"].extra, ENGINE_EXTRA: engine})
        storage.save_profile(latest["profile"])

    health.on_change = save_engine
    key = StudyKey(profile=profile, model=model, workload=workload, space=resolved, objective=options.objective)
    # Constraint violations (memory ceiling, quality) reach TPE through Trial.set_constraint.
    sampler = make_sampler(options.seed)
    study, resumed = open_study(storage, key, sampler, make_pruner())
    notes = list(resolved.notes)
    if not resumed and (old := sibling_studies(storage, key)):
        notes.append(f"the search space differs from the one of study {old[-1]}: started a new study {key.name}")
    remove_orphan_trial_dirs()
    orphans = fail_orphans(storage, study)
    if orphans:
        notes.append(f"marked {len(orphans)} trial(s) left running by a stopped run as failed: {orphans}")
    warm: dict[str, Any] = {}
    if not study.get_trials(deepcopy=False):
        warm, note = _warm_start(storage, profile, model, workload, resolved)
        if note:
            notes.append(note)
    effects = _similar_effects(storage, profile, model, workload, options.objective)
    for note in notes:
        progress.status(note)
    ctx = TrialContext(storage=storage, study=study, model=model, workload=workload, objective=options.objective,
                       repetitions=options.repetitions, memory_ceiling=ceiling,
                       timeout_s=options.trial_timeout_s, progress=progress,
                       max_quality_loss=options.max_quality_loss, max_kl=options.max_kl,
                       targets=targets.for_run(options.targets, study, workload.rank_at_depth),
                       bandwidth_for=profile.bandwidth_for,
                       quality_guard="quant" in resolved.distributions, variants=variants,
                       deadline=start + options.budget_s + grace_s(options.budget_s) - WRAP_UP_S, health=health)
    elapsed = lambda: time.monotonic() - start  # noqa: E731
    trials_run = 0

    stage = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"  # this run's confirmation stage

    def measure(settings: Any, role: str, reps: int | None = None, notes: tuple[str, ...] = (),
                round_no: int | None = None) -> Any:
        nonlocal trials_run
        with storage.errors():
            if settings is None and warm:  # the most similar machine's best config, before anything else
                study.enqueue_trial(warm.pop("params"), user_attrs=warm.pop("user_attrs"))
            elif settings is None:
                informed.enqueue_next(study, resolved, profile.physical_cores, profile.logical_cores)
            trial = study.ask()
            if role == "remeasure":
                trial.set_user_attr(select.CONFIRM_ATTR, stage)
                if round_no is not None:
                    trial.set_user_attr(select.ROUND_ATTR, round_no)
        if trial.user_attrs.get(WARM_ATTR):
            notes = (*notes, f"warm start from profile {trial.user_attrs[WARM_ATTR]}, measured like any other")
        elif trial.user_attrs.get(informed.INFORMED_ATTR):
            notes = (*notes, "informed start: a config that usually does well on CPUs, measured like any other")
        elif trial.user_attrs.get(refine.REFINE_ATTR):
            changed = trial.user_attrs[refine.REFINE_ATTR]
            step = "screening" if trial.user_attrs.get(refine.SCREEN_ATTR) else "local refinement"
            notes = (*notes, f"{step}: the best config so far with {changed} changed, measured like any other")
        sampled = resolved.suggest(trial) if settings is None else settings
        # A trial may run three times what one of its backend cost so far; the very first baseline
        # of a study is the one trial that may run past the deadline (the speedup needs it).
        cost = _typical_cost(study, sampled.backend)
        first = role == "baseline" and not any(r.role == "baseline" and r.outcome.ok for _, r in select.records(study))
        record = run_trial(ctx, trial, sampled, role, reps, notes,
                           timeout_s=max(3 * cost, MIN_TRIAL_TIMEOUT_S) if cost else None, cut_at_deadline=not first,
                           adaptive=role == "search")
        trials_run += 1
        progress.trial_finished(trial.number, record, _best_so_far(study, options.objective), elapsed())
        engine = backends.get(sampled.backend)
        retry = engine.retry_after_crash(sampled) if settings is not None and _killed(record) else None
        if retry is not None:  # a baseline or re-measurement killed by a signal is retried once, safer
            changed = ", ".join(f"{k}={v}" for k, v in retry.model_dump().items() if getattr(sampled, k) != v)
            again = measure(retry, role, reps, (*notes, f"retried with {changed}: as it was, trial "
                                                f"{trial.number} died by {record.outcome.signal}"), round_no)
            if again.outcome.ok:
                engine.crash_evidence(health, weight_type(ctx, sampled), record.outcome, progress.status)
        return record

    with _sigterm_as_interrupt(), storage.errors():
        for i, backend in enumerate(resolved.backends):
            if i == 1 and elapsed() < options.budget_s:
                # Cost-aware order: the first backend's informed start (cheap, and what usually wins)
                # before the other backends' baselines (a transformers baseline costs a minute).
                measure(None, "search")
            if decision.baseline(select.candidates(study), backend) is None and elapsed() < options.budget_s \
                    and not baseline_running(study, backend):  # a concurrent worker measures it now
                base = defaults(backend, profile.n_cpus, workload.needed_ctx())
                measure(base, "baseline", notes=backends.get(backend).baseline_notes(base))
        tried: set[str] = set()  # composites measured (a failed one is not proposed again)
        after_composite = False  # a search trial follows every composite: it never replaces the search
        while _search_on(study, options, options.budget_s - elapsed()):
            guess = None if after_composite else composite.propose(select.candidates(study), options.objective, tried)
            after_composite = guess is not None
            if guess is not None:  # the best decode and prefill settings together, measured before recommended
                tried.add(config_key(guess))
                measure(guess, "composite", notes=(composite.NOTE,))
            else:
                # The best config's next untried neighbour (local refinement), queued for the search trial;
                # at a local optimum TPE samples it.
                refine.enqueue_refinement(study, resolved, options.objective, effects)
                measure(None, "search")
        # The confirmation stage: the winner, its baseline and its runners-up, as many as fit, in
        # interleaved rounds that each fit whole; the recommendation is chosen on these figures alone.
        if remeasure.schedule(select.candidates(study), options, options.budget_s - elapsed()):
            progress.status("confirmation: the best configs re-measured side by side in interleaved rounds; "
                            "the recommendation is chosen on these")

        def run_round(configs: list[select.Candidate], number: int) -> None:
            for cand in configs:
                measure(TrialSettings(**cand.settings), "remeasure", options.repetitions, round_no=number)

        configs, rounds, planned = remeasure.run_stage(
            select.candidates(study), options, lambda: options.budget_s - elapsed(), run_round,
            lambda: select.candidates(study))
        if configs:
            extra = f", {rounds - planned} more to tell the winner from a close rival" if rounds > planned else ""
            progress.status(f"confirmation: {configs} config(s), {min(rounds, planned)} of {planned} planned "
                            f"round(s) fitted{extra}")
    targets.check_run(select.candidates(study), ctx.targets, options.objective,  # with targets that no config
                      progress.status if options.explain else None)  # meets: one line and exit 1
    with storage.errors():
        path, doc = write_recommendation(storage, study, replace(key, profile=latest["profile"]), options, ceiling)
    return TuneResult(study_name=key.name, recommendation_path=path, recommendation=doc,
                      trials_run=trials_run, elapsed_s=elapsed(), resumed=resumed, notes=notes)


def _warm_start(storage: Any, profile: MachineProfile, model: Any, workload: Any,
                resolved: Any) -> tuple[dict[str, Any], str | None]:
    """For a study with no trials: the params (and the user attributes to queue them with) of the best
    config of the most similar stored profile, and a note; ({}, None) when none is similar enough."""
    from .appconfig import predict, stored_results
    from .similarity import scale_threads

    guess = predict(profile, stored_results(storage, model, workload.name))
    if guess is None:
        return {}, None
    (view, cand), score = guess
    params = informed.allowed_params(resolved, scale_threads(cand.settings, view.profile.n_cpus, profile.n_cpus))
    if not params:
        return {}, None
    return ({"params": params, "user_attrs": {informed.INFORMED_ATTR: True, WARM_ATTR: view.profile.name}},
            f"warm start: the first search trial is the best config of profile {view.profile.name} "
            f"(similarity {score:.2f}), threads scaled to this machine")


def _similar_effects(storage: Any, profile: MachineProfile, model: Any, workload: Any,
                     objective: str) -> dict[str, float]:
    """The effect of each setting in the stored study of the most similar other machine (what to screen
    first, :func:`tuner.refine.screen_order`); empty when no stored machine is similar enough."""
    from .appconfig import predict, stored_results

    guess = predict(profile, stored_results(storage, model, workload.name))
    if guess is None:
        return {}
    (view, _), _ = guess
    return refine.setting_effects(view.candidates, objective)


def grace_s(budget_s: float) -> float:
    """How far past its budget a run may end: 10% of the budget, at least 30 s (a trial stopped at the
    budget needs a moment to be stored, and a recommendation to be written)."""
    return max(GRACE_SHARE * budget_s, MIN_GRACE_S)


def _typical_cost(study: optuna.Study, backend: str) -> float | None:
    """The median wall time of the study's finished trials of ``backend`` so far (None before the first)."""
    walls = [r.outcome.wall_s for _, r in select.records(study) if r.backend == backend and r.outcome.ok]
    return statistics.median(walls) if walls else None


def _killed(record: Any) -> bool:
    """Whether the trial's child died by a signal (a crash, not a timeout or the memory ceiling)."""
    return record.outcome.status == R.CRASHED and record.outcome.signal is not None


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


def _search_on(study: optuna.Study, options: TuneOptions, left_s: float) -> bool:
    """Whether another search trial starts with ``left_s`` seconds of the budget left.

    Time is kept back for the confirmation stage (:func:`tuner.remeasure.reserve_seconds`), and a
    search trial starts only when a typical one ends before that reserve. Once the stage's time has
    come, the search stops if the stage fits in what is left; a stage that no longer fits (a long
    baseline took its time) leaves the rest to the search, as a run without a reserve does.
    """
    if left_s <= 0:
        return False
    cands = select.candidates(study)
    reserve = reserve_seconds(cands, options)
    if reserve <= 0:
        return True
    walls = [r.outcome.wall_s for _, r in select.records(study) if r.role == "search" and r.outcome.ok]
    if left_s > reserve + (statistics.median(walls) if walls else 0.0):
        return True
    return not remeasure.schedule(cands, options, left_s)


def write_recommendation(storage: Any, study: optuna.Study, key: StudyKey, options: TuneOptions,
                         ceiling: int | None = None) -> tuple[Path | None, dict[str, Any] | None]:
    """Write the recommendation YAML for the study's best config whose measured peak memory stays under
    ``ceiling``; (None, None) if nothing ran (AutotuneError naming the leanest config when none fits)."""
    from .query import StudyView

    view = StudyView(storage=storage, study=study, profile=key.profile, candidates=select.candidates(study))
    if not view.candidates:
        return None, None
    doc = view.recommendation(ceiling=ceiling)
    path = Path(options.output) if options.output else recommend.default_path(
        key.profile.name, key.model.stem, key.workload.name)
    return recommend.write(doc, path), doc
