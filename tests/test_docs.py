"""Docs that cannot go stale: every repository path and every ``autotune`` command that README.md,
benchmarks/README.md and docs/ name must exist, and the site must build with ``mkdocs build --strict``.

The checker is two small functions over text (``stale_paths``, ``unknown_commands``), so its own
self-test can feed it a renamed module and an unknown command and see both reported.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Paths a doc may name that a fresh checkout does not have: outputs made by running things.
GENERATED = ("benchmarks/.cache",)

# A repository path: one of the top-level folders (or a few top-level files), not inside a longer path
# such as /work/main/search_spaces/cpu.yaml (a log line of some other checkout).
PATH_RE = re.compile(r"(?<![\w/.~-])((?:tuner|tests|benchmarks|search_spaces|docs)/[\w./<>*{}-]*"
                     r"|\.ci/run\b|mkdocs\.yml|pyproject\.toml)")
LINK_RE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
SPAN_RE = re.compile(r"`([^`\n]+)`")
# One space apart, as a command is typed (a table column "autotune         median ..." is not one).
COMMAND_RE = re.compile(r"\bautotune ([a-z][\w-]*)(?: ([a-z][\w-]*))?")


def doc_files() -> list[Path]:
    """The documents checked: the README, the benchmarks' index and every page of the site."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def stale_paths(text: str, where: Path, root: Path = ROOT) -> list[str]:
    """Each repository path or relative link in ``text`` (a document at ``where``) that does not exist."""
    found = []
    for match in PATH_RE.finditer(LINK_RE.sub("", text)):  # links are relative to the document: below
        path = match.group(1).rstrip(".,:;")
        if any(c in path for c in "<>*{}") or path.startswith(GENERATED):
            continue  # a pattern (tuner/backends/<name>/), not a path
        if not (root / path).exists():
            found.append(f"{where.name}: path {path} does not exist")
    for match in LINK_RE.finditer(text):
        target = match.group(1).split("#", 1)[0]
        if not target or re.match(r"^[a-z][a-z+.-]*:", target):
            continue  # an anchor on the same page, or a URL (https:, mailto:)
        if not (where.parent / target).resolve().exists():
            found.append(f"{where.name}: link {match.group(1)} does not exist")
    return found


def code_of(text: str) -> list[str]:
    """The code in a Markdown text: fenced blocks and inline code spans."""
    blocks = [m.group(0) for m in FENCE_RE.finditer(text)]
    rest = FENCE_RE.sub("", text)
    return blocks + SPAN_RE.findall(rest)


def named_commands(text: str) -> set[tuple[str, ...]]:
    """Every ``autotune <command> [<subcommand>]`` named in the code of ``text``."""
    out = set()
    for code in code_of(text):
        for match in COMMAND_RE.finditer(code):
            out.add(tuple(w for w in match.groups() if w))
    return out


@lru_cache(maxsize=1)
def _cli():
    from tuner.cli import cli

    return cli


def help_fails(words: tuple[str, ...]) -> str | None:
    """Why ``autotune <words> --help`` does not exit 0 (None when it does), through click's CliRunner."""
    import click
    from click.testing import CliRunner

    cli = _cli()
    command = cli.commands.get(words[0])
    if command is None:
        return f"autotune {words[0]}: no such command"
    args = list(words[:2] if isinstance(command, click.Group) else words[:1])  # a second word is a subcommand only of a group
    result = CliRunner().invoke(cli, [*args, "--help"])
    if result.exit_code != 0:
        return f"autotune {' '.join(args)} --help: exit {result.exit_code}: {result.output.strip()[-300:]}"
    return None


def unknown_commands(text: str, where: Path) -> list[str]:
    """Each ``autotune`` command named in ``text`` whose ``--help`` fails."""
    found = []
    for words in sorted(named_commands(text)):
        why = help_fails(words)
        if why:
            found.append(f"{where.name}: {why}")
    return found


def test_every_path_the_docs_name_exists() -> None:
    found = [p for doc in doc_files() for p in stale_paths(doc.read_text(), doc)]
    assert not found, "\n".join(found)


def test_every_autotune_command_the_docs_name_runs_its_help() -> None:
    named = set().union(*(named_commands(doc.read_text()) for doc in doc_files()))
    assert ("run",) in named and ("serve",) in named  # the checker sees the README's commands at all
    found = [p for doc in doc_files() for p in unknown_commands(doc.read_text(), doc)]
    assert not found, "\n".join(found)


def test_the_checker_reports_a_renamed_module_and_an_unknown_command() -> None:
    doc = ROOT / "docs" / "example.md"
    text = ("The rule lives in `tuner/decision.py` (see [the rule](concepts.md) and [gone](gone.md)).\n"
            "Logs of other checkouts (/work/main/tuner/decision.py) and patterns (`tuner/backends/<name>/`) "
            "are not paths.\n\n```bash\nautotune frobnicate --now\nautotune run --budget 2m\n```\n")
    paths = stale_paths(text, doc)
    assert paths == ["example.md: path tuner/decision.py does not exist",
                     "example.md: link gone.md does not exist"], paths
    assert stale_paths("`tuner/selection/decision.py`", doc) == []
    assert named_commands(text) == {("frobnicate",), ("run",)}
    commands = unknown_commands(text, doc)
    assert commands == ["example.md: autotune frobnicate: no such command"], commands
    assert named_commands("`autotune --results DIR run` and `autotune-recommendation`") == set()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    missing = [m for m in ("mkdocs", "material", "mkdocs_click") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
