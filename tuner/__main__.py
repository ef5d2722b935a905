"""``python -m tuner``: the autotune command line (:func:`tuner.entry.main`), as the ``autotune`` script runs it."""

from .entry import main

main()
