"""What a backend does beyond measuring a trial: its weights, their quality, what this machine's engine can
run, the forms a recommendation takes for other programs, and a tuned model loaded or served.

:class:`Capabilities` is the interface (every method has a do-nothing default a backend overrides where it
has the capability); :class:`tuner.backends.base.Backend` extends it. search/, selection/, recommend/,
service/ and cli/ reach these only through the registry (``tuner.backends.get(name)``): no module outside
``tuner/backends/`` imports a backend's package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..errors import AutotuneError
from ..config.model import ModelInfo
from ..measure import records as R

if TYPE_CHECKING:  # cycle break: the settings model is built from the backend packages
    from .settings_model import TrialSettings

Say = Callable[[str], None]
FOLDER_FLOOR = 0.25  # a model folder's weights may load in a narrower dtype: at least a quarter of its files


class Health(Protocol):
    """What this machine's engine can run, learned by probes and kept in the machine profile's ``extra``."""

    extra_key: ClassVar[str]                              # where it is kept in ``MachineProfile.extra``
    on_change: Callable[[dict[str, Any]], None] | None    # gets :meth:`public` whenever it learns something

    def public(self) -> dict[str, Any]:
        """Plain data for the profile and the recommendation."""
        ...

    def record_crash(self, weight_type: str, outcome: R.TrialOutcome, say: Say | None = None) -> None:
        """A trial died by a signal: evidence of what this engine cannot run here."""
        ...


@dataclass(frozen=True)
class WeightFile:
    """The weights one config runs on: their facts (for the trial record), the path, and why they are unusable."""

    facts: dict[str, Any]
    path: str | None
    unusable: str | None = None


@dataclass(frozen=True)
class ServerBinary:
    """An engine's own server program, ready to run: where it is, what its ``--version`` says, and how it was
    found: ``env`` (named by an environment variable), ``cache`` (built before), ``path`` (on PATH) or ``built``
    (just now, in ``build_s`` seconds)."""

    path: str
    version: str
    source: str
    build_s: float | None = None


@dataclass(frozen=True)
class QualityLimits:
    """How much worse than the source weights a config's weights may be (None: not guarded)."""

    max_quality_loss: float | None = None
    max_kl: float | None = None
    tokens: int = 1024  # evaluation-text tokens scored

    @property
    def guarded(self) -> bool:
        """Whether any limit is set."""
        return self.max_quality_loss is not None or self.max_kl is not None


@dataclass(frozen=True)
class Verdicts:
    """Quality figures of a weight file and the violation of a limit ("" when within them)."""

    facts: dict[str, Any] = field(default_factory=dict)
    violation: str = ""


