"""What a trial's child process is told to measure: one typed, versioned spec.

The parent builds a :class:`TrialSpec` (``TrialSpec.of``), :func:`tuner.measure.runner.run_child`
writes it as JSON beside the child and adds where the child reports its progress, and the child
(:mod:`tuner.backends.child`) reads it back with :meth:`TrialSpec.read`. Every place that starts a
measurement (the search's trial, the engine check, ``autotune check``, the benchmarks, the tests)
goes through this one type, so a field added here reaches every backend's ``measure(spec)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..config.workloads import Workload

SPEC_VERSION = 1


class TrialSpec(BaseModel):
    """One measurement: which weights, which settings, which workload, how many timed repetitions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = SPEC_VERSION
    model_path: str = Field(description="The weights file (or model folder) the child loads.")
    settings: dict[str, Any] = Field(description="A backend's settings, as TrialSettings.model_dump() gives them.")
    workload: Workload
    repetitions: int = Field(ge=1, description="Timed repetitions after the warm-up.")
    warmup: bool = Field(True, description="One untimed repetition first.")
    adaptive: dict[str, float] | None = Field(None, description="Stop repeating once the figures are steady.")
    capacity: bool = Field(False, description="Serve workload: also sweep the user count for a capacity figure.")
    fault: str | None = Field(None, description="A fault the child injects (tests only, AUTOTUNE_FAULT).")
    max_wait_s: float | None = Field(None, ge=0, description="Seconds the child may wait for a quiet machine in "
                                     "all (the run's share left); None: the per-trial cap alone.")
    max_timed_s: float | None = Field(None, gt=0, description="Seconds the timed repetitions may take in all (a "
                                      "share of the run's budget): fewer than asked, at least one, where one "
                                      "costs that much; None: no cap.")
    parent_pid: int | None = Field(None, description="Set by the runner: the child ends if this process ends.")
    progress_path: str | None = Field(None, description="Set by the runner: where each repetition's figures go.")

    @classmethod
    def of(cls, model_path: str | Path, settings: Any, workload: Workload | dict[str, Any], repetitions: int,
           **more: Any) -> "TrialSpec":
        """A spec from a settings model (anything with ``model_dump``) or a settings dict."""
        dumped = settings.model_dump() if hasattr(settings, "model_dump") else dict(settings)
        return cls(model_path=str(model_path), settings=dumped, workload=workload, repetitions=repetitions, **more)

    @classmethod
    def coerce(cls, spec: "TrialSpec | dict[str, Any]") -> "TrialSpec":
        """``spec`` as a TrialSpec (a plain dict of the same fields is validated into one)."""
        return spec if isinstance(spec, cls) else cls.model_validate(spec)

    @classmethod
    def read(cls, path: Path) -> "TrialSpec":
        """The spec the runner wrote at ``path``."""
        return cls.model_validate_json(path.read_text())

    @property
    def backend(self) -> str:
        """The name of the backend that measures this spec."""
        return str(self.settings["backend"])

    def with_runner(self, parent_pid: int, progress_path: Path) -> "TrialSpec":
        """This spec with the runner's own fields set."""
        return self.model_copy(update={"parent_pid": parent_pid, "progress_path": str(progress_path)})
