"""The llama.cpp backend (llama-cpp-python): its settings, rules, exports and measurement.

Measured with as little Python overhead as the API allows: prefill is one ``Llama.eval`` of the
whole prompt from an empty cache; decode is N single-token evals, each next token the argmax of
the last logits (read straight from llama.cpp's buffer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..base import LARGEST, SMALLEST, Backend
from ..capabilities import Health
from .depth import llama_probe
from .fields import FIELDS, LABEL, NAME
from . import buffers, sizes
from .capabilities import GgufCapabilities
from .kwargs import UNQUANTIZED_V, llama_kwargs, model_params, server_flags
from ..protocol import prefill_decode_reps
from ...config.model import KV_TYPE_BYTES, ModelInfo
from ...config.workloads import prompt_tokens, Workload
from ..chat import CHATML, conversation_tokens, measure_chat
from ..settings_model import TrialSettings
from . import engine  # engine.open_llama read at call time: tests stand in for it
from .server_binary import find_llama_server
from .serving import measure_serving
from ...measure import records as R
from ...measure.spec import TrialSpec


def llama_cpp_defaults(logical_cpus: int, needed_ctx: int) -> TrialSettings:
    """What ``llama_cpp.Llama(model_path)`` runs when a user passes nothing.

    llama-cpp-python's default n_ctx (512) may be too small for the workload; the baseline
    then takes the smallest multiple of 256 that fits it, and says so in the trial.
    """
    n_ctx = 512 if needed_ctx <= 512 else -(-needed_ctx // 256) * 256
    return TrialSettings(backend="llama_cpp", quant="source",
                         n_threads=max(logical_cpus // 2, 1), n_threads_batch=logical_cpus,
                         n_batch=512, n_ubatch=512, n_ctx=n_ctx, flash_attn=False,
                         type_k="f16", type_v="f16", use_mmap=True, repack=True)


def llama_server_defaults(logical_cpus: int, needed_ctx: int) -> TrialSettings:
    """What ``llama-server -m MODEL`` runs: 4 slots sharing one unified KV cache (its automatic slot count),
    flash attention on where the CPU backend has it (``-fa auto``), ``-b 2048 -ub 512``, a thread per core
    (every CPU of a VM without SMT). The context is the workload's (rounded up to 256), not the model's
    trained one, so the baseline's KV cache is not larger than the search's."""
    return TrialSettings(backend="llama_cpp", quant="source", n_threads=max(logical_cpus, 1),
                         n_threads_batch=max(logical_cpus, 1), n_batch=2048, n_ubatch=512,
                         n_ctx=max(-(-needed_ctx // 256) * 256, 512), flash_attn=True, type_k="f16", type_v="f16",
                         use_mmap=True, repack=True, n_parallel=4, kv_unified=True)


class LlamaCpp(GgufCapabilities, Backend):
    """llama.cpp through llama-cpp-python, on a GGUF file or a quantized variant made from it."""

    name = NAME
    label = LABEL
    summary_keys = ("quant", "n_threads", "n_threads_batch", "n_batch", "n_ubatch", "n_ctx", "flash_attn",
                    "type_k", "type_v", "repack")
    thread_settings = {"prefill": "n_threads_batch", "decode": "n_threads"}
    # llama.cpp runs a prompt in batches on n_threads_batch threads and each next token on n_threads.
    figure_settings = {"prefill": ("n_threads_batch", "n_batch", "n_ubatch"), "decode": ("n_threads",)}
    screened = ("flash_attn", "repack", "quant", "n_threads", "n_threads_batch", "type_k", "type_v")
    fields = FIELDS

    def defaults(self, cpus: int, needed_ctx: int, serving: bool = False) -> TrialSettings:
        """llama-cpp-python's own defaults (n_threads = CPUs/2, n_threads_batch = CPUs, ...); ``serving``:
        llama-server's (:func:`llama_server_defaults`)."""
        return llama_server_defaults(cpus, needed_ctx) if serving else llama_cpp_defaults(cpus, needed_ctx)

    def baseline_notes(self, settings: TrialSettings) -> tuple[str, ...]:
        """Say so when n_ctx had to grow beyond llama-cpp-python's default to fit the workload."""
        if settings.n_parallel > 1:
            return (f"llama-server's defaults; n_ctx {settings.n_ctx} fits every user's request (its own default "
                    "is the model's trained context)",)
        if settings.n_ctx == 512:
            return ()
        return (f"n_ctx raised from llama-cpp-python's default 512 to {settings.n_ctx} to fit the workload",)

    def normalize(self, settings: TrialSettings) -> tuple[TrialSettings, list[str]]:
        """llama-cpp-python clamps ``n_batch`` to ``n_ctx`` and ``n_ubatch`` to ``n_batch`` silently."""
        notes: list[str] = []
        changes: dict[str, Any] = {}
        n_batch = settings.n_batch
        if n_batch > settings.n_ctx:
            notes.append(f"n_batch {n_batch} clamped to n_ctx {settings.n_ctx}")
            n_batch = settings.n_ctx
            changes["n_batch"] = n_batch
        if settings.n_ubatch > n_batch:
            notes.append(f"n_ubatch {settings.n_ubatch} clamped to n_batch {n_batch}")
            changes["n_ubatch"] = n_batch
        return settings.model_copy(update=changes), notes

    def infeasible_reason(self, settings: TrialSettings, needed_ctx: int) -> str | None:
        """A quantized V cache without flash attention, or a context smaller than the workload."""
        if settings.type_v not in UNQUANTIZED_V and not settings.flash_attn:
            return f"a quantized V cache ({settings.type_v}) needs flash attention"
        if settings.n_ctx < needed_ctx:
            return f"n_ctx {settings.n_ctx} is smaller than the workload's {needed_ctx} tokens"
        return None

    def memory_needed(self, model: ModelInfo, settings: TrialSettings, weight_bytes: int) -> int:
        """The weights file plus the KV cache of n_ctx tokens."""
        return weight_bytes + model.kv_cache_bytes(settings.n_ctx, settings.type_k, settings.type_v)

    def engine_check(self, settings: TrialSettings, weight_type: str, model_path: str, health: Health,
                     say: Callable[[str], None]) -> tuple[TrialSettings, tuple[str, ...]]:
        """Repacking off, with a note, for a weight type whose engine probe crashed (:mod:`tuner.backends.llama_cpp.health`)."""
        if not settings.repack:
            return settings, ()
        verdict = health.repack_verdict(weight_type, model_path, say)
        if verdict.usable:
            return settings, ()
        return settings.model_copy(update={"repack": False}), (f"repack off: {verdict.evidence}",)

    def retry_after_crash(self, settings: TrialSettings) -> TrialSettings | None:
        """Without repacking: llama.cpp's AMX path segfaults on some VMs (see :mod:`tuner.backends.llama_cpp.health`)."""
        return settings.model_copy(update={"repack": False}) if settings.repack else None

    def crash_evidence(self, health: Health, weight_type: str, crashed: R.TrialOutcome,
                       say: Callable[[str], None]) -> None:
        """The config ran without repacking where it died with it: repacking is unusable for the type."""
        health.record_crash(weight_type, crashed, say)

    def nearest_first(self, name: str, current: Any, others: list[Any]) -> list[Any]:
        """Weight types nearest in size first (:mod:`tuner.backends.llama_cpp.sizes`: from Q8_0, Q6_K before
        Q4_0 or F16); the other settings' choices as the space lists them."""
        return sizes.nearest_first(current, others) if name == "quant" else others

    def same_program(self, records: Any, params: dict[str, Any]) -> dict[str, set[Any]]:
        """Repacking the other way, for a weight type whose trials put nothing in an extra buffer type
        (:func:`tuner.backends.llama_cpp.buffers.same_program`: Q8_0 and Q6_K on an AVX2 EPYC)."""
        return buffers.same_program(records, params)

    def informed_start(self, cpus: int, decode_threads: int) -> dict[str, Any]:
        """Compact 8-bit weights, every CPU for prefill, one decode thread per core, flash attention; for a
        server, a slot for every user the space allows (a queued request waits for a whole answer)."""
        return {"quant": "Q8_0", "n_threads": decode_threads, "n_threads_batch": cpus, "n_batch": 512,
                "n_ubatch": 512, "flash_attn": True, "type_k": "f16", "type_v": "f16", "use_mmap": True,
                "repack": True, "n_ctx": SMALLEST, "n_parallel": LARGEST, "kv_unified": False}

    def describe(self, settings: dict[str, Any], model: dict[str, Any]) -> str:
        """"llama.cpp Q8_0" (the source file's type for ``quant: source``)."""
        quant = settings.get("quant", "source")
        return f"llama.cpp {model.get('file_type') if quant == 'source' else quant}".strip()

    def export(self, settings: TrialSettings, model_path: str) -> dict[str, Any]:
        """``Llama`` keywords, the model parameters it has no keyword for, and llama-server flags."""
        return {"llama_cpp_kwargs": llama_kwargs(settings, model_path),
                "llama_cpp_model_params": model_params(settings),
                "llama_server_args": server_flags(settings, model_path)}

    def decode_bytes_per_token(self, model: dict[str, Any], settings: dict[str, Any], weight_bytes: float,
                               mean_ctx: float) -> float | None:
        """Every weight once, plus the KV cache at the mean context."""
        if not model.get("n_layer"):
            return None
        per_token_kv = model["n_layer"] * model["n_head_kv"] * (
            model["head_dim_k"] * KV_TYPE_BYTES[settings.get("type_k", "f16")]
            + model["head_dim_v"] * KV_TYPE_BYTES[settings.get("type_v", "f16")])
        return weight_bytes + per_token_kv * mean_ctx

    def measure(self, spec: TrialSpec) -> dict[str, Any]:
        """Load the model with the spec's settings and measure the spec's workload (and report the MiB
        of weights repacked: :func:`tuner.backends.llama_cpp.engine.repacked_mib`)."""
        workload = spec.workload
        if workload.kind == "serve":  # several users: the real llama-server, built once per version
            return measure_serving(spec, str(find_llama_server(build=False).path))
        llm, load_s = load(spec)
        if workload.kind == "chat":
            result = measure_chat_llama(llm, workload, spec.repetitions, spec.warmup)
        else:
            result = measure_single(llm, workload, spec.repetitions, spec.warmup)
        result["load_s"] = load_s
        result["n_ctx"] = llm.n_ctx()
        result["n_batch"] = llm.n_batch
        result["repacked_mib"] = engine.repacked_mib(llm)
        return result


