"""What autotune asks of an inference backend: one class per engine, registered in ``tuner.backends``.

A backend owns everything that depends on the engine: the settings it adds to the one typed
settings model (:mod:`tuner.backends.settings` composes them), its own defaults (the baseline every
recommendation is compared with), the rules the engine applies silently (clamping), why a config
cannot run, the memory a config needs at least, a config that usually does well on CPUs (the
informed start), how to hand a config to other programs (the recommendation's sections), and the
measurement itself, which runs inside a trial's child process.

Adding a backend is one new package under ``tuner/backends/`` with a :class:`Backend` subclass (named
``BACKEND`` in its ``__init__``) and the settings it adds in its ``fields`` module, and its name in
:data:`tuner.backends.registry.ENGINES` (:mod:`tuner.backends.settings_model` builds the settings model from
the ``fields`` modules without loading any backend).
Backend modules import nothing heavy at import time: the engine is imported inside ``measure``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from .capabilities import Capabilities, Health
from .fields import LARGEST, SMALLEST, setting  # noqa: F401 - the helpers a backend declares its settings with
from ..measure import records as R
from ..measure.spec import TrialSpec
from ..config.model import ModelInfo

if TYPE_CHECKING:  # cycle break: the settings model is built from the backend packages
    from .settings_model import TrialSettings


class Backend(Capabilities):
    """One inference engine. Subclasses set the class attributes and override what differs (the
    capabilities around a trial, :class:`tuner.backends.capabilities.Capabilities`, too)."""

    name: ClassVar[str]                         # the value of the ``backend`` setting
    label: ClassVar[str]                        # for people: "llama.cpp"
    fields: ClassVar[dict[str, tuple[Any, dict[str, Any]]]]  # setting name -> (type, :func:`setting`)
    summary_keys: ClassVar[tuple[str, ...]]     # the settings a one-line summary shows
    summary_prefix: ClassVar[str] = ""          # put before that line ("hf ")
    model_formats: ClassVar[tuple[str, ...]] = ("gguf",)  # the ModelInfo.format values it loads
    thread_settings: ClassVar[dict[str, str]] = {}  # figure ("prefill"/"decode") -> its thread setting
    # Settings that act on one figure only ("prefill"/"decode" -> names); a composite config takes each
    # figure's from the config that measured it fastest (tuner.search.composite). Empty: no composite.
    figure_settings: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The settings with large effects, screened first one change at a time around the best config
    # (tuner.search.refine), in the order used when no similar machine's study says otherwise: the binary
    # switches first. The other settings (batch sizes, ...) are refined after them.
    screened: ClassVar[tuple[str, ...]] = ()

    def defaults(self, cpus: int, needed_ctx: int, serving: bool = False) -> TrialSettings:
        """What the engine runs when a user passes nothing, on ``cpus`` CPUs (the baseline); ``serving``: what
        its server runs for several users (the serve workload)."""
        raise NotImplementedError

    def baseline_notes(self, settings: TrialSettings) -> tuple[str, ...]:
        """Notes for the baseline trial, e.g. where a default had to change to fit the workload."""
        return ()

    def normalize(self, settings: TrialSettings) -> tuple[TrialSettings, list[str]]:
        """What the engine will really run, and a note for every value it changes silently."""
        return settings, []

    def infeasible_reason(self, settings: TrialSettings, needed_ctx: int) -> str | None:
        """Why the engine cannot run ``settings`` for a workload of ``needed_ctx`` tokens, or None."""
        return None

    def memory_needed(self, model: ModelInfo, settings: TrialSettings, weight_bytes: int) -> int:
        """A lower bound of a trial's resident memory in bytes (``weight_bytes``: the file it runs)."""
        raise NotImplementedError

    def engine_check(self, settings: TrialSettings, weight_type: str, model_path: str, health: Health,
                     say: Callable[[str], None]) -> tuple[TrialSettings, tuple[str, ...]]:
        """The config as this machine's engine can run it (probing what ``health`` does not know yet),
        and a note for every setting it had to change."""
        return settings, ()

    def retry_after_crash(self, settings: TrialSettings) -> TrialSettings | None:
        """A config to try once more after ``settings`` died by a signal (None: none is safer)."""
        return None

    def crash_evidence(self, health: Health, weight_type: str, crashed: R.TrialOutcome,
                       say: Callable[[str], None]) -> None:
        """The :meth:`retry_after_crash` config ran where ``crashed`` died: record what that proves."""

    def nearest_first(self, name: str, current: Any, others: list[Any]) -> list[Any]:
        """The other choices of the categorical setting ``name`` in the order local refinement tries them
        (:mod:`tuner.search.refine`): nearest to ``current`` first where the engine knows an order, else as given."""
        return others

    def same_program(self, records: Any, params: dict[str, Any]) -> dict[str, set[Any]]:
        """{setting: values} that would run the same program as ``params`` on this machine, as the study's
        measured ``records`` show (:mod:`tuner.search.refine` does not propose them); none by default."""
        return {}

    def informed_start(self, cpus: int, decode_threads: int) -> dict[str, Any]:
        """Settings that usually do well on ``cpus`` CPUs (``decode_threads``: one per physical core).

        Only values the space allows are used; :data:`SMALLEST` asks for the smallest one it allows, :data:`LARGEST`
        for the largest.
        """
        return {}

    def describe(self, settings: dict[str, Any], model: dict[str, Any]) -> str:
        """A short name of a config for comparisons, e.g. "llama.cpp Q8_0"."""
        return self.label

    def export(self, settings: TrialSettings, model_path: str) -> dict[str, Any]:
        """Sections of the recommendation file that hand the config to other programs."""
        return {}

    def decode_bytes_per_token(self, model: dict[str, Any], settings: dict[str, Any], weight_bytes: float,
                               mean_ctx: float) -> float | None:
        """Bytes a decoded token reads from memory (the roofline), or None where it is not modelled."""
        return None

    def measure(self, spec: TrialSpec) -> dict[str, Any]:
        """Load the model with ``spec.settings`` and measure ``spec.workload`` (in the child).

        Returns per-repetition samples ``prefill_tps``, ``decode_tps``, ``ttft_s`` and ``load_s``,
        ``prompt_tokens``, ``generate_tokens`` (see :func:`tuner.backends.protocol.prefill_decode_reps`).
        """
        raise NotImplementedError
