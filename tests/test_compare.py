"""``autotune compare`` over stored studies of invented machines: whole tables, JSON, Markdown, errors."""

from __future__ import annotations

import json

from click.testing import CliRunner
from fixtures.invented import invented_db  # noqa: F401  (a fixture)

from tuner.cli import cli
from tuner.recommend.compare import compare
from tuner.results.storage import open_storage

TABLE = """\
Hardware
                     desktop-16c                          laptop-4c
───────────────────────────────────────────────────────────────────────────────────────────────────
 CPU                 AMD Ryzen 9 7950X 16-Core Processor  Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz
 CPUs used           32                                   8
 cores               16 physical, 32 logical              4 physical, 8 logical
 RAM                 64 GiB                               16 GiB
 GPU                 none                                 none
 bandwidth 1 thread  62.0 GB/s                            19.5 GB/s
 bandwidth all CPUs  88.0 GB/s                            31.0 GB/s
 arch                x86_64                               x86_64
 llama-cpp-python    0.3.36                               0.3.36
SmolLM2-135M-Instruct.Q4_1 · workload tiny
                         desktop-16c    laptop-4c
──────────────────────────────────────────────────────
 backend                 llama_cpp      llama_cpp
 quant *                 Q4_0           source
 n_threads               4              4
 n_threads_batch *       16             8
 n_batch                 512            512
 n_ubatch                512            512
 n_ctx                   512            512
 flash_attn              True           True
 type_k                  f16            f16
 type_v                  f16            f16
 use_mmap                True           True
 repack                  True           True
 n_gpu_layers            0              0
 prefill tok/s           20014.9 ±3%    1350.5 ±3%
 decode tok/s            128.7 ±3%      41.4 ±3%
 peak memory             173.0 MiB      190.1 MiB
 vs defaults             2.42x / 1.40x  1.10x / 1.00x
 prefill vs desktop-16c  1.00x          0.07x
 decode vs desktop-16c   1.00x          0.32x
The best config of each profile by its study's objective. * the best configs differ in this setting;
vs defaults: prefill / decode speedup over the engine's defaults on that machine.
"""


def _run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["compare", *args, "--storage", url])
    return result.exit_code, result.output


def _stripped(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def test_whole_table(invented_db: str) -> None:
    code, out = _run(invented_db, "desktop-16c", "laptop-4c")
    assert code == 0, out
    assert _stripped(out) == TABLE
    assert max(len(line) for line in out.splitlines()) <= 100


def test_json_is_stable_and_complete(invented_db: str) -> None:
    code, out = _run(invented_db, "desktop-16c", "laptop-4c", "--format", "json")
    assert code == 0, out
    data = json.loads(out)
    assert out == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert [p["name"] for p in data["profiles"]] == ["desktop-16c", "laptop-4c"]
    (target,) = data["targets"]
    assert target["workload"] == "tiny" and target["reference"] == "desktop-16c"
    assert target["model"]["name"] == "SmolLM2-135M-Instruct.Q4_1"
    assert target["setting_differences"] == {"quant": {"desktop-16c": "Q4_0", "laptop-4c": "source"},
                                             "n_threads_batch": {"desktop-16c": 16, "laptop-4c": 8}}
    desktop, laptop = target["results"]
    assert desktop["vs_reference"] == {"prefill": 1.0, "decode": 1.0}
    assert laptop["vs_reference"]["decode"] == round(laptop["decode_tps"]["median"] / desktop["decode_tps"]["median"], 3)
    assert laptop["speedup_vs_defaults"] == {"prefill": 1.1, "decode": 1.0}
    assert desktop["trials"] == [3, 11]  # the search trial and its re-measurement, pooled
    assert data == compare(open_storage(invented_db), ["desktop-16c", "laptop-4c"])


def test_markdown(invented_db: str) -> None:
    code, out = _run(invented_db, "desktop-16c", "laptop-4c", "--format", "markdown")
    assert code == 0, out
    assert out.startswith("### Hardware\n\n|  | desktop-16c | laptop-4c |\n|---|---|---|\n")
    assert "| quant * | Q4_0 | source |" in out
    assert "| decode vs desktop-16c | 1.00x | 0.32x |" in out


def test_targets_tuned_on_two_profiles(invented_db: str) -> None:
    data = json.loads(_run(invented_db, "laptop-4c", "desktop-16c", "arm-8c", "--format", "json")[1])
    assert [t["workload"] for t in data["targets"]] == ["chat", "tiny"]
    chat = data["targets"][0]
    assert chat["reference"] == "desktop-16c"
    assert [r["study"] is None for r in chat["results"]] == [True, False, False]
    code, out = _run(invented_db, "laptop-4c", "desktop-16c", "arm-8c", "--workload", "chat")
    assert code == 0 and "not tuned" in out and "workload tiny" not in out


def test_no_common_target_says_so(invented_db: str) -> None:
    code, out = _run(invented_db, "laptop-4c", "arm-8c")
    assert code == 0, out
    assert out.rstrip().endswith("no model and workload was tuned on two of these profiles")


def test_user_errors_are_one_line(invented_db: str) -> None:
    for args, words in ((["desktop-16c", "nope"], "unknown profile 'nope': known profiles are arm-8c, "
                                                   "desktop-16c, laptop-4c"),
                        (["desktop-16c"], "at least two profile names"),
                        (["arm-8c", "arm-8c"], "named twice")):
        code, out = _run(invented_db, *args)
        assert code == 1 and out.startswith("Error: ") and out.count("\n") == 1 and words in out, out
