"""One trial of a run: ask Optuna for it (queuing the warm or informed start first), note why it is
measured, run it in its child process with a timeout sized by what its backend cost so far, report
it, and retry a crashed baseline or re-measure once with safer settings."""

from __future__ import annotations

import statistics

import optuna

from .. import backends
from ..backends.settings import TrialSettings, config_key, normalize
from ..config import objectives
from ..measure import disturbance, records as R
from ..measure.lock import machine_lock
from ..results.storage import asked_params
from ..selection import candidates as select, decision
from . import informed, refine, remeasure
from .options import MIN_TRIAL_TIMEOUT_S, TuneOptions
from .run import WARM_ATTR
from .state import Run
from .stopping import OUTCLASSED_SHARE
from .trial import fault_for, record_attr, run_trial, worker_facts
from .weights import weight_type


def measure(run: Run, settings: TrialSettings | None, role: str, reps: int | None = None, notes: tuple[str, ...] = (),
            round_no: int | None = None, round_size: int | None = None) -> R.TrialRecord:
    """Measure ``settings`` (None: the next queued start, refinement step or TPE's sample) as a trial of
    ``role``; a confirmation trial carries the run's stage, its round ``round_no`` and how many configs
    that round measures (``round_size``).

    The machine lock is taken before Optuna is asked for the trial: a run that waits its whole budget for
    another run's lock stores no trial (not a failed one) and ends with :class:`tuner.measure.lock.MachineBusy`."""
    with machine_lock(on_wait=lambda: run.progress.status("waiting: another autotune run uses this machine"),
                      deadline=run.ctx.deadline):
        return _measure(run, settings, role, reps, notes, round_no, round_size)


def _measure(run: Run, settings: TrialSettings | None, role: str, reps: int | None, notes: tuple[str, ...],
             round_no: int | None, round_size: int | None) -> R.TrialRecord:
    """:func:`measure` once the machine is this run's."""
    if settings is None:
        trial, sampled = _ask_untried(run, role)
    else:
        trial, sampled = _ask(run, settings, role, round_no, round_size), settings
    notes = (*notes, *_why(trial))
    # A trial may run three times what one of its backend cost so far; every trial, the very first
    # baseline included, stops at the run's deadline and keeps the repetitions it measured (the budget
    # promise: budget + max(10%, 30 s)).
    cost = typical_cost(run.study, sampled.backend)
    record = run_trial(run.ctx, trial, sampled, role, reps, notes,
                       timeout_s=max(3 * cost, MIN_TRIAL_TIMEOUT_S) if cost else None, cut_at_deadline=True,
                       adaptive=role == R.Role.SEARCH,
                       outclassed_by=outclass_bar(run, role, sampled.backend),
                       outclassed_disturbed=disturbed_bar(run), max_wait_s=run.wait_left())
    run.trials_run += 1
    run.waited_s += (record.extra.get(disturbance.KEY) or {}).get(disturbance.WAITED, 0.0)
    run.progress.trial_finished(trial.number, record, best_so_far(run.study, run.options.objective), run.elapsed())
    engine = backends.get(sampled.backend)
    retry = engine.retry_after_crash(sampled) if settings is not None and _killed(record) else None
    if retry is not None:  # a baseline or re-measurement killed by a signal is retried once, safer
        changed = ", ".join(f"{k}={v}" for k, v in retry.model_dump().items() if getattr(sampled, k) != v)
        again = measure(run, retry, role, reps, (*notes, f"retried with {changed}: as it was, trial "
                                                 f"{trial.number} died by {record.outcome.signal}"), round_no, round_size)
        if again.outcome.ok:
            engine.crash_evidence(run.ctx.health, weight_type(run.ctx, sampled), record.outcome, run.progress.status)
    return record


def _ask(run: Run, settings: TrialSettings | None, role: str, round_no: int | None, round_size: int | None) -> optuna.Trial:
    """The next Optuna trial: the warm start, else the next informed start, queued first when no
    settings are given (a search trial of a backend whose typical trial fits before the confirmation
    stage: :func:`fitting_backends`); a re-measure carries the run's confirmation stage and round."""
    with run.storage.errors():
        if settings is None and run.warm:  # the most similar machine's best config, before anything else
            run.study.enqueue_trial(run.warm.pop("params"), user_attrs=run.warm.pop("user_attrs"))
        elif settings is None:
            fit = fitting_backends(run) if role == R.Role.SEARCH else list(run.resolved.backends)
            informed.enqueue_next(run.study, run.resolved, run.profile.physical_cores, run.profile.logical_cores,
                                  only=fit, free_cpus=run.load.free_cpus() if run.busy else None)
            if fit and len(fit) < len(run.resolved.backends) and not _waiting(run.study):
                _enqueue_backend(run, fit)
        trial = run.study.ask()
        if role == R.Role.REMEASURE:
            trial.set_user_attr(select.CONFIRM_ATTR, run.stage)
            if round_no is not None:
                trial.set_user_attr(select.ROUND_ATTR, round_no)
            if round_size is not None:
                trial.set_user_attr(select.ROUND_SIZE_ATTR, round_size)
    return trial


