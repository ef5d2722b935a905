"""``tune()``: a budgeted, resumable Optuna search that ends in a recommendation file.

Flow: profile -> model -> space -> study (resumed if it exists; :mod:`tuner.search.run`) -> baselines ->
informed starts (:mod:`tuner.search.informed`) -> ask/tell search until the budget (minus a reserve) is
spent: composites (:mod:`tuner.search.composite`), the best config's neighbours, big settings first
(:mod:`tuner.search.refine`) and, at a local optimum, TPE's samples -> the confirmation stage
(:mod:`tuner.search.remeasure`: the top configs re-measured side by side in whole rounds, the
recommendation chosen on those figures by :mod:`tuner.selection.decision`) -> recommendation YAML.
The stages are in :mod:`tuner.search.stages`, one trial in :mod:`tuner.search.step`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import optuna

from ..measure.lock import MachineBusy
from ..recommend import document as recommend
from ..results.storage import Storage
from ..results.studies import StudyKey
from ..selection import candidates as select, targets
from . import serving, stages
from .options import TuneOptions, TuneResult
from .progress import Progress
from .run import prepare
from ..recommend.query import StudyView

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# autotune records heartbeats itself around each ask/tell trial.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM and SIGHUP (a closed terminal) like Ctrl-C so the running trial is stopped and marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)


def tune(options: TuneOptions = TuneOptions(), progress: Progress | None = None) -> TuneResult:
    """Run a tuning session and write the recommendation; resumes the study if it exists.

    Raises :class:`AutotuneError` for bad input (model, space, ceiling, storage); crashed or
    hung trials are recorded, not raised. Ctrl-C / SIGTERM stop the running trial, mark it
    interrupted and propagate ``KeyboardInterrupt``.
    """
    run = prepare(options, progress or Progress())
    with _sigterm_as_interrupt(), run.storage.errors():
        try:
            stages.baselines(run)
            stages.search(run)
            stages.confirmation(run)
            stages.capacity(run)  # the serve pick's capacity, where the confirmation measured none
        except MachineBusy as busy:  # another run held the machine to the deadline: nothing stored for it
            if not run.trials_run:
                raise
            run.progress.status(f"measuring stopped: {busy}; the recommendation rests on what was measured")
    options = run.options  # as resolved (the serve workload's objective and space)
    serving.check_targets_met(select.candidates(run.study), run.workload)  # none served a request in time
    targets.check_run(select.candidates(run.study), run.ctx.targets, options.objective,  # with targets that no
                      run.progress.status if options.explain else None)  # config meets: one line and exit 1
    with run.storage.errors():
        path, doc = write_recommendation(run.storage, run.study, replace(run.key, profile=run.latest["profile"]),
                                         options, run.ceiling)
    return TuneResult(study_name=run.key.name, recommendation_path=path, recommendation=doc,
                      trials_run=run.trials_run, elapsed_s=run.elapsed(), resumed=run.resumed, notes=run.notes)


def write_recommendation(storage: Storage, study: optuna.Study, key: StudyKey, options: TuneOptions,
                         ceiling: int | None = None) -> tuple[Path | None, dict[str, Any] | None]:
    """Write the recommendation YAML for the study's best config whose measured peak memory stays under
    ``ceiling``; (None, None) if nothing ran (AutotuneError naming the leanest config when none fits)."""
    view = StudyView(storage=storage, study=study, profile=key.profile, candidates=select.candidates(study))
    if not view.candidates:
        return None, None
    doc = view.recommendation(ceiling=ceiling)
    path = Path(options.output) if options.output else recommend.default_path(
        key.profile.name, key.model.stem, key.workload.name, key.model.sha256)
    return recommend.write(doc, path), doc
