"""The quality guard: perplexity of a model variant on a fixed text, against the source model.

Perplexity comes from the model's own logits through llama-cpp-python: the evaluation text
(``tuner/data/eval.txt``) is cut into non-overlapping windows of ``n_ctx`` tokens, each
evaluated from an empty cache, and every next token after the first of a window is scored
(a BOS token is put in front of each window when the model's tokenizer asks for one). It is
measured in a child process (``python -m tuner.backends.llama_cpp.quality MODEL N_CTX MAX_TOKENS N_THREADS [REPACK]``),
since a bad file can abort() llama.cpp (a child killed by a signal is retried once with weight
repacking off, see :mod:`tuner.backends.llama_cpp.health`), and cached under ``cache_dir()/quality`` keyed by the
model file's sha256, the eval text's sha256 and the window settings.
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

from ...errors import AutotuneError
from ...config.model import ModelInfo
from ...util.paths import DATA_DIR, cache_dir
from ...util.files import write_json
from .quant import Variant
from ...util.processes import exit_text, run_module, signal_name, stderr_line
from . import engine

EVAL_FILE = DATA_DIR / "eval.txt"
MEASURE_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Quality:
    """Perplexity of a variant, the source's, and the relative loss (0.031 means 3.1% worse)."""

    perplexity: float
    reference_perplexity: float
    loss: float
    tokens: int
    seconds: float
    cached: bool = False
    error: str | None = None


def eval_text() -> str:
    """The shipped evaluation text."""
    return EVAL_FILE.read_text(encoding="utf-8")


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _evaluate(model_path: str | os.PathLike, text: str, n_ctx: int, max_tokens: int,
              n_threads: int, repack: bool = True) -> tuple[float, int]:
    """Perplexity and the number of tokens scored, in this process."""
    import numpy as np

    llm = engine.open_llama({"model_path": str(model_path), "n_ctx": n_ctx, "n_batch": n_ctx, "n_threads": n_threads,
                      "n_threads_batch": n_threads, "logits_all": True}, repack=repack)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False)[:max_tokens]
    prefix = llm.tokenize(b"", add_bos=True)  # [BOS] if the model wants one, else []
    width = n_ctx - len(prefix)
    nll, count = 0.0, 0
    for start in range(0, len(tokens), width):
        seq = prefix + tokens[start:start + width]
        if len(seq) < 2:
            break
        llm.reset()
        llm.eval(seq)
        logits = llm.scores[:len(seq) - 1]
        top = logits.max(axis=1)
        log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1, dtype=np.float64))
        targets = np.asarray(seq[1:])
        nll += float((log_norm - logits[np.arange(len(targets)), targets]).sum())
        count += len(targets)
    if count == 0:
        raise AutotuneError("the evaluation text is too short to measure perplexity")
    return math.exp(nll / count), count


def perplexity(model_path: str | os.PathLike, text: str | None = None, *, n_ctx: int = 512,
               max_tokens: int = 2048, n_threads: int | None = None, repack: bool = True) -> float:
    """Perplexity of the model at ``model_path`` on ``text`` (default: the shipped eval text).

    Runs in this process: llama.cpp may abort() on a bad file, so callers outside a child
    process should use :func:`measure_quality` instead.
    """
    return _evaluate(model_path, eval_text() if text is None else text, n_ctx, max_tokens,
                     n_threads or _cpus(), repack)[0]


def _cache_file(sha256: str) -> Path:
    return cache_dir() / "quality" / f"{sha256[:16]}.json"


def _cache_key(n_ctx: int, max_tokens: int) -> str:
    text_sha = hashlib.sha256(eval_text().encode("utf-8")).hexdigest()[:16]
    return f"{text_sha}-ctx{n_ctx}-max{max_tokens}"


def _measure_file(path: str, sha256: str, n_ctx: int, max_tokens: int,
                  n_threads: int | None) -> tuple[dict, bool]:
    """``{"perplexity", "tokens", "seconds"}`` for one file, from the cache or a child process."""
    cache, key = _cache_file(sha256), _cache_key(n_ctx, max_tokens)
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key], True
    start = time.perf_counter()
    notes = []
    for repack in (True, False):  # a child killed by a signal is retried once without repacking
        try:
            proc = run_module("tuner.backends.llama_cpp.quality", (path, str(n_ctx), str(max_tokens),
                              str(n_threads or _cpus()), str(int(repack))), MEASURE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"perplexity still running after {MEASURE_TIMEOUT_S}s"}, False
        if proc.returncode >= 0 or not repack:
            break
        notes.append(f"with repacking the evaluation died by {signal_name(proc.returncode)}; "
                     "measured without repacking")
    seconds = time.perf_counter() - start
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"perplexity measurement failed ({exit_text(proc.returncode)}): "
                         f"{stderr_line(proc.stderr, ('GGML_ASSERT',))}"}, False
    result = {**json.loads(lines[-1]), "seconds": round(seconds, 3), "repack": repack,
              **({"notes": notes} if notes else {})}
    write_json(cache, {**known, key: result})
    return result, False




def is_measured(variant: Variant, source: ModelInfo, *, n_ctx: int = 512, max_tokens: int = 2048) -> bool:
    """Whether :func:`measure_quality` would answer from the cache alone (nothing to wait for)."""
    key = _cache_key(n_ctx, max_tokens)
    for sha256 in (variant.sha256, source.sha256):
        try:
            if key not in json.loads(_cache_file(sha256).read_text()):
                return False
        except (OSError, ValueError):
            return False
    return True


def measure_quality(variant: Variant, source: ModelInfo, *, n_ctx: int = 512, max_tokens: int = 2048,
                    n_threads: int | None = None) -> Quality:
    """Perplexity of ``variant`` and of ``source`` on the eval text, each measured once and cached.

    A variant that fails to load or evaluate gives a Quality with ``error`` set and NaN figures;
    a failed variant (``variant.error``) is not measured. A source that cannot be measured raises
    AutotuneError naming the file.
    """
    nan = float("nan")
    if variant.error:
        return Quality(nan, nan, nan, 0, 0.0, error=f"variant {variant.quant} is unusable: {variant.error}")
    ref, _ = _measure_file(source.path, source.sha256, n_ctx, max_tokens, n_threads)
    if "error" in ref:
        raise AutotuneError(f"model file {source.path}: {ref['error']}")
    mine, cached = _measure_file(variant.path, variant.sha256, n_ctx, max_tokens, n_threads)
    if "error" in mine:
        return Quality(nan, ref["perplexity"], nan, 0, 0.0, error=f"{variant.path}: {mine['error']}")
    return Quality(perplexity=mine["perplexity"], reference_perplexity=ref["perplexity"],
                   loss=mine["perplexity"] / ref["perplexity"] - 1.0, tokens=mine["tokens"],
                   seconds=mine["seconds"], cached=cached)


def quality_ok(quality: Quality, max_loss: float) -> bool:
    """Whether the variant is usable and its loss is within ``max_loss`` (0.05 means 5%)."""
    return quality.error is None and math.isfinite(quality.loss) and quality.loss <= max_loss


def _main(argv: list[str]) -> int:
    """Child entry: print the perplexity of ``argv[1]`` as one JSON line."""
    path, n_ctx, max_tokens, n_threads = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    repack = argv[5] != "0" if len(argv) > 5 else True
    ppl, tokens = _evaluate(path, eval_text(), n_ctx, max_tokens, n_threads, repack)
    print(json.dumps({"perplexity": ppl, "tokens": tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
