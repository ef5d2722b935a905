"""The transformers backend (Hugging Face transformers on torch, CPU) and what only it needs: its settings
(:mod:`.fields`), the measurement (:mod:`.backend`), and a tuned model loaded for an application (:mod:`.loaded`).

``Transformers`` and the public helpers of :mod:`.backend` are re-exported here, so
``from tuner.backends.transformers import transformers_defaults`` keeps working. Nothing here imports
torch or transformers at import time.
"""

from .backend import (Session, Transformers, estimate_memory_bytes, load, measure, measure_chat_transformers,
                      measure_single, prompt_ids, timed_decode, timed_feed, transformers_defaults)

BACKEND = Transformers  # the class the registry (tuner.backends.registry) instantiates

__all__ = ["BACKEND", "Session", "Transformers", "estimate_memory_bytes", "load", "measure",
           "measure_chat_transformers", "measure_single", "prompt_ids", "timed_decode", "timed_feed",
           "transformers_defaults"]
