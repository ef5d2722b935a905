"""The prior from stored studies: the best config of each stored study of a model and workload, and the one of
the machine most like this one (what autoconfig predicts and what a new study's warm start tries first)."""

from __future__ import annotations

from typing import Any

from ..config.model import ModelInfo
from ..machine.profile import MachineProfile
from ..machine.similarity import similarity
from ..selection import decision

MIN_SIMILARITY = 0.5  # below this a borrowed config is no better a guess than the engine's defaults


def stored_results(db: Any, model: ModelInfo, workload: str, backend: str | None = None) -> list[tuple[Any, Any]]:
    """(study view, best candidate) of every study of ``model`` and ``workload`` in the open database ``db``."""
    from ..recommend.query import load_view
    from ..results.studies import find_studies

    out = []
    for summary in find_studies(db, model=model.sha256, workload=workload):
        view = load_view(db, summary)
        cands = [c for c in view.candidates if backend is None or c.backend == backend]
        if cands:
            out.append((view, decision.best(cands, view.objective)))
    return out


def predict(here: MachineProfile, stored: list[tuple[Any, Any]]) -> tuple[tuple[Any, Any], float] | None:
    """The stored (view, best config) of the profile most similar to ``here``, other profiles only."""
    scored = [((v, c), similarity(here, v.profile)) for v, c in stored if v.profile.id != here.id]
    scored = [item for item in scored if item[1] >= MIN_SIMILARITY]
    return max(scored, key=lambda item: item[1]) if scored else None
