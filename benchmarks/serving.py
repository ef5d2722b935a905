"""Serving several users (issue 43): llama-server's defaults, the single-request pick and the serving pick,
re-measured side by side on the real ``llama-server`` at 1, 2, 4 and 8 users.

1. Three configs, each served by llama-server (``autotune build-server``'s binary):

   - ``defaults``: what ``llama-server -m MODEL`` runs (4 slots sharing one unified KV cache, ``-fa auto``,
     ``-b 2048 -ub 512``, a thread per CPU) on the bundled model, with the context the users need
     (:func:`tuner.backends.llama_cpp.backend.llama_server_defaults`);
   - ``single pick``: the recommendation of ``autotune run`` (the single-request workload) served the way a
     user who takes its exported flags to llama-server gets it: its settings with llama-server's default
     slots (4, unified KV cache) and a context that holds the most users' requests (its own n_ctx when
     larger);
   - ``serving pick``: the recommendation of ``autotune run --workload serve``, as it was measured.

   The picks are recommendation files (both are required: this script runs no tuning). Each config runs
   on its own weights file (the pick's quant variant; made again from the pick's model if it is missing).
2. Every config's server starts once and stays up for the whole run (start-up is not measured; with
   ``--restart`` each window starts its own server instead, for models too large for three at once).
3. Per round, per user count, every config in turn (the order reversed every other round:
   :func:`tuner.measure.rounds.round_order`): a ``--warmup`` window, untimed, then one timed ``--window``
   of closed-loop streaming users (:mod:`tuner.measure.serving_client`) with the serve workload's prompt
   and answer lengths (the serving pick's, else the shipped ``serve`` workload's).
4. Per user count: each config's goodput (output tokens/s of requests meeting the targets: first token
   within ``--max-ttft``, then at most ``--max-tpot`` per token), output tokens/s of all requests, p90
   time to first token and p90 time per output token, median over rounds with min-max; the ratios
   serving pick / single pick and serving pick / defaults (ratio of the medians, with the range of the
   per-round ratios). Then each config's capacity (the most users whose p90 TTFT and p90 TPOT met the
   targets, from the per-user-count medians; per round in brackets) and the goal line: at 8 users the
   serving pick's goodput at least 1.5x the single pick's.

The whole measurement holds the machine-wide trial lock, as ``autotune run`` does.

Usage: ``python benchmarks/serving.py --serving-pick SERVE.yaml --single-pick SINGLE.yaml [--users 1,2,4,8]
[--rounds 3] [--window 8] [--warmup 2] [--max-ttft 1.0] [--max-tpot 0.1] [--restart] [--json PATH] [--quick]``
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.backends.llama_cpp.backend import llama_server_defaults  # noqa: E402
from tuner.backends.llama_cpp.server_binary import find_llama_server  # noqa: E402
from tuner.backends.llama_cpp.server_process import LlamaServer, ServerFailed, serving_flags  # noqa: E402
from tuner.backends.llama_cpp.serving import WARMUP_S, prompt_text, window  # noqa: E402
from tuner.backends.settings import TrialSettings, config_key  # noqa: E402
from tuner.config.model import resolve_model  # noqa: E402
from tuner.config.workloads import DEFAULT_MAX_TPOT_S, DEFAULT_MAX_TTFT_S, Workload, get_workload  # noqa: E402
from tuner.errors import AutotuneError  # noqa: E402
from tuner.measure import serving_figures as F  # noqa: E402
from tuner.measure.rounds import round_order  # noqa: E402
from tuner.measure.lock import machine_lock  # noqa: E402
from tuner.measure.serving_client import Load, LoadSession  # noqa: E402
from tuner.recommend import document  # noqa: E402

DEFAULTS, SINGLE, SERVING = "defaults", "single pick", "serving pick"
NAMES = (DEFAULTS, SINGLE, SERVING)
GOAL_USERS, GOAL = 8, 1.5
# Per window: (figure key, column title, format); the first two are the ratios' figures.
COLUMNS = (("goodput_tps", "goodput t/s", 1), ("output_tps", "output t/s", 1), ("ttft_p90_s", "p90 TTFT s", 3),
           ("tpot_p90_s", "p90 TPOT s", 4))


@dataclasses.dataclass(frozen=True)
class Config:
    """One served config: its settings and the weights file it runs on."""

    settings: TrialSettings
    model_path: str

    @property
    def key(self) -> tuple[str, str]:
        return config_key(self.settings), self.model_path

    def flags(self) -> list[str]:
        """llama-server's flags for this config (the model as its file name)."""
        flags = serving_flags(self.settings, self.model_path)
        flags[flags.index("-m") + 1] = Path(self.model_path).name
        return flags


