"""Progress events of a tuning run. The library reports through this interface; the CLI draws it."""

from __future__ import annotations

from typing import Any

from ..measure.records import TrialRecord


class Progress:
    """Receives progress events; the base class ignores them all."""

    def status(self, text: str) -> None:
        """A short line about what is happening now (quantizing, waiting for the machine lock)."""

    def trial_started(self, number: int, role: str, settings: dict[str, Any], elapsed: float) -> None:
        """A trial's child process is about to start."""

    def trial_finished(self, number: int, record: TrialRecord, best: dict[str, float], elapsed: float) -> None:
        """A trial ended; ``best`` holds the prefill and decode tokens/s of the best config so far."""
