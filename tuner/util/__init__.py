"""The lowest layer: files, YAML, units, paths and child-process helpers. Imports nothing from autotune but tuner.errors."""
