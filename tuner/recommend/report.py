"""A study report: one self-contained HTML file (plotly.js inlined, works offline) and PNG images.

The page has the Pareto front of prefill against decode, the optimization history,
parameter importances, throughput by weight type and by thread count, the recommended
config against the engine defaults, and the machine profile. The main plots are also
written as PNG files next to the page (kaleido, which drives a local Chrome/Chromium);
when that fails the page still gets written and says why the images are missing.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import document as recommend, report_plots as plots
from ..util.files import atomic_write_text
from ..util.paths import writable_dir
from ..recommend.query import StudyView, model_stem
from ..measure.records import Stat
from .summary import quant_table
from ..util.units import format_bytes

SECTIONS = (("pareto", "Pareto front: prefill against decode", plots.pareto),
            ("history", "Optimization history", plots.history),
            ("importances", "Parameter importances", plots.importances),
            ("quant", "Throughput by weight type", plots.by_quant),
            ("threads", "Throughput by thread count", plots.by_threads),
            ("baseline", "Recommended config against the defaults", plots.against_baseline),
            ("capacity", "Capacity: users against latency and tokens/s", plots.capacity))
IMAGES = ("pareto", "history", "baseline", "threads")  # the main plots, also written as PNG
IMAGE_SIZE = {"width": 1100, "height": 550}
STYLE = """body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1150px;color:#222}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .6rem;text-align:left}
th{background:#f5f5f5}.note{color:#8a5a00;background:#fff8e6;padding:.5rem .8rem;border-left:3px solid #e0a800}
.meta{color:#555}"""


@dataclass
class ReportResult:
    """What ``write_report`` wrote."""

    html: Path
    images: list[Path] = field(default_factory=list)
    images_missing: str = ""  # why there are no PNG images, if there are none


def default_path(view: StudyView) -> Path:
    """Next to the study's recommendation file: ``results/<profile>/<model>[.<workload>].html``."""
    return recommend.default_path(view.profile.name, model_stem(view.attrs), view.attrs["workload"]["name"],
                                  view.attrs["model"].get("sha256", "")).with_suffix(".html")


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...] = ()) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _recommendation(doc: dict[str, Any]) -> str:
    base = doc.get("baseline", {})
    rows = [(k, v, base.get("settings", {}).get(k, "-")) for k, v in doc["settings"].items()]
    for name, key in (("prefill tokens/s", "prefill_tps"), ("decode tokens/s", "decode_tps")):
        rows.append((name, str(Stat.from_dict(doc["figures"][key])),
                     str(Stat.from_dict(base["figures"][key])) if base else "-"))
    rows.append(("peak memory", format_bytes(doc["figures"]["peak_rss_bytes"]),
                 format_bytes(base["figures"]["peak_rss_bytes"]) if base else "-"))
    speed = doc.get("speedup")
    lines = [f"Speedup over the defaults: prefill {speed['prefill']:.2f}x, decode {speed['decode']:.2f}x."
             if speed else "The engine defaults were not measured in this study."]
    lines += [doc[key]["text"] for key in ("backends", "kv_cache", "roofline") if "text" in doc.get(key, {})]
    return _table(rows, ("setting", "recommended", "baseline (defaults)")) + \
        "".join(f"<p>{html.escape(line)}</p>" for line in lines)


def _quants(view: StudyView) -> str:
    rows = [(q["quant"], q["file_type"], format_bytes(q["size_bytes"]), q["trials"],
             f"{q['best_prefill_tps']:.1f}" if q["best_prefill_tps"] else "-",
             f"{q['best_decode_tps']:.1f}" if q["best_decode_tps"] else "-",
             f"{q['perplexity']:.2f}" if q["perplexity"] is not None else "-",
             f"{q['quality_loss']:+.1%}" if q["quality_loss"] is not None else "-") for q in quant_table(view.study)]
    return _table(rows, ("quant", "file type", "file size", "trials", "best prefill tok/s", "best decode tok/s",
                         "perplexity", "quality loss")) if rows else ""


def _profile(view: StudyView) -> str:
    facts = view.profile.public()
    facts.pop("extra", None)
    facts.update(ram_bytes=format_bytes(facts["ram_bytes"]), cpus=",".join(map(str, facts["cpus"])),
                 cpu_flags=" ".join(facts["cpu_flags"]))
    return _table([(k, v if v is not None else "-") for k, v in facts.items()], ("fact", "value"))


def _write_images(figures: dict[str, Any], path: Path) -> tuple[list[Path], str]:
    """Write the main plots as PNG next to ``path``; (files, why none) — kaleido needs a Chrome/Chromium."""
    chosen = {name: fig for name, fig in figures.items() if name in IMAGES and not isinstance(fig, str)}
    paths = [path.with_name(f"{path.stem}.{name}.png") for name in chosen]
    try:
        import plotly.io as pio

        pio.write_images(list(chosen.values()), paths, **IMAGE_SIZE)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the HTML report intact
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        return [], f"PNG export failed ({reason}); install Chromium (e.g. apt-get install chromium) for images"
    return paths, ""


def render_html(view: StudyView, figures: dict[str, Any], result: ReportResult) -> str:
    """The report page; the first figure carries plotly.js inline, the others reuse it."""
    doc = view.recommendation()
    title = f"autotune report · {view.profile.name} · {model_stem(view.attrs)} · workload {view.attrs['workload']['name']}"
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='meta'>study {html.escape(view.name)} · objective {view.objective} · "
             f"{len(view.study.trials)} trials · {len(view.candidates)} distinct measured configs · "
             f"written {html.escape(doc['created_at'])}</p>"]
    if result.images:
        parts.append("<p class='meta'>PNG images: " + ", ".join(html.escape(p.name) for p in result.images) + "</p>")
    elif result.images_missing:
        parts.append(f"<p class='note'>PNG images are missing: {html.escape(result.images_missing)}</p>")
    parts.append(f"<h2 id='recommendation'>Recommendation</h2>{_recommendation(doc)}")
    inline_js = True
    for name, heading, _ in SECTIONS:
        fig = figures[name]
        if fig is None:  # a section of another workload's (capacity: the serve workload's)
            continue
        parts.append(f"<h2 id='{name}'>{html.escape(heading)}</h2>")
        if isinstance(fig, str):
            parts.append(f"<p class='note'>{html.escape(fig)}</p>")
            continue
        parts.append(fig.to_html(full_html=False, include_plotlyjs=inline_js, div_id=f"plot-{name}",
                                 config={"displaylogo": False, "responsive": True}))
        inline_js = False
        if name == "quant":
            parts.append(_quants(view))
    parts.append(f"<h2 id='profile'>Machine profile</h2>{_profile(view)}</body></html>")
    return "\n".join(parts)


def write_report(view: StudyView, path: Path | None = None, images: bool = True) -> ReportResult:
    """Write the HTML report of ``view`` (and PNG images of the main plots) and say what was written."""
    view.chosen()  # a study without a completed trial has nothing to report
    path = Path(path) if path else default_path(view)
    writable_dir(path.parent, "report folder", "give -o with a file in a folder you can write")
    figures = {name: make(view) for name, _, make in SECTIONS}
    result = ReportResult(html=path)
    if images:
        result.images, result.images_missing = _write_images(figures, path)
    atomic_write_text(path, render_html(view, figures, result))
    return result
