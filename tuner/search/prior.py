"""The prior from stored studies: the best config of each stored study of a model and workload, and the one of
the machine most like this one (what autoconfig predicts and what a new study's warm start tries first)."""

from __future__ import annotations

from collections.abc import Callable
from ..config.model import ModelInfo
from ..machine.profile import MachineProfile
from ..machine.similarity import similarity
from ..recommend.query import StudyView, load_view, newest_first
from ..results.storage import Storage
from ..results.studies import find_studies
from ..selection.candidates import Candidate

MIN_SIMILARITY = 0.5  # below this a borrowed config is no better a guess than the engine's defaults


def stored_views(db: Storage, model: ModelInfo, workload: str) -> list[StudyView]:
    """The study view of every study of ``model`` and ``workload`` in the open database ``db``, newest first
    (the order ``autotune best`` takes the current study in)."""
    return [load_view(db, summary) for summary in newest_first(find_studies(db, model=model.sha256,
                                                                            workload=workload))]


def of_backend(backend: str | None) -> Callable[[Candidate], bool] | None:
    """The filter of configs of ``backend`` (None: every config)."""
    return None if backend is None else (lambda c: c.backend == backend)


def stored_results(db: Storage, model: ModelInfo, workload: str, backend: str | None = None
                   ) -> list[tuple[StudyView, Candidate]]:
    """(study view, its pick) of every study of ``model`` and ``workload`` in the open database ``db`` that
    has one, newest first: the config its recommendation names (:meth:`tuner.recommend.query.StudyView.pick_among`:
    the one decision rule under the targets and memory ceiling its run stored), of ``backend`` when given."""
    out = []
    for view in stored_views(db, model, workload):
        chosen = view.pick_among(of_backend(backend))
        if chosen is not None:
            out.append((view, chosen))
    return out


def predict(here: MachineProfile, stored: list[tuple[StudyView, Candidate]]
            ) -> tuple[tuple[StudyView, Candidate], float] | None:
    """The stored (view, best config) of the profile most similar to ``here``, other profiles only."""
    scored = [((v, c), similarity(here, v.profile)) for v, c in stored if v.profile.id != here.id]
    scored = [item for item in scored if item[1] >= MIN_SIMILARITY]
    return max(scored, key=lambda item: item[1]) if scored else None
