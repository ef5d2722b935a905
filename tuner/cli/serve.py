"""``autotune serve`` and ``autotune dashboard``."""

from __future__ import annotations

import click

from ..errors import AutotuneError
from .group import cli
from .options import storage_option
from .render import short_settings
from .. import backends
from ..backends.settings import TrialSettings
from ..config.workloads import get_workload
from ..recommend.query import open_results
from ..search.options import default_memory_ceiling
from ..service import appconfig  # appconfig.autoconfig and service.serve read at call time: tests stand in
from ..service import serve as service
from ..service.serve_hf import serve_transformers
from ..service.served import MEASURED_ENGINE, differences, with_served_context
from ..util.units import parse_duration


@cli.command()
@click.argument("model", required=False, type=click.Path())
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--engine", type=click.Choice(["llama-cpp-python", "llama-server"]),
              help="Server to run (default: llama-server when on PATH, else llama-cpp-python's).")
@click.option("--workload", default="default", show_default=True, help="Workload the settings were tuned for.")
@click.option("--ctx", type=click.IntRange(16, None), help="Context to serve, in tokens (default: the model's "
              "trained context, clipped to what 75% of the available memory holds).")
@click.option("--budget", metavar="DURATION", help="Tune first for this long when nothing is stored for "
              "this machine (default: start on a prediction or the defaults, and say so).")
@storage_option
def serve(model: str | None, port: int, engine: str | None, workload: str, ctx: int | None, budget: str | None,
          storage: str | None) -> None:
    """Serve MODEL (a GGUF file or a Hugging Face model folder; default: the bundled one) on 127.0.0.1 with
    this machine's tuned settings.

    An OpenAI-compatible server (/v1/completions, /v1/chat/completions). It prints the settings it
    starts with and where they came from (measured here, predicted from a similar machine, or the
    engine's defaults), warms the model up before accepting requests, and stops on Ctrl-C.
    """
    sock = service.listen(port)  # a busy port is one line before anything is looked up, made or loaded
    config = appconfig.autoconfig(model, workload, storage)
    if config.source != "measured" and budget:
        click.echo(f"nothing measured on this machine yet: tuning for {budget} first", err=True)
        config = appconfig.autoconfig(model, workload, storage, tune_budget=parse_duration(budget))
    click.echo(f"settings: {short_settings(config.settings)}")
    click.echo(f"from: {config.describe()}")
    backend = backends.get(config.backend)
    if not backend.own_server:  # served by autotune's own small server
        if ctx is not None:
            click.echo("note: --ctx is not used by transformers (its cache grows with the conversation)", err=True)
        click.echo(f"model: {config.model_path}; engine: transformers (as measured)")
        raise SystemExit(serve_transformers(backend.load_tuned(TrialSettings(**config.settings), config.model_path), sock,
                                            say=click.echo))
    several = get_workload(workload).kind == "serve"  # tuned for several users: llama-server as measured
    if several and engine == "llama-cpp-python":
        raise AutotuneError("the serve workload was tuned on llama-server (several slots): llama-cpp-python's "
                            "server answers one request at a time; leave out --engine")
    chosen = "llama-server" if several else service.pick_engine(engine)
    measured = dict(config.settings)
    # The variant file (made if missing), the repacking verdict, then the context to serve.
    if several:  # the context as measured: split among the tuned slots
        config, why = appconfig.weights_for(config, model), f"as measured, {config.settings.get('n_parallel')} slots"
    else:
        config, why = with_served_context(appconfig.weights_for(config, model), model, ctx, default_memory_ceiling())
    click.echo(f"context: {config.settings['n_ctx']} tokens ({why})")
    click.echo(f"model: {config.model_path}; engine: {chosen}")
    basis = {"measured": "what was measured", "predicted": "the prediction"}.get(config.source, "the defaults")
    for line in differences(measured, config.settings, chosen, "llama-server" if several else MEASURED_ENGINE):
        click.echo(f"differs from {basis}: {line}")
    raise SystemExit(service.serve(config, port, chosen, say=click.echo, sock=sock, several_users=several))


@cli.command()
@storage_option
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
def dashboard(storage: str | None, port: int) -> None:
    """Open optuna-dashboard on the study storage (SQLite or PostgreSQL), served on 127.0.0.1.

    A live view of a long run: trials, their values, parameter importances. Needs the
    `dashboard` extra (pip install 'autotune[dashboard]').
    """
    try:
        from optuna_dashboard import run_server
    except ModuleNotFoundError:
        raise AutotuneError("optuna-dashboard is not installed: pip install 'autotune[dashboard]'") from None

    db = open_results(storage)
    click.echo(f"dashboard on http://127.0.0.1:{port}/ for {db.url}; Ctrl-C stops")
    run_server(db.rdb, host="127.0.0.1", port=port)
