"""``autotune build-server``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import AutotuneError
from .group import cli
from .. import backends

HOW = {"env": "used as is (AUTOTUNE_LLAMA_SERVER)", "cache": "already built",
       "path": "found on PATH (llama-cpp-python's llama.cpp commit, or AUTOTUNE_LLAMA_SERVER_FROM_PATH=1)"}


@cli.command("build-server")
def build_server() -> None:
    """Build llama.cpp's llama-server once for the installed llama-cpp-python, and cache it.

    llama-cpp-python's wheel has no llama-server; this builds it with cmake from the llama.cpp sources
    vendored in llama-cpp-python's sdist (about 10 minutes, once per llama-cpp-python version; needs cmake
    and a C++ compiler) into the user's cache folder ($XDG_CACHE_HOME/autotune, else ~/.cache/autotune).
    Prints where the binary is, its version, and the build time (or "already built"). The binary
    AUTOTUNE_LLAMA_SERVER names is used instead, as is.
    """
    found = [server for b in backends.REGISTRY.values() if (server := b.server_binary(say=click.echo))]
    if not found:
        raise AutotuneError("no registered backend has a server program to build")
    for server in found:
        click.echo(f"{Path(server.path).name}: {server.path}")
        click.echo(f"version: {server.version}")
        click.echo(f"built in {server.build_s:.0f} s" if server.build_s is not None
                   else HOW.get(server.source, server.source))