def load_pick(path: Path) -> tuple[dict[str, Any], Config]:
    """A recommendation file and the config it recommends (its weights made again if the file is missing)."""
    doc = document.load(path)
    if "llama_server_args" not in doc:
        raise AutotuneError(f"{path} recommends the {doc['settings'].get('backend')} backend, not llama.cpp: "
                            "llama-server cannot serve it")
    settings = TrialSettings(**doc["settings"])
    model = doc.get("model") or {}
    weights = (model.get("variant") or {}).get("path") or model.get("path")
    if not weights:
        raise AutotuneError(f"{path} names no model file (model.path)")
    if not Path(weights).is_file():  # a quant variant from another cache: make it from the pick's model
        C.log(f"  {path}: {weights} is missing; making the {settings.quant} weights again")
        weights, _ = C.model_path_for(resolve_model(model.get("path")), settings)
    return doc, Config(settings, str(weights))


def serve_workload(doc: dict[str, Any], a: Any) -> Workload:
    """The serving pick's workload (the shipped ``serve`` one if it has none) with the asked targets."""
    raw = doc.get("workload") or {}
    base = Workload(**{k: v for k, v in raw.items() if k in Workload.model_fields}) if raw.get("kind") == "serve" \
        else get_workload("serve")
    return base.model_copy(update={"max_ttft_s": a.max_ttft, "max_tpot_s": a.max_tpot, "duration_s": a.window})


def configs_of(serving: Config, single: Config, cpus: int, needed_ctx: int) -> dict[str, Config]:
    """The three configs: llama-server's defaults on the bundled model, the single-request pick with
    llama-server's default slots and a context for every user, and the serving pick as it is."""
    defaults = llama_server_defaults(cpus, needed_ctx)
    served = single.settings.model_copy(update={"n_parallel": defaults.n_parallel, "kv_unified": defaults.kv_unified,
                                                "n_ctx": max(single.settings.n_ctx, defaults.n_ctx)})
    return {DEFAULTS: Config(defaults, str(resolve_model(None).path)), SINGLE: Config(served, single.model_path),
            SERVING: serving}


class Servers:
    """A ready llama-server per config: started once and kept (``restart``: one per window)."""

    def __init__(self, binary: str, configs: dict[str, Config], folder: Path, prompt_tokens: int, restart: bool):
        self.binary, self.configs, self.folder, self.restart = binary, configs, folder, restart
        self.prompt_tokens = prompt_tokens
        self.running: dict[str, LlamaServer] = {}
        self.prompts: dict[str, str] = {}
        self.ready_s: dict[str, list[float]] = {name: [] for name in configs}

    def start(self, name: str) -> LlamaServer:
        server = LlamaServer(self.binary, serving_flags(self.configs[name].settings, self.configs[name].model_path),
                             self.folder / f"{name.replace(' ', '-')}.log")
        server.start()
        self.ready_s[name].append(server.ready_s)
        if name not in self.prompts:  # the server's own tokenizer cuts the prompt (once per config)
            try:
                self.prompts[name] = prompt_text(server.base_url, self.prompt_tokens)
            except (OSError, ValueError) as exc:
                server.stop()
                raise ServerFailed(f"llama-server's /tokenize failed: {exc}") from exc
        return server

    @contextlib.contextmanager
    def get(self, name: str) -> Iterator[LlamaServer]:
        """The ready server of ``name`` (started now if it is not up, or with ``restart``)."""
        server = self.running.get(name)
        if server is None or server.proc is None or server.proc.poll() is not None:
            server = self.running[name] = self.start(name)
        try:
            yield server
        finally:
            if self.restart:
                self.running.pop(name).stop()

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()
        self.running.clear()


