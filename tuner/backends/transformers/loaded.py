"""A transformers pick, loaded as measured: model, tokenizer and a generate call that keeps the KV cache.

``tuner.load()`` returns a :class:`TransformersModel` when the recommendation names the transformers
backend: the weights in the recommended dtype, ``torch`` set to the recommended thread count, the
recommended attention kernel, and a cache of the recommended kind (dynamic or static) used by
:meth:`TransformersModel.generate`, which feeds each new turn on top of what the cache holds
(the chat workload's strategy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import AutotuneError
from ..settings import TrialSettings
from .fields import NAME
from .loading import load
from .session import Session


@dataclass
class TransformersModel:
    """A loaded transformers model with the settings it was loaded with."""

    model: Any
    tokenizer: Any
    settings: TrialSettings
    model_path: str
    max_tokens: int
    _session: Any = field(default=None, repr=False)

    @property
    def dtype(self) -> str:
        """The dtype the weights really run in ("bfloat16", ...)."""
        return str(self.model.dtype).removeprefix("torch.")

    def reset(self) -> None:
        """Forget the conversation: the next :meth:`generate` starts from an empty cache."""
        if self._session is not None:
            self._session.start()

    def generate(self, text: str, max_new_tokens: int = 64, keep: bool = True) -> str:
        """Greedy continuation of ``text`` fed after what this object already holds.

        With ``keep`` (the default) the KV cache is kept across calls, so a chat turn only pays for
        its new tokens; ``keep=False`` starts afresh. Stops at the tokenizer's EOS.
        """
        import torch


        torch.set_num_threads(self.settings.torch_threads)
        if self._session is None:
            self._session = Session(self.model, self.settings, self.max_tokens)
        session = self._session
        if not keep:
            session.start()
        first = not session.history
        ids = self.tokenizer(text, add_special_tokens=first)["input_ids"]
        if len(session.history) + len(ids) + max_new_tokens > self.max_tokens:
            session.start()  # the cache is full: start again from this text
            ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        out: list[int] = []
        eos = self.tokenizer.eos_token_id
        with torch.inference_mode():
            token = session.feed(ids)
            for _ in range(max_new_tokens):
                if token == eos:
                    break
                out.append(token)
                if len(out) == max_new_tokens:
                    break
                token = session.feed([token])
        return self.tokenizer.decode(out, skip_special_tokens=True)


def load_transformers(model_path: str, settings: dict[str, Any] | TrialSettings,
                      max_tokens: int | None = None) -> TransformersModel:
    """Load ``model_path`` (a GGUF file or a Hugging Face folder) with transformers settings ``settings``.

    Every measured setting is carried: dtype, ``torch_threads``, ``attn_implementation``,
    ``use_cache`` and ``cache_implementation``; ``max_tokens`` (default the settings' ``n_ctx``,
    clipped to the model's trained context) sizes the cache.
    """
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch


    s = settings if isinstance(settings, TrialSettings) else TrialSettings(**settings)
    if s.backend != NAME:
        raise AutotuneError(f"these settings are for {s.backend}, not transformers: use tuner.load()")
    torch.set_num_threads(s.torch_threads)
    model, tokenizer, _ = load(model_path, s)
    trained = getattr(model.config, "max_position_embeddings", None) or s.n_ctx
    return TransformersModel(model=model, tokenizer=tokenizer, settings=s, model_path=model_path,
                             max_tokens=min(max_tokens or s.n_ctx, trained))
