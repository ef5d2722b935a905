"""Compatibility entry point: ``python -m tuner.child SPEC.json RESULT.json`` runs
:mod:`tuner.backends.child` (the trial child; the runner launches that module directly)."""

import sys

from .backends.child import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
