"""Derived figures for reports and recommendation files: picks, Pareto front, roofline, per-backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


from .. import backends
from ..backends.roofline import Roofline, decode_roofline
from ..results.studies import Study
from ..selection import decision, candidates as select
from ..measure import disturbance
from ..measure import load as machine_load
from ..config import objectives
from ..util.units import format_bytes
from .document import figures


def roofline_of(study_attrs: dict[str, Any], cand: select.Candidate, bandwidth_gbs: float | None) -> Roofline | None:
    """``cand``'s decode against the memory-bandwidth limit (:func:`tuner.backends.roofline.decode_roofline`)
    on the study's model and workload; None where it cannot be told."""
    model, workload = study_attrs.get("model", {}), study_attrs.get("workload", {})
    weights = float(cand.model.get("size_bytes") or model.get("size_bytes", 0))
    return decode_roofline(cand.backend, model, cand.settings, weights, workload.get("prompt_tokens", 0),
                           workload.get("generate_tokens", 0), cand.decode.median, bandwidth_gbs)


def backend_comparison(cands: list[select.Candidate], objective: str) -> dict[str, Any] | None:
    """The best config of each backend and the ratios between the winner and the runner-up."""
    by_backend = decision.best_of_each(cands, objective, key=lambda c: c.backend)
    if len(by_backend) < 2:
        return None
    win, other = list(by_backend.values())[:2]
    return {
        "winner": {"backend": win.backend, "settings": win.settings},
        "other": {"backend": other.backend, "settings": other.settings},
        "prefill_ratio": round(win.prefill.median / other.prefill.median, 2),
        "decode_ratio": round(win.decode.median / other.decode.median, 2),
        "text": (f"{_label(win)} against {_label(other)} on this machine: decode "
                 f"{win.decode.median / other.decode.median:.1f}x, prefill "
                 f"{win.prefill.median / other.prefill.median:.1f}x (tokens/s ratios)"),
    }


def quant_table(study: Study) -> list[dict[str, Any]]:
    """Per weight type tried (backends with GGUF weight variants): best prefill and decode, perplexity,
    loss, file size."""
    rows: dict[str, dict[str, Any]] = {}
    for _, rec in select.records(study):
        if not backends.get(rec.backend).weight_variants:
            continue
        quant = rec.settings.get("quant", "source")
        row = rows.setdefault(quant, {"quant": quant, "file_type": rec.model.get("file_type") or quant,
                                      "size_bytes": rec.model.get("size_bytes"), "trials": 0,
                                      "best_prefill_tps": None, "best_decode_tps": None,
                                      "perplexity": None, "quality_loss": None, "feasible": True,
                                      "kl_mean": None, "kl_p99": None, "top_agreement": None,
                                      "requantized": rec.model.get("requantized", False)})
        row["trials"] += 1
        for key in ("perplexity", "quality_loss", "kl_mean", "kl_p99", "top_agreement"):
            if rec.extra.get(key) is not None:
                row[key] = rec.extra[key]
        if rec.violation.startswith(("quality loss", "KL divergence")):
            row["feasible"] = False
        if rec.outcome.ok and rec.prefill and rec.decode:
            row["best_prefill_tps"] = max(row["best_prefill_tps"] or 0.0, rec.prefill.median)
            row["best_decode_tps"] = max(row["best_decode_tps"] or 0.0, rec.decode.median)
    return sorted(rows.values(), key=lambda r: -(r["best_decode_tps"] or 0.0))


def kv_cache_worth(cands: list[select.Candidate]) -> dict[str, Any] | None:
    """Decode speed with the KV cache over decode speed without it (same other settings), for a
    backend that has a ``use_cache`` setting."""
    by_key = {c.config_key: c for c in cands if "use_cache" in c.settings}
    ratios = []
    for cand in by_key.values():
        if cand.settings.get("use_cache"):
            twin = {**cand.settings, "use_cache": False}
            other = next((c for c in by_key.values() if c.settings == twin), None)
            if other:
                ratios.append((cand.decode.median / other.decode.median, backends.get(cand.backend).label))
    if not ratios:
        return None
    best, label = max(ratios)
    return {"decode_ratio": round(best, 2),
            "text": f"the KV cache makes {label} decode {best:.1f}x faster on this machine"}


def chat_reuse(chosen: select.Candidate) -> list[dict[str, Any]] | None:
    """Per-turn time to first token with the session cache kept vs the conversation re-sent."""
    chat = chosen.extra.get("chat")
    return chat.get("turns") if chat else None


def _label(cand: select.Candidate) -> str:
    return backends.get(cand.backend).describe(cand.settings, cand.model)


def disturbance_section(study: Study, chosen: select.Candidate) -> dict[str, Any] | None:
    """How disturbed the study's repetitions were, and how many disturbed ones the pick's figures keep."""
    recs = dict((t.number, r) for t, r in select.records(study))
    summary = disturbance.run_summary(list(recs.values()))
    if not summary["repetitions"]:
        return None
    kept = disturbance.kept_disturbed([recs[n] for n in chosen.trials if n in recs])
    return {**summary, "pick_disturbed": kept, "text": disturbance.text(summary, kept)}