def load(spec: TrialSpec) -> tuple[Any, float]:
    """A ``Llama`` built from the spec's settings, and its load time in seconds."""
    settings = TrialSettings(**spec.settings)
    kwargs = llama_kwargs(settings, spec.model_path)
    start = time.perf_counter()
    llm = engine.open_llama(kwargs, repack=settings.repack)
    return llm, time.perf_counter() - start


def _next_token(llm: Any, n_vocab: int) -> int:
    import numpy as np

    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
    return int(logits.argmax())


def prefill(llm: Any, tokens: list[int], n_vocab: int) -> tuple[float, int]:
    """Evaluate ``tokens`` on top of the cache; seconds to the first next token, and that token."""
    start = time.perf_counter()
    llm.eval(tokens)
    token = _next_token(llm, n_vocab)
    return time.perf_counter() - start, token


def decode(llm: Any, first: int, n_tokens: int, n_vocab: int) -> tuple[float, list[int]]:
    """Generate ``n_tokens`` greedily after ``first``; seconds taken and the tokens fed."""
    fed = []
    token = first
    start = time.perf_counter()
    for _ in range(n_tokens):
        llm.eval([token])
        fed.append(token)
        token = _next_token(llm, n_vocab)
    return time.perf_counter() - start, fed


def measure_single(llm: Any, workload: Workload, repetitions: int, warmup: bool) -> dict[str, Any]:
    """Prefill of P prompt tokens from an empty cache, then decode of N tokens, repeated."""
    n_vocab = llm.n_vocab()
    tokens = prompt_tokens(lambda t: llm.tokenize(t.encode(), add_bos=False),
                           workload.prompt_tokens, [llm.token_bos()])
    depth = llama_probe(llm, workload, len(tokens) + workload.generate_tokens,
                        lambda first, n: decode(llm, first, n, n_vocab))
    # llm.reset() empties the cache: llama-cpp-python would otherwise reuse the matching prefix.
    return prefill_decode_reps(llm.reset, lambda toks: prefill(llm, toks, n_vocab),
                               lambda first, n: decode(llm, first, n, n_vocab), tokens,
                               workload.generate_tokens, repetitions, warmup, depth, workload.rank_at_depth)


