"""llama.cpp's export formats: a recommendation's llama.cpp settings written for another program.

- ``llama-server``: the command line of llama.cpp's server.
- ``llama-cpp-server``: a config file for ``python -m llama_cpp.server --config_file FILE``
  (the ``ConfigFileSettings`` model of llama-cpp-python: ``{"models": [ModelSettings]}``).
- ``ollama``: a Modelfile (``FROM`` the GGUF file, ``PARAMETER`` lines for the runner options
  Ollama has); what Ollama sets per server rather than per model is written as comments.

Each reads a recommendation document (:mod:`tuner.recommend.document`) and refuses one whose weights file
is gone, since the program would be pointed at nothing.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ...errors import AutotuneError

FORMATS = ("llama-server", "llama-cpp-server", "ollama")
# llama_cpp.Llama keyword -> llama_cpp.server ModelSettings field (the same names but the path).
SERVER_FIELDS = {"model_path": "model", "n_ctx": "n_ctx", "n_batch": "n_batch", "n_ubatch": "n_ubatch",
                 "n_threads": "n_threads", "n_threads_batch": "n_threads_batch", "flash_attn": "flash_attn",
                 "type_k": "type_k", "type_v": "type_v", "use_mmap": "use_mmap", "n_gpu_layers": "n_gpu_layers"}
# llama_cpp.Llama keyword -> Ollama runner option.
OLLAMA_PARAMETERS = {"n_ctx": "num_ctx", "n_batch": "num_batch", "n_threads": "num_thread",
                     "n_gpu_layers": "num_gpu", "use_mmap": "use_mmap"}


def _llama(doc: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The llama.cpp keywords of ``doc``, whose weights file must exist: another program is pointed at it."""
    if "llama_cpp_kwargs" not in doc:
        raise AutotuneError(f"the recommendation is for the {doc['settings'].get('backend')} backend: "
                            f"--format {fmt} needs a llama.cpp config; use yaml or json")
    path = Path(doc["llama_cpp_kwargs"]["model_path"])
    if not path.is_file():
        source = (doc.get("model") or {}).get("path")
        again = f"autotune run --model {shlex.quote(source)}" if source else "autotune run on the model"
        raise AutotuneError(f"the weights file this recommendation names, {path}, no longer exists: --format {fmt} "
                            f"would point {fmt} at nothing; `{again}` makes it again (yaml and json export as is)")
    return doc["llama_cpp_kwargs"]


def llama_server_command(doc: dict[str, Any]) -> str:
    """The ``llama-server`` command line that runs the recommended settings."""
    _llama(doc, "llama-server")
    return shlex.join(["llama-server", *doc["llama_server_args"]])


def llama_cpp_server_config(doc: dict[str, Any]) -> dict[str, Any]:
    """A ``llama_cpp.server`` config file (``ConfigFileSettings``) with one model."""
    kwargs = _llama(doc, "llama-cpp-server")
    model = {SERVER_FIELDS[k]: v for k, v in kwargs.items() if k in SERVER_FIELDS}
    model["model_alias"] = Path(kwargs["model_path"]).stem
    return {"models": [model]}


def ollama_modelfile(doc: dict[str, Any]) -> str:
    """Modelfile lines: ``FROM`` the GGUF file and ``PARAMETER`` lines for the tuned runner options."""
    kwargs = _llama(doc, "ollama")
    settings = doc["settings"]
    lines = [f"# autotune: {doc['profile']['name']} · workload {doc['workload']['name']} · "
             f"objective {doc['objective']}{' · pick ' + doc['pick'] if doc.get('pick') else ''}",
             f"FROM {kwargs['model_path']}"]
    for key, name in OLLAMA_PARAMETERS.items():
        value = kwargs[key]
        lines.append(f"PARAMETER {name} {str(value).lower() if isinstance(value, bool) else value}")
    lines += ["# Set per Ollama server, not per model:",
              f"#   OLLAMA_FLASH_ATTENTION={1 if settings.get('flash_attn') else 0}",
              f"#   OLLAMA_KV_CACHE_TYPE={settings.get('type_k', 'f16')}"
              + (f" (one type for keys and values; tuned type_v={settings['type_v']})"
                 if settings.get("type_v", "f16") != settings.get("type_k", "f16") else ""),
              f"# No Ollama equivalent: n_threads_batch={kwargs['n_threads_batch']}, "
              f"n_ubatch={kwargs['n_ubatch']}"
              + ("" if (doc.get("llama_cpp_model_params") or {}).get("use_extra_bufts", True)
                 else ", repack=false (llama.cpp --no-repack)")]
    return "\n".join(lines) + "\n"


def caveats(doc: dict[str, Any], fmt: str) -> list[str]:
    """Settings of ``doc`` that format ``fmt`` cannot carry, one line each (the CLI prints them)."""
    repack = (doc.get("llama_cpp_model_params") or {}).get("use_extra_bufts", True)
    if repack or fmt not in ("llama-cpp-server", "ollama"):
        return []
    program = "llama_cpp.server" if fmt == "llama-cpp-server" else "Ollama"
    return [f"{program} has no setting for weight repacking, which this recommendation turns off "
            "(llama.cpp's extra buffer types): it will run with repacking on; llama-server takes "
            "--no-repack (autotune export --format llama-server)"]


def render(doc: dict[str, Any], fmt: str) -> str:
    """``doc`` in llama.cpp format ``fmt`` (one of ``FORMATS``)."""
    if fmt == "llama-server":
        return llama_server_command(doc) + "\n"
    if fmt == "llama-cpp-server":
        return json.dumps(llama_cpp_server_config(doc), indent=2) + "\n"
    return ollama_modelfile(doc)
