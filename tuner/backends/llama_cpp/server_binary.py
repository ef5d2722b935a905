"""llama.cpp's own ``llama-server`` (slots, continuous batching), built once from the llama.cpp sources that
llama-cpp-python vendors, so it runs the same engine as the trials.

llama-cpp-python's wheel has no ``llama-server``: :func:`build_llama_server` downloads the sdist of the
installed version (``pip download``), extracts its ``vendor/llama.cpp`` (and that submodule's git folder, so the
binary's ``--version`` names its commit), builds the one target with cmake and keeps the binary by version in
the user's cache folder (:func:`tuner.util.paths.user_cache_dir`)::

    <cache>/llama-server/<version>.lock            a build holds it: a second process waits, then finds the binary
    <cache>/llama-server/<version>/llama-server    the binary (renamed in whole: never half-written)
    <cache>/llama-server/<version>/build.log       the last build's output
    <cache>/llama-server/<version>/llama_cpp_python-<version>.tar.gz   the sdist, until a build succeeds
    <cache>/llama-server/<version>/build-*/        the sources and build tree, while a build runs

``autotune build-server`` builds it ahead of time (``.ci/run`` does, before the tests).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ...errors import AutotuneError
from ...measure.lock import file_lock
from ...util.files import remove_stale_temps, temp_sibling
from ...util.paths import user_cache_dir, writable_dir
from ...util.processes import exit_text, stderr_line
from ..capabilities import Say, ServerBinary

__all__ = ["ServerBinary", "build_llama_server", "cached_path", "find_llama_server", "server_version"]

ENV_BINARY = "AUTOTUNE_LLAMA_SERVER"           # a llama-server to use as is
ENV_FROM_PATH = "AUTOTUNE_LLAMA_SERVER_FROM_PATH"  # "1": the one on PATH even when its commit is not llama-cpp-python's
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF")
VERSION_TIMEOUT_S = 30
DOWNLOAD_TIMEOUT_S = 900
PROGRESS_EVERY_S = 30  # a progress line at least this often while the percentage moves (and every 10%)
# Make the binary: (llama-cpp-python version, an empty work folder, say) -> the built binary's path.
Make = Callable[[str, Path, Say], Path]
_COMMIT_RE = re.compile(r"commit[:\s]+([0-9a-f]{7,40})\b")
_PERCENT_RE = re.compile(r"^\[\s*(\d+)%\]")


def llama_cpp_python_version() -> str:
    """The installed llama-cpp-python's version (the sources a build uses, and the cache folder's name)."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise AutotuneError("llama-cpp-python is not installed: pip install autotune (it depends on it)") from None


def cached_path(version: str | None = None) -> Path:
    """Where the ``llama-server`` of llama-cpp-python ``version`` (default: the installed one) is cached."""
    version = re.sub(r"[^\w.+-]", "_", version or llama_cpp_python_version())
    return user_cache_dir() / "llama-server" / version / "llama-server"


