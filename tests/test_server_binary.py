"""llama.cpp's ``llama-server``, found or built once per llama-cpp-python version and cached
(tuner/backends/llama_cpp/server_binary.py, ``autotune build-server``).

The fast tests never run the real 10-minute build: a fake ``make`` (or a fake ``cmake`` on PATH building from
a small fake sdist) stands in for it. The slow one runs the real binary that ``.ci/run``'s build step cached.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.backends.llama_cpp import server_binary as sb
from tuner.cli import cli
from tuner.errors import AutotuneError

VERSION = sb.llama_cpp_python_version()
FAKE_SERVER = '#!/bin/sh\necho "load_backend: noise"\necho "version: {text}"\necho "built with a test"\n'
FAKE_CMAKE = """#!/bin/sh
export PATH=/usr/bin:/bin
if [ "$1" = "-S" ]; then  # configure: only llama.cpp and its git folder were extracted
  test -f "$2/CMakeLists.txt" && test -f "$2/../../.git/modules/vendor/llama.cpp/HEAD" || exit 3
  test -e "$2/../../llama_cpp" && exit 4
  echo "-- Configuring done"; exit 0
fi
for p in 1 5 17 30 64 100; do echo "[ $p%] Building CXX object x.o"; done
{fail}
mkdir -p "$2/bin"
printf '#!/bin/sh\\necho "version: 0.5.0-dev (build 1, commit 0c1e570)"\\n' > "$2/bin/llama-server"
chmod +x "$2/bin/llama-server"
"""


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _fake_server(path: Path, text: str = "0.5.0-dev (build 1, commit 0c1e570)") -> Path:
    return _script(path, FAKE_SERVER.format(text=text))


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache folder and a PATH with nothing on it (the folder returned, for fake programs)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (tmp_path / "bin").mkdir()
    for name in (sb.ENV_BINARY, sb.ENV_FROM_PATH, "CC", "CXX"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "bin"


def test_the_binary_is_cached_by_llama_cpp_python_version(bare: Path, tmp_path: Path) -> None:
    root = tmp_path / "xdg" / "autotune" / "llama-server"
    assert sb.cached_path("0.3.36") == root / "0.3.36" / "llama-server"
    assert sb.cached_path() == root / VERSION / "llama-server"  # the installed version by default
    assert sb.cached_path("1.0+cu 12/x") == root / "1.0+cu_12_x" / "llama-server"  # a file-name-safe folder


def test_the_binary_autotune_llama_server_names_is_used_as_is(bare: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _fake_server(tmp_path / "mine" / "llama-server", "7.0 (build 9, commit deadbee)")
    _fake_server(sb.cached_path())  # even with one cached
    monkeypatch.setenv(sb.ENV_BINARY, str(mine))
    assert sb.find_llama_server(build=False) == sb.ServerBinary(str(mine), "7.0 (build 9, commit deadbee)", "env")
    monkeypatch.setenv(sb.ENV_BINARY, str(tmp_path / "gone"))
    with pytest.raises(AutotuneError, match="AUTOTUNE_LLAMA_SERVER=.* is not an executable file"):
        sb.find_llama_server()


def test_the_cached_binary_then_a_path_one_of_the_same_commit(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = _fake_server(bare / "llama-server", "0.5.0 (build 7100, commit abcdef12)")
    monkeypatch.setattr(sb, "vendored_commit", lambda: "abcdef1")  # the short hashes differ in length
    assert sb.find_llama_server(build=False) == sb.ServerBinary(str(on_path), "0.5.0 (build 7100, commit abcdef12)",
                                                                "path")
    monkeypatch.setattr(sb, "vendored_commit", lambda: "1234567")
    with pytest.raises(AutotuneError, match=r"autotune build-server.*") as err:
        sb.find_llama_server(build=False)
    assert "not llama-cpp-python's llama.cpp commit 1234567; AUTOTUNE_LLAMA_SERVER_FROM_PATH=1" in str(err.value)
    monkeypatch.setenv(sb.ENV_FROM_PATH, "1")
    assert sb.find_llama_server(build=False).source == "path"
    cached = _fake_server(sb.cached_path())
    assert sb.find_llama_server(build=False) == sb.ServerBinary(str(cached), "0.5.0-dev (build 1, commit 0c1e570)",
                                                                "cache")
    assert sb.server_version(cached) == "0.5.0-dev (build 1, commit 0c1e570)"


def test_missing_tools_are_one_line_before_any_download(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(*args: object) -> None:
        raise AssertionError("the sources were downloaded before the tools were checked")

    monkeypatch.setattr(sb, "_download_sdist", no_download)
    with pytest.raises(AutotuneError) as err:
        sb.find_llama_server(say=lambda line: None, build=True)
    assert "cmake is not installed" in str(err.value) and "apt install cmake" in str(err.value)
    assert "\n" not in str(err.value)
    _script(bare / "cmake", "#!/bin/sh\nexit 0\n")
    with pytest.raises(AutotuneError, match="install a C\\+\\+ compiler, e.g. apt install g\\+\\+"):
        sb.find_llama_server(say=lambda line: None, build=True)
    assert not sb.cached_path().exists()


def test_the_lock_lets_one_process_build_and_the_other_find_it(bare: Path, tmp_path: Path) -> None:
    calls, said, results = [], [], []

    def make(version: str, work: Path, say: object) -> Path:
        calls.append(version)
        time.sleep(1.0)  # long enough for the other thread to find the lock taken
        return _fake_server(work / "bin" / "llama-server")

    def find() -> None:
        results.append(sb.find_llama_server(say=said.append, make=make))

    threads = [threading.Thread(target=find) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(timeout=60)
    assert calls == [VERSION]
    assert sorted(r.source for r in results) == ["built", "cache"]
    assert all(r.path == str(sb.cached_path()) for r in results)
    assert any("another process is building llama-server" in line for line in said), said
    assert os.access(sb.cached_path(), os.X_OK)
    assert not list(sb.cached_path().parent.glob("build-*"))  # the work folder is gone


def test_a_binary_that_does_not_run_is_never_cached_and_a_broken_cached_one_is_replaced(bare: Path) -> None:
    broken = "#!/bin/sh\necho 'error while loading shared libraries' >&2\nexit 127\n"
    with pytest.raises(AutotuneError, match="--version failed \\(exit status 127\\): error while loading"):
        sb.find_llama_server(say=lambda line: None, make=lambda v, work, say: _script(work / "llama-server", broken))
    assert not sb.cached_path().exists() and not list(sb.cached_path().parent.iterdir())
    _script(sb.cached_path(), broken)  # e.g. a system library it was linked against is gone
    said: list[str] = []
    server = sb.find_llama_server(say=said.append, make=lambda v, work, say: _fake_server(work / "llama-server"))
    assert server.source == "built" and sb.server_version(sb.cached_path()) == server.version
    assert said[0].startswith("not using the cached llama-server: ") and "exit status 127" in said[0], said


def _fake_sdist(folder: Path) -> Path:
    """A small stand-in for llama-cpp-python's sdist: llama.cpp, its git folder and the Python package."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"llama_cpp_python-{VERSION}.tar.gz"
    top = f"llama_cpp_python-{VERSION}"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in ((f"{top}/vendor/llama.cpp/CMakeLists.txt", "project(llama.cpp)\n"),
                           (f"{top}/vendor/llama.cpp/.git", "gitdir: ../../.git/modules/vendor/llama.cpp\n"),
                           (f"{top}/.git/modules/vendor/llama.cpp/HEAD", "0c1e57098bba43ac29e6e3b677cdceebdd22334f\n"),
                           (f"{top}/llama_cpp/__init__.py", ""), (f"{top}/pyproject.toml", "")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def test_a_build_with_cmake_from_the_cached_sdist(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = _fake_sdist(sb.cached_path().parent)  # reused: pip is never asked
    monkeypatch.setattr(sb.subprocess, "run", _no_pip(sb.subprocess.run))
    _script(bare / "cmake", FAKE_CMAKE.format(fail=""))
    monkeypatch.setenv("CC", "/bin/true")
    monkeypatch.setenv("CXX", "/bin/true")
    said: list[str] = []
    server = sb.build_llama_server(say=said.append)
    assert server.source == "built" and server.path == str(sb.cached_path()) and server.build_s is not None
    assert server.version == "0.5.0-dev (build 1, commit 0c1e570)"
    progress = [line for line in said if line.startswith("building llama-server: ")]
    assert progress == ["building llama-server: 1%", "building llama-server: 17%", "building llama-server: 30%",
                        "building llama-server: 64%", "building llama-server: 100%"], said
    folder = sb.cached_path().parent
    assert not sdist.exists() and not list(folder.glob("build-*")) and (folder / "build.log").is_file()
    assert sb.build_llama_server(say=said.append).source == "cache"  # built once


def _no_pip(run):
    def guarded(command, *args, **kwargs):
        assert "pip" not in command, command
        return run(command, *args, **kwargs)
    return guarded


def test_a_failed_build_names_its_log_and_caches_nothing(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = _fake_sdist(sb.cached_path().parent)
    fail = 'echo "llama.cpp:12:3: error: boom"; echo "make: *** failed"; exit 2'
    _script(bare / "cmake", FAKE_CMAKE.format(fail=fail))
    monkeypatch.setenv("CC", "/bin/true")
    monkeypatch.setenv("CXX", "/bin/true")
    with pytest.raises(AutotuneError) as err:
        sb.build_llama_server(say=lambda line: None)
    log = sb.cached_path().parent / "build.log"
    assert f"the full log is {log}" in str(err.value) and "error: boom" in str(err.value), err.value
    assert "compile: exit status 2" in str(err.value) and "\n" not in str(err.value)
    assert not sb.cached_path().exists() and not list(log.parent.glob("build-*"))
    assert not list(log.parent.glob(".*tmp*"))  # no half-written binary
    assert sdist.exists()  # kept for the next try


def test_a_download_that_fails_says_what_to_do_offline(bare: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dl").mkdir()

    def offline(command, *args, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version that satisfies")

    monkeypatch.setattr(sb.subprocess, "run", offline)
    with pytest.raises(AutotuneError, match="could not download llama-cpp-python .*set AUTOTUNE_LLAMA_SERVER"):
        sb._download_sdist(VERSION, (tmp_path / "dl").resolve(), say=lambda line: None)
    assert not list((tmp_path / "dl").iterdir())  # no download folder left behind


def test_autotune_build_server_says_where_the_binary_is(bare: Path) -> None:
    _fake_server(sb.cached_path())
    result = CliRunner().invoke(cli, ["build-server"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"llama-server: {sb.cached_path()}",
                                          "version: 0.5.0-dev (build 1, commit 0c1e570)", "already built"]


@pytest.mark.slow
def test_the_real_llama_server_runs() -> None:
    try:
        server = sb.find_llama_server(build=bool(os.environ.get("AUTOTUNE_BUILD_SERVER_IN_TESTS")))
    except AutotuneError as exc:
        pytest.skip(f"{exc} (.ci/run builds it before the tests; AUTOTUNE_BUILD_SERVER_IN_TESTS=1 builds it here)")
    done = subprocess.run([server.path, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "version:" in done.stdout + done.stderr
    assert server.version in done.stdout + done.stderr