FIT_ATTR = "autotune_fitting_backend"  # a TPE sample held to the backend whose trial fits before the stage


def fitting_backends(run: Run) -> list[str]:
    """The run's backends a search trial of which may start now (:func:`backends_that_fit`)."""
    return backends_that_fit(run.study, run.options, run.left(), list(run.resolved.backends))


def backends_that_fit(study: optuna.Study, options: TuneOptions, left_s: float, names: list[str]) -> list[str]:
    """Those of ``names`` whose typical trial (:func:`typical_cost`: the median wall time of the study's
    trials of that backend, its baseline included) ends before the time kept for the confirmation stage
    (:func:`tuner.search.remeasure.reserve_seconds`), with ``left_s`` seconds of the budget left. A backend
    not measured yet fits. Where no reserve is kept, or the stage no longer fits in what is left (the rule
    of :func:`tuner.search.stages.search_on`), every backend fits: that time is the search's.

    A TPE-sampled transformers trial late in a 10-minute run took 57 s (llama.cpp's took 20 s) and cut the
    confirmation to two rounds: the median search trial fitted, the costliest backend's did not."""
    cands = select.candidates(study)
    reserve = remeasure.reserve_seconds(cands, options)
    if reserve <= 0 or not remeasure.schedule(cands, options, left_s):
        return list(names)
    return [name for name in names if left_s > reserve + (typical_cost(study, name) or 0.0)]


def _enqueue_backend(run: Run, fit: list[str]) -> None:
    """Hold TPE's next sample to one backend of ``fit``: the best config's where it fits, else the cheapest
    (the other settings are TPE's)."""
    best = decision.best(select.candidates(run.study), run.options.objective)
    name = best.backend if best is not None and best.backend in fit else \
        min(fit, key=lambda b: typical_cost(run.study, b) or 0.0)
    if "backend" in run.resolved.distributions:
        run.study.enqueue_trial({"backend": name}, user_attrs={FIT_ATTR: name})


def _waiting(study: optuna.Study) -> bool:
    """Whether a trial is queued (a start or a refinement step): it is asked next."""
    from optuna.trial import TrialState

    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


MAX_REPEATS = 3  # TPE samples of configs already measured answered in a row before one is measured again


def _ask_untried(run: Run, role: str) -> tuple[optuna.Trial, TrialSettings]:
    """The next trial to measure and its settings: the next queued start or refinement step, else TPE's sample.

    TPE may sample a config the study has already measured (a small space, a converged model, a resumed
    study): such a sample is told the figures that config has (TPE learns the same) and a fresh one is
    asked, so the search does not measure one config again and again. After ``MAX_REPEATS`` such samples
    in a row the next one is measured whatever it is (its repetitions pool with the earlier ones). A trial
    the fault-injection hook names (``AUTOTUNE_FAULT=kind:number``) is always measured: its number is the
    test's handle on it."""
    for _ in range(MAX_REPEATS):
        trial = _ask(run, None, role, None, None)
        sampled = run.resolved.suggest(trial)
        twin = None if _queued(trial) or fault_for(trial.number) else _measured_twin(run, sampled)
        if twin is None:
            return trial, sampled
        why = f"TPE sampled {twin.config_key} again: told its figures (trials {_numbers(twin)}), not measured"
        record = R.TrialRecord(role=role, settings=twin.settings, config_key=twin.config_key, notes=(why,),
                               outcome=R.TrialOutcome(status=R.REPEAT, reason=why),
                               worker=worker_facts())
        with run.storage.errors():  # every finished trial carries a record; candidates leave this one out
            trial.set_user_attr(R.RECORD_ATTR, record_attr(record))
            run.study.tell(trial, objectives.get(run.options.objective).values(twin))
        run.progress.status(f"trial {trial.number}: {why}")
    trial = _ask(run, None, role, None, None)
    return trial, run.resolved.suggest(trial)


def _numbers(cand: select.Candidate) -> str:
    return ", ".join(map(str, cand.trials[:5])) + (", ..." if len(cand.trials) > 5 else "")


