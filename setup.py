"""Package discovery only (everything else is in pyproject.toml): every package under tuner/, found rather
than listed, plus the top-level search_spaces/ folder installed as tuner.search_spaces."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["tuner", "tuner.*"]), "tuner.search_spaces"])
