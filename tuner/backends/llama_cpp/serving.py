"""The serve workload on llama.cpp: the real ``llama-server`` with a config, driven by several users at once.

One trial starts the server (:mod:`.server_process`) with the config's flags (slots ``-np``, unified KV,
batch sizes, threads, weights, flash attention, KV cache types), warms it up with one short window, then
measures timed windows: every user streams chat requests in a closed loop (:mod:`tuner.measure.serving_client`)
and each window's figures (:mod:`tuner.measure.serving_figures`) are one repetition. The figures every trial
has are filled from the server's: ``prefill_tps`` the prompt tokens/s over all users, ``decode_tps`` the output
tokens/s over all users, ``ttft_s`` the p90 time to first token, ``request_s`` the median request's seconds;
``goodput_tps`` is what the serve workload ranks by. ``capacity_users`` (when asked) sweeps the user count.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...measure import serving_figures as F
from ...measure.serving_client import Load, LoadSession
from ...util.processes import post_json
from .. import protocol
from .server_process import LlamaServer, ServerFailed, serving_flags

from ...config.workloads import Workload, corpus_text
from ...measure.spec import TrialSpec

WARMUP_S = 2.0  # the untimed window before the timed ones: every slot has run once
SWEEP_S = 4.0   # seconds of each window of a capacity sweep (at most the workload's own window)
LISTS = ("prefill_tps", "decode_tps", "ttft_s", "request_s", "goodput_tps")


def measure_serving(spec: TrialSpec, binary: str) -> dict[str, Any]:
    """Start ``binary`` (llama-server) with the spec's settings and measure the serve workload on it."""
    from ..settings_model import TrialSettings  # cycle break: the settings model loads this package first

    settings = TrialSettings(**spec.settings)
    workload = spec.workload
    folder = Path(spec.progress_path).parent if spec.progress_path else Path.cwd()
    with LlamaServer(binary, serving_flags(settings, spec.model_path), folder / "llama-server.log") as server:
        load = Load(users=workload.users, prompt=prompt_text(server.base_url, workload.prompt_tokens),
                    max_tokens=workload.generate_tokens, duration_s=workload.duration_s, think_s=workload.think_s)
        with LoadSession(server.base_url, load) as session:  # the users run on through every window
            if spec.warmup:
                protocol.warming_up()
                session.warm_up(min(WARMUP_S, load.duration_s))  # every user's first request: the start's burst
                protocol.warmed_up()
            result = timed_windows(server, session, load, workload, spec.repetitions)
        if spec.capacity:
            result["capacity"] = capacity_sweep(server, load, workload)
        result["load_s"] = server.ready_s
    return result


def timed_windows(server: LlamaServer, session: LoadSession, load: Load, workload: Workload,
                  repetitions: int) -> dict[str, Any]:
    """The timed windows (repetitions) of ``load`` on a ready server: per-window figures and their lists."""
    result: dict[str, Any] = {name: [] for name in LISTS}
    windows: list[dict[str, Any]] = []
    result.update(prompt_tokens=workload.prompt_tokens, generate_tokens=workload.generate_tokens, timed_s=0.0,
                  serving_windows=windows)
    while protocol.more_repetitions(result, repetitions):
        figures = window(server, session, load, workload)  # one phase: the window (its figures are all of it)
        for name, key in (("prefill_tps", "prompt_tps"), ("decode_tps", "output_tps"), ("ttft_s", "ttft_p90_s"),
                          ("request_s", "request_p50_s"), ("goodput_tps", "goodput_tps")):
            result[name].append(figures[key])
        windows.append(figures)
        result["timed_s"] += figures["elapsed_s"]
        result["serving"] = F.summary(windows)
        protocol.repetition_done(result, lambda: _drop_last(result))
    result["serving"] = F.summary(windows)
    return result


def window(server: LlamaServer, session: LoadSession, load: Load, workload: Workload) -> dict[str, Any]:
    """One window of ``load``'s session: the figures of the requests started in it; ServerFailed when the server
    died or none of them completed."""
    results, span = session.window(load.duration_s)
    server.check_alive()
    figures = F.window_figures(results, span, load.users, workload.max_ttft_s, workload.max_tpot_s)
    if not figures["completed"]:
        raise ServerFailed(f"no request of {figures['requests']} completed: {'; '.join(figures['errors'])}")
    return figures


def capacity_sweep(server: LlamaServer, load: Load, workload: Workload) -> dict[str, Any]:
    """Windows at 1, 2, 4, ... users up to twice the workload's (stopping after the first that misses the
    targets), each after a warm-up window of its own: the capacity (most users within the targets) and each
    window's figures."""
    sweep: list[dict[str, Any]] = []
    users = 1
    seconds = min(SWEEP_S, load.duration_s)  # no longer than the workload's own windows
    while users <= 2 * workload.users:
        at = dataclasses.replace(load, users=users, duration_s=seconds)
        with LoadSession(server.base_url, at) as session:
            session.warm_up(min(WARMUP_S, seconds))  # the start's burst
            figures = window(server, session, at, workload)
        sweep.append(figures)
        if not F.within_targets(figures, workload.max_ttft_s, workload.max_tpot_s):
            break
        users *= 2
    return {"users": F.capacity(sweep, workload.max_ttft_s, workload.max_tpot_s), "sweep": sweep}


def prompt_text(base_url: str, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of the shipped corpus, cut with the server's own tokenizer."""
    tokens = post_json(base_url + "/tokenize", {"content": corpus_text()}, 60)["tokens"]
    if not tokens:
        raise ServerFailed("llama-server's tokenizer returned no tokens for the shipped corpus")
    tokens = (tokens * (-(-n_tokens // len(tokens))))[:n_tokens]
    return str(post_json(base_url + "/detokenize", {"tokens": tokens}, 60)["content"])


def _drop_last(result: dict[str, Any]) -> None:
    """Take the last window out (a disturbed one that another replaces)."""
    for name in LISTS:
        if result[name]:
            result[name].pop()
    if result["serving_windows"]:
        result["serving_windows"].pop()
    result["serving"] = F.summary(result["serving_windows"])