class Capabilities:
    """The engine-specific work around a trial; defaults are those of a backend without the capability."""

    weight_variants: ClassVar[bool] = False         # the ``quant`` setting picks a weight file made from the source
    export_formats: ClassVar[tuple[str, ...]] = ()  # the forms :meth:`render_export` writes
    own_server: ClassVar[bool] = False              # served by the engine's own server (else by autotune's)
    child_faults: ClassVar[tuple[str, ...]] = ()    # AUTOTUNE_FAULT kinds the engine acts on in every child

    # -- weights ------------------------------------------------------------------------------------
    def find_variants(self, model_dir: str, model: ModelInfo) -> dict[str, Any]:
        """Ready-made weight variants of ``model`` in ``model_dir`` by weight type (``--model-dir``)."""
        return {}

    def check_weight_name(self, name: str) -> str:
        """``name`` as a weight type this backend makes; AutotuneError for one it does not know."""
        return name

    def weight_file(self, model: ModelInfo, settings: TrialSettings, variants: Mapping[str, Any],
                    say: Say) -> WeightFile:
        """The weights ``settings`` run on (a variant is made once and cached); the source file by default."""
        return WeightFile({"path": model.path, "quant": "source", "file_type": model.file_type,
                           "size_bytes": model.size_bytes}, model.path)

    def weight_type(self, model: ModelInfo, settings: TrialSettings) -> str:
        """The weight type a config runs (the source file's own for ``source``)."""
        return model.file_type if settings.quant == "source" else settings.quant.upper()

    def smallest_weights(self, model: ModelInfo, quants: list[Any], variants: Mapping[str, Any]) -> int:
        """A floor under the bytes any config of ``model`` maps; a quarter of it by default (a narrower dtype)."""
        return int(model.size_bytes * FOLDER_FLOOR)

    # -- quality --------------------------------------------------------------------------------------
    def quality(self, model: ModelInfo, settings: TrialSettings, variants: Mapping[str, Any],
                limits: QualityLimits, say: Say) -> Verdicts:
        """Quality of the config's weights against the source, and a violation of ``limits``; none by default."""
        return Verdicts()

    def preparation_passes(self, weight_type: str) -> int:
        """Passes over the quality text a new ``weight_type`` costs before its child runs (0: none)."""
        return 0

    # -- what this machine's engine runs ----------------------------------------------------------------
    def system_info(self) -> str:
        """The engine build's features, for the machine profile ("" when it has none to tell)."""
        return ""

    def open_health(self, extra: Mapping[str, Any], profile: Mapping[str, Any]) -> Health | None:
        """The engine health stored in a profile's ``extra`` (``profile``: its public facts); None: none kept."""
        return None

    def probe_health(self, health: Health, model: ModelInfo) -> None:
        """Probe what ``health`` does not know yet on ``model`` (``autotune profile``)."""

    def health_lines(self, extra: Mapping[str, Any]) -> list[str]:
        """Human lines for the engine health stored in a profile's ``extra``."""
        return []

    def health_sections(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Sections of the recommendation document that tell the engine health stored in a profile's ``extra``."""
        return {}

    def runnable_here(self, settings: TrialSettings, model_path: str, source: Callable[[], ModelInfo],
                      measured_here: bool) -> tuple[TrialSettings, str]:
        """A tuned config made runnable on this machine: its weight file (made from ``source()`` if missing) and
        settings this machine's engine runs (probed unless ``measured_here``)."""
        return settings, model_path

    # -- recommendations for other programs, a tuned model loaded or served --------------------------------
    def render_export(self, doc: dict[str, Any], fmt: str) -> str:
        """``doc`` (a recommendation) as text in ``fmt``, one of :attr:`export_formats`."""
        raise NotImplementedError

    def export_caveats(self, doc: dict[str, Any], fmt: str) -> list[str]:
        """Settings of ``doc`` that ``fmt`` cannot carry, one line each."""
        return []

    def load_tuned(self, settings: TrialSettings, model_path: str, **overrides: Any) -> Any:
        """The engine's model loaded with every tuned setting (``overrides``: engine keywords that replace them)."""
        raise NotImplementedError

    def from_document(self, doc: dict[str, Any], path: str, repack: bool | None, **overrides: Any) -> Any:
        """The engine's model built from a recommendation document read from ``path``."""
        raise NotImplementedError

    def server_command(self, settings: TrialSettings, model_path: str) -> list[str]:
        """The engine's own server's command-line flags that reproduce ``settings``."""
        raise NotImplementedError

    def server_app(self, settings: TrialSettings, model_path: str, host: str, port: int) -> tuple[Any, Any]:
        """The engine's in-process server app with every tuned setting, and the model it serves."""
        raise NotImplementedError

    def server_binary(self, say: Say, build: bool = True) -> ServerBinary | None:
        """The engine's own server program, found or built once and cached (``autotune build-server``); None
        for an engine without a program to build. AutotuneError when it cannot be had."""
        return None

    def serving_engine(self, say: Say) -> dict[str, Any]:
        """Make ready the server that measures the serve workload (several users), building it if it must be
        (:meth:`server_binary`); facts about it (``binary``, ``version``, ``source``, ``build_s``). The trials'
        children find the same program the same way, without building (:meth:`server_binary` with ``build``
        off: the cache this call filled, or what the environment names). AutotuneError where the engine has no
        such server."""
        found = self.server_binary(say, build=True)
        if found is None:
            raise AutotuneError(f"{getattr(self, 'label', 'this backend')} cannot serve several users: the serve "
                                "workload runs on llama.cpp's llama-server (use a space with backend llama_cpp "
                                "only, such as search_spaces/serve.yaml)")
        return {"binary": str(found.path), "version": found.version, "source": found.source, "build_s": found.build_s}

    def serving_command(self, settings: TrialSettings, model_path: str) -> list[str]:
        """The server command line that reproduces ``settings`` as the serve workload measured it."""
        raise NotImplementedError
