"""What a trial's figures look like to the objectives and the decision rule: the :class:`Measured` protocol
every measured thing meets, and a running trial's figures so far (:class:`PartialFigures`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .records import Stat


class Measured(Protocol):
    """The figures of anything measured, as objectives and the decision rule read them: a trial's
    :class:`tuner.measure.records.TrialRecord`, a pooled candidate (:class:`tuner.selection.candidates.Candidate`) or a running
    trial's :class:`PartialFigures`."""

    @property
    def prefill(self) -> Stat | None: ...
    @property
    def decode(self) -> Stat | None: ...
    @property
    def request(self) -> Stat | None: ...
    @property
    def goodput(self) -> Stat | None: ...
    @property
    def ttft(self) -> Stat | None: ...


@dataclass(frozen=True)
class PartialFigures:
    """What a trial's child measured so far (its streamed progress), in the shape objectives read."""

    prefill: Stat | None
    decode: Stat | None
    request: Stat | None
    repetitions: int
    goodput: Stat | None = None
    ttft: Stat | None = None

    @classmethod
    def of(cls, figures: dict[str, Any]) -> PartialFigures:
        """From the figures a child streams after each repetition."""
        return cls(prefill=Stat.of(figures.get("prefill_tps") or []), decode=Stat.of(figures.get("decode_tps") or []),
                   request=Stat.of(figures.get("request_s") or []), repetitions=len(figures.get("request_s") or []),
                   goodput=Stat.of(figures.get("goodput_tps") or []), ttft=Stat.of(figures.get("ttft_s") or []))
