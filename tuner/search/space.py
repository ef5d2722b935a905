"""Search spaces as data: YAML files checked against the settings model, then sampled by Optuna.

A space file looks like::

    version: 1
    description: ...
    params:
      n_threads: {low: 1, high: auto}        # integer range; `auto` = CPUs autotune may use
      n_batch: {choices: [128, 256, 512]}   # categorical
      n_ubatch: {low: 32, high: 512, log: true}
    workloads: {...}                         # optional, same shape as workloads.yaml

Parameters that do not apply to a sampled backend are not sampled for it (a conditional
space). Every problem is reported as one error naming the file and the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..errors import AutotuneError
from ..util.paths import SEARCH_SPACES_DIR
from .. import backends as engines
from ..backends.settings import BACKENDS, TrialSettings, defaults, param_backend
from ..util.yamlio import read_yaml

SPACE_VERSION = 1
DEFAULT_SPACE = SEARCH_SPACES_DIR / "cpu.yaml"
THREAD_PARAMS = ("n_threads", "n_threads_batch", "torch_threads")
BATCH_PARAMS = ("n_batch", "n_ubatch")  # prompt tokens per engine call: beyond the prompt they are all one
Scalar = str | int | float | bool


class ParamSpec(BaseModel):
    """One dimension: either ``choices`` or an integer range ``low``..``high``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    choices: list[Scalar] | None = None
    low: int | None = None
    high: int | str | None = None
    log: bool = False
    step: int = 1
    oversubscribe: bool = False  # a thread count may exceed the CPUs autotune may use (on purpose)

    @model_validator(mode="after")
    def _shape(self) -> "ParamSpec":
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low/high, not both")
            if not self.choices:
                raise ValueError("choices must not be empty")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError("choices must not repeat")
            return self
        if self.low is None or self.high is None:
            raise ValueError("give choices, or both low and high")
        if isinstance(self.high, str) and self.high != "auto":
            raise ValueError("high must be an integer or 'auto'")
        if isinstance(self.high, int) and self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be smaller than high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("a log scale needs low > 0")
        if self.step < 1 or (self.log and self.step != 1):
            raise ValueError("step must be >= 1, and 1 on a log scale")
        return self


class SpaceFile(BaseModel):
    """The whole search-space document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = SPACE_VERSION
    description: str = ""
    params: dict[str, ParamSpec]
    workloads: dict[str, Any] = {}


@dataclass(frozen=True)
class ResolvedSpace:
    """A space made concrete for one machine and workload: Optuna distributions and a hash."""

    source: str
    distributions: dict[str, BaseDistribution]
    cpus: int
    needed_ctx: int
    hash: str
    backends: tuple[str, ...] = field(default=(engines.DEFAULT,))
    notes: tuple[str, ...] = ()  # what resolving changed in the file's space (n_ctx above the trained context)
    serving: bool = False  # the serve workload: unsampled settings take the engine's server defaults

    def defaults(self, backend: str) -> TrialSettings:
        """The values of unsampled settings: the backend's own defaults on this machine."""
        return defaults(backend, self.cpus, self.needed_ctx, self.serving)

    def suggest(self, trial: optuna.Trial) -> TrialSettings:
        """Sample a config with ``trial``; only the sampled backend's parameters are asked for."""
        if "backend" in self.distributions:
            backend = trial.suggest_categorical("backend", self.distributions["backend"].choices)
        else:
            backend = self.backends[0]
        values = self.defaults(str(backend)).model_dump()
        for name, dist in self.distributions.items():
            if name == "backend" or param_backend(name) not in (None, backend):
                continue
            if isinstance(dist, IntDistribution):
                values[name] = trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
            else:
                values[name] = trial.suggest_categorical(name, dist.choices)
        return TrialSettings(**values)


