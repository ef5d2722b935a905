"""What a tuning run is asked (:class:`TuneOptions`), what it gives back (:class:`TuneResult`), and the
budget policy every stage of it follows: how far past its budget a run may end, and Optuna's sampler
and pruner."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import psutil

from ..config import objectives
from ..config.model import SPEED_ONLY_KEY, SPEED_ONLY_NOTE, ModelInfo
from ..selection.targets import Targets
from .remeasure import REMEASURE_TOP

GRACE_SHARE, MIN_GRACE_S = 0.1, 30.0  # a run ends by budget + max(10% of it, 30 s)
WRAP_UP_S = 3.0               # kept before the deadline for storing the last trial and the recommendation
MIN_TRIAL_TIMEOUT_S = 60.0    # a trial's timeout is 3x what its backend cost so far, at least this


@dataclass(frozen=True)
class TuneOptions:
    """Everything a tuning run needs; every field has a sensible default."""

    model: str | None = None
    gguf: str | None = None  # a GGUF of the same model beside a model folder as ``model``: llama.cpp runs it
    budget_s: float = 1800.0
    space: str | None = None
    storage: str | None = None
    memory_ceiling: int | None = None
    profile: str | None = None
    objective: str | None = None  # None: objectives.DEFAULT, or goodput for the serve workload
    users: int | None = None  # the serve workload's user count (None: the workload's own)
    max_ttft_s: float | None = None  # the serve workload's latency targets (None: the workload's own)
    max_tpot_s: float | None = None
    workload: str = "default"
    repetitions: int = 3
    trial_timeout_s: float = 300.0
    seed: int | None = None
    cpus: list[int] | None = None
    max_quality_loss: float | None = 0.05
    remeasure: int = REMEASURE_TOP
    output: str | None = None
    model_dir: str | None = None
    max_kl: float | None = None  # --max-kl (None: no KL guard; the CLI's default is config.quality.DEFAULT_MAX_KL)
    targets: Targets | None = None  # min decode / prefill, max memory
    explain: bool = False  # on a missed target, list the setting changes that would help
    depth: str | None = None  # decode-at-depth of N tokens or "75%" of n_ctx (None: the workload's end)
    ephemeral: bool = False  # a database that keeps nothing (SQLite in memory) is allowed on purpose


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


def grace_s(budget_s: float) -> float:
    """How far past its budget a run may end: 10% of the budget, at least 30 s (a trial stopped at the
    budget needs a moment to be stored, and a recommendation to be written)."""
    return max(GRACE_SHARE * budget_s, MIN_GRACE_S)


def speed_only(options: TuneOptions, models: tuple[ModelInfo | None, ...]) -> tuple[TuneOptions, str | None]:
    """``options`` with the quality guards off (``max_quality_loss``, ``max_kl``) and the note that says so,
    where one of ``models`` (:class:`tuner.config.model.ModelInfo` or None) is marked speed-only in its
    metadata (random weights, ``benchmarks/models.py``); ``options`` unchanged and None otherwise. A guard
    on random weights would choose weight types by noise."""
    marked = [m for m in models if m is not None and m.speed_only]
    if not marked:
        return options, None
    return (replace(options, max_quality_loss=None, max_kl=None),
            f"{Path(marked[0].path).name} is made for speed measurements ({SPEED_ONLY_KEY}): {SPEED_ONLY_NOTE}")
