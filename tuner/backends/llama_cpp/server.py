"""llama-cpp-python's own OpenAI-compatible server (``llama_cpp.server``, the ``server`` extra) with every
tuned setting: the one place autotune touches that server's internals.

``llama_cpp.server`` has no setting for weight repacking, so where the config turns it off its one model
is built under :func:`tuner.backends.llama_cpp.engine.repacking`; it defaults to ``logits_all=True``,
which no trial ran, so that is set false.
"""

from __future__ import annotations

from typing import Any

from ...errors import AutotuneError
from ..settings_model import TrialSettings
from .kwargs import llama_kwargs
from .engine import repacking


def llama_server_app(settings: TrialSettings, model_path: str, host: str, port: int) -> tuple[Any, Any]:
    """llama-cpp-python's OpenAI-compatible app with every tuned setting, and the ``Llama`` it serves."""
    try:
        from llama_cpp.server import app as server_app
        from llama_cpp.server.settings import ModelSettings, ServerSettings
    except ModuleNotFoundError as exc:
        raise AutotuneError(f"llama-cpp-python's server is not installed ({exc.name}): "
                            "pip install 'autotune[server]'") from None
    kwargs = llama_kwargs(settings, model_path)
    kwargs["logits_all"] = False  # every trial ran so; llama_cpp.server's own default is True
    model = ModelSettings(model=kwargs.pop("model_path"), model_alias="autotune", verbose=False, **kwargs)
    with repacking(settings.repack):  # the server's one model is built here (its proxy loads it at once)
        app = server_app.create_app(server_settings=ServerSettings(host=host, port=port), model_settings=[model])
    return app, server_app._llama_proxy()  # the loaded model: llama_cpp.server exposes no public handle
