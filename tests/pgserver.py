"""A throwaway PostgreSQL cluster on loopback for the tests (Debian's ``postgresql`` package).

The cluster lives in a temporary folder, listens on 127.0.0.1 on a free port with ``trust``
authentication, runs with fsync off (it holds nothing worth keeping) and is removed at the
end of the test session. PostgreSQL refuses to run as root, so as root the server programs
run as the ``postgres`` user. Tests that need it skip with a reason when the binaries are
missing.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_OPTIONS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with ``initdb`` and ``pg_ctl``, or PATH's."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2].split(".")[0]))
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "pg_ctl"), os.X_OK):
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster: initialized on first start, stoppable and restartable on the same port."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.run_as = "postgres" if os.geteuid() == 0 else None
        self.base = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = free_port()
        self.running = False
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)

    def _cmd(self, *args: str) -> subprocess.CompletedProcess:
        argv = [str(self.bindir / args[0]), *args[1:]]
        if self.run_as:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.base)
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.is_file() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed: {proc.stderr.strip()} {log[-2000:]}")
        return proc

    def start(self) -> None:
        """Start the server (initializing the cluster the first time) and wait until it accepts connections."""
        if not self.data.exists():
            self._cmd("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                      "--no-sync", "--no-instructions")
        self._cmd("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", "-o",
                  f"-h 127.0.0.1 -p {self.port} -k {self.base} {SERVER_OPTIONS}")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` ends open sessions; ``immediate`` is a crash); no-op if stopped."""
        if self.running:
            self._cmd("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
            self.running = False

    def destroy(self) -> None:
        """Stop the server and delete the cluster."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` (a plain ``postgresql://`` URL, as a user writes it)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> list[tuple]:
        """Run one statement in autocommit mode; returns the rows, if any."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                             autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def new_database(self) -> str:
        """Create an empty database with a fresh name; returns its URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def terminate_connections(self, database: str) -> int:
        """Kill every server-side session on ``database`` (as an idle timeout or a failover would)."""
        rows = self.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            f"WHERE datname = '{database}' AND pid <> pg_backend_pid()")
        return int(rows[0][0])


_shared: PgServer | None = None


def shared_server() -> PgServer:
    """The session's one server, started on first use and removed when the interpreter exits."""
    global _shared
    if _shared is None:
        bindir = find_bindir()
        if bindir is None:
            pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: "
                        "apt-get install postgresql to run the PostgreSQL tests")
        server = PgServer(bindir)
        atexit.register(server.destroy)
        server.start()
        _shared = server
    if not _shared.running:
        _shared.start()
    return _shared


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A running PostgreSQL server on loopback, shared by the session and removed at its end."""
    server = shared_server()
    yield server
    server.destroy()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh, empty database on the shared server (restarted first if a test stopped it)."""
    if not pg_server.running:
        pg_server.start()
    return pg_server.new_database()
