"""Several users at once against an OpenAI-compatible server: a closed loop of streamed chat requests.

Each user sends a streaming ``/v1/chat/completions`` request, reads the stream token by token, waits its think
time and sends the next, until the window ends; requests under way then finish. What a request measured is
one :class:`RequestResult`: when its first token came (time to first token), how long each token after it
took on average (time per output token), and how many tokens it returned. The server's side (which engine,
which settings) is the caller's; :mod:`tuner.measure.serving_figures` turns the results into figures.

Every prompt starts with text of its own (user and request number), so no request reuses another's cached
prompt: each one is prefilled in full, as different users' requests are.
"""

from __future__ import annotations

import asyncio
import json
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
    """What the users send: a prompt of about ``prompt_words`` corpus words, ``max_tokens`` back."""

    users: int
    prompt: str                       # the shared body every prompt is cut from
    max_tokens: int
    duration_s: float
    think_s: float = 0.0
    request_timeout_s: float = 300.0
    extra_body: dict[str, Any] = field(default_factory=dict)


def prompt_for(load: Load, user: int, number: int) -> str:
    """The prompt of request ``number`` of ``user``: its own first line, then the shared body."""
    return f"Request {number} from user {user}. Continue this text.\n\n{load.prompt}"


def run_load(base_url: str, load: Load) -> tuple[list[RequestResult], float]:
    """Drive ``load`` against the server at ``base_url`` (``http://127.0.0.1:PORT``); every request's
    result, in the order they finished, and the seconds from the window's start to the last one's end."""
    return asyncio.run(_run(base_url, load))


async def _run(base_url: str, load: Load) -> tuple[list[RequestResult], float]:
    import httpx

    limits = httpx.Limits(max_connections=load.users + 2, max_keepalive_connections=load.users + 2)
    timeout = httpx.Timeout(load.request_timeout_s, connect=CONNECT_TIMEOUT_S)
    results: list[RequestResult] = []
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        start = time.perf_counter()
        end = start + load.duration_s

        async def user_loop(user: int) -> None:
            number = 0
            while time.perf_counter() < end:
                results.append(await _request(client, load, user, number, start))
                number += 1
                if load.think_s and time.perf_counter() < end:
                    await asyncio.sleep(load.think_s)

        await asyncio.gather(*(user_loop(u) for u in range(load.users)))
        return results, time.perf_counter() - start


async def _request(client: Any, load: Load, user: int, number: int, window_start: float) -> RequestResult:
    """One streamed chat request; its timings, or the error that ended it (a failed request is data)."""
    body = {"messages": [{"role": "user", "content": prompt_for(load, user, number)}], "stream": True,
            "max_tokens": load.max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **load.extra_body}
    sent = time.perf_counter()
    first: float | None = None
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
                         total_s=done - sent, output_tokens=usage_tokens or tokens, prompt_tokens=prompt)


def _has_content(chunk: dict[str, Any]) -> bool:
    """Whether a stream chunk carries output text (a token), not only a role or the final usage."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            return True
    return False