def server_version(path: str | os.PathLike[str]) -> str:
    """What ``<path> --version`` says: its ``version:`` line without the prefix (else its first non-empty
    line), e.g. ``0.5.0-dev (build 1, commit 0c1e570)``. AutotuneError when the program does not run."""
    try:
        done = subprocess.run([str(path), "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=VERSION_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise AutotuneError(f"{path} --version did not answer within {VERSION_TIMEOUT_S} s") from None
    except OSError as exc:
        raise AutotuneError(f"cannot run {path} ({exc.strerror or exc})") from None
    text = (done.stdout + done.stderr).decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if done.returncode != 0 or not lines:
        raise AutotuneError(f"{path} --version failed ({exit_text(done.returncode)}): {stderr_line(text)}")
    return next((ln.removeprefix("version:").strip() for ln in lines if ln.startswith("version:")), lines[0])


def vendored_commit() -> str | None:
    """The llama.cpp commit (short hash) llama-cpp-python's library was built from, as its ``ggml_commit()``
    tells; None where that is unknown (a build without git, a library that does not load)."""
    try:
        from llama_cpp import llama_cpp as lib

        commit = lib._lib.ggml_commit
        commit.restype, commit.argtypes = ctypes.c_char_p, []
        found = re.match(r"[0-9a-f]{7,40}\b", (commit() or b"").decode(errors="replace"))
    except Exception:  # noqa: BLE001 - unknown, not an error: PATH is then used only when asked for
        return None
    return found.group(0) if found else None


def find_llama_server(say: Say = print, build: bool = True, *, make: Make | None = None) -> ServerBinary:
    """The ``llama-server`` to measure with, in this order:

    1. the binary ``AUTOTUNE_LLAMA_SERVER`` names, used as is (source ``env``);
    2. the one cached for the installed llama-cpp-python version (:func:`cached_path`, source ``cache``);
    3. ``llama-server`` on PATH when its ``--version`` names the llama.cpp commit llama-cpp-python's library was
       built from (``ggml_commit()``), or whatever its version with ``AUTOTUNE_LLAMA_SERVER_FROM_PATH=1``
       (source ``path``); where the library's commit is unknown, only the latter uses PATH;
    4. built now (:func:`build_llama_server`, about 10 minutes, once per version) when ``build``, else an
       AutotuneError that says to run ``autotune build-server``.

    ``make`` replaces the download and compile steps of a build (tests).
    """
    named = os.environ.get(ENV_BINARY)
    if named:
        path = shutil.which(named)
        if not path:
            raise AutotuneError(f"{ENV_BINARY}={named} is not an executable file: point it at a llama-server "
                                "binary, or unset it to use the one autotune builds")
        return ServerBinary(path, server_version(path), "env")
    found = _cached(say)
    if found:
        return found
    skipped = ""
    on_path = shutil.which("llama-server")
    if on_path:
        with contextlib.suppress(AutotuneError):  # a llama-server on PATH that does not run is not used
            version = server_version(on_path)
            wanted = vendored_commit()
            if os.environ.get(ENV_FROM_PATH) == "1" or _same_commit(version, wanted):
                return ServerBinary(on_path, version, "path")
            skipped = (f" (the llama-server on PATH, {on_path}, says {version!r}, not llama-cpp-python's llama.cpp "
                       f"commit {wanted or 'unknown'}; {ENV_FROM_PATH}=1 uses it anyway)")
    if not build:
        raise AutotuneError(f"no llama-server is built for llama-cpp-python {llama_cpp_python_version()}{skipped}: "
                            f"run `autotune build-server` (about 10 minutes, once), or set {ENV_BINARY} to a "
                            "llama-server binary")
    if skipped:
        say(f"not using{skipped}")
    return build_llama_server(say, make=make)


def build_llama_server(say: Say = print, *, make: Make | None = None) -> ServerBinary:
    """Build ``llama-server`` for the installed llama-cpp-python and cache it (:func:`cached_path`); the cached
    one (source ``cache``) where it is already there, also after waiting for another process that was building
    it. cmake and a C/C++ compiler are checked before anything is downloaded; every failure is one
    AutotuneError line that says what to do. ``make`` replaces the download and compile steps (tests)."""
    version = llama_cpp_python_version()
    target = cached_path(version)
    folder = writable_dir(target.parent, "llama-server cache folder",
                          "set XDG_CACHE_HOME to a folder you can write, or AUTOTUNE_LLAMA_SERVER to a llama-server")
    lock = folder.with_name(f"{folder.name}.lock")
    with file_lock(lock, on_wait=lambda: say(f"another process is building llama-server (lock {lock}): waiting")):
        found = _cached(lambda line: None)  # built meanwhile by the process we waited for
        if found:
            return found
        remove_stale_temps(target)
        for stale in folder.glob("build-*"):  # a build killed half-way (nobody else builds: the lock is ours)
            shutil.rmtree(stale, ignore_errors=True)
        start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="build-", dir=folder))
        try:
            built = (make or _compile)(version, work, say)
            version_line = server_version(built)  # a binary that does not run never enters the cache
            with temp_sibling(target) as tmp:
                shutil.copyfile(built, tmp)
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for sdist in _sdists(folder, version):  # only a failed build needs it again
            sdist.unlink(missing_ok=True)
    elapsed = time.monotonic() - start
    say(f"built {target} in {elapsed:.0f} s")
    return ServerBinary(str(target), version_line, "built", elapsed)


def _cached(say: Say) -> ServerBinary | None:
    """The cached binary when it is there and runs (one that does not is replaced by the next build)."""
    path = cached_path()
    if not path.is_file():
        return None
    try:
        return ServerBinary(str(path), server_version(path), "cache")
    except AutotuneError as exc:
        say(f"not using the cached llama-server: {exc}")
        return None


def _same_commit(version: str, wanted: str | None) -> bool:
    """Whether a ``--version`` line names the commit ``wanted`` (short hashes of any length, 7 or more)."""
    found = _COMMIT_RE.search(version)
    return bool(wanted and found and (found.group(1).startswith(wanted) or wanted.startswith(found.group(1))))


def _check_tools() -> None:
    """cmake and C and C++ compilers on PATH (CC / CXX when set); one AutotuneError line naming what to install."""
    fix = f"then run `autotune build-server`, or set {ENV_BINARY} to a llama-server binary"
    if not shutil.which("cmake"):
        raise AutotuneError(f"cmake is not installed (building llama-server needs it once): install cmake, "
                            f"e.g. apt install cmake (or pip install cmake), {fix}")
    for env, names in (("CC", ("cc", "gcc", "clang")), ("CXX", ("c++", "g++", "clang++"))):
        if not any(shutil.which(n) for n in ([os.environ[env].split()[0]] if os.environ.get(env) else names)):
            raise AutotuneError(f"no C/C++ compiler found (building llama-server needs one once): install a C++ "
                                f"compiler, e.g. apt install g++ (or set {env}), {fix}")