class LlamaSession:
    """A ``Llama`` instance as a chat session: llama-cpp-python evaluates on top of ``n_tokens``."""

    def __init__(self, llm: Any):
        self.llm, self.n_vocab = llm, llm.n_vocab()

    def start(self) -> None:
        """Forget the cache (``eval`` then overwrites it from position 0)."""
        self.llm.reset()

    def feed(self, tokens: list[int]) -> int:
        """Evaluate ``tokens`` after the cached ones; the argmax of the next token."""
        return prefill(self.llm, tokens, self.n_vocab)[1]


def measure_chat_llama(llm: Any, workload: Workload, repetitions: int, warmup: bool) -> dict[str, Any]:
    """The chat workload on a loaded ``llama_cpp.Llama`` (template from the GGUF metadata)."""
    template = llm.metadata.get("tokenizer.chat_template") or CHATML

    def special(token: int) -> str:
        return llm.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

    turns = conversation_tokens(
        workload, template, lambda text, first: llm.tokenize(text.encode(), add_bos=first, special=True),
        special(llm.token_bos()), special(llm.token_eos()))
    end = sum(len(t) for t in turns) + workload.generate_tokens * len(turns)
    n_vocab = llm.n_vocab()
    depth = llama_probe(llm, workload, end, lambda first, n: decode(llm, first, n, n_vocab))
    return measure_chat(LlamaSession(llm), turns, workload, repetitions, warmup, llm.n_ctx(), depth)
