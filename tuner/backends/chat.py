"""The chat workload: what keeping a session's KV cache across turns is worth, on either backend.

A conversation is the workload's system prompt and K user turns, each answered with
``generate_tokens`` greedy tokens. Turns are rendered with the model's own chat template (the
GGUF's ``tokenizer.chat_template``; ChatML when a model has none), so each turn adds the text
after the previous reply: the end of that reply's message, the user message and the assistant
header. The generated reply tokens become part of the history as they are.

Each turn is measured in two modes over the very same token history:

- cached: the session keeps its KV cache and processes only the new turn's tokens;
- naive: the cache is emptied and the whole conversation so far is processed again.

The first cached pass records the replies; every later pass feeds those recorded tokens back
(teacher forcing, with the same argmax work), so both modes see identical histories.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Protocol

from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..config.workloads import Workload
from .depth import timed as timed_depth
from .protocol import WARMUP_DECODE, more_repetitions, repetition_done, warmed_up, warming_up

REPLY_MARK = "@@autotune-reply-{}@@"
# Used when a model carries no chat template.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


class Session(Protocol):
    """A sequence on some backend: ``start()`` empties it, ``feed`` appends tokens, returns the argmax."""

    def start(self) -> None: ...

    def feed(self, tokens: list[int]) -> int: ...


def _raise(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def render_turns(template: str, system: str, messages: list[str], bos_token: str = "",
                 eos_token: str = "") -> list[str]:
    """The text each user turn adds to the conversation, rendered with ``template`` (Jinja).

    The first entry is the whole prompt of turn 1 (system prompt included); each later entry
    is what follows the previous assistant reply, up to and including the assistant header.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    compiled = env.from_string(template)
    convo: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    texts = []
    for i, message in enumerate(messages):
        convo.append({"role": "user", "content": message})
        text = compiled.render(messages=convo, add_generation_prompt=True,
                               bos_token=bos_token, eos_token=eos_token)
        if i:
            before, mark, after = text.partition(REPLY_MARK.format(i - 1))
            if not mark:
                raise ValueError("the chat template drops earlier assistant replies: "
                                 "a session cannot be extended turn by turn")
            text = after
        texts.append(text)
        convo.append({"role": "assistant", "content": REPLY_MARK.format(i)})
    return texts


def conversation_tokens(workload: Workload, template: str, tokenize: Callable[[str, bool], list[int]],
                        bos_token: str = "", eos_token: str = "") -> list[list[int]]:
    """Token ids each turn adds; ``tokenize(text, first)`` adds BOS (if the model does) only when first."""
    texts = render_turns(template, workload.system, workload.messages, bos_token, eos_token)
    return [tokenize(text, i == 0) for i, text in enumerate(texts)]


def run_conversation(session: Session, turns: list[list[int]], n_generate: int, naive: bool,
                     replies: list[list[int]] | None = None) -> tuple[list[float], list[float], list[list[int]]]:
    """One pass over the conversation: per-turn TTFT and decode seconds, and the replies fed.

    Cached (``naive=False``): one session, only each turn's new tokens are processed. Naive:
    the session is emptied every turn and the whole history so far is processed. ``replies``
    (recorded by an earlier pass) are fed instead of the generated tokens when given.
    """
    history: list[int] = []
    ttfts, decodes, fed = [], [], []
    session.start()
    for i, new in enumerate(turns):
        if naive:
            session.start()
        tokens = history + new if naive else new
        start = time.perf_counter()
        token = session.feed(tokens)
        ttfts.append(time.perf_counter() - start)
        history += new
        reply: list[int] = []
        start = time.perf_counter()
        for k in range(n_generate):
            reply.append(replies[i][k] if replies else token)
            token = session.feed([reply[-1]])
        decodes.append(time.perf_counter() - start)
        history += reply
        fed.append(reply)
    return ttfts, decodes, fed


def _warm_up(session: Session, first_turn: list[int], n_gen: int) -> None:
    """The untimed warmup: the first turn's prompt and a few decode steps."""
    session.start()
    token = session.feed(first_turn)
    for _ in range(min(WARMUP_DECODE, n_gen)):
        token = session.feed([token])


