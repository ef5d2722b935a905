"""The ``autotune`` console script: signals are answered from the first instant, then the CLI runs.

Importing the command line takes most of a second (click, pydantic, the commands). A SIGTERM or
SIGHUP in that time used to end the process silently (exit 143); here the handler that turns them
into Ctrl-C is set before anything else is imported, so they end with the same one line as Ctrl-C,
and nothing has been started or written. Only the standard library is imported before it.
"""

from __future__ import annotations

import signal
import sys

STOPPING = (signal.SIGTERM, signal.SIGHUP)


def _as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    """Console-script entry point: SIGTERM and SIGHUP act as Ctrl-C from here on, then :func:`tuner.cli.main`."""
    for sig in STOPPING:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup autotune ...` keeps ignoring SIGHUP
            signal.signal(sig, _as_interrupt)
    try:
        from .cli import main as cli_main  # after the signal handlers: a Ctrl-C while the CLI loads is answered
    except KeyboardInterrupt:
        print("Interrupted before anything started: nothing was written.", file=sys.stderr)
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