@dataclass(frozen=True)
class SearchSpace:
    """A checked search-space file."""

    path: Path
    spec: SpaceFile

    @property
    def workloads(self) -> dict[str, Any]:
        """The file's own ``workloads:`` section."""
        return dict(self.spec.workloads)

    def resolve(self, cpus: int, needed_ctx: int, trained_ctx: int | None = None,
                prefill_tokens: int | None = None, model_format: str | tuple[str, ...] = "gguf") -> ResolvedSpace:
        """Concrete distributions for ``cpus`` usable CPUs and a workload needing ``needed_ctx`` tokens.

        With ``trained_ctx`` (the model's trained context), n_ctx values beyond it are dropped with a
        note (refused only when the workload itself needs more than the model was trained on). Values
        that cannot change a measurement are left out of the search: n_ctx is the smallest value
        that holds the workload (a larger one only reserves KV cache memory the workload never
        fills), and of the batch sizes at or above the longest prompt the workload sends at once
        (``prefill_tokens``) only the smallest is kept (the whole prompt fits in one batch either way).
        Backends that cannot load the model (``model_format``: its format, or the formats it is given in) are
        left out with a note (:func:`_loadable`).
        """
        where = f"search space {self.path}"
        dists: dict[str, BaseDistribution] = {}
        notes: list[str] = []
        formats = (model_format,) if isinstance(model_format, str) else tuple(model_format)
        for name, p in _loadable(where, self.spec.params, formats, notes).items():
            if p.choices is not None:
                choices = list(p.choices)
                _check_threads(where, name, p, choices, cpus)
                if name == "n_ctx":
                    choices = _fit_context(where, [int(c) for c in choices], trained_ctx, needed_ctx, notes)
                    choices = [c for c in choices if int(c) >= needed_ctx]
                    if not choices:
                        raise AutotuneError(
                            f"{where}: key params.n_ctx: the workload needs {needed_ctx} tokens of "
                            f"context but the largest n_ctx is {max(p.choices)}: add a larger n_ctx "
                            "or choose a shorter workload")
                    choices = [min(choices, key=int)]
                elif name in BATCH_PARAMS and prefill_tokens:
                    choices = up_to_first_covering([int(c) for c in choices], prefill_tokens)
                dists[name] = CategoricalDistribution(choices)
                continue
            low, high = int(p.low), cpus if p.high == "auto" else int(p.high)  # type: ignore[arg-type]
            _check_threads(where, name, p, [high], cpus)
            if name == "n_ctx":
                high = min(high, max(_fit_context(where, [low, high], trained_ctx, needed_ctx, notes)))
                low = max(low, needed_ctx)
                high = min(high, low)
            if low > high:
                raise AutotuneError(f"{where}: key params.{name}: low {low} is above high {high} "
                                    f"on this machine ({cpus} CPUs, workload needs {needed_ctx} tokens)")
            if name in BATCH_PARAMS and prefill_tokens:
                high = max(low, min(high, prefill_tokens))
            dists[name] = IntDistribution(low, high, log=p.log, step=p.step) if low < high else \
                CategoricalDistribution([low])
        canonical = json.dumps({k: optuna.distributions.distribution_to_json(v)
                                for k, v in sorted(dists.items())}, sort_keys=True)
        backends = tuple(dists["backend"].choices) if "backend" in dists else (engines.DEFAULT,)  # type: ignore[attr-defined]
        return ResolvedSpace(source=str(self.path), distributions=dists, cpus=cpus, needed_ctx=needed_ctx,
                             hash=hashlib.sha256(canonical.encode()).hexdigest()[:10],
                             backends=tuple(str(b) for b in backends), notes=tuple(notes))


def _loadable(where: str, params: dict[str, ParamSpec], formats: tuple[str, ...],
              notes: list[str]) -> dict[str, ParamSpec]:
    """``params`` without the backends that load the model in none of ``formats`` (llama.cpp and a Hugging
    Face folder) nor their settings, a note in ``notes`` naming them; refused when none is left."""
    able = engines.loading(*formats)
    offered = [str(b) for b in params["backend"].choices or ()] if "backend" in params else [engines.DEFAULT]
    kept = [b for b in offered if b in able]
    what = " or ".join(formats)
    if not kept:
        raise AutotuneError(f"{where}: its backend(s) {', '.join(offered)} cannot load a model of format "
                            f"{what}: use a space with the {' or '.join(able) or 'right'} backend")
    if kept == offered:
        return params
    notes.append(f"backend {', '.join(b for b in offered if b not in kept)} left out: it cannot load a model "
                 f"of format {what}")
    return {name: p.model_copy(update={"choices": kept}) if name == "backend" else p
            for name, p in params.items() if param_backend(name) in (None, *kept)}


def up_to_first_covering(values: list[int], need: int) -> list[int]:
    """The ``values`` below ``need`` and the smallest at or above it, in their order: the values a
    batch size can take for a prompt of ``need`` tokens that do not all behave the same."""
    covering = [v for v in values if v >= need]
    return [v for v in values if v < need or (covering and v == min(covering))]


