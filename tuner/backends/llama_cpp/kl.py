"""KL divergence and top-token agreement of a weight variant against its source model (issue 29).

The same three figures ``llama-perplexity --kl-divergence`` reports, computed from
llama-cpp-python's logits: the shipped evaluation text (``tuner/data/eval.txt``) is cut into
windows of ``n_ctx`` tokens as for perplexity (:mod:`tuner.backends.llama_cpp.quality`); each window is evaluated by the
source and by the variant, and for every scored position the KL divergence of the variant's
next-token distribution from the source's, KL(P_source || Q_variant) in nats, and whether both
put the same token first. Reported: the mean KL, its 99th percentile, and the share of positions
whose top token agrees.

Measured in a child process (``python -m tuner.backends.llama_cpp.kl SOURCE VARIANT N_CTX MAX_TOKENS N_THREADS
[REPACK]``; both models load there with ``logits_all=True``, only there) and cached under
``cache_dir()/quality`` keyed by the variant's and the source's sha256, the text and the windows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import AutotuneError
from ...util.files import write_json
from ...config.model import ModelInfo
from ...util.paths import cache_dir
from .quant import Variant
from ...util.processes import exit_text, run_module, stderr_line
from . import engine
from .quality import eval_text

MEASURE_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Divergence:
    """Mean and 99th-percentile KL divergence (nats per token) and top-token agreement (0..1)."""

    kl_mean: float
    kl_p99: float
    top_agreement: float
    tokens: int
    cached: bool = False
    error: str | None = None

    def facts(self) -> dict[str, Any]:
        """The figures a trial stores (rounded; None when not measured)."""
        if self.error:
            return {"kl_error": self.error}
        return {"kl_mean": round(self.kl_mean, 6), "kl_p99": round(self.kl_p99, 6),
                "top_agreement": round(self.top_agreement, 5)}


def _windows(llm: Any, text: str, n_ctx: int, max_tokens: int) -> list[list[int]]:
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False)[:max_tokens]
    prefix = llm.tokenize(b"", add_bos=True)
    width = n_ctx - len(prefix)
    return [prefix + tokens[i:i + width] for i in range(0, len(tokens), width) if len(tokens[i:i + width]) >= 1]


def _log_softmax(logits: Any) -> Any:
    import numpy as np

    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def divergence_in_process(source_path: str, variant_path: str, text: str, n_ctx: int, max_tokens: int,
                          n_threads: int, repack: bool = True) -> dict[str, float]:
    """The three figures, in this process (llama.cpp may abort() on a bad file: use a child)."""
    import numpy as np

    def load(path: str) -> Any:
        return engine.open_llama({"model_path": path, "n_ctx": n_ctx, "n_batch": n_ctx, "n_threads": n_threads,
                           "n_threads_batch": n_threads, "logits_all": True, "verbose": False}, repack=repack)

    src, var = load(source_path), load(variant_path)
    kls, agree = [], 0
    for seq in _windows(src, text, n_ctx, max_tokens):
        if len(seq) < 2:
            continue
        logp = []
        for llm in (src, var):
            llm.reset()
            llm.eval(seq)
            logp.append(_log_softmax(np.asarray(llm.scores[:len(seq) - 1])))
        p_log, q_log = logp
        kls.append((np.exp(p_log) * (p_log - q_log)).sum(axis=1))
        agree += int((p_log.argmax(axis=1) == q_log.argmax(axis=1)).sum())
    if not kls:
        raise AutotuneError("the evaluation text is too short to measure KL divergence")
    per_token = np.maximum(np.concatenate(kls), 0.0)  # rounding can leave -1e-12 where both agree exactly
    return {"kl_mean": float(per_token.mean()), "kl_p99": float(np.percentile(per_token, 99)),
            "top_agreement": agree / len(per_token), "tokens": int(len(per_token))}


def _cache_file(sha256: str) -> Path:
    return cache_dir() / "quality" / f"{sha256[:16]}.json"


def _cache_key(source_sha: str, n_ctx: int, max_tokens: int) -> str:
    text_sha = hashlib.sha256(eval_text().encode("utf-8")).hexdigest()[:16]
    return f"kl-vs-{source_sha[:16]}-{text_sha}-ctx{n_ctx}-max{max_tokens}"


def is_measured(variant: Variant, source: ModelInfo, *, n_ctx: int = 512, max_tokens: int = 2048) -> bool:
    """Whether :func:`measure_divergence` would answer from the cache alone."""
    try:
        return _cache_key(source.sha256, n_ctx, max_tokens) in json.loads(_cache_file(variant.sha256).read_text())
    except (OSError, ValueError):
        return False


def measure_divergence(variant: Variant, source: ModelInfo, *, n_ctx: int = 512, max_tokens: int = 2048,
                       n_threads: int | None = None) -> Divergence:
    """KL divergence and top-token agreement of ``variant`` against ``source``, measured once in a
    child process and cached; a failure is a Divergence with ``error`` set (NaN figures)."""
    nan = float("nan")
    if variant.error:
        return Divergence(nan, nan, nan, 0, error=f"variant {variant.quant} is unusable: {variant.error}")
    cache, key = _cache_file(variant.sha256), _cache_key(source.sha256, n_ctx, max_tokens)
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        got = known[key]
        return Divergence(got["kl_mean"], got["kl_p99"], got["top_agreement"], got["tokens"], cached=True)
    threads = n_threads or len(os.sched_getaffinity(0))
    start = time.perf_counter()
    for repack in (True, False):  # a child killed by a signal is retried once without repacking
        try:
            proc = run_module("tuner.backends.llama_cpp.kl", (source.path, variant.path, str(n_ctx), str(max_tokens),
                              str(threads), str(int(repack))), MEASURE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Divergence(nan, nan, nan, 0, error=f"KL divergence still running after {MEASURE_TIMEOUT_S}s")
        if proc.returncode >= 0:
            break
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        return Divergence(nan, nan, nan, 0, error=f"KL divergence measurement failed ({exit_text(proc.returncode)}): "
                                                  f"{stderr_line(proc.stderr, ('GGML_ASSERT',))}")
    got = json.loads(lines[-1])
    write_json(cache, {**known, key: {**got, "seconds": round(time.perf_counter() - start, 3), "repack": repack}})
    return Divergence(got["kl_mean"], got["kl_p99"], got["top_agreement"], got["tokens"])


def kl_ok(divergence: Divergence, max_kl: float | None) -> bool:
    """Whether the variant's mean KL is within ``max_kl`` (None: no guard)."""
    if max_kl is None:
        return True
    return divergence.error is None and math.isfinite(divergence.kl_mean) and divergence.kl_mean <= max_kl


def _main(argv: list[str]) -> int:
    """Child entry: print the figures of ``argv[2]`` against ``argv[1]`` as one JSON line."""
    source, variant, n_ctx, max_tokens, n_threads = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    repack = argv[6] != "0" if len(argv) > 6 else True
    print(json.dumps(divergence_in_process(source, variant, eval_text(), n_ctx, max_tokens, n_threads, repack)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