def _queued(trial: optuna.Trial) -> bool:
    """Whether ``trial`` was queued on purpose (warm or informed start, screening, refinement): measured as asked."""
    return any(trial.user_attrs.get(attr) for attr in (WARM_ATTR, informed.INFORMED_ATTR, refine.REFINE_ATTR))


def _measured_twin(run: Run, sampled: TrialSettings) -> select.Candidate | None:
    """The study's measured config (a :class:`tuner.selection.candidates.Candidate`) that ``sampled``
    would measure again: the same real config, or one whose trial asked for the same params (the engine
    check may have changed a setting as it ran); None when it is new."""
    key = config_key(normalize(sampled)[0])
    cands = {c.config_key: c for c in select.candidates(run.study)}
    if key in cands:
        return cands[key]
    for trial, rec in select.records(run.study):
        if rec.config_key in cands and trial.params:
            try:
                if refine.key_of(run.resolved, asked_params(trial)) == key:
                    return cands[rec.config_key]
            except (KeyError, ValueError):  # params of another space
                continue
    return None


def _why(trial: optuna.Trial) -> tuple[str, ...]:
    """The note that says why a queued trial is measured (warm start, informed start, screening...)."""
    if trial.user_attrs.get(WARM_ATTR):
        return (f"warm start from profile {trial.user_attrs[WARM_ATTR]}, measured like any other",)
    if trial.user_attrs.get(informed.INFORMED_ATTR):
        return ("informed start: a config that usually does well on CPUs, measured like any other",)
    if trial.user_attrs.get(refine.REFINE_ATTR):
        changed = trial.user_attrs[refine.REFINE_ATTR]
        step = "screening" if trial.user_attrs.get(refine.SCREEN_ATTR) else "local refinement"
        return (f"{step}: the best config so far with {changed} changed, measured like any other",)
    if trial.user_attrs.get(FIT_ATTR):
        return (f"TPE's sample held to {trial.user_attrs[FIT_ATTR]}: another backend's typical trial would not end "
                "before the time kept for the confirmation stage",)
    return ()


def outclass_bar(run: Run, role: str, backend: str) -> float | None:
    """The score of the study's best config so far, under half of which a trial of ``role`` and ``backend``
    stops after one undisturbed repetition (:func:`tuner.search.trial.run_trial`'s ``outclassed_by``): a
    config that slow cannot be recommended. None (every asked repetition runs) for a re-measurement or a
    reference (the pick is compared with it), for a baseline of the best config's own backend (the speedup is
    reckoned against it), and before any best."""
    if role in (R.Role.REMEASURE, R.Role.REFERENCE):
        return None
    best = decision.best(select.candidates(run.study), run.options.objective)
    if best is None or (role == R.Role.BASELINE and best.backend == backend):
        return None
    return decision.estimate(best, run.options.objective)


def disturbed_bar(run: Run) -> float | None:
    """The share of the best config's score under which a *disturbed* repetition stops an outclassed trial
    (:func:`tuner.search.stopping._outclassed`): ``OUTCLASSED_SHARE``, as for a quiet one, where the two compare
    like with like (the machine was busy when the run started, or the best config's own figures rest on
    disturbed repetitions); None (the trial's stricter default) otherwise."""
    if run.busy:
        return OUTCLASSED_SHARE
    best = decision.best(select.candidates(run.study), run.options.objective)
    if best is None:
        return None
    recs = dict((t.number, r) for t, r in select.records(run.study))
    return OUTCLASSED_SHARE if disturbance.kept_disturbed([recs[n] for n in best.trials if n in recs]) else None


def best_so_far(study: optuna.Study, objective: str) -> dict[str, float]:
    """The figures of the study's best config so far by ``objective`` (the progress line shows them)."""
    best = decision.best(select.candidates(study), objective)
    if best is None:
        return {"prefill": 0.0, "decode": 0.0}
    return {"prefill": best.prefill.median, "decode": best.decode.median}


def typical_cost(study: optuna.Study, backend: str) -> float | None:
    """The median wall time of the study's finished trials of ``backend`` so far (None before the first)."""
    walls = [r.outcome.wall_s for _, r in select.records(study) if r.backend == backend and r.outcome.ok]
    return statistics.median(walls) if walls else None


def _killed(record: R.TrialRecord) -> bool:
    """Whether the trial's child died by a signal (a crash, not a timeout or the memory ceiling)."""
    return record.outcome.status == R.CRASHED and record.outcome.signal is not None
