"""The stages of a run, in order: the baselines (with the first backend's informed start and first
screening step before the other backends' costly baselines), the search (composites, screening and local
refinement, TPE) while the budget minus the confirmation reserve lasts, and the confirmation stage
(:mod:`tuner.search.remeasure`)."""

from __future__ import annotations

import statistics

import optuna

from .. import backends
from ..measure import records as R
from ..backends.settings import TrialSettings, config_key, defaults
from ..results.studies import baseline_running
from ..selection import candidates as select
from ..selection import decision
from . import composite, refine, remeasure
from .options import TuneOptions
from .remeasure import reserve_seconds
from .state import Run
from .step import fitting_backends, measure
from .weights import preparation_s


def baselines(run: Run) -> None:
    """Each backend's own defaults, measured once per study; the first backend's informed start and its
    first screening step come before the other backends' baselines (cost-aware order: a transformers
    baseline costs a minute, two on a busy machine, while the first backend's biggest switch, which the
    informed start may have set the way another CPU kind likes, costs seconds). The other backends'
    baselines start only while a search trial would (:func:`search_on`): the time kept for the
    confirmation stage is not spent on them (a 4-minute run on a 2-vCPU EPYC of family 23 spent it on
    the transformers baseline and confirmed nothing)."""
    for i, backend in enumerate(run.resolved.backends):
        if i == 1:
            _first_steps(run)
        if decision.baseline(select.candidates(run.study), backend) is not None or run.left() <= 0 \
                or baseline_running(run.study, backend):  # a concurrent worker measures it now
            continue
        if i > 0 and not search_on(run.study, run.options, run.left()):
            run.progress.status(f"{backends.get(backend).label} baseline not measured: the time left is kept "
                                "for the confirmation stage")
            continue
        base = defaults(backend, run.profile.n_cpus, run.workload.needed_ctx(), run.workload.kind == "serve")
        measure(run, base, R.Role.BASELINE, notes=backends.get(backend).baseline_notes(base))


def _first_steps(run: Run) -> None:
    """The informed start (queued by the run), then the first screened neighbour of the best so far."""
    if run.left() > 0:
        measure(run, None, R.Role.SEARCH)
    if search_on(run.study, run.options, run.left()) and \
            refine.enqueue_refinement(run.study, run.resolved, run.options.objective, run.effects, run.busy):
        measure(run, None, R.Role.SEARCH)


def search(run: Run) -> None:
    """Search trials while :func:`search_on` says so: a composite after the trial that revealed it, else the
    best config's next untried neighbour (screening first, then local refinement), else TPE's sample."""
    tried: set[str] = set()  # composites measured (a failed one is not proposed again)
    after_composite = False  # a search trial follows every composite: it never replaces the search
    while search_on(run.study, run.options, run.left()) and _ends_before_reserve(run):
        fit = fitting_backends(run)
        if not fit:
            run.progress.status("search ends: no backend's typical trial ends before the time kept for the "
                                "confirmation stage")
            break
        guess = None if after_composite else composite.propose(select.candidates(run.study), run.options.objective,
                                                              tried)
        after_composite = guess is not None
        if guess is not None:  # the best decode and prefill settings together, measured before recommended
            tried.add(config_key(guess))
            measure(run, guess, R.Role.COMPOSITE, notes=(composite.NOTE,))
        else:
            step = refine.next_refinement(run.study, run.resolved, run.options.objective, run.effects, run.busy)
            if step is not None and step[1].get("backend", run.resolved.backends[0]) not in fit:
                step = None  # the best config's backend costs more than the time before the stage: TPE's sample
            if step is not None:
                if not _prepared_in_time(run, *step):
                    break
                refine.enqueue(run.study, run.resolved, *step)
            measure(run, None, R.Role.SEARCH)


def _prepared_in_time(run: Run, name: str, params: dict) -> bool:
    """Whether a refinement step to new weights still ends before the confirmation stage's time once its
    weights' quality is measured (:func:`tuner.search.weights.preparation_s`): a search trial starts
    when a typical one fits, and a new weight type costs more than a typical one."""
    extra = preparation_s(run.ctx, str(params.get("quant")), select.candidates(run.study)) if name == "quant" else 0.0
    if extra <= 0 or search_on(run.study, run.options, run.left(), extra):
        return True
    run.progress.status(f"search ends before {params.get('quant')}: measuring its quality (~{extra:.0f} s) would "
                        "take the confirmation stage's time")
    return False


