"""The measuring protocol every backend shares for a single prompt: warmup, then timed repetitions."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..measure import disturbance
from .depth import timed as timed_depth

WARMUP_DECODE = 8  # decode steps of the untimed warmup
WARMUP_PREFILL = 512  # prompt tokens of the untimed warmup at most: it touches every weight and buffer; a long
                      # prompt's whole prefill again would double a costly trial (3072 tokens: ~30 s on 2 vCPUs)
_listeners: list[Callable[[dict[str, Any]], None]] = []
_adaptive: dict[str, float] = {}  # set by the child from its spec: see adapt()
_watch = disturbance.Watch()  # how disturbed the repetition under way is
_watched: list[dict[str, Any]] = []  # ... and each one before it
_warmup: list[dict[str, Any]] = []  # how disturbed the untimed warmup was (none or one)
_wait_cap: list[float] = []  # the seconds this process may wait for a quiet machine in all: see allow_wait()
_timed_cap: list[float] = []  # the seconds this process's timed repetitions may take in all: see cap_timed()
_spent = {"s": 0.0, "n": 0, "start": 0.0}  # seconds and count of the timed repetitions run, replaced ones included


def adapt(rule: dict[str, float] | None) -> None:
    """Adaptive repetitions for this process: with ``{"min": 2, "max": 6, "cv": 0.03}`` a trial stops
    once at least ``min`` repetitions have a request-time CV below ``cv`` and goes on while the spread
    is larger, up to ``max``. None (the default) runs exactly the repetitions asked for."""
    _adaptive.clear()
    _adaptive.update(rule or {})


def allow_wait(seconds: float | None) -> None:
    """The seconds this process may wait for a quiet machine in all (the run's share of its budget left,
    :mod:`tuner.measure.load`); None: ``MAX_WAIT_PER_TRIAL_S`` alone."""
    _wait_cap[:] = [] if seconds is None else [seconds]


def cap_timed(seconds: float | None) -> None:
    """The seconds this process's timed repetitions may take in all (a share of the run's budget: where one
    request costs that much, a trial keeps fewer repetitions than asked, at least one); None: no cap."""
    _timed_cap[:] = [] if seconds is None else [seconds]
    _spent.update(s=0.0, n=0, start=0.0)


def _affords_another() -> bool:
    """Whether one more timed repetition, at the mean cost of those run so far, stays within :func:`cap_timed`."""
    if not _timed_cap or not _spent["n"]:
        return True
    return _spent["s"] + _spent["s"] / _spent["n"] <= _timed_cap[0]


def more_repetitions(figures: dict[str, Any], planned: int) -> bool:
    """Whether another timed repetition should run after those in ``figures`` (see :func:`adapt`; none once
    one is kept and another would pass :func:`cap_timed`); if so, waits for a quiet machine where the
    repetition (or warmup) before it was disturbed (:func:`tuner.measure.disturbance.wait_for_quiet`) and
    starts watching how disturbed it is."""
    more = _planned_more(figures, planned) and (not figures.get("request_s") or _affords_another())
    if more:
        limit = disturbance.wait_left(_watched or _warmup, *_wait_cap)
        _watch.start(disturbance.wait_for_quiet(limit) if limit > 0 else 0.0)
        _spent["start"] = time.monotonic()
    return more


def warming_up() -> None:
    """The untimed warmup starts: watch it, so a busy machine makes the first timed repetition wait too."""
    _warmup.clear()
    _watch.start()


def warmed_up() -> None:
    """The untimed warmup ended (see :func:`warming_up`)."""
    seen = _watch.stop()
    _warmup[:] = [seen] if seen is not None else []


def _planned_more(figures: dict[str, Any], planned: int) -> bool:
    """The repetition count asked for, or what the adaptive rule says."""
    done = figures.get("request_s") or []
    if not _adaptive:
        return len(done) < planned
    if len(done) < _adaptive["min"]:
        return True
    if len(done) >= _adaptive["max"]:
        return False
    mean = statistics.fmean(done)
    spread = statistics.stdev(done) / mean if len(done) > 1 and mean > 0 else 0.0
    return spread >= _adaptive["cv"]


def watched() -> list[dict[str, Any]]:
    """How disturbed each timed repetition of this process was, in order (:mod:`tuner.measure.disturbance`)."""
    return list(_watched)


def on_repetition(listener: Callable[[dict[str, Any]], None]) -> None:
    """Call ``listener`` with the figures so far after every timed repetition (the trial's child
    streams them to its parent, so a trial stopped at the run's deadline keeps what it measured)."""
    _listeners.append(listener)


def phase_done(name: str) -> None:
    """A phase of the repetition under way ended ("prefill", "decode", "decode_depth"): note how disturbed
    it was on its own (:meth:`tuner.measure.disturbance.Watch.phase`)."""
    _watch.phase(name)


def repetition_done(figures: dict[str, Any], discard: Callable[[], None] | None = None,
                    request_phases: tuple[str, ...] = ("prefill", "decode")) -> None:
    """A timed repetition ended: note how disturbed it was (with phases watched: whether one of
    ``request_phases``, those its request time is made of, was); if other processes disturbed it and the
    trial may still replace one, ``discard()`` takes it out of ``figures`` (another runs in its place, as
    :func:`more_repetitions` counts what is left); then tell the listeners the figures so far."""
    if _spent["start"]:
        _spent.update(s=_spent["s"] + time.monotonic() - _spent["start"], n=_spent["n"] + 1, start=0.0)
    watched = _watch.stop(request_phases)
    if watched is not None:  # a disturbed repetition is replaced only where another fits the cap (cap_timed)
        watched["replaced"] = discard is not None and disturbance.should_replace(_watched, watched) \
            and _affords_another()
        _watched.append(watched)
        if watched["replaced"]:
            discard()  # type: ignore[misc]
    figures[disturbance.KEY] = list(_watched)
    for listener in _listeners:
        listener(figures)


def prefill_decode_reps(reset: Callable[[], None], prefill: Callable[[list[int]], tuple[float, int]],
                        decode: Callable[[int, int], tuple[float, Any]], tokens: list[int],
                        n_generate: int, repetitions: int, warmup: bool, depth: Any = None,
                        rank_at_depth: bool = False) -> dict[str, Any]:
    """The single-prompt protocol every backend shares: an untimed warmup (the first ``WARMUP_PREFILL`` prompt
    tokens and a few decode steps), then ``repetitions``
    (or as :func:`adapt` says) of a prefill of ``tokens`` from an empty cache (``reset``) and a decode of ``n_generate`` tokens.

    ``prefill(tokens)`` returns (seconds to the first next token, that token);
    ``decode(first, n)`` returns (seconds, anything). ``request_s`` is each repetition's whole
    request: prefill to the first token, then the decode of the rest.

    ``depth`` (a probe of :mod:`tuner.backends.depth`) adds ``decode_depth_tps``: after each
    repetition's decode, a decode with the cache filled to the probe's depth. With
    ``rank_at_depth`` the request's decode is taken at that rate (workloads that live at depth).
    """
    if warmup:
        warming_up()
        reset()
        _, first = prefill(tokens[:WARMUP_PREFILL])
        decode(first, min(WARMUP_DECODE, n_generate))
        warmed_up()
    prefill_tps, decode_tps, ttft, request = [], [], [], []
    timed = 0.0
    result: dict[str, Any] = {"prefill_tps": prefill_tps, "decode_tps": decode_tps, "ttft_s": ttft,
                              "request_s": request, "prompt_tokens": len(tokens), "generate_tokens": n_generate,
                              "timed_s": timed}
    if depth is not None:
        result.update(decode_depth_tps=[], depth=depth.depth, depth_decode_tokens=depth.n_decode, depth_note=depth.note,
                      depth_n_past=depth.n_past)
    while more_repetitions(result, repetitions):
        reset()
        t_prefill, first = prefill(tokens)
        phase_done("prefill")
        t_decode, _ = decode(first, n_generate)
        phase_done("decode")
        prefill_tps.append(len(tokens) / t_prefill)
        decode_tps.append(n_generate / t_decode)
        ttft.append(t_prefill)
        if depth is not None:
            depth_tps, _ = timed_depth(depth)
            phase_done("decode_depth")
            result["decode_depth_tps"].append(depth_tps)
            timed += depth.n_decode / depth_tps
            if rank_at_depth:
                t_decode = n_generate / depth_tps
        request.append(t_prefill + t_decode)  # the wait for the whole answer
        timed += t_prefill + t_decode
        result["timed_s"] = timed
        repetition_done(result, lambda: _drop_last(result),
                        ("prefill", "decode_depth" if depth is not None and rank_at_depth else "decode"))
    return result


def _drop_last(figures: dict[str, Any]) -> None:
    """Take the last repetition out of every per-repetition list of ``figures``."""
    for name in ("prefill_tps", "decode_tps", "ttft_s", "request_s", "decode_depth_tps", "depth_n_past"):
        if figures.get(name):
            figures[name].pop()
