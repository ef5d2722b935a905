"""Search-space files: validation errors name the file and key; resolution and sampling."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.errors import AutotuneError
from tuner.backends.settings import TrialSettings, infeasible_reason, normalize
from tuner.search.space import DEFAULT_SPACE, load_space
from tuner.config.workloads import get_workload


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("body, key, words", [
    ("params:\n  n_thread: {low: 1, high: 2}\n", "params.n_thread", "unknown key"),
    ("params:\n  n_batch: {choices: []}\n", "params.n_batch", "must not be empty"),
    ("params:\n  n_threads: {low: 4, high: 2}\n", "params.n_threads", "smaller than high"),
    ("params:\n  n_ubatch: {low: 0, high: 64, log: true}\n", "params.n_ubatch", "log scale"),
    ("params:\n  n_batch: {choices: [abc, 128]}\n", "params.n_batch", "invalid"),
    ("params:\n  flash_attn: {choices: [1, 0]}\n", "params.flash_attn", "invalid"),
    ("params:\n  type_k: {choices: [q7_0]}\n", "params.type_k", "invalid"),
    ("params:\n  n_batch: {choices: [[1, 2]]}\n", "params.n_batch", ""),
    ("params:\n  n_ctx: {low: 16, high: 100000000000}\n", "params.n_ctx", "invalid"),
    ("params:\n  n_batch: {choices: [128], colour: red}\n", "params.n_batch.colour", ""),
    ("params:\n  n_batch: {choices: [128]}\nextra: 1\n", "extra", ""),
    ("params:\n  n_batch: {choices: [128]}\n  n_batch: {choices: [256]}\n", "", "duplicate key"),
    ("params:\n  n_batch: {high: auto, low: 1}\n", "params.n_batch", "only for thread counts"),
    ("params: {}\n", "params", "nothing to search"),
    ("- just\n- a list\n", "", "must be a mapping"),
    ("params: [unclosed\n", "", "not valid YAML"),
])
def test_bad_space_names_file_and_key(tmp_path: Path, body: str, key: str, words: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(AutotuneError) as err:
        load_space(path)
    message = str(err.value)
    assert str(path) in message
    assert key in message
    assert words in message
    assert "\n" not in message


def test_missing_space_file(tmp_path: Path) -> None:
    with pytest.raises(AutotuneError, match="does not exist"):
        load_space(tmp_path / "nope.yaml")


def test_default_space_resolves_for_this_machine() -> None:
    space = load_space(DEFAULT_SPACE)
    resolved = space.resolve(cpus=2, needed_ctx=656)
    assert resolved.distributions["n_threads"].high == 2
    assert set(resolved.backends) == {"llama_cpp", "transformers"}
    assert resolved.hash == space.resolve(cpus=2, needed_ctx=656).hash
    assert resolved.hash != space.resolve(cpus=1, needed_ctx=656).hash


def test_n_ctx_too_small_for_workload_is_refused(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "params:\n  n_ctx: {choices: [256, 512]}\n"))
    with pytest.raises(AutotuneError, match=r"needs 3200 tokens.*largest n_ctx is 512"):
        space.resolve(cpus=2, needed_ctx=3200)
    assert space.resolve(cpus=2, needed_ctx=300).distributions["n_ctx"].choices == (512,)


def test_n_ctx_beyond_the_models_trained_context_is_left_out_with_a_note(tmp_path: Path) -> None:
    from tuner.config.model import resolve_model

    trained = resolve_model(None).context_length  # the bundled SmolLM2: 8192
    space = load_space(write(tmp_path, f"params:\n  n_ctx: {{choices: [1024, {2 * trained}]}}\n"))
    resolved = space.resolve(cpus=2, needed_ctx=300, trained_ctx=trained)
    assert resolved.distributions["n_ctx"].choices == (1024,)
    assert any(f"n_ctx {2 * trained} left out" in n and str(trained) in n for n in resolved.notes)
    assert not space.resolve(cpus=2, needed_ctx=300).notes
    # A model trained on 2048 tokens, the shipped space's 4096 choice dropped; a workload needing 2000 still fits.
    shipped = load_space(write(tmp_path, "params:\n  n_ctx: {choices: [1024, 4096]}\n"))
    fitted = shipped.resolve(cpus=2, needed_ctx=2000, trained_ctx=2048)
    assert fitted.distributions["n_ctx"].choices == (2048,) and fitted.notes
    ranged = load_space(write(tmp_path, f"params:\n  n_ctx: {{low: 512, high: {2 * trained}}}\n"))
    assert ranged.resolve(cpus=2, needed_ctx=300, trained_ctx=trained).notes
    with pytest.raises(AutotuneError, match="more than the model's trained context of 2048"):
        shipped.resolve(cpus=2, needed_ctx=3200, trained_ctx=2048)


def test_dimensions_that_cannot_matter_are_left_out(tmp_path: Path) -> None:
    """n_ctx beyond the workload's need and batch sizes beyond its prompt measure the same config."""
    space = load_space(write(tmp_path, "params:\n  n_ctx: {choices: [4096, 1024, 2048]}\n"
                                       "  n_batch: {choices: [128, 256, 512, 1024, 2048]}\n"
                                       "  n_ubatch: {low: 32, high: 1024}\n"))
    resolved = space.resolve(cpus=2, needed_ctx=656, prefill_tokens=300)
    assert resolved.distributions["n_ctx"].choices == (1024,)
    assert resolved.distributions["n_batch"].choices == (128, 256, 512)
    assert (resolved.distributions["n_ubatch"].low, resolved.distributions["n_ubatch"].high) == (32, 300)
    unknown = space.resolve(cpus=2, needed_ctx=656)  # no prompt length given: every batch size stays
    assert unknown.distributions["n_batch"].choices == (128, 256, 512, 1024, 2048)
    ranged = load_space(write(tmp_path, "params:\n  n_ctx: {low: 256, high: 8192}\n"))
    assert ranged.resolve(cpus=2, needed_ctx=700).distributions["n_ctx"].choices == (700,)


