"""Frozen records of what a trial measured, as stored on Optuna trials, and the child's result they start from.

A trial's child writes a :class:`TrialResult` (versioned JSON, the one contract between the child and the
parent); the parent reads it back with :meth:`TrialResult.read` and makes a :class:`TrialRecord` of it. A
record lives in the trial's user attribute ``autotune`` as plain JSON with a format version, so records
written by an older autotune can still be read.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

RECORD_VERSION = 4  # 2: ``request`` (seconds per request of the workload); 3: ``decode_depth``; 4: ``goodput``
RECORD_ATTR = "autotune"
# The backend of a record whose settings name none: records written before autotune had a second backend
# were llama.cpp's (tuner.backends.DEFAULT is this same name, checked by tests/test_layers.py).
UNNAMED_BACKEND = "llama_cpp"

RESULT_VERSION = 1  # a child's result (TrialResult); 1: the result as written before it had a version

# Outcome statuses. Only "ok" has figures; "over_ceiling" and "infeasible" are constraint
# violations the sampler learns from; the rest are failures.
OK = "ok"
INFEASIBLE = "infeasible"
OVER_CEILING = "over_ceiling"
CRASHED = "crashed"
TIMEOUT = "timeout"
ERROR = "error"
INTERRUPTED = "interrupted"
CUT = "cut"  # stopped at the run's deadline; the repetitions it finished are kept (Optuna: PRUNED)
PRUNED = "pruned"  # stopped by the pruner: its first repetitions showed it cannot win (Optuna: PRUNED)
REPEAT = "repeat"  # a TPE sample of a config already measured: told that config's figures, not measured
PARTIAL_STATUSES = (CUT, PRUNED)  # stopped early on purpose, with the figures of the repetitions finished
ORPHANED = "orphaned"
FAILED_STATUSES = (CRASHED, TIMEOUT, ERROR, INTERRUPTED, ORPHANED)
CONSTRAINT_STATUSES = (INFEASIBLE, OVER_CEILING)


@dataclass(frozen=True)
class Stat:
    """Median and spread of repeated measurements."""

    median: float
    cv: float
    min: float
    max: float
    n: int
    samples: tuple[float, ...] = ()

    @classmethod
    def of(cls, samples: list[float] | tuple[float, ...]) -> "Stat | None":
        """Summarize ``samples``; None when there are none."""
        values = [float(s) for s in samples if s is not None]
        if not values:
            return None
        median = statistics.median(values)
        cv = statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 and statistics.fmean(values) else 0.0
        return cls(median=median, cv=cv, min=min(values), max=max(values), n=len(values),
                   samples=tuple(round(v, 4) for v in values))

    def public(self) -> dict[str, Any]:
        """Plain data."""
        out = asdict(self)
        out["samples"] = list(self.samples)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Stat | None":
        """Inverse of :meth:`public`."""
        if not data:
            return None
        return cls(median=data["median"], cv=data["cv"], min=data["min"], max=data["max"],
                   n=data["n"], samples=tuple(data.get("samples", ())))

    def __str__(self) -> str:
        return f"{self.median:.1f} ±{self.cv * 100:.0f}%"


@dataclass(frozen=True)
class Memory:
    """Peak memory of a trial's process, in bytes."""

    peak_rss: int = 0
    peak_anon: int = 0
    peak_file: int = 0

    def public(self) -> dict[str, int]:
        """Plain data."""
        return asdict(self)


class ResultError(ValueError):
    """A child's result this autotune cannot read: malformed, or written by a newer autotune."""


class TrialResult(BaseModel):
    """What a trial's child measured: written by the child (:mod:`tuner.backends.child`), read by the parent.

    The figures are one sample per timed repetition. What a backend reports beyond the fields here (its
    engine's own facts: ``n_ctx``, ``dtype``, ...) is kept as extra fields, as it was written.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    version: int = RESULT_VERSION
    ok: bool = False                          # the child measured to its end
    error: str | None = None                  # why it did not: the exception it caught
    prefill_tps: list[float | None] = []      # tokens/s
    decode_tps: list[float | None] = []       # tokens/s, right after the prompt
    ttft_s: list[float | None] = []           # seconds to the first token
    request_s: list[float | None] = []        # seconds for one whole request of the workload
    decode_depth_tps: list[float | None] = []  # tokens/s with the cache filled to the trial's depth
    goodput_tps: list[float | None] = []      # serve: output tokens/s of the requests that met the targets
    prompt_tokens: int = 0
    generate_tokens: int = 0
    load_s: float | None = None               # seconds to load the weights (or start the server)
    once_s: float | None = None               # setup no later trial of the same weights repeats (a copy kept)
    timed_s: float | None = None              # seconds of timed work in all
    repacked_mib: float | None = None         # llama.cpp: MiB of weights put in extra buffer types
    memory: Memory | None = None              # the child's own peak memory
    disturbance: list[dict[str, Any]] = []    # per repetition: what other processes took (tuner.measure.disturbance)
    chat: dict[str, Any] | None = None        # the chat workload's turns
    serving: dict[str, Any] | None = None     # the serve workload's window figures (tuner.measure.serving_figures)
    capacity: dict[str, Any] | None = None    # the serve workload's capacity sweep
    depth: int | None = None                  # the decode-at-depth probe (tuner.backends.depth)
    depth_n_past: list[int] | None = None
    depth_decode_tokens: int | None = None
    depth_note: str | None = None

    @classmethod
    def read(cls, data: object) -> "TrialResult":
        """The result in ``data`` (the child's JSON, parsed); ResultError for a malformed one or one of a newer
        version than this autotune reads. A result without a version is version 1 (written before it had one)."""
        if not isinstance(data, dict):
            raise ResultError(f"a trial result is a JSON object, not {type(data).__name__}")
        version = data.get("version", RESULT_VERSION)
        if not isinstance(version, int) or version > RESULT_VERSION:
            raise ResultError(f"a trial result of version {version!r}: this autotune reads up to version "
                              f"{RESULT_VERSION} (a newer autotune's child?)")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ResultError(f"a malformed trial result: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") \
                from None

    def public(self) -> dict[str, Any]:
        """Plain JSON data: what the child writes and what a record keeps as its outcome's ``result`` (the
        fields the child set, extras included, and the version)."""
        return {"version": self.version, **self.model_dump(mode="json", exclude_unset=True)}

    @property
    def repetitions(self) -> int:
        """How many timed repetitions the figures hold."""
        return len(self.prefill_tps)


@dataclass(frozen=True)
class TrialOutcome:
    """What happened when a config was run in its child process."""

    status: str
    reason: str = ""
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str = ""
    wall_s: float = 0.0
    memory: Memory = field(default_factory=Memory)
    result: dict[str, Any] | None = None  # the child's TrialResult as plain data (TrialResult.public)

    @property
    def ok(self) -> bool:
        """Whether the trial produced figures (all its repetitions, or those before a cut or pruning)."""
        return self.status in (OK, *PARTIAL_STATUSES) and self.result is not None

    def measured(self) -> TrialResult | None:
        """The child's result as its type (None where it kept none)."""
        return TrialResult.read(self.result) if self.result is not None else None

    def public(self) -> dict[str, Any]:
        """Plain data."""
        out = asdict(self)
        out["memory"] = self.memory.public()
        return out