def _fit_context(where: str, values: list[int], trained_ctx: int | None, needed_ctx: int,
                 notes: list[str]) -> list[int]:
    """The context sizes at or below the model's trained context (answers degrade past it), a note in
    ``notes`` for those dropped; refused only when the workload needs more than the model was trained on."""
    over = [v for v in values if trained_ctx and v > trained_ctx]
    if not over:
        return values
    if trained_ctx is not None and needed_ctx > trained_ctx:
        raise AutotuneError(f"{where}: key params.n_ctx: the workload needs {needed_ctx} tokens of context, more "
                            f"than the model's trained context of {trained_ctx}: choose a shorter workload")
    kept = [v for v in values if v not in over] or [int(trained_ctx)]  # type: ignore[arg-type]
    notes.append(f"n_ctx {', '.join(map(str, sorted(set(over))))} left out: above the model's trained context "
                 f"of {trained_ctx} tokens")
    return kept + ([int(trained_ctx)] if max(kept) < needed_ctx else [])  # type: ignore[arg-type]


def _check_threads(where: str, name: str, spec: ParamSpec, values: list[Any], cpus: int) -> None:
    """Refuse thread counts above the CPUs autotune may use, unless the space asks for it on purpose."""
    if name not in THREAD_PARAMS or spec.oversubscribe:
        return
    over = [v for v in values if isinstance(v, int) and v > cpus]
    if over:
        raise AutotuneError(f"{where}: key params.{name}: {max(over)} threads is more than the {cpus} CPU(s) "
                            "autotune may use here, which only oversubscribes them: write high: auto, or add "
                            "oversubscribe: true to the parameter to measure that on purpose")


def _check_values(where: str, name: str, spec: ParamSpec) -> None:
    if name not in TrialSettings.model_fields:
        known = ", ".join(TrialSettings.model_fields)
        raise AutotuneError(f"{where}: unknown key params.{name}: known parameters are {known}")
    values = list(spec.choices) if spec.choices is not None else \
        [spec.low] + ([spec.high] if spec.high != "auto" else [])
    if spec.high == "auto" and name not in THREAD_PARAMS:
        raise AutotuneError(f"{where}: key params.{name}: high: auto is only for thread counts")
    for value in values:
        if name == "quant":
            if not isinstance(value, str):
                raise AutotuneError(f"{where}: key params.quant: {value!r} is not a quant type name")
            engines.get(param_backend(name)).check_weight_name(value)
            continue
        try:
            TrialSettings.model_validate({name: value}, strict=True)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            raise AutotuneError(f"{where}: key params.{name}: value {value!r} is invalid: {msg}") from None
    if name == "backend" and spec.choices is not None:
        unknown = [c for c in spec.choices if c not in BACKENDS]
        if unknown:
            raise AutotuneError(f"{where}: key params.backend: unknown backend {unknown[0]!r}")


def load_space(path: Path | str | None = None) -> SearchSpace:
    """Read and check a search-space file (default ``search_spaces/cpu.yaml``).

    A bare name that is not a file here (``llama-cpp`` or ``llama-cpp.yaml``) names a shipped space.
    """
    path = Path(path) if path else DEFAULT_SPACE
    shipped = SEARCH_SPACES_DIR / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    if not path.exists() and len(path.parts) == 1 and shipped.is_file():
        path = shipped  # a shipped space by name: --space llama-cpp
    where = f"search space {path}"
    raw = read_yaml(path, "search space")
    if not isinstance(raw, dict):
        raise AutotuneError(f"{where}: the file must be a mapping with a 'params' key")
    if isinstance(raw.get("version"), int) and raw["version"] > SPACE_VERSION:
        raise AutotuneError(f"{where}: version {raw['version']} is newer than this autotune "
                            f"understands ({SPACE_VERSION}): upgrade autotune")
    try:
        spec = SpaceFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("list[", "int", "str",
                                                                               "float", "bool")))
        msg = err["msg"].removeprefix("Value error, ")
        raise AutotuneError(f"{where}: key {key or '(top level)'}: {msg}") from None
    if not spec.params:
        raise AutotuneError(f"{where}: key params: there is nothing to search; add parameters")
    for name, pspec in spec.params.items():
        _check_values(where, name, pspec)
    return SearchSpace(path=path, spec=spec)
