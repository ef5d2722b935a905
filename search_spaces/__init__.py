"""The shipped search spaces and workloads, installed as the package data ``tuner.search_spaces``.

The YAML files live in the repository's top-level ``search_spaces/`` folder; ``pyproject.toml``
maps that folder to this package so a wheel (``pip install .``, pipx) carries them.
"""
