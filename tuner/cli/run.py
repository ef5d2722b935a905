"""``autotune run``."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn

from ..backends.settings import TrialSettings
from ..config import objectives
from ..config.quality import DEFAULT_MAX_KL, parse_max_kl, parse_max_loss
from ..search.progress import Progress
from ..selection.targets import Targets
from ..util.units import format_bytes, format_duration, parse_duration, parse_size
from .group import cli
from .options import parse_cpus, storage_option
from .render import recommendation_table, short_settings
from ..search.tune import TuneOptions, tune


class ConsoleProgress(Progress):
    """Live progress on the terminal: a budget bar and one line per finished trial."""

    def __init__(self, console: Console, budget_s: float):
        self.console = console
        self.budget_s = budget_s
        self.bar = Bar(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                       TextColumn(f"/ {format_duration(budget_s)}"), console=console, transient=True)
        self.task = self.bar.add_task("starting", total=budget_s)
        self.started = False

    def __enter__(self) -> "ConsoleProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            self.bar.stop()

    def _start(self) -> None:
        # Started at the first event, so an input error before any trial prints only its one line.
        if not self.started:
            self.started = True
            self.bar.start()

    def status(self, text: str) -> None:
        self._start()
        self.console.print(f"  [dim]{text}[/dim]")

    def trial_started(self, number: int, role: str, settings: dict[str, Any], elapsed: float) -> None:
        self._start()
        self.bar.update(self.task, description=f"trial {number} ({role}): {short_settings(settings)}")

    def trial_finished(self, number: int, record: Any, best: dict[str, float], elapsed: float) -> None:
        self._start()
        self.bar.update(self.task, completed=min(elapsed, self.budget_s))
        if record.outcome.ok and record.goodput is not None:  # the serve workload: several users
            serving = record.extra.get("serving") or {}
            figures = f"goodput {record.goodput} t/s  output {serving.get('output_tps', 0):.1f} t/s  " \
                      f"p90 TTFT {serving.get('ttft_p90_s') or 0:.2f} s  p90 {(serving.get('tpot_p90_s') or 0) * 1000:.0f} " \
                      f"ms/token  slots {TrialSettings(**record.settings).n_parallel}  " \
                      f"mem {format_bytes(record.outcome.memory.peak_rss)}"
        elif record.outcome.ok:
            deep = f" (at depth {record.extra.get('depth')}: {record.decode_depth})" if record.decode_depth else ""
            figures = f"prefill {record.prefill} t/s  decode {record.decode}{deep} t/s  " \
                      f"mem {format_bytes(record.outcome.memory.peak_rss)}"
        else:
            figures = f"[yellow]{record.outcome.status}[/yellow]: {record.outcome.reason or record.violation}"
        if record.violation and record.outcome.ok:
            figures += f"  [yellow]infeasible: {record.violation}[/yellow]"
        left = max(self.budget_s - elapsed, 0.0)
        self.console.print(f"[bold]#{number:<3}[/bold] {format_duration(elapsed):>6} ({format_duration(left)} left)  "
                           f"{record.role:<9} "
                           f"{short_settings(record.settings)}\n      {figures}  "
                           f"[dim](best config: prefill {best['prefill']:.1f}, decode {best['decode']:.1f})[/dim]")


@cli.command()
@click.option("--budget", default="30m", show_default=True, help="Time to spend, e.g. 90s, 30m, 1h.")
@click.option("--model", type=click.Path(), help="GGUF model file, or a Hugging Face model folder (config.json and "
              "*.safetensors: tuned with transformers) (default: bundled SmolLM2-135M).")
@click.option("--gguf", type=click.Path(dir_okay=False), help="With a model folder as --model: a GGUF file of the same "
              "model, which llama.cpp runs, so both backends compete.")
@click.option("--model-dir", type=click.Path(exists=True),
              help="Folder of ready-made quant files of the same model, used instead of quantizing.")
@click.option("--space", type=click.Path(dir_okay=False), help="Search-space YAML (default: search_spaces/cpu.yaml).")
@storage_option
@click.option("--memory-ceiling", metavar="SIZE", help="Kill trials above this resident memory, e.g. 4GiB "
              "(default: 75% of available memory).")
@click.option("--profile", metavar="NAME", help="Machine profile name (default: derived from the hardware).")
@click.option("--objective", type=click.Choice(objectives.names()), default=None,
              help=f"(default: {objectives.DEFAULT}; goodput for --workload serve) "
              + "; ".join(f"{o.name}: {o.description}" for o in objectives.OBJECTIVES.values()) + ".")
@click.option("--workload", default="default", show_default=True, help="Workload name: default, chat, long-prompt, "
              "serve (several users on llama-server), ...")
@click.option("--users", type=click.IntRange(1, 256), help="Users of the serve workload (default: its own, 8).")
@click.option("--max-ttft", metavar="DURATION", help="Serve workload target: time to first token, e.g. 1s or 500ms "
              "(default 1s).")
@click.option("--max-tpot", metavar="DURATION", help="Serve workload target: time per output token after the first, "
              "e.g. 100ms (default 100ms: 10 tokens/s, faster than people read).")
@click.option("--depth", metavar="N|P%", help="Context depth of the second decode figure: N tokens or a share "
              "of n_ctx such as 75% (default: where the workload ends). Request time uses it for long-prompt and chat.")
@click.option("--repetitions", default=3, show_default=True, type=click.IntRange(1, 50),
              help="Timed repetitions per trial.")
@click.option("--trial-timeout", default="300s", show_default=True, help="Kill a trial after this long.")
@click.option("--max-quality-loss", default="5%", show_default=True,
              help="Largest perplexity increase allowed for a quant type, e.g. 5% (or 'none').")
@click.option("--max-kl", default=str(DEFAULT_MAX_KL), show_default=True,
              help="Largest mean KL divergence (nats per token) of a weight type's next-token distributions "
              "from the source's on the evaluation text (or 'none').")
@click.option("--min-decode", type=float, metavar="TPS", help="Target: decode at least this many tokens/s "
              "(at depth for long-prompt and chat). With a target the pick is the best quality meeting all targets.")
@click.option("--min-prefill", type=float, metavar="TPS", help="Target: prefill at least this many tokens/s.")
@click.option("--max-memory", metavar="SIZE", help="Target: peak resident memory at most this, e.g. 1GiB.")
@click.option("--explain", is_flag=True, help="When no config meets the targets, list for the closest configs "
              "which measured setting change would help.")
@click.option("--cpus", metavar="LIST", help="Restrict autotune and its trials to these CPUs, e.g. 0 or 0-3.")
@click.option("--seed", type=int, help="Sampler seed.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Where to write the recommendation YAML.")
@click.option("--ephemeral", is_flag=True, help="Allow a database that keeps nothing (sqlite:/// in memory): the "
              "trials are lost when the run ends.")
def run(budget: str, model: str | None, gguf: str | None, model_dir: str | None, space: str | None, storage: str | None, memory_ceiling: str | None,
        profile: str | None, objective: str | None, workload: str, users: int | None, max_ttft: str | None,
        max_tpot: str | None, depth: str | None, repetitions: int, trial_timeout: str,
        max_quality_loss: str, max_kl: str, min_decode: float | None, min_prefill: float | None,
        max_memory: str | None, explain: bool, cpus: str | None, seed: int | None, output: str | None,
        ephemeral: bool) -> None:
    """Search for the fastest settings within a time budget and write a recommendation.

    Every trial loads the model in its own process, warms up, and measures prefill and
    decode tokens/s over several repetitions. Running the same command again resumes the
    same study.
    """
    options = TuneOptions(
        model=model, gguf=gguf, budget_s=parse_duration(budget), space=space, storage=storage,
        memory_ceiling=parse_size(memory_ceiling) if memory_ceiling else None, profile=profile,
        objective=objective, workload=workload, users=users, repetitions=repetitions,
        trial_timeout_s=parse_duration(trial_timeout), seed=seed, cpus=parse_cpus(cpus),
        max_quality_loss=None if max_quality_loss.lower() == "none" else parse_max_loss(max_quality_loss),
        output=output, model_dir=model_dir, depth=depth, max_kl=parse_max_kl(max_kl), explain=explain,
        ephemeral=ephemeral, max_ttft_s=parse_duration(max_ttft) if max_ttft else None,
        max_tpot_s=parse_duration(max_tpot) if max_tpot else None,
        targets=Targets(min_decode=min_decode, min_prefill=min_prefill,
                        max_memory=parse_size(max_memory) if max_memory else None))
    console = Console() if Console().is_terminal else Console(width=100)
    with ConsoleProgress(console, options.budget_s) as progress:
        result = tune(options, progress)
    console.print(f"study {result.study_name}: {result.trials_run} trial(s) in {format_duration(result.elapsed_s)}"
                  + (" (resumed)" if result.resumed else ""))
    if result.recommendation is None:
        console.print("No trial completed yet: give a larger --budget and run again"
                      + ("." if ephemeral else " (the study resumes)."))
        return
    console.print(recommendation_table(result.recommendation))
    console.print(f"Recommendation written to {result.recommendation_path}")
