"""Several users at once against an OpenAI-compatible server: a closed loop of streamed chat requests.

Each user sends a streaming ``/v1/chat/completions`` request, reads the stream token by token, waits its think
time and sends the next, until the window ends; requests under way then finish. What a request measured is
one :class:`RequestResult`: when its first token came (time to first token), how long each token after it
took on average (time per output token), and how many tokens it returned. The server's side (which engine,
which settings) is the caller's; :mod:`tuner.measure.serving_figures` turns the results into figures.

Every request is a shared system prompt (the workload's prompt tokens) and a short question of its own, as
a chat service's are: the server may keep the shared part in its prompt cache, and must prefill the rest.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RequestResult:
    """One streamed request: when it started (seconds from the window's start) and what it measured."""

    user: int
    started_s: float
    ttft_s: float | None = None       # seconds to the first output token (None: none came)
    total_s: float = 0.0              # seconds to the end of the stream
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""                   # why the request failed ("" when it completed)
    token_times: tuple[float, ...] = ()  # when each output token arrived, in seconds from the window's origin

    def tokens_between(self, start: float, end: float) -> int:
        """Output tokens that arrived in [start, end) (seconds from the origin)."""
        return sum(start <= t < end for t in self.token_times)

    @property
    def ok(self) -> bool:
        """Whether the request completed with at least one token."""
        return not self.error and self.ttft_s is not None and self.output_tokens > 0

    @property
    def tpot_s(self) -> float | None:
        """Mean seconds per output token after the first (None for fewer than two tokens)."""
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.total_s - self.ttft_s) / (self.output_tokens - 1)  # type: ignore[operator]


@dataclass(frozen=True)
class Load:
    """What the users send: the prompt text, ``max_tokens`` back on average (:func:`answer_tokens`)."""

    users: int
    prompt: str                       # the shared body every prompt is cut from
    max_tokens: int
    duration_s: float
    think_s: float = 0.0
    request_timeout_s: float = 300.0
    extra_body: dict[str, Any] = field(default_factory=dict)


def messages_for(load: Load, user: int, number: int) -> list[dict[str, str]]:
    """The chat of request ``number`` of ``user``: the system prompt every request shares (a chat service's
    instructions and context, which llama-server's prompt cache may keep), then a question of its own (no
    request's whole prompt is another's)."""
    return [{"role": "system", "content": load.prompt},
            {"role": "user", "content": f"Request {number} from user {user}: continue the text above."}]


