"""Machine profiles side by side: hardware facts, and the best config of each for the same target.

A target is a model file (by content) and a workload. Every profile's most recent study
of a target gives its best config (by the study's objective); figures are compared as
ratios to the first profile named that tuned the target (the reference).
"""

from __future__ import annotations

from typing import Any

from ..errors import AutotuneError
from ..recommend.query import latest_by_target, load_view, model_stem
from ..measure.records import Stat
from ..backends.settings import TrialSettings
from ..results.storage import Storage
from ..results.studies import find_studies
from ..util.units import format_bytes

HARDWARE_KEYS = ("name", "id", "cpu_model", "physical_cores", "logical_cores", "cpus", "ram_gib", "gpu", "arch",
                 "os", "memory_bandwidth_gbs", "memory_bandwidth_all_gbs", "cpu_flags", "llama_cpp_python")
Section = tuple[str, list[str], list[list[str]], str]  # title, headers, rows, a note printed below


def _result(storage: Storage, profile: str, summary: Any) -> dict[str, Any]:
    view = load_view(storage, summary)
    out: dict[str, Any] = {"profile": profile, "study": view.name, "objective": view.objective}
    if not view.candidates:
        return {**out, "settings": None}
    chosen = view.chosen()
    base = view.baseline(chosen.backend)
    return {**out, "settings": chosen.settings, "prefill_tps": chosen.prefill.public(),
            "decode_tps": chosen.decode.public(), "peak_rss_bytes": chosen.peak_rss, "trials": list(chosen.trials),
            "speedup_vs_defaults": {"prefill": round(chosen.prefill.median / base.prefill.median, 3),
                                    "decode": round(chosen.decode.median / base.decode.median, 3)} if base else None}


def _target(storage: Storage, names: list[str], per_profile: dict[str, dict[Any, Any]], key: Any) -> dict[str, Any]:
    studies = {n: per_profile[n][key] for n in names if key in per_profile[n]}
    attrs = next(iter(studies.values())).user_attrs
    results = [_result(storage, n, studies[n]) if n in studies else {"profile": n, "study": None, "settings": None}
               for n in names]
    measured = [r for r in results if r["settings"]]
    ref = measured[0] if measured else None
    for r in measured:
        r["vs_reference"] = {fig: round(r[f"{fig}_tps"]["median"] / ref[f"{fig}_tps"]["median"], 3)  # type: ignore[index]
                             for fig in ("prefill", "decode")}
    keys = [k for k in TrialSettings.model_fields if any(k in r["settings"] for r in measured)]
    differ = {k: {r["profile"]: r["settings"].get(k) for r in measured} for k in keys
              if len({repr(r["settings"].get(k)) for r in measured}) > 1}
    model = attrs.get("model", {})
    return {"model": {"name": model_stem(attrs),
                      "sha256": model.get("sha256"), "file_type": model.get("file_type")},
            "workload": attrs.get("workload", {}).get("name"), "reference": ref["profile"] if ref else None,
            "results": results, "setting_differences": differ}


def compare(storage: Storage, names: list[str], model: str | None = None, workload: str | None = None) -> dict[str, Any]:
    """Compare the stored profiles ``names`` (JSON-ready; fields documented in the README).

    Without ``model``/``workload`` the targets are those tuned on at least two of the
    profiles; with them, every matching target.
    """
    if len(names) < 2:
        raise AutotuneError("compare needs at least two profile names, e.g. autotune compare P1 P2")
    if len(set(names)) != len(names):
        raise AutotuneError(f"a profile is named twice in {' '.join(names)}: name each once")
    profiles = [storage.profile(n) for n in names]  # an unknown name lists the known ones
    per_profile = {n: latest_by_target(find_studies(storage, n, model, workload)) for n in names}
    keys = sorted({k for found in per_profile.values() for k in found}, key=lambda k: (k[1], k[0]))
    if not (model or workload):
        keys = [k for k in keys if sum(k in found for found in per_profile.values()) >= 2]
    targets = [_target(storage, names, per_profile, k) for k in keys]
    notes = [] if targets else [
        "no model and workload was tuned on two of these profiles" if not (model or workload)
        else "no study of these profiles matches the given --model and --workload"]
    return {"profiles": [{k: p.public()[k] for k in HARDWARE_KEYS} for p in profiles], "targets": targets,
            "notes": notes}


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def sections(data: dict[str, Any]) -> list[Section]:
    """The comparison as titled tables of text: hardware first, then one per target."""
    names = [p["name"] for p in data["profiles"]]
    hw_rows = [["CPU", *(p["cpu_model"] for p in data["profiles"])],
               ["CPUs used", *(str(len(p["cpus"])) for p in data["profiles"])],
               ["cores", *(f"{p['physical_cores']} physical, {p['logical_cores']} logical" for p in data["profiles"])],
               ["RAM", *(f"{p['ram_gib']} GiB" for p in data["profiles"])],
               ["GPU", *(p["gpu"] for p in data["profiles"])],
               ["bandwidth 1 thread", *(f"{p['memory_bandwidth_gbs']} GB/s" if p["memory_bandwidth_gbs"] else "-"
                                        for p in data["profiles"])],
               ["bandwidth all CPUs", *(f"{p['memory_bandwidth_all_gbs']} GB/s" if p["memory_bandwidth_all_gbs"]
                                        else "-" for p in data["profiles"])],
               ["arch", *(p["arch"] for p in data["profiles"])],
               ["llama-cpp-python", *(p["llama_cpp_python"] for p in data["profiles"])]]
    out: list[Section] = [("Hardware", ["", *names], hw_rows, "")]
    for t in data["targets"]:
        res = t["results"]
        keys = [k for k in TrialSettings.model_fields if any(r["settings"] and k in r["settings"] for r in res)]
        rows = [[f"{k} *" if k in t["setting_differences"] else k,
                 *(str(r["settings"].get(k, "-")) if r["settings"] else "-" for r in res)] for k in keys]
        rows += [[label, *(fmt(r) if r["settings"] else ("not tuned" if r["study"] is None else "no result")
                           for r in res)] for label, fmt in (
            ("prefill tok/s", lambda r: str(Stat.from_dict(r["prefill_tps"]))),
            ("decode tok/s", lambda r: str(Stat.from_dict(r["decode_tps"]))),
            ("peak memory", lambda r: format_bytes(r["peak_rss_bytes"])),
            ("vs defaults", lambda r: " / ".join(_ratio(v) for v in r["speedup_vs_defaults"].values())
             if r["speedup_vs_defaults"] else "-"),
            (f"prefill vs {t['reference']}", lambda r: _ratio(r["vs_reference"]["prefill"])),
            (f"decode vs {t['reference']}", lambda r: _ratio(r["vs_reference"]["decode"])))]
        out.append((f"{t['model']['name']} · workload {t['workload']}", ["", *names], rows,
                    "The best config of each profile by its study's objective. * the best configs differ in this "
                    "setting; vs defaults: prefill / decode speedup over the engine's defaults on that machine."))
    return out


def to_markdown(data: dict[str, Any]) -> str:
    """The comparison as Markdown tables."""
    parts = []
    for title, headers, rows, note in sections(data):
        lines = [f"### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        parts.append("\n".join(lines) + (f"\n\n_{note}_" if note else ""))
    parts += [f"_{note}_" for note in data["notes"]]
    return "\n\n".join(parts) + "\n"
