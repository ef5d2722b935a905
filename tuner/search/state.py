"""A tuning run's typed state, in two parts where one holds the other and no field is kept twice.

:class:`TrialContext` is what every trial of a run shares (the storage, the study, the model, the workload,
the limits a trial is held to); a trial is measured with it alone (:func:`tuner.search.trial.run_trial`).
:class:`Run` is the run around those trials: what it was asked, the space and machine it resolved, and what
it has done so far. It holds its :class:`TrialContext` as ``ctx`` and reads the shared things from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from .. import backends
from ..backends.capabilities import Health
from ..backends.settings import TrialSettings
from ..config.model import ModelInfo
from ..config.workloads import Workload
from ..machine.profile import MachineProfile
from ..measure import load as machine_load
from ..results.storage import Storage
from ..results.studies import StudyKey
from ..selection.targets import Targets
from .options import TuneOptions
from .progress import Progress
from .space import ResolvedSpace

MEMORY_OVERHEAD = 64 * 1024**2  # interpreter, llama.cpp buffers: below this a config clearly fails
DEADLINE_REASON = "stopped at the run's deadline (the budget plus its grace), not a fault of this config"
QUALITY_TOKENS = 1024  # eval-text tokens scored for perplexity: loss ratios settle well before this


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a run shares."""

    storage: Storage
    study: optuna.Study
    model: ModelInfo
    workload: Workload
    objective: str
    repetitions: int
    memory_ceiling: int
    timeout_s: float
    progress: Progress
    max_quality_loss: float | None = None
    bandwidth_for: Callable[[int | None], float | None] | None = None  # MachineProfile.bandwidth_for
    quality_guard: bool = False
    variants: dict[str, Any] = field(default_factory=dict)  # ready-made weights by type (--model-dir): backend-owned
    deadline: float | None = None  # time.monotonic() by which a child must end: the budget plus its grace
    health: Health | None = None  # repacking verdicts of this machine's engine
    targets: Targets | None = None  # issue 29: told to TPE as a constraint
    max_kl: float | None = None  # issue 29: largest mean KL divergence (nats/token) from the source
    gguf: ModelInfo | None = None  # a GGUF of the same model beside a model folder (--gguf), for llama.cpp
    load: dict[str, Any] | None = None  # issue 41: the machine's load at the run's start (its public data)
    timed_cap_s: float | None = None  # issue 44: seconds a trial's timed repetitions may take (not a serve trial's)

    def model_for(self, backend: str) -> ModelInfo:
        """The model ``backend`` runs: the study's model, or the GGUF given beside a model folder for a
        backend that cannot load the folder (llama.cpp)."""
        if self.gguf is not None and self.model.format not in backends.get(backend).model_formats:
            return self.gguf
        return self.model


@dataclass
class Run:
    """One tuning run as it goes: what it was asked, what it opened, and what it has done so far.

    The storage, study, workload, progress and memory ceiling are its trials' (``ctx``): read here, kept there.
    """

    options: TuneOptions
    ctx: TrialContext
    start: float             # time.monotonic() when the run's budget started
    resolved: ResolvedSpace  # the search space resolved for this machine and model
    profile: MachineProfile  # as detected; ``latest`` holds it with the engine's health as it changes
    key: StudyKey
    resumed: bool
    notes: list[str] = field(default_factory=list)
    warm: dict[str, Any] = field(default_factory=dict)     # a warm start still to queue: params and user attrs
    effects: dict[str, float] = field(default_factory=dict)  # a similar machine's setting effects
    latest: dict[str, MachineProfile] = field(default_factory=dict)
    stage: str = ""          # this run's confirmation stage id
    trials_run: int = 0
    waited_s: float = 0.0    # seconds this run's trials waited for a quiet machine so far
    reserve_s: float = 0.0   # seconds kept back from the stages for a last step (the serve pick's capacity)
    reference: TrialSettings | None = None  # serve: the single-request pick as llama-server serves it, to compare

    @property
    def storage(self) -> Storage:
        """The run's results database (its trials')."""
        return self.ctx.storage

    @property
    def study(self) -> optuna.Study:
        """The run's Optuna study (its trials')."""
        return self.ctx.study

    @property
    def workload(self) -> Workload:
        """The workload every trial measures."""
        return self.ctx.workload

    @property
    def progress(self) -> Progress:
        """Where the run says what it does."""
        return self.ctx.progress

    @property
    def ceiling(self) -> int:
        """The memory ceiling in bytes every trial is held to."""
        return self.ctx.memory_ceiling

    @property
    def load(self) -> machine_load.MachineLoad | None:
        """The machine's load when the run started (issue 41), from what every trial record keeps of it."""
        return machine_load.MachineLoad.of(self.ctx.load) if self.ctx.load else None

    @property
    def busy(self) -> bool:
        """Whether the machine was busy when the run started (:mod:`tuner.measure.load`)."""
        return bool(self.ctx.load and self.ctx.load.get("busy"))

    def wait_left(self) -> float:
        """Seconds this run's trials may still wait for a quiet machine: ``WAIT_SHARE`` of the budget in all."""
        return max(machine_load.wait_budget_s(self.options.budget_s) - self.waited_s, 0.0)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds of the budget left to the stages (less what is kept back: ``reserve_s``)."""
        return self.options.budget_s - self.elapsed() - self.reserve_s