def measure(servers: Servers, name: str, workload: Workload, users: int, warmup_s: float) -> dict[str, Any]:
    """One window of ``users`` on config ``name`` after an untimed warmup: its figures, or {"error": ...}."""
    try:
        with servers.get(name) as server:
            load = Load(users=users, prompt=servers.prompts[name], max_tokens=workload.generate_tokens,
                        duration_s=workload.duration_s, think_s=workload.think_s)
            with LoadSession(server.base_url, load) as session:  # the users' loop, as a trial measures it
                if warmup_s > 0:
                    session.warm_up(warmup_s)  # the burst of every user's first request, not judged
                return window(server, session, load, workload)
    except ServerFailed as exc:
        return {"users": users, "error": str(exc)[:500]}


def ok(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [w for w in windows if "error" not in w]


def values(windows: list[dict[str, Any]], key: str) -> list[float]:
    return [w[key] for w in ok(windows) if w.get(key) is not None]


def ratio_text(top: list[dict[str, Any]], bottom: list[dict[str, Any]], key: str) -> tuple[float | None, str]:
    """Ratio of the medians of ``key`` (top / bottom) and the range of the per-round ratios, as text."""
    a, b = values(top, key), values(bottom, key)
    if not a or not b:
        return None, "n/a (no window measured)"
    num, den = C.median(a), C.median(b)
    ratio = num / den if den > 0 else (float("inf") if num > 0 else None)
    rounds = [x[key] / y[key] for x, y in zip(top, bottom) if "error" not in x and "error" not in y
              and x.get(key) is not None and y.get(key) and y[key] > 0]
    zero = sum(1 for y in bottom if "error" not in y and y.get(key) == 0)
    spread = f"per round {min(rounds):.2f}-{max(rounds):.2f}, n={len(rounds)}" if rounds else "no round with both > 0"
    if rounds and zero:
        spread += f"; {zero} round(s) with 0 below"
    shown = "n/a" if ratio is None else f"from 0 ({num:.1f} against 0)" if ratio == float("inf") else f"{ratio:.2f}x"
    return ratio, f"{shown} ({spread})"


def capacities(windows: dict[int, list[dict[str, Any]]], rounds: int, w: Workload) -> tuple[int, list[int]]:
    """The capacity from the per-user-count medians, and each round's own."""
    medians = [F.summary(ok(ws)) for ws in windows.values() if ok(ws)]
    per_round = []
    for r in range(rounds):
        sweep = [ws[r] for ws in windows.values() if r < len(ws) and "error" not in ws[r]]
        per_round.append(F.capacity(sweep, w.max_ttft_s, w.max_tpot_s))
    return F.capacity(medians, w.max_ttft_s, w.max_tpot_s), per_round


def cpu_model() -> str:
    """lscpu's "Model name" (else /proc/cpuinfo's "model name")."""
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def report(out: dict[str, dict[int, list[dict[str, Any]]]], names: list[str], user_counts: list[int], rounds: int,
           workload: Workload) -> float | None:
    """The tables, ratios and capacities; the goal ratio (goodput at 8 users, serving / single)."""
    goal_ratio = None
    for users in user_counts:
        print(f"\n-- {users} user(s) --")
        print(f"{'config':<13} " + " ".join(f"{title:<36}" for _, title, _ in COLUMNS) + " met/requests")
        for name in names:
            ws = out[name][users]
            cells = [C.spread(values(ws, key), "", digits) for key, _, digits in COLUMNS]
            met = sum(w["met_targets"] for w in ok(ws))
            asked = sum(w["requests"] for w in ok(ws))
            errors = [w["error"] for w in ws if "error" in w]
            print(f"{name:<13} " + " ".join(f"{c:<36}" for c in cells) + f" {met}/{asked}"
                  + (f"  ({len(errors)} window(s) failed: {errors[0][:200]})" if errors else ""))
        for other in (SINGLE, DEFAULTS):
            good, good_text = ratio_text(out[SERVING][users], out[other][users], "goodput_tps")
            _, tps_text = ratio_text(out[SERVING][users], out[other][users], "output_tps")
            print(f"ratio serving pick / {other} at {users} user(s): goodput {good_text}; output t/s {tps_text}")
            if other == SINGLE and users == GOAL_USERS:
                goal_ratio = good
    print(f"\ncapacity (most users with p90 TTFT <= {workload.max_ttft_s:g} s and p90 TPOT <= "
          f"{workload.max_tpot_s * 1000:g} ms, of {','.join(map(str, user_counts))}; per round in brackets):")
    caps = {}
    for name in names:
        caps[name] = capacities(out[name], rounds, workload)
        print(f"  {name:<13} {caps[name][0]} user(s) [{', '.join(map(str, caps[name][1]))}]")
    for other in (SINGLE, DEFAULTS):
        top, bottom = caps[SERVING], caps[other]
        ratio = f"{top[0] / bottom[0]:.2f}x" if bottom[0] else "n/a (0 users)"
        rounds_ratio = [x / y for x, y in zip(top[1], bottom[1]) if y]
        spread = f"per round {min(rounds_ratio):.2f}-{max(rounds_ratio):.2f}" if rounds_ratio else "no round > 0"
        print(f"ratio serving pick / {other}, capacity: {ratio} ({spread})")
    return goal_ratio


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--serving-pick", type=Path, required=True,
                   help="recommendation file of `autotune run --workload serve` (required)")
    p.add_argument("--single-pick", type=Path, required=True,
                   help="recommendation file of `autotune run` (the single-request workload; required)")
    p.add_argument("--users", help="comma-separated user counts (default 1,2,4,8; --quick: 1,2)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3; --quick: 1)")
    p.add_argument("--window", type=float, help="seconds of each timed window (default 8; --quick: 2)")
    p.add_argument("--warmup", type=float, help=f"seconds of the untimed window before each (default {WARMUP_S:g}; "
                   "--quick: 1)")
    p.add_argument("--max-ttft", type=float, default=DEFAULT_MAX_TTFT_S, help="target: seconds to the first token "
                   "(default %(default)s)")
    p.add_argument("--max-tpot", type=float, default=DEFAULT_MAX_TPOT_S, help="target: seconds per output token "
                   "(default %(default)s)")
    p.add_argument("--restart", action="store_true", help="start each window's server anew instead of keeping one "
                   "per config up (for a model too large to hold three times)")
    p.add_argument("--json", type=Path, help="also write every window's figures to this file")
    a = p.parse_args(argv)
    user_counts = sorted({int(u) for u in (a.users or ("1,2" if a.quick else "1,2,4,8")).split(",")})
    rounds = a.rounds or (1 if a.quick else 3)
    a.window = a.window or (2.0 if a.quick else 8.0)
    warmup_s = a.warmup if a.warmup is not None else (1.0 if a.quick else WARMUP_S)
    try:
        binary = find_llama_server(C.log, build=False)
        serving_doc, serving = load_pick(a.serving_pick)
        _, single = load_pick(a.single_pick)
    except AutotuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workload = serve_workload(serving_doc, a)
    machine = C.Machine.detect()
    needed_ctx = workload.model_copy(update={"users": max(user_counts)}).needed_ctx()
    configs = configs_of(serving, single, machine.profile.n_cpus, needed_ctx)
    C.header("serving several users: llama-server's defaults, the single-request pick and the serving pick", machine,
             cpu_model=cpu_model(), llama_server=f"{binary.version} ({binary.path})",
             load=f"{workload.prompt_tokens}-token prompts, {workload.generate_tokens} tokens back, think "
                  f"{workload.think_s:g} s, closed loop; users {','.join(map(str, user_counts))}",
             targets=f"p90 TTFT <= {workload.max_ttft_s:g} s, TPOT <= {workload.max_tpot_s * 1000:g} ms "
                     "(goodput counts the requests meeting both)",
             re_measurement=f"{rounds} interleaved rounds x {len(user_counts)} user counts x 3 configs; per window "
                            f"{warmup_s:g} s warmup, then {a.window:g} s timed",
             servers="started anew for every window" if a.restart else "one per config, kept up for the whole run "
                     "(start-up not measured)")
    for name, config in configs.items():
        print(f"{name:<13} llama-server {' '.join(config.flags())}")
    print(f"(the single pick is served with llama-server's default slots, -np {configs[SINGLE].settings.n_parallel}"
          f"{' --kv-unified' if configs[SINGLE].settings.kv_unified else ''}, and -c {configs[SINGLE].settings.n_ctx} "
          f"for {max(user_counts)} users' requests: what its exported flags give a llama-server user)")
    # Configs that are one config (a pick that is llama-server's defaults) share one measurement per round.
    first = {}
    for name, config in configs.items():
        first.setdefault(config.key, name)
    distinct = [n for n in NAMES if first[configs[n].key] == n]
    for name in NAMES:
        if name not in distinct:
            print(f"{name} is the same config as {first[configs[name].key]}: measured once, shown for both")
    sys.stdout.flush()
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {n: {u: [] for u in user_counts} for n in distinct}
    with tempfile.TemporaryDirectory(prefix="autotune-serving-") as tmp, \
            machine_lock(on_wait=lambda: C.log("  waiting: another trial holds the machine lock")):
        servers = Servers(binary.path, {n: configs[n] for n in distinct}, Path(tmp), workload.prompt_tokens, a.restart)
        try:
            for r in range(rounds):
                for users in user_counts:
                    for name in round_order(distinct, r):
                        figures = measure(servers, name, workload, users, warmup_s)
                        raw[name][users].append(figures)
                        C.log(f"  round {r + 1}/{rounds} {users} user(s) {name}: " + (
                            f"goodput {figures['goodput_tps']:.1f} t/s, output {figures['output_tps']:.1f} t/s, "
                            f"p90 TTFT {figures['ttft_p90_s']:.3f} s, {figures['met_targets']}/{figures['requests']} "
                            "met" if "error" not in figures else f"failed: {figures['error'][:300]}"))
        finally:
            servers.stop()
    out = {name: raw[first[configs[name].key]] for name in NAMES}
    goal_ratio = report(out, list(NAMES), user_counts, rounds, workload)
    if GOAL_USERS in user_counts and goal_ratio is not None:
        verdict = "met" if goal_ratio >= GOAL else "not met"
        shown = "from 0 (the single pick met the targets for no request)" if goal_ratio == float("inf") \
            else f"{goal_ratio:.2f}x"
        print(f"goal: goodput at {GOAL_USERS} users serving/single = {shown} (goal >= {GOAL:g}x): {verdict}")
    else:
        why = "no goodput measured" if GOAL_USERS in user_counts else f"{GOAL_USERS} users not measured"
        print(f"goal: goodput at {GOAL_USERS} users serving/single = n/a (goal >= {GOAL:g}x): not judged ({why})")
    if a.json:
        a.json.write_text(json.dumps({
            "cpu_model": cpu_model(), "llama_server": binary.version, "workload": workload.public(),
            "configs": {n: {"settings": c.settings.model_dump(), "model_path": c.model_path, "flags": c.flags()}
                        for n, c in configs.items()},
            "server_ready_s": servers.ready_s, "windows": out}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