def load_section(study: Study, chosen: select.Candidate) -> dict[str, Any] | None:
    """The machine's load the pick was tuned under (issue 41): that of the latest run that measured it
    (:mod:`tuner.measure.load`, kept in each trial record), and whether its figures pool trials of a busy run
    with trials of a quiet one (``mixed``, with a line saying so); None where no record kept a load."""
    recs = dict((t.number, r) for t, r in select.records(study))
    mine = [recs[n] for n in sorted(chosen.trials) if n in recs]
    known = [(r, load) for r in mine if (load := machine_load.of_record(r)) is not None]
    if not known:
        return None
    latest = known[-1][1]
    mixed = machine_load.mixed_text(mine, "the recommendation's figures")
    text = latest.tuned_text()
    return {**latest.public(), "mixed": mixed is not None, "text": f"{text} Note: {mixed}." if mixed else text}


def recommendation_extras(study: Study, cands: list[select.Candidate],
                          chosen: select.Candidate,
                          bandwidth_for: Callable[[int | None], float | None] | None = None) -> dict[str, Any]:
    """Extra sections for the recommendation file: picks, Pareto front, backends, roofline.

    ``bandwidth_for`` maps a decode thread count to the memory bandwidth it can draw on
    (:meth:`tuner.machine.profile.MachineProfile.bandwidth_for`); without it there is no roofline.
    """

    extras: dict[str, Any] = {
        "picks": {name: {"settings": c.settings, "prefill_tps": round(c.prefill.median, 2),
                         "decode_tps": round(c.decode.median, 2), "peak_rss_bytes": c.peak_rss,
                         "trials": list(c.trials)}
                  for name, c in decision.picks(cands).items()},
        "pareto_front": [{"settings": c.settings, "prefill_tps": round(c.prefill.median, 2),
                          "decode_tps": round(c.decode.median, 2)} for c in decision.judged_front(cands)],
    }
    against = speedup_by_backend(cands, chosen)
    if len(against) > 1:
        extras["speedup_by_backend"] = against
    comparison = backend_comparison(cands, study.user_attrs.get("objective", objectives.DEFAULT))
    if comparison:
        extras["backends"] = comparison
    quants = quant_table(study)
    if len(quants) > 1 or any(q["perplexity"] is not None for q in quants):
        extras["quants"] = quants
    kv = kv_cache_worth(cands)
    if kv:
        extras["kv_cache"] = kv
    quiet = disturbance_section(study, chosen)
    if quiet:
        extras["disturbance"] = quiet
    load = load_section(study, chosen)
    if load:
        extras[machine_load.KEY] = load
    turns = chat_reuse(chosen)
    if turns:
        extras["chat_cache_reuse"] = turns
    single = served_single_pick(study, cands)
    if single:
        extras["single_request_pick"] = single
    threads = chosen.settings.get("n_threads")
    bandwidth = bandwidth_for(threads) if bandwidth_for else None
    roof = roofline_of(study.user_attrs, chosen, bandwidth)
    if roof is not None:
        extras["roofline"] = {"memory_bandwidth_gbs": bandwidth, "decode_threads": threads,
                              "decode_bytes_per_token": roof.bytes_per_token,
                              "decode_efficiency": round(roof.efficiency, 3),
                              "text": f"Decode reaches {roof.efficiency:.0%} of the memory-bandwidth limit "
                                      f"({bandwidth} GB/s for {threads} decode thread(s), "
                                      f"{format_bytes(roof.bytes_per_token)} read per token)."}
    return extras


def speedup_by_backend(cands: list[select.Candidate], chosen: select.Candidate) -> dict[str, dict[str, float]]:
    """The chosen config's speedup against every backend's measured defaults (its own and the others'):
    {backend: {prefill, decode, request}}; a llama-cpp-python user and a transformers user each see theirs."""
    out: dict[str, dict[str, float]] = {}
    for name in backends.names():
        base = decision.baseline(cands, name)
        if base is None or not base.prefill.median or not base.decode.median:
            continue
        speed = {"prefill": round(chosen.prefill.median / base.prefill.median, 3),
                 "decode": round(chosen.decode.median / base.decode.median, 3)}
        if chosen.request and base.request:
            speed["request"] = round(base.request.median / chosen.request.median, 3)
        out[name] = speed
    return out


SINGLE_PICK_ATTR = "single_request_pick"  # a serve study's attribute: the config that is the single-request pick


def served_single_pick(study: Study, cands: list[select.Candidate]) -> dict[str, Any] | None:
    """The serve workload's comparison: the single-request pick of the model served by llama-server the same
    way (the config the study's ``single_request_pick`` attribute names, :mod:`tuner.search.serving`), its
    settings and figures shaped as the baseline's; None when there is none or it was not measured."""
    key = (study.user_attrs.get(SINGLE_PICK_ATTR) or {}).get("config_key")
    ref = next((c for c in cands if key is not None and c.config_key == key), None)
    if ref is None or ref.goodput is None:
        return None
    return {"settings": ref.settings, "figures": figures(ref)}