class Role(str, Enum):
    """Why a trial was measured. A ``str``: stored records and older ones hold the plain value, and a role
    compares equal to it."""

    BASELINE = "baseline"    # a backend's own defaults, once per study: every speedup is against it
    SEARCH = "search"        # the search's sample (informed start, screening, refinement or TPE)
    COMPOSITE = "composite"  # the best decode and prefill settings put together
    REMEASURE = "remeasure"  # the confirmation stage: the best configs measured again side by side
    REFERENCE = "reference"  # a config measured to compare the pick with (serve: the single-request pick)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, value: str) -> "Role | str":
        """The role named ``value``; a name this version does not know (a record from a newer autotune) stays
        the plain string, so reading it never fails."""
        return cls(value) if value in cls._value2member_map_ else value


@dataclass(frozen=True)
class TrialRecord:
    """Everything autotune stores about one trial."""

    role: Role | str               # why it was measured (a str only for a role a newer autotune wrote)
    settings: dict[str, Any]       # the applicable settings that really ran
    config_key: str
    notes: tuple[str, ...]
    outcome: TrialOutcome
    prefill: Stat | None = None    # tokens/s
    decode: Stat | None = None     # tokens/s
    ttft: Stat | None = None       # seconds
    request: Stat | None = None    # seconds for one whole request of the workload (version 2)
    decode_depth: Stat | None = None  # tokens/s decoded with the cache at the trial's depth (version 3)
    goodput: Stat | None = None    # serve: output tokens/s of the requests that met the targets (version 4)
    load_s: float | None = None
    model: dict[str, Any] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    violation: str = ""            # why a measured or skipped config breaks a constraint

    @property
    def feasible(self) -> bool:
        """Whether the config ran, produced figures and breaks no constraint."""
        return self.outcome.ok and not self.violation

    @property
    def backend(self) -> str:
        """The backend of the config."""
        return str(self.settings.get("backend", UNNAMED_BACKEND))

    def public(self) -> dict[str, Any]:
        """Plain data for the trial's user attribute."""
        return {
            "v": RECORD_VERSION, "role": self.role, "settings": self.settings,
            "config_key": self.config_key, "notes": list(self.notes),
            "outcome": self.outcome.public(),
            "prefill": self.prefill.public() if self.prefill else None,
            "decode": self.decode.public() if self.decode else None,
            "ttft": self.ttft.public() if self.ttft else None,
            "request": self.request.public() if self.request else None,
            "decode_depth": self.decode_depth.public() if self.decode_depth else None,
            "goodput": self.goodput.public() if self.goodput else None,
            "load_s": self.load_s, "model": self.model, "worker": self.worker, "extra": self.extra,
            "violation": self.violation,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialRecord":
        """Inverse of :meth:`public`; accepts every record version so far."""
        out = dict(data["outcome"])
        out["memory"] = Memory(**out.get("memory", {}))
        return cls(
            role=Role.of(data["role"]), settings=data["settings"], config_key=data["config_key"],
            notes=tuple(data.get("notes", ())), outcome=TrialOutcome(**out),
            prefill=Stat.from_dict(data.get("prefill")), decode=Stat.from_dict(data.get("decode")),
            ttft=Stat.from_dict(data.get("ttft")), request=Stat.from_dict(data.get("request")),
            decode_depth=Stat.from_dict(data.get("decode_depth")),
            goodput=Stat.from_dict(data.get("goodput")),
            load_s=data.get("load_s"),
            model=data.get("model", {}), worker=data.get("worker", {}), extra=data.get("extra", {}),
            violation=data.get("violation", ""),
        )


def record_of(trial: Any) -> TrialRecord | None:
    """The autotune record stored on an Optuna ``FrozenTrial``, if any."""
    data = trial.user_attrs.get(RECORD_ATTR)
    return TrialRecord.from_dict(data) if data else None
