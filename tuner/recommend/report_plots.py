"""The figures of a study report: Optuna's own plots, and plotly charts of the trial records.

Every function returns a plotly figure, or a sentence saying why the figure cannot be
drawn for this study (too few trials, nothing to compare).
"""

from __future__ import annotations

import warnings
from typing import Any

import optuna
import optuna.visualization as ov
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import backends
from ..selection import decision, candidates as select
from ..config import objectives
from ..measure.records import record_of
from ..recommend.query import StudyView
from .summary import SINGLE_PICK_ATTR

Figure = go.Figure | str
MIN_IMPORTANCE_TRIALS = 3
# Fixed colours so the same role or pick looks the same in every chart.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _multi(view: StudyView) -> bool:
    return objectives.get(view.objective).multi


def pareto(view: StudyView) -> Figure:
    """Prefill against decode tokens/s of every measured config (its trials pooled, as `autotune best`
    pools them), the Pareto front highlighted: the same front `autotune best` lists."""
    if not _multi(view):
        return (f"this study maximizes one figure ({view.objective}), so it has no Pareto front: "
                "see the optimization history")
    front = decision.judged_front(view.candidates)
    keys = {c.config_key for c in front}
    fig = go.Figure()
    for name, cands, color in (("measured configs", [c for c in view.candidates if c.config_key not in keys],
                                "#b0b0b0"), ("Pareto front", front, COLORS[0])):
        fig.add_trace(go.Scatter(x=[c.prefill.median for c in cands], y=[c.decode.median for c in cands],
                                 mode="markers", name=name, marker={"size": 11, "color": color},
                                 text=[f"trials {', '.join(map(str, c.trials))}" for c in cands]))
    fig.update_layout(title="Pareto front of the pooled configs", xaxis_title="prefill tokens/s",
                      yaxis_title="decode tokens/s")
    return fig


def history(view: StudyView) -> Figure:
    """The objective's score of each trial in order, and the best so far."""
    objective = objectives.get(view.objective)

    sign = -1.0 if objective.unit == "s" else 1.0  # seconds are ranked negated; plot them as they are

    def score(trial: optuna.trial.FrozenTrial) -> float:
        rec = record_of(trial)  # a repeat (told a measured config's figures) measured nothing of its own
        return sign * objective.score(rec) if rec is not None and rec.outcome.ok else float("nan")

    name = "balanced tokens/s (√ prefill·decode)" if objective.multi else f"{view.objective} {objective.unit}"
    return ov.plot_optimization_history(view.study, target=score, target_name=name)


def importances(view: StudyView) -> Figure:
    """How much each sampled setting explains the objective (Optuna's default evaluator)."""
    searched = [t for t in view.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.params]
    if len(searched) < MIN_IMPORTANCE_TRIALS:
        return (f"parameter importances need at least {MIN_IMPORTANCE_TRIALS} completed search trials with "
                f"sampled settings; this study has {len(searched)}: run `autotune run` longer (it resumes)")
    # One bar per setting and figure. Optuna's default evaluator (PedANOVA) ranks settings by how
    # they separate the best trials; it reads a custom target as lower-is-better, hence the minus.
    targets = [(lambda t, i=i: -t.values[i], f"{name} tokens/s") for i, name in enumerate(("prefill", "decode"))] \
        if _multi(view) else [(None, f"{view.objective} tokens/s")]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parts = [ov.plot_param_importances(view.study, target=target, target_name=name) for target, name in targets]
    except (ValueError, RuntimeError) as exc:
        return f"parameter importances could not be computed: {exc}"
    if not any(part.data for part in parts):
        return "parameter importances could not be computed: the completed trials share no sampled setting"
    fig = parts[0]
    for part in parts[1:]:
        fig.add_traces(list(part.data))
    fig.update_traces(text=None, texttemplate=None)
    fig.update_layout(barmode="group", showlegend=len(parts) > 1, title="Parameter importances (PedANOVA)")
    return fig


def _feasible_records(view: StudyView) -> list[Any]:
    return [rec for _, rec in select.records(view.study) if rec.feasible and rec.prefill and rec.decode]


def _quant_label(rec: Any) -> str:
    quant = rec.settings.get("quant", "source")
    return f"{rec.model.get('file_type', '?')} (source)" if quant == "source" else quant


def by_quant(view: StudyView) -> Figure:
    """Prefill and decode tokens/s of every completed trial, by weight type."""
    recs = [r for r in _feasible_records(view) if backends.get(r.backend).weight_variants]
    if not recs:
        return "no completed trial with GGUF weight types yet"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill tokens/s", "decode tokens/s"))
    for i, label in enumerate(sorted({_quant_label(r) for r in recs})):
        mine = [r for r in recs if _quant_label(r) == label]
        for col, figure in ((1, "prefill"), (2, "decode")):
            fig.add_trace(go.Box(y=[getattr(r, figure).median for r in mine], name=label, boxpoints="all",
                                 marker_color=COLORS[i % len(COLORS)], showlegend=False), row=1, col=col)
    fig.update_layout(title="Throughput by weight type (one point per trial)")
    return fig


