"""Workloads: named, data-defined descriptions of what a trial measures."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import AutotuneError
from ..util.paths import DATA_DIR, SEARCH_SPACES_DIR
from ..util.yamlio import read_yaml
from .depth import depth_decode_tokens, parse_depth

WORKLOADS_FILE = SEARCH_SPACES_DIR / "workloads.yaml"
CORPUS_FILE = DATA_DIR / "corpus.txt"
# Room for BOS and chat-template tokens that the counts above do not include.
CTX_MARGIN = 16
# The targets a chat user accepts (README): the answer starts within a second and streams at 10 tokens/s or
# faster (people read 4-8 tokens/s).
DEFAULT_MAX_TTFT_S = 1.0
DEFAULT_MAX_TPOT_S = 0.1
SERVE_FIELDS = ("users", "think_s", "duration_s", "max_ttft_s", "max_tpot_s")
CHAT_TEMPLATE_TOKENS = 32  # a served request is a chat message: its template's tokens on top of the prompt


class Workload(BaseModel):
    """What one trial measures: a single prompt and a generation, a multi-turn chat, or a server with
    several users (``serve``: each of ``users`` sends a prompt of ``prompt_tokens`` and streams
    ``generate_tokens`` back, again and again, for ``duration_s`` per repetition)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    kind: Literal["single", "chat", "serve"] = "single"
    prompt_tokens: int = Field(512, ge=1, le=1_000_000, description="Prompt length (single).")
    generate_tokens: int = Field(128, ge=1, le=100_000, description="Tokens generated per reply.")
    system: str = Field("", description="System prompt (chat).")
    messages: list[str] = Field(default_factory=list, description="User turns (chat).")
    # Decode at a filled context (issue 29): None = where the workload ends; N tokens; or "75%" of n_ctx.
    depth: int | str | None = Field(None, description="Context depth of the second decode figure.")
    rank_at_depth: bool = Field(False, description="Rank (request time) by the decode figure at depth.")
    # Serving several users (issue 43): a closed loop of users against llama-server, judged by goodput.
    users: int = Field(8, ge=1, le=256, description="Concurrent users, each in a closed loop (serve).")
    think_s: float = Field(0.0, ge=0, le=600, description="Seconds a user waits between requests (serve).")
    duration_s: float = Field(10.0, gt=0, le=3600, description="Seconds users send requests per repetition (serve).")
    max_ttft_s: float = Field(DEFAULT_MAX_TTFT_S, gt=0, description="Target: time to first token (serve).")
    max_tpot_s: float = Field(DEFAULT_MAX_TPOT_S, gt=0, description="Target: time per output token (serve).")

    @model_validator(mode="after")
    def _check_chat(self) -> "Workload":
        if self.kind == "chat" and not self.messages:
            raise ValueError("a chat workload needs at least one entry in messages")
        return self

    @field_validator("depth", mode="before")
    @classmethod
    def _parse_depth(cls, value: Any) -> int | str | None:
        return parse_depth(value)

    def needed_ctx(self) -> int:
        """Context tokens the workload needs; chat is estimated from its text length; a depth of
        N tokens needs room for N plus the tokens decoded there."""
        if isinstance(self.depth, int):
            return max(self._own_ctx(), self.depth + depth_decode_tokens(self.generate_tokens) + CTX_MARGIN)
        return self._own_ctx()

    def _own_ctx(self) -> int:
        if self.kind == "serve":  # every user's request at once: one slot each (llama-server splits -c)
            return self.users * self.request_ctx()
        if self.kind == "single":
            return self.prompt_tokens + self.generate_tokens + CTX_MARGIN
        # ~4 characters per token for English; template tokens per turn on top.
        text_tokens = (len(self.system) + sum(len(m) for m in self.messages)) // 3
        per_turn = self.generate_tokens + 16
        return text_tokens + per_turn * len(self.messages) + CTX_MARGIN

    def request_ctx(self) -> int:
        """Context tokens one request needs (a serving slot's share of the context)."""
        if self.kind == "serve":  # the system prompt, a question, the template, and up to 1.5x the mean answer
            return self.prompt_tokens + CHAT_TEMPLATE_TOKENS + -(-self.generate_tokens * 3 // 2) + CTX_MARGIN
        return self.prompt_tokens + self.generate_tokens + CTX_MARGIN

    def prefill_tokens(self) -> int:
        """The most prompt tokens the workload hands the engine at once: the prompt of a single
        request; for a chat, at most its whole context (later turns send only what is new)."""
        return self.prompt_tokens if self.kind in ("single", "serve") else self._own_ctx()

    def public(self) -> dict[str, Any]:
        """The workload as plain data for storage and recommendation files (the serving fields for a
        ``serve`` workload only)."""
        data = self.model_dump(exclude_defaults=False)
        if self.kind != "serve":
            for name in SERVE_FIELDS:
                data.pop(name)
        return data


def load_workloads(extra: dict[str, Any] | None = None, source: str = "search space") -> dict[str, Workload]:
    """The shipped workloads, overridden or extended by ``extra`` (a ``workloads:`` section)."""
    raw = read_yaml(WORKLOADS_FILE, "workloads file")
    merged: dict[str, Any] = dict(raw.get("workloads", {}))
    merged.update(extra or {})
    out: dict[str, Workload] = {}
    for name, body in merged.items():
        where = WORKLOADS_FILE if name not in (extra or {}) else source
        if not isinstance(body, dict):
            raise AutotuneError(f"{where}: workload {name!r} must be a mapping of settings")
        try:
            out[name] = Workload(name=str(name), **body)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "workload"
            raise AutotuneError(f"{where}: workload {name!r}, key {key!r}: {err['msg']}") from None
    return out


def get_workload(name: str, extra: dict[str, Any] | None = None, source: str = "search space") -> Workload:
    """The workload called ``name``; an unknown name lists the known ones."""
    workloads = load_workloads(extra, source)
    if name not in workloads:
        known = ", ".join(sorted(workloads))
        raise AutotuneError(f"unknown workload {name!r}: choose one of {known}")
    return workloads[name]


def with_depth(workload: Workload, depth: str | int | None) -> Workload:
    """``workload`` with its decode at depth set by ``--depth`` (N tokens or "75%" of n_ctx); a run at
    another depth is another study, so the name says it (``long-prompt@75%``)."""
    if depth is None:
        return workload

    try:
        parsed = parse_depth(depth)
    except ValueError as exc:
        raise AutotuneError(f"cannot read --depth {depth!r} ({exc}): give a token count such as 2048 "
                            "or a share of n_ctx such as 75%") from None
    return workload.model_copy(update={"depth": parsed, "name": f"{workload.name}@{parsed}"})


def corpus_text() -> str:
    """The shipped English prose that prompts are cut from."""
    return CORPUS_FILE.read_text(encoding="utf-8")


def prompt_tokens(tokenize, n_tokens: int, bos: list[int] | None = None) -> list[int]:
    """Exactly ``n_tokens`` prompt tokens cut from the corpus (repeated when it is too short).

    ``tokenize`` maps text to token ids without special tokens; ``bos`` (if given) is put
    first and counted.
    """
    body = tokenize(corpus_text())
    if not body:
        raise AutotuneError("the tokenizer returned no tokens for the shipped corpus")
    head = list(bos or [])
    need = n_tokens - len(head)
    reps = -(-need // len(body)) if need > 0 else 0
    return (head + body * reps)[:n_tokens]


