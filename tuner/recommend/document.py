"""Recommendation files: a versioned YAML document per profile and model, and loading it back.

Format version 1::

    format: autotune-recommendation
    version: 1
    profile: {id, name, facts...}
    model: {path, size_bytes, sha256, file_type, quant, requantized, ...}
    workload: {name, prompt_tokens, generate_tokens, ...}
    objective: balanced
    settings: {backend: llama_cpp, n_threads: 1, ...}
    llama_cpp_kwargs: {model_path: ..., n_ctx: ..., ...}      # Llama(**llama_cpp_kwargs)
    llama_cpp_model_params: {use_extra_bufts: true}          # no Llama keyword: see llama_from
    llama_server_args: [-m, ..., -c, "2048", ...]
    figures: {prefill_tps: {median, cv, n, ...}, decode_tps: ..., ttft_s: ..., peak_rss_bytes}
    baseline: {settings, figures}
    speedup: {prefill: 2.9, decode: 1.4}
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import backends
from ..config.model import SPEED_ONLY_NOTE
from ..errors import AutotuneError
from ..util.files import VersionedFormat
from ..util.paths import results_dir, slug
from ..selection.candidates import Candidate
from ..backends.settings import TrialSettings
from ..util.yamlio import read_yaml, write_yaml

FORMAT = "autotune-recommendation"
FORMAT_VERSION = 1


def _upgrade_v0(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (pre-release) files named the settings ``config``."""
    doc = dict(doc)
    if "config" in doc and "settings" not in doc:
        doc["settings"] = doc.pop("config")
    doc["version"] = 1
    return doc


# UPGRADES[v] turns a version-v document into version v+1.
UPGRADES = {0: _upgrade_v0}
RECOMMENDATION = VersionedFormat(FORMAT, FORMAT_VERSION, "autotune recommendation", UPGRADES)


def figures(cand: Candidate) -> dict[str, Any]:
    """The measured figures of a candidate as plain data."""
    return {"prefill_tps": cand.prefill.public(), "decode_tps": cand.decode.public(),
            "ttft_s": cand.ttft.public() if cand.ttft else None,
            "request_s": cand.request.public() if cand.request else None, "peak_rss_bytes": cand.peak_rss,
            "decode_depth_tps": cand.decode_depth.public() if cand.decode_depth else None,
            "depth": cand.extra.get("depth"),
            **({"goodput_tps": cand.goodput.public()} if cand.goodput else {}),
            **{key: cand.extra[key] for key in ("serving", "capacity") if cand.extra.get(key)},
            "trials": list(cand.trials), "confirmed": cand.confirmed}


def build(*, profile: dict[str, Any], model: dict[str, Any], workload: dict[str, Any], objective: str,
          study: str, storage: str, chosen: Candidate, baseline: Candidate | None,
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recommendation document for ``chosen``."""
    settings = TrialSettings(**chosen.settings)
    model_path = chosen.model.get("path") or model["path"]
    doc: dict[str, Any] = RECOMMENDATION.stamp({
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "profile": profile,
        "model": {**model, **({"variant": chosen.model} if chosen.model else {})},
        "workload": workload,
        "objective": objective,
        "study": {"name": study, "storage": storage},
        "settings": chosen.settings,
        "figures": figures(chosen),
    })
    doc.update(backends.get(settings.backend).export(settings, model_path))
    if baseline is not None:
        doc["baseline"] = {"settings": baseline.settings, "figures": figures(baseline)}
        doc["speedup"] = {
            "prefill": round(chosen.prefill.median / baseline.prefill.median, 3),
            "decode": round(chosen.decode.median / baseline.decode.median, 3),
        }
        if chosen.request and baseline.request:  # how many times sooner a request is answered
            doc["speedup"]["request"] = round(baseline.request.median / chosen.request.median, 3)
        if chosen.goodput and baseline.goodput and baseline.goodput.median > 0:
            doc["speedup"]["goodput"] = round(chosen.goodput.median / baseline.goodput.median, 3)
    if workload.get("kind") == "serve":  # the server, started as it was measured (`autotune serve` runs it)
        doc["serving_command"] = backends.get(settings.backend).serving_command(settings, model_path)
    doc.update(extra or {})
    if model.get("speed_only"):
        _not_meaningful(doc)
    return doc


QUALITY_FIGURES = ("perplexity", "quality_loss", "kl_mean", "kl_p99", "top_agreement")


def _not_meaningful(doc: dict[str, Any]) -> None:
    """A model made for speed only (random weights): the document says its quality figures mean nothing,
    and its weight-type table keeps none (a perplexity of random weights is noise)."""
    doc["quality"] = {"meaningful": False, "text": f"This model is made for speed measurements: {SPEED_ONLY_NOTE}."}
    for row in doc.get("quants") or []:
        row.update(dict.fromkeys(QUALITY_FIGURES), feasible=True)


def default_path(profile_name: str, model_stem: str, workload: str, model_sha256: str = "") -> Path:
    """``results/<profile>/<model>-<hash>.yaml`` (``<model>-<hash>.<workload>.yaml`` for other workloads).

    The file name carries the first 8 hex digits of the model's content hash, as study names do: two
    models whose names reduce to the same ASCII slug (``mödel.gguf``, ``mädel.gguf``) keep two files.
    """
    stem = slug(model_stem) + (f"-{model_sha256[:8]}" if model_sha256 else "")
    name = stem + ("" if workload == "default" else f".{slug(workload)}")
    return results_dir() / slug(profile_name) / f"{name}.yaml"


def write(doc: dict[str, Any], path: Path) -> Path:
    """Write ``doc`` to ``path`` atomically."""
    write_yaml(path, doc)
    return path


def upgrade(doc: Any, where: str) -> dict[str, Any]:
    """Check a loaded document and bring it to the current format version."""
    doc = RECOMMENDATION.check(doc, where)
    if "settings" not in doc:
        raise AutotuneError(f"{where} has no settings section")
    return doc


def load(path: Path | str) -> dict[str, Any]:
    """Read a recommendation file, upgrading an older format version."""
    return upgrade(read_yaml(path, "recommendation file"), str(path))


def llama_from(path: Path | str, *, repack: bool | None = None, **overrides: Any) -> Any:
    """A ready ``llama_cpp.Llama`` built from the recommendation at ``path``.

    Every tuned setting is carried, weight repacking too: ``Llama(**doc["llama_cpp_kwargs"])``
    alone would drop it, since ``Llama`` has no keyword for ``use_extra_bufts``. ``repack`` and
    ``overrides`` (``Llama`` keywords) replace what the file says.
    """
    doc = load(path)
    if "llama_cpp_kwargs" not in doc:
        raise AutotuneError(f"{path} recommends the {doc['settings'].get('backend')} backend, "
                            "not llama.cpp: load the model with that backend instead")
    return backends.get(doc["settings"].get("backend")).from_document(doc, str(path), repack, **overrides)
