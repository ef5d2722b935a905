"""``autotune report``: the HTML page opened in a real headless Chromium, PNG images, and the
page's notes where a plot cannot be drawn; over stored studies of invented machines."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.invented import invented_db  # noqa: F401  (a fixture)

from tuner.cli import cli
from tuner.recommend.query import study_view
from tuner.recommend.report import IMAGES, write_report
from tuner.results.storage import open_storage

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                    "(apt-get install chromium; .ci/run installs it)")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium offline with console messages logged to stderr."""
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120, check=True)


def png_byte_values(path: Path) -> int:
    """How many distinct byte values the PNG's scanlines hold (a blank image filters to a handful)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


@pytest.fixture(scope="module")
def desktop_report(invented_db: str, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The report of the desktop's tiny study, written once through the CLI, with its images where
    Chromium is installed (kaleido draws PNGs with it) and with ``--no-images`` where it is not."""
    out = tmp_path_factory.mktemp("report") / "desktop.html"
    images = [] if CHROMIUM.exists() else ["--no-images"]
    result = CliRunner().invoke(cli, ["report", "--storage", invented_db, "--profile", "desktop-16c",
                                      "--workload", "tiny", "-o", str(out), *images])
    assert result.exit_code == 0, result.output
    assert f"Report written to {out}" in result.output
    return out


def test_page_is_self_contained(desktop_report: Path) -> None:
    page = desktop_report.read_text()
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js is inline: the page works offline
    for heading in ("Recommendation", "Pareto front: prefill against decode", "Optimization history",
                    "Parameter importances", "Throughput by weight type", "Throughput by thread count",
                    "Recommended config against the defaults", "Machine profile"):
        assert f">{heading}</h2>" in page
    assert "AMD Ryzen 9 7950X 16-Core Processor" in page
    assert "Speedup over the defaults: prefill 2.42x, decode 1.40x." in page
    assert "class='note'" not in page  # every plot could be drawn


@needs_chromium
def test_images_are_real_pngs(desktop_report: Path) -> None:
    for name in IMAGES:
        image = desktop_report.with_name(f"desktop.{name}.png")
        assert png_byte_values(image) > 64, f"{image} looks blank"
        assert image.name in desktop_report.read_text()


@needs_chromium
def test_page_renders_in_chromium_without_console_errors(desktop_report: Path, tmp_path: Path) -> None:
    run = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", desktop_report.as_uri())
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert not console, "\n".join(console)
    for name in ("pareto", "history", "importances", "quant", "threads", "baseline"):
        start = run.stdout.find(f'id="plot-{name}"')
        section = run.stdout[start:run.stdout.find("<h2", start)]
        assert start > 0 and 'class="main-svg"' in section, f"plot {name} was not drawn"


@needs_chromium
def test_screenshot_is_not_blank(desktop_report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    chromium(tmp_path, "--hide-scrollbars", "--window-size=1200,2000", "--virtual-time-budget=5000",
             f"--screenshot={shot}", desktop_report.as_uri())
    assert png_byte_values(shot) > 64


def test_notes_where_a_plot_cannot_be_drawn(invented_db: str, tmp_path: Path) -> None:  # noqa: F811
    # arm-8c: a single-objective (decode) study with two search trials.
    result = write_report(study_view(open_storage(invented_db), "arm-8c"), tmp_path / "arm.html", images=False)
    page = result.html.read_text()
    assert result.images == [] and result.images_missing == ""
    assert "this study maximizes one figure (decode), so it has no Pareto front" in page
    assert "parameter importances need at least 3 completed search trials with sampled settings; " \
           "this study has 2" in page
    assert 'id="plot-history"' in page and 'id="plot-baseline"' in page


def test_failed_png_export_still_writes_the_page(invented_db: str, tmp_path: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    result = write_report(study_view(open_storage(invented_db), "laptop-4c"), tmp_path / "laptop.html")
    assert result.images == [] and "PNG export failed" in result.images_missing
    assert "PNG images are missing: PNG export failed" in result.html.read_text()
    assert not list(tmp_path.glob("*.png"))