def measure_chat(session: Session, turns: list[list[int]], workload: Workload, repetitions: int,
                 warmup: bool, max_ctx: int, depth: Any = None) -> dict[str, Any]:
    """Both modes of the conversation ``repetitions`` times: the backend result dict.

    ``chat.turns`` holds, per turn (numbered from 1), the medians over repetitions: TTFT and
    decode tokens/s of both modes, the TTFT speedup of cache reuse (naive / cached), the tokens
    the turn adds and the context once they are in. The per-repetition figures the search
    optimizes are those of the cached mode: ``prefill_tps`` (all turns' new tokens over their
    summed TTFT), ``decode_tps`` (all generated tokens over summed decode time) and ``ttft_s``
    (mean TTFT per turn), and ``request_s``: the whole conversation's wait, session cache kept.
    Raises ``ValueError`` before anything runs when the conversation does not fit ``max_ctx``.

    ``depth`` (a probe of :mod:`tuner.backends.depth`) adds ``decode_depth_tps``, measured right
    after each cached pass; with the workload's ``rank_at_depth`` the conversation's decode is
    taken at that rate in ``request_s``.
    """
    n_gen = workload.generate_tokens
    total = sum(len(t) for t in turns) + n_gen * len(turns)
    if total > max_ctx:
        raise ValueError(f"the chat workload {workload.name!r} needs {total} context tokens, "
                         f"more than the {max_ctx} available: raise n_ctx")
    if warmup:
        warming_up()
        _warm_up(session, turns[0], n_gen)
        warmed_up()
    replies = None
    depth_rates: list[float] = []
    per_rep: list[dict[str, list[float]]] = []
    figures: dict[str, Any] = {}
    while more_repetitions(figures, repetitions):
        ttft_c, dec_c, fed = run_conversation(session, turns, n_gen, naive=False, replies=replies)
        replies = replies or fed
        depth_tps = timed_depth(depth)[0] if depth is not None else None
        ttft_n, dec_n, _ = run_conversation(session, turns, n_gen, naive=True, replies=replies)
        per_rep.append({"ttft_c": ttft_c, "dec_c": dec_c, "ttft_n": ttft_n, "dec_n": dec_n})
        if depth_tps is not None:
            depth_rates.append(depth_tps)
        figures = _with_depth(_cached_figures(per_rep, turns, n_gen), depth, depth_rates, workload.rank_at_depth)

        def discard() -> None:  # a disturbed repetition: another runs in its place
            per_rep.pop()
            if depth_tps is not None:
                depth_rates.pop()
                depth.n_past.pop()  # its engine-side depth goes with it
            kept = _with_depth(_cached_figures(per_rep, turns, n_gen), depth, depth_rates, workload.rank_at_depth)
            figures.clear()
            figures.update(kept)

        repetition_done(figures, discard)
    rows, context = [], 0
    for i, new in enumerate(turns):
        context += len(new)
        med = {k: statistics.median(rep[k][i] for rep in per_rep) for k in per_rep[0]}
        rows.append({"turn": i + 1, "new_tokens": len(new), "context_tokens": context,
                     "ttft_cached_s": med["ttft_c"], "ttft_naive_s": med["ttft_n"],
                     "decode_cached_tps": n_gen / med["dec_c"], "decode_naive_tps": n_gen / med["dec_n"],
                     "ttft_speedup": med["ttft_n"] / med["ttft_c"]})
        context += n_gen
    return {**_with_depth(_cached_figures(per_rep, turns, n_gen), depth, depth_rates, workload.rank_at_depth),
            "chat": {"turns": rows}}


def _with_depth(figures: dict[str, Any], depth: Any, rates: list[float], rank_at_depth: bool) -> dict[str, Any]:
    """The cached figures plus decode at depth; with ``rank_at_depth`` each conversation's decode
    is taken at the depth rate in ``request_s``."""
    ttft_sums = figures.pop("_ttft_sums")
    if depth is None:
        return figures
    figures.update(decode_depth_tps=list(rates), depth=depth.depth, depth_decode_tokens=depth.n_decode, depth_note=depth.note,
                   depth_n_past=list(depth.n_past))
    if rank_at_depth:
        n_total = figures["generate_tokens"]
        figures["request_s"] = [sum(ttft) + n_total / rate for ttft, rate in zip(ttft_sums, rates)]
    return figures


def _cached_figures(per_rep: list[dict[str, list[float]]], turns: list[list[int]], n_gen: int) -> dict[str, Any]:
    """The per-repetition figures of the cached mode (what the search optimizes)."""
    new_total = sum(len(t) for t in turns)
    return {
        "prefill_tps": [new_total / sum(rep["ttft_c"]) for rep in per_rep],
        "decode_tps": [n_gen * len(turns) / sum(rep["dec_c"]) for rep in per_rep],
        "ttft_s": [statistics.fmean(rep["ttft_c"]) for rep in per_rep],
        "request_s": [sum(rep["ttft_c"]) + sum(rep["dec_c"]) for rep in per_rep],  # the whole conversation
        "prompt_tokens": new_total, "generate_tokens": n_gen * len(turns),
        "timed_s": sum(sum(sum(v) for v in rep.values()) for rep in per_rep),
        "_ttft_sums": [rep["ttft_c"] for rep in per_rep],
    }
