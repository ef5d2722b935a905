"""``python -m tuner.cli``: the autotune command line, through the console script's entry point
(:func:`tuner.entry.main`: SIGTERM and SIGHUP end it with the same one line as Ctrl-C)."""

from ..entry import main

main()
