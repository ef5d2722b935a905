"""The figures of a study report: Optuna's own plots, and plotly charts of the trial records.

Every function returns a plotly figure, or a sentence saying why the figure cannot be
drawn for this study (too few trials, nothing to compare).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import optuna
import optuna.visualization as ov
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import select
from .query import StudyView

Figure = go.Figure | str
MIN_IMPORTANCE_TRIALS = 3
# Fixed colours so the same role or pick looks the same in every chart.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _multi(view: StudyView) -> bool:
    return len(view.study.directions) > 1


def _balanced(trial: optuna.trial.FrozenTrial) -> float:
    return math.sqrt(max(trial.values[0], 0.0) * max(trial.values[1], 0.0))


def pareto(view: StudyView) -> Figure:
    """Prefill against decode tokens/s of every trial, the Pareto front highlighted."""
    if not _multi(view):
        return (f"this study maximizes one figure ({view.objective}), so it has no Pareto front: "
                "see the optimization history")
    return ov.plot_pareto_front(view.study, target_names=["prefill tokens/s", "decode tokens/s"])


def history(view: StudyView) -> Figure:
    """The objective of each trial in order, and the best so far."""
    if _multi(view):
        return ov.plot_optimization_history(view.study, target=_balanced,
                                            target_name="balanced tokens/s (√ prefill·decode)")
    return ov.plot_optimization_history(view.study, target_name=f"{view.objective} tokens/s")


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
    recs = [r for r in _feasible_records(view) if r.backend == "llama_cpp"]
    if not recs:
        return "no completed llama.cpp trial yet"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill tokens/s", "decode tokens/s"))
    for i, label in enumerate(sorted({_quant_label(r) for r in recs})):
        mine = [r for r in recs if _quant_label(r) == label]
        for col, figure in ((1, "prefill"), (2, "decode")):
            fig.add_trace(go.Box(y=[getattr(r, figure).median for r in mine], name=label, boxpoints="all",
                                 marker_color=COLORS[i % len(COLORS)], showlegend=False), row=1, col=col)
    fig.update_layout(title="Throughput by weight type (one point per trial)")
    return fig


def by_threads(view: StudyView) -> Figure:
    """Decode tokens/s against decode threads and prefill tokens/s against prefill threads."""
    recs = [r for r in _feasible_records(view) if r.backend == "llama_cpp"]
    if not recs:
        return "no completed llama.cpp trial yet"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill tokens/s by n_threads_batch",
                                                        "decode tokens/s by n_threads"))
    for col, figure, threads in ((1, "prefill", "n_threads_batch"), (2, "decode", "n_threads")):
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
        (name, cand) for name, cand in select.picks(view.candidates).items() if cand.config_key != chosen.config_key]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill tokens/s", "decode tokens/s"))
    for i, (label, cand) in enumerate(shown):
        for col, stat in ((1, cand.prefill), (2, cand.decode)):
            fig.add_trace(go.Bar(x=[label], y=[stat.median], marker_color=COLORS[i % len(COLORS)], showlegend=False,
                                 error_y={"type": "data", "symmetric": False, "array": [stat.max - stat.median],
                                          "arrayminus": [stat.median - stat.min]}), row=1, col=col)
    fig.update_layout(title="Recommended config against the engine defaults (median, min-max)")
    return fig