def confirmation(run: Run) -> None:
    """The winner, its closest rival of other weights, its baseline and its runners-up, as many as fit,
    in interleaved rounds that each fit whole; the recommendation is chosen on these figures alone."""
    if remeasure.schedule(select.candidates(run.study), run.options, run.left()):
        run.progress.status("confirmation: the best configs re-measured side by side in interleaved rounds; "
                            "the recommendation is chosen on these")

    def run_round(configs: list[select.Candidate], number: int) -> None:
        for cand in configs:
            measure(run, TrialSettings(**cand.settings), R.Role.REMEASURE, run.options.repetitions, round_no=number,
                    round_size=len(configs))

    configs, rounds, planned = remeasure.run_stage(select.candidates(run.study), run.options, run.left, run_round,
                                                   lambda: select.candidates(run.study))
    if configs:
        extra = (f", {rounds - planned} deciding round(s) of the winner and a rival it was not yet told apart from"
                 if rounds > planned else "")
        run.progress.status(f"confirmation: {configs} config(s), {min(rounds, planned)} of {planned} planned "
                            f"round(s) fitted{extra}")


def search_on(study: optuna.Study, options: TuneOptions, left_s: float, extra_s: float = 0.0) -> bool:
    """Whether another search trial starts with ``left_s`` seconds of the budget left.

    Time is kept back for the confirmation stage (:func:`tuner.search.remeasure.reserve_seconds`), and a
    search trial starts only when a typical one (plus ``extra_s``: making and scoring new weights) ends
    before that reserve. Once the stage's time has
    come, the search stops if the stage fits in what is left; a stage that no longer fits (a long
    baseline took its time) leaves the rest to the search, as a run without a reserve does.
    """
    if left_s <= 0:
        return False
    cands = select.candidates(study)
    reserve = reserve_seconds(cands, options)
    if reserve <= 0:
        return True
    if left_s > reserve + typical_search_s(study) + extra_s:
        return True
    return not remeasure.schedule(cands, options, left_s)


def typical_search_s(study: optuna.Study) -> float:
    """The median wall time of the study's completed search trials (0 before the first)."""
    walls = [r.outcome.wall_s for _, r in select.records(study) if r.role == R.Role.SEARCH and r.outcome.ok]
    return statistics.median(walls) if walls else 0.0


def _ends_before_reserve(run: Run) -> bool:
    """Whether a typical search trial ends before the time the run keeps back (``Run.reserve_s``: the serve
    pick's capacity sweep); always, when it keeps none back."""
    if run.reserve_s <= 0:
        return True
    return run.left() > typical_search_s(run.study)


def capacity(run: Run) -> None:
    """The serve pick measured once more with its capacity sweep when the confirmation stage measured none for
    it (a short budget, a stage that did not fit), then the single-request pick served the same way
    (``Run.reference``) when this study has not swept it yet: trials stored like any other, in the time the run
    kept back (``Run.reserve_s``, :func:`tuner.search.serving.capacity_reserve_s`)."""
    if run.workload.kind != "serve":
        return
    chosen = decision.best(select.candidates(run.study), run.options.objective, ceiling=run.ceiling,
                           targets=run.ctx.targets)
    run.reserve_s = 0.0
    if chosen is not None and not chosen.extra.get("capacity") and run.left() > 0:
        run.progress.status(f"capacity: the pick measured at 1, 2, 4, ... users (up to {2 * run.workload.users})")
        measure(run, TrialSettings(**chosen.settings), R.Role.REMEASURE, 1)
    reference = run.reference
    if reference is None or run.left() <= 0 or any(
            c.config_key == config_key(reference) and c.extra.get("capacity") for c in select.candidates(run.study)):
        return
    run.progress.status("capacity: the single-request pick of this model, served by llama-server the same way")
    measure(run, reference, R.Role.REFERENCE, 1)
