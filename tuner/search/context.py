"""What every trial of a run shares (:class:`TrialContext`), and the limits a trial is held to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from .. import backends
from ..backends.capabilities import Health
from ..config.model import ModelInfo
from ..config.workloads import Workload
from ..results.storage import Storage
from .progress import Progress

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
    variants: dict[str, Any] = field(default_factory=dict)  # ready-made quant files (--model-dir)
    deadline: float | None = None  # time.monotonic() by which a child must end: the budget plus its grace
    health: Health | None = None  # repacking verdicts of this machine's engine
    targets: Any = None  # issue 29: tuner.selection.targets.Targets, told to TPE as a constraint
    max_kl: float | None = None  # issue 29: largest mean KL divergence (nats/token) from the source
    gguf: ModelInfo | None = None  # a GGUF of the same model beside a model folder (--gguf), for llama.cpp
    load: dict[str, Any] | None = None  # issue 41: the machine's load at the run's start, kept in every record

    def model_for(self, backend: str) -> ModelInfo:
        """The model ``backend`` runs: the study's model, or the GGUF given beside a model folder for a
        backend that cannot load the folder (llama.cpp)."""
        if self.gguf is not None and self.model.format not in backends.get(backend).model_formats:
            return self.gguf
        return self.model
