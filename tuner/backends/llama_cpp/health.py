"""Engine health: whether llama.cpp's extra buffer types (weight repacking) run on this machine.

On some machines the repacked kernels crash: on virtualized Intel Sapphire/Granite Rapids the
AMX buffer type segfaults on the first decode of every quantized weight type
(ggml-org/llama.cpp#20824). A probe measures it instead of guessing from CPU flags: a tiny
eval of the weight file with repacking on, in a child process like any trial. A probe that
dies by a signal marks repacking unusable for that weight type on this profile, with the
evidence (signal, exit status, stderr tail); trials of that type then run with repacking off.

Verdicts are kept in the machine profile (``extra["engine"]``), keyed by the llama-cpp-python
version and llama.cpp's system info, so an upgrade or another build probes again. Each weight
type is probed once, before its first trial with repacking on.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from ...measure import records as R
from .fields import NAME
from ..settings_model import TrialSettings
from ...config.workloads import get_workload
from ...measure.runner import run_child
from ...measure.spec import TrialSpec

PROBE_TIMEOUT_S = 120
PROBE_MEMORY_CEILING = 8 << 30
ENGINE_EXTRA = "engine"


@dataclass(frozen=True)
class Probe:
    """The outcome of one tiny eval with repacking on, for one weight type."""

    weight_type: str
    usable: bool
    status: str
    signal: str | None = None
    exit_code: int | None = None
    stderr_tail: str = ""
    seconds: float = 0.0
    checked_at: str = ""
    source: str = "probe"  # "probe", or "trial" when a trial's crash is the evidence

    @property
    def evidence(self) -> str:
        """One line: what happened, for progress lines, the recommendation and ``autotune profile``."""
        if self.usable:
            return f"{self.weight_type}: repacking runs"
        cause = self.signal or (f"exit status {self.exit_code}" if self.exit_code else self.status)
        line = telling_line(self.stderr_tail)
        return f"{self.weight_type}: repacking crashed llama.cpp ({cause})" + (f": {line[:160]}" if line else "")

    def public(self) -> dict[str, Any]:
        """Plain data."""
        return asdict(self)


TELLING = ("GGML_ASSERT", "Fatal Python error", "error", "File ")


def telling_line(stderr: str) -> str:
    """The line of a crashed child's stderr that says most: an assertion, the fatal error, the
    innermost Python frame (faulthandler prints the innermost first), else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for marker in TELLING:
        found = next((ln for ln in lines if marker in ln), None)
        if found:
            return found
    return lines[-1] if lines else ""


def engine_key(llama_cpp_python: str, system_info: str) -> str:
    """What the verdicts hold for: one llama-cpp-python version and one llama.cpp build's features."""
    return f"{llama_cpp_python}|{hashlib.sha256(system_info.encode()).hexdigest()[:12]}"


def _tiny_eval(model_path: str, repack: bool) -> R.TrialOutcome:
    settings = TrialSettings(backend=NAME, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=1,
                             n_threads_batch=1, repack=repack)
    spec = TrialSpec.of(model_path, settings, get_workload("tiny").model_copy(update={"generate_tokens": 4}), 1,
                        warmup=False)
    return run_child(spec, timeout_s=PROBE_TIMEOUT_S, memory_ceiling=PROBE_MEMORY_CEILING)


def probe_repack(model_path: str, weight_type: str) -> Probe:
    """Load ``model_path`` with repacking on and run a tiny prefill and decode, in a child process.

    When that dies by a signal, the same eval with repacking off is the control: repacking is
    blamed only if the control runs (a file that crashes llama.cpp either way is not its fault).
    """
    verdict = from_outcome(weight_type, _tiny_eval(model_path, repack=True), source="probe")
    if verdict.usable:
        return verdict
    control = _tiny_eval(model_path, repack=False)
    if control.signal is not None:
        return replace(verdict, usable=True, status="crashes with and without repacking")
    return verdict


def from_outcome(weight_type: str, outcome: R.TrialOutcome, source: str) -> Probe:
    """A verdict from a child's outcome: unusable only when the child died by a signal."""
    usable = outcome.signal is None or outcome.status == R.OVER_CEILING
    return Probe(weight_type=weight_type, usable=usable, status=outcome.status, signal=outcome.signal,
                 exit_code=outcome.exit_code, stderr_tail=outcome.stderr_tail,
                 seconds=outcome.wall_s, checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 source=source)


@dataclass
class EngineHealth:
    """The repacking verdicts of one profile's engine; probes what it does not know yet.

    ``on_change`` receives :meth:`public` whenever a verdict is added (the run stores it in the
    profile); ``probe`` is :func:`probe_repack` (replaceable in tests of this bookkeeping only).
    """

    extra_key: ClassVar[str] = ENGINE_EXTRA  # where a profile keeps it
    key: str
    verdicts: dict[str, Probe] = field(default_factory=dict)
    on_change: Callable[[dict[str, Any]], None] | None = None
    probe: Callable[[str, str], Probe] = probe_repack

    @classmethod
    def from_extra(cls, extra: dict[str, Any], key: str, **kwargs: Any) -> "EngineHealth":
        """The verdicts stored in a profile's ``extra``, if they are for this engine ``key``."""
        stored = extra.get(ENGINE_EXTRA) or {}
        verdicts = {}
        if stored.get("key") == key:
            verdicts = {t: Probe(**v) for t, v in (stored.get("repack") or {}).items()}
        return cls(key=key, verdicts=verdicts, **kwargs)

    def public(self) -> dict[str, Any]:
        """Plain data for the profile and the recommendation."""
        return {"key": self.key, "repack": {t: p.public() for t, p in sorted(self.verdicts.items())},
                "repack_unusable": sorted(t for t, p in self.verdicts.items() if not p.usable)}

    def repack_verdict(self, weight_type: str, model_path: str,
                       say: Callable[[str], None] | None = None) -> Probe:
        """Whether repacking runs for ``weight_type`` (probing ``model_path`` the first time)."""
        known = self.verdicts.get(weight_type)
        if known is not None:
            return known
        if say:
            say(f"engine check: {weight_type} weights with repacking (llama.cpp extra buffer types)")
        verdict = self.probe(model_path, weight_type)
        self._add(verdict, say)
        return verdict

    def record_crash(self, weight_type: str, outcome: R.TrialOutcome,
                     say: Callable[[str], None] | None = None) -> None:
        """A config with repacking on died by a signal: evidence that repacking is unusable here."""
        self._add(from_outcome(weight_type, outcome, source="trial"), say)

    def _add(self, verdict: Probe, say: Callable[[str], None] | None) -> None:
        self.verdicts[verdict.weight_type] = verdict
        if say and not verdict.usable:
            say(f"{verdict.evidence}; {verdict.weight_type} runs with repacking off on this machine")
        if self.on_change:
            self.on_change(self.public())


def summary_lines(engine: dict[str, Any] | None) -> list[str]:
    """Human lines for stored engine facts (``autotune profile``, the run's table)."""
    if not engine or not engine.get("repack"):
        return []
    return [Probe(**v).evidence for v in engine["repack"].values()]
