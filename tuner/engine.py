"""Compatibility re-export: ``tuner.engine.open_llama`` lives in :mod:`tuner.backends.llama_cpp.engine`."""

from .backends.llama_cpp.engine import open_llama

__all__ = ["open_llama"]