def by_threads(view: StudyView) -> Figure:
    """Decode tokens/s against decode threads and prefill tokens/s against prefill threads (the
    default backend's trials: thread settings differ between engines)."""
    engine = backends.get(backends.DEFAULT)
    recs = [r for r in _feasible_records(view) if r.backend == engine.name]
    if not recs:
        return f"no completed {engine.label} trial yet"
    prefill_threads, decode_threads = engine.thread_settings["prefill"], engine.thread_settings["decode"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"prefill tokens/s by {prefill_threads}",
                                                        f"decode tokens/s by {decode_threads}"))
    for col, figure, threads in ((1, "prefill", prefill_threads), (2, "decode", decode_threads)):
        fig.add_trace(go.Scatter(x=[r.settings[threads] for r in recs], y=[getattr(r, figure).median for r in recs],
                                 mode="markers", marker={"size": 10, "color": COLORS[col - 1]}, showlegend=False,
                                 text=[r.role for r in recs]), row=1, col=col)
        fig.update_xaxes(title_text=threads, dtick=1 if max(r.settings[threads] for r in recs) <= 16 else None,
                         row=1, col=col)
    fig.update_layout(title="Throughput by thread count (one point per trial)")
    return fig


def against_baseline(view: StudyView) -> Figure:
    """The recommended config and the named picks against the engine defaults, with min-max bars."""
    chosen = view.chosen()
    base = view.baseline(chosen.backend)
    shown = ([("baseline (defaults)", base)] if base else []) + [("recommended", chosen)] + [
        (name, cand) for name, cand in decision.picks(view.candidates).items() if cand.config_key != chosen.config_key]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill tokens/s", "decode tokens/s"))
    for i, (label, cand) in enumerate(shown):
        for col, stat in ((1, cand.prefill), (2, cand.decode)):
            fig.add_trace(go.Bar(x=[label], y=[stat.median], marker_color=COLORS[i % len(COLORS)], showlegend=False,
                                 error_y={"type": "data", "symmetric": False, "array": [stat.max - stat.median],
                                          "arrayminus": [stat.median - stat.min]}), row=1, col=col)
    fig.update_layout(title="Recommended config against the engine defaults (median, min-max)")
    return fig


def capacity(view: StudyView) -> Figure | str | None:
    """The serve workload's capacity curves: p90 time to first token and output tokens/s against the users,
    one line per config whose user count was swept (the confirmation stage's finalists, the defaults and the
    single-request pick served the same way);
    None for another workload (no section)."""
    if view.attrs.get("workload", {}).get("kind") != "serve":
        return None
    chosen = view.chosen()
    base = view.baseline(chosen.backend)
    single = (view.attrs.get(SINGLE_PICK_ATTR) or {}).get("config_key")
    swept = [c for c in view.candidates if (c.extra.get("capacity") or {}).get("sweep")]
    if not swept:
        return "No capacity sweep yet: the confirmation stage of a serve run measures one for each finalist."
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p90 time to first token (s)", "output tokens/s, all users"))
    for i, cand in enumerate(sorted(swept, key=lambda c: c.config_key != chosen.config_key)):
        label = ("recommended" if cand.config_key == chosen.config_key else "defaults"
                 if base is not None and cand.config_key == base.config_key else "single-request pick"
                 if cand.config_key == single else
                 f"{backends.get(cand.backend).describe(cand.settings, cand.model)} np={cand.settings.get('n_parallel')}")
        label += f" (capacity {cand.extra['capacity']['users']})"
        sweep = cand.extra["capacity"]["sweep"]
        users = [w["users"] for w in sweep]
        color = COLORS[i % len(COLORS)]
        fig.add_trace(go.Scatter(x=users, y=[w.get("ttft_p90_s") for w in sweep], name=label, mode="lines+markers",
                                 line={"color": color}), row=1, col=1)
        fig.add_trace(go.Scatter(x=users, y=[w.get("output_tps") for w in sweep], name=label, mode="lines+markers",
                                 line={"color": color}, showlegend=False), row=1, col=2)
    target = view.attrs["workload"].get("max_ttft_s")
    if target:
        fig.add_hline(y=target, line_dash="dot", row=1, col=1, annotation_text="target")
    fig.update_xaxes(title_text="users", type="log", dtick=0.30103)
    fig.update_layout(title="Capacity: what each config serves as users are added")
    return fig
