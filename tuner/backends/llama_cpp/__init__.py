"""The llama.cpp backend and everything only llama.cpp needs: opening a model, the engine health probes,
quantized variants, the quality measurement, GGUF facts.

``LlamaCpp`` and the public helpers of :mod:`.backend` are re-exported here, so
``from tuner.backends.llama_cpp import llama_cpp_defaults`` keeps working.
"""

from .backend import LlamaCpp, LlamaSession, llama_cpp_defaults, measure_chat_llama

BACKEND = LlamaCpp  # the class the registry (tuner.backends.registry) instantiates

__all__ = ["BACKEND", "LlamaCpp", "LlamaSession", "llama_cpp_defaults", "measure_chat_llama"]
