"""autotune: find the fastest local LLM inference settings for this machine by measuring them.

Library entry points::

    import tuner
    llm = tuner.load()                                  # this machine's tuned settings, ready to use
    print(tuner.autoconfig().source)                    # measured / predicted / defaults

    from tuner import tune, TuneOptions, load_recommendation, llama_from_recommendation
    result = tune(TuneOptions(budget_s=120))            # bundled model, SQLite in results/
    llm = llama_from_recommendation(result.recommendation_path)

Names are imported lazily so the trial child process (``python -m tuner.backends.child``) starts
without loading Optuna and SQLAlchemy.
"""

from importlib import import_module
from typing import Any

from .errors import AutotuneError

_LAZY = {
    "TuneOptions": ("search.tune", "TuneOptions"),
    "TuneResult": ("search.tune", "TuneResult"),
    "tune": ("search.tune", "tune"),
    "load_recommendation": ("recommend.document", "load"),
    "llama_from_recommendation": ("recommend.document", "llama_from"),
    "autoconfig": ("service.appconfig", "autoconfig"),
    "load": ("service.appconfig", "load"),
    "AutoConfig": ("service.appconfig", "AutoConfig"),
    "load_transformers": ("backends.transformers.loaded", "load_transformers"),
    "TransformersModel": ("backends.transformers.loaded", "TransformersModel"),
}

__all__ = ["AutotuneError", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