def test_the_default_workload_searches_no_batch_beyond_its_prompt() -> None:
    workload = get_workload("default")
    resolved = load_space(DEFAULT_SPACE).resolve(2, workload.needed_ctx(), 8192, workload.prefill_tokens())
    assert max(resolved.distributions["n_batch"].choices) == workload.prompt_tokens == 512
    assert len(resolved.distributions["n_ctx"].choices) == 1


def test_conditional_sampling_skips_other_backend_params() -> None:
    resolved = load_space(DEFAULT_SPACE).resolve(cpus=2, needed_ctx=656)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        settings = resolved.suggest(trial)
        seen.add(settings.backend)
        if settings.backend == "transformers":
            assert "quant" not in trial.params and "n_threads" not in trial.params
            assert "dtype" in trial.params
        else:
            assert "dtype" not in trial.params and "quant" in trial.params
        study.tell(trial, 1.0)
    assert seen == {"llama_cpp", "transformers"}


def test_normalize_records_llama_cpp_clamping() -> None:
    settings, notes = normalize(TrialSettings(n_ctx=256, n_batch=512, n_ubatch=512))
    assert (settings.n_batch, settings.n_ubatch) == (256, 256)
    assert notes == ["n_batch 512 clamped to n_ctx 256", "n_ubatch 512 clamped to n_batch 256"]


def test_quantized_v_cache_needs_flash_attention() -> None:
    assert "flash attention" in infeasible_reason(TrialSettings(type_v="q8_0", flash_attn=False), 100)
    assert infeasible_reason(TrialSettings(type_v="q8_0", flash_attn=True), 100) is None
    assert "smaller than" in infeasible_reason(TrialSettings(n_ctx=256), 700)


@pytest.mark.slow
def test_a_model_trained_on_2048_tokens_runs_on_a_space_up_to_4096_with_a_note(tmp_path: Path,
                                                                                 model_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    short = tmp_path / "short-context.gguf"
    shutil.copy(model_path, short)
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_set_metadata", "--force", str(short),
                    "llama.context_length", "2048"], check=True, capture_output=True)
    from tuner.config.model import resolve_model

    assert resolve_model(str(short)).context_length == 2048
    space = write(tmp_path, "params:\n  n_threads: {low: 1, high: auto}\n  n_ctx: {choices: [1024, 2048, 4096]}\n")
    from click.testing import CliRunner

    from tuner.cli import cli

    out = CliRunner().invoke(cli, ["run", "--model", str(short), "--space", str(space), "--budget", "15s",
                                   "--workload", "tiny", "--repetitions", "1", "--max-quality-loss", "none"])
    assert out.exit_code == 0, out.output[-2000:]
    assert "n_ctx 4096 left out: above the model's trained context of 2048" in out.output