class LoadSession:
    """The users' closed loop running without pause in a thread of its own, measured in windows: a window's
    requests are those that *started* in it (each waited for to its end), so every window sees the server in
    its steady state, not the burst of every user starting at once.

    ``with LoadSession(base_url, load) as session: results, seconds = session.window(8.0)``
    """

    def __init__(self, base_url: str, load: Load) -> None:
        import threading

        self.base_url, self.load = base_url, load
        self.results: list[RequestResult] = []
        self.in_flight: dict[tuple[int, int], float] = {}  # (user, number) -> started, seconds from the origin
        self.lock = threading.Lock()
        self.stopping = False
        self.origin = 0.0
        self.last_end: float | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> "LoadSession":
        self.origin = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping = True
        self.thread.join(self.load.request_timeout_s + CONNECT_TIMEOUT_S)

    def window(self, seconds: float) -> tuple[list[RequestResult], tuple[float, float]]:
        """Wait ``seconds`` (longer, until as many requests as users have started in it, where requests take
        longer than that), then until every request under way in the window has ended; those requests and
        the window's (start, end) in seconds from the origin (:func:`tuner.measure.serving_figures.window_figures`
        counts the tokens that arrived in it)."""
        now = time.perf_counter() - self.origin
        # Back to back: a window starts where the one before ended (the wait for that one's requests to end
        # is time this one has already run), so a trial's windows cost their seconds, not a drain each.
        start = self.last_end if self.last_end is not None and now - self.last_end < seconds else now
        time.sleep(max(start + seconds - now, 0.0))
        limit = time.perf_counter() + self.load.request_timeout_s
        while self._started_since(start) < self.load.users and time.perf_counter() < limit and self.thread.is_alive():
            time.sleep(0.02)
        end = self.last_end = time.perf_counter() - self.origin
        deadline = time.perf_counter() + self.load.request_timeout_s
        while time.perf_counter() < deadline:  # every request under way in the window ends: all are judged
            with self.lock:
                if not any(began < end for began in self.in_flight.values()):
                    break
            if not self.thread.is_alive():
                break
            time.sleep(0.02)
        with self.lock:
            return [r for r in self.results if r.started_s < end and r.started_s + r.total_s >= start], \
                (start, end)

    def warm_up(self, seconds: float) -> None:
        """An untimed window, waited for to its last request (every user's first request arrives at once: a
        burst the server never sees again), so the first timed window starts after it, not back to back."""
        self.window(seconds)
        self.last_end = None

    def _started_since(self, start: float) -> int:
        """How many requests started at or after ``start`` (seconds from the origin)."""
        with self.lock:
            return (sum(r.started_s >= start for r in self.results)
                    + sum(began >= start for began in self.in_flight.values()))

    async def _main(self) -> None:
        import httpx

        load = self.load
        limits = httpx.Limits(max_connections=load.users + 2, max_keepalive_connections=load.users + 2)
        timeout = httpx.Timeout(load.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        async with httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=timeout) as client:
            async def user_loop(user: int) -> None:
                number = 0
                while not self.stopping:
                    sent = time.perf_counter()
                    with self.lock:
                        self.in_flight[(user, number)] = sent - self.origin
                    result = await _request(client, load, user, number, self.origin, sent)
                    with self.lock:
                        self.results.append(result)
                        del self.in_flight[(user, number)]
                    number += 1
                    if load.think_s and not self.stopping:
                        await asyncio.sleep(load.think_s)

            await asyncio.gather(*(user_loop(u) for u in range(load.users)))


def answer_tokens(load: Load, user: int, number: int) -> int:
    """Tokens request ``number`` of ``user`` asks for: from half to one and a half times ``max_tokens``, the
    same for every config measured (answers differ in length; equal lengths keep users in lock-step, every
    prompt arriving at once, which real users are not)."""
    share = random.Random(user * 1_000_003 + number).random()
    return max(1, round(load.max_tokens * (0.5 + share)))


async def _request(client: Any, load: Load, user: int, number: int, window_start: float,
                   sent: float | None = None) -> RequestResult:
    """One streamed chat request (``sent``: when it counts as sent, default now); its timings, or the error
    that ended it (a failed request is data)."""
    body = {"messages": messages_for(load, user, number), "stream": True,
            "max_tokens": answer_tokens(load, user, number), "temperature": 0.0, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **load.extra_body}
    sent = time.perf_counter() if sent is None else sent
    first: float | None = None
    arrivals: list[float] = []
    tokens = prompt = 0
    usage_tokens: int | None = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")[:200]
                return RequestResult(user, sent - window_start, error=f"HTTP {response.status_code}: {text}",
                                     total_s=time.perf_counter() - sent)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if _has_content(chunk):
                    tokens += 1
                    arrivals.append(time.perf_counter() - window_start)
                    if first is None:
                        first = time.perf_counter()
                usage = chunk.get("usage") or {}
                if usage.get("completion_tokens"):
                    usage_tokens, prompt = int(usage["completion_tokens"]), int(usage.get("prompt_tokens") or 0)
    except Exception as exc:  # a dropped connection, a timeout, a malformed stream: recorded, not raised
        return RequestResult(user, sent - window_start, error=f"{type(exc).__name__}: {exc}"[:200],
                             total_s=time.perf_counter() - sent)
    done = time.perf_counter()
    return RequestResult(user, sent - window_start, ttft_s=None if first is None else first - sent,
                         total_s=done - sent, output_tokens=usage_tokens or tokens, prompt_tokens=prompt,
                         token_times=tuple(arrivals))


def _has_content(chunk: dict[str, Any]) -> bool:
    """Whether a stream chunk carries output text (a token), not only a role or the final usage."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            return True
    return False