def _sdists(folder: Path, version: str) -> list[Path]:
    return sorted(folder.glob(f"llama[_-]cpp[_-]python-{version}.tar.gz"))


def _download_sdist(version: str, folder: Path, say: Say) -> Path:
    """The sdist of llama-cpp-python ``version`` in ``folder``: one already there, else downloaded with pip."""
    found = _sdists(folder, version)
    if found:
        return found[0]
    say(f"downloading llama-cpp-python {version}'s sources (pip download)")
    with tempfile.TemporaryDirectory(prefix="download-", dir=folder) as tmp:
        command = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-deps",
                   "--no-binary", ":all:", "-d", tmp]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=DOWNLOAD_TIMEOUT_S, check=False)
            failed = stderr_line(done.stderr or done.stdout) if done.returncode else ""
        except subprocess.TimeoutExpired:
            failed = f"no answer within {DOWNLOAD_TIMEOUT_S} s"
        downloaded = sorted(Path(tmp).glob("*.tar.gz"))
        if failed or not downloaded:
            raise AutotuneError(f"could not download llama-cpp-python {version}'s sources to build llama-server "
                                f"(pip: {failed or 'no sdist'}): check the network (offline: set {ENV_BINARY} "
                                "to a llama-server binary)")
        return Path(shutil.move(str(downloaded[0]), folder / downloaded[0].name))


def _wanted(member: tarfile.TarInfo) -> bool:
    """The vendored llama.cpp and its git folder (for the commit in ``--version``), nothing else of the sdist."""
    parts = member.name.split("/")
    return parts[1:3] == ["vendor", "llama.cpp"] or parts[1:5] == [".git", "modules", "vendor", "llama.cpp"]


def _compile(version: str, work: Path, say: Say) -> Path:
    """Download (or reuse) the sdist, extract its llama.cpp into ``work`` and build ``llama-server`` there."""
    _check_tools()  # before a 75 MB download
    folder = work.parent
    sdist = _download_sdist(version, folder, say)
    try:
        with tarfile.open(sdist) as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.10.12+, 3.11.4+
            tar.extractall(work / "src", members=(m for m in tar if _wanted(m)), **safe)  # type: ignore[arg-type]
    except (tarfile.TarError, OSError, EOFError) as exc:
        sdist.unlink(missing_ok=True)
        raise AutotuneError(f"the llama-cpp-python sources {sdist.name} are damaged ({exc}): removed; run "
                            "`autotune build-server` again to download them anew") from None
    sources = next((work / "src").glob("*/vendor/llama.cpp"), None)
    if sources is None or not (sources / "CMakeLists.txt").is_file():
        raise AutotuneError(f"{sdist.name} has no vendor/llama.cpp to build llama-server from: set {ENV_BINARY} "
                            "to a llama-server binary")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    log = folder / "build.log"
    say(f"building llama-server for llama-cpp-python {version} on {cpus} CPUs (about 10 minutes, once per "
        f"version); log: {log}")
    with open(log, "w", encoding="utf-8") as out:
        _run_logged("configure", ["cmake", "-S", str(sources), "-B", str(work / "build"), *CMAKE_FLAGS], out, say)
        _run_logged("compile", ["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", str(cpus)],
                    out, say)
    binary = work / "build" / "bin" / "llama-server"
    if not binary.is_file():
        raise AutotuneError(f"the llama-server build made no {binary.relative_to(work)}: see {log}")
    return binary


def _run_logged(step: str, command: list[str], out: TextIO, say: Say) -> None:
    """Run one build command, its output into the log ``out`` and its progress, now and then, to ``say``."""
    log = Path(out.name)
    out.write(f"$ {' '.join(command)}\n")
    out.flush()
    shown, shown_at = -10, time.monotonic()
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                out.write(line)
                found = _PERCENT_RE.match(line)
                if found and (pct := int(found.group(1))) > shown and \
                        (pct >= shown + 10 or time.monotonic() - shown_at >= PROGRESS_EVERY_S):
                    say(f"building llama-server: {pct}%")
                    shown, shown_at = pct, time.monotonic()
        except BaseException:
            proc.kill()
            raise
    out.flush()
    if proc.returncode != 0:
        why = stderr_line(log.read_text(errors="replace"), markers=("error:", "CMake Error"))
        raise AutotuneError(f"building llama-server failed ({step}: {exit_text(proc.returncode)}): {why}; "
                            f"the full log is {log}: fix that and run `autotune build-server` again, or set "
                            f"{ENV_BINARY} to a llama-server binary")
