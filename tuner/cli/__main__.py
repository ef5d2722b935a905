"""``python -m tuner.cli``: the autotune command line."""

from . import main

main()
