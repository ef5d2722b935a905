"""Serving a transformers pick as measured: a small OpenAI-compatible FastAPI app on loopback.

``transformers serve`` loads its own model with its own settings, so it cannot carry the tuned dtype,
threads, attention kernel and cache; this app serves the :class:`tuner.backends.transformers.loaded.TransformersModel`
``tuner.load()`` builds with exactly those (``/v1/chat/completions`` and ``/v1/models``). Requests
are answered one at a time (one model, one cache); the model answers a short prompt before the
server accepts requests.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

from ..errors import AutotuneError

HOST = "127.0.0.1"
MODEL_ID = "autotune"


def _prompt(loaded: Any, messages: list[dict[str, Any]]) -> str:
    tok = loaded.tokenizer
    if tok.chat_template:
        return str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return "".join(f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in messages) + "assistant:"


def make_app(loaded: Any) -> Any:
    """The FastAPI app over ``loaded`` (a :class:`tuner.backends.transformers.loaded.TransformersModel`)."""
    from fastapi import Body, FastAPI

    app = FastAPI(title="autotune (transformers)")
    lock = threading.Lock()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "autotune"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 64)
        with lock:
            text = loaded.generate(_prompt(loaded, body.get("messages", [])), max_new_tokens=max_tokens,
                                   keep=False)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or MODEL_ID,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}]}

    return app


def serve_transformers(loaded: Any, sock: socket.socket, say: Any = print) -> int:
    """Warm ``loaded`` up, then serve it on ``sock`` (loopback, bound before the model loaded:
    :func:`tuner.service.serve.listen`) until Ctrl-C; the exit status."""
    try:
        import uvicorn
    except ModuleNotFoundError:
        raise AutotuneError("uvicorn and fastapi are not installed: pip install 'autotune[server]'") from None
    app = make_app(loaded)
    loaded.generate("Hello", max_new_tokens=4, keep=False)  # warm up before accepting requests
    port = sock.getsockname()[1]
    say(f"serving on http://{HOST}:{port}/v1 (OpenAI-compatible, transformers); Ctrl-C stops")
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    say("stopped")
    return 0
