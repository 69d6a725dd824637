"""A real PostgreSQL server for the ledger's tests, from the PyPI package `pgserver` (its binaries only).

pgserver's wheel carries PostgreSQL's own `initdb` and `postgres`; its Python
API listens on a unix socket only, so `PostgresServer` runs the binaries
itself: `initdb` into a temporary folder, then `postgres` on 127.0.0.1 at a
free port (up when it accepts a connection and is the one listening there: a
port taken by another server before postgres bound it is tried again on
another), no unix socket, fsync off (a test server). PostgreSQL refuses to
run as root, so under root it runs as the user `pgserver` (made once with
useradd, as pgserver itself does). `stop()` is a fast shutdown (SIGINT) and
`start()` brings it back on the same port and data: the store "down for a
while" of the ledger's tests. `database()` makes a fresh database per test.

`unavailable()` says why a server cannot run here (the package missing, or
its binaries failing), for a skip with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from itertools import count
from pathlib import Path

from harness.process import free_port
from harness.procs import listens

USER = "pgserver"
_databases = count(1)


def binaries() -> Path | None:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    return folder if (folder / "postgres").exists() else None


class PostgresServer:
    def __init__(self) -> None:
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("the PyPI package `pgserver` is not installed (pip install pgserver)")
        self.bin = bin_dir
        self.user: str | None = None
        self.folder = Path(tempfile.mkdtemp(prefix="streamproxy-pg-"))
        self.folder.chmod(0o755)
        self.data = self.folder / "data"
        self.data.mkdir()
        if os.geteuid() == 0:
            self.user = USER
            try:
                pwd.getpwnam(USER)
            except KeyError:
                subprocess.run(["useradd", "--no-create-home", "-s", "/usr/sbin/nologin", USER], check=True, capture_output=True)
            entry = pwd.getpwnam(USER)
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
            _traversable(self.bin.parent)
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
            check=True, user=self.user, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
        )
        self.proc: subprocess.Popen[bytes] | None = None
        for attempt in range(3):  # a port picked free may be taken before postgres binds it: another one
            self.port = free_port()
            try:
                self.start()
                break
            except RuntimeError as exc:
                if attempt == 2 or "already in use" not in str(exc):
                    raise

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 20.0) -> None:
        log = open(self.folder / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port), "-k", "",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200"],
            user=self.user, stdout=log, stderr=log,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: {self.log_tail()}")
            if self._accepts() and listens(self.proc.pid, self.port):  # (not another worker's server on a reused port)
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not come up in {timeout:g} s: {self.log_tail()}")

    def _accepts(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        """Fast shutdown: connections are ended, new ones refused, until `start()`."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(2)  # SIGINT: fast shutdown
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def database(self) -> str:
        """A fresh empty database's URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url_of(name)

    def log_tail(self) -> str:
        try:
            return (self.folder / "postgres.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _traversable(folder: Path) -> None:
    """The package's folder readable and its binaries runnable by the server's user (pip installs as root)."""
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o055 if path.is_dir() or mode & 0o100 else mode | 0o044)
    parent = folder
    while parent != parent.parent:
        parent = parent.parent
        parent.chmod(parent.stat().st_mode | 0o005)


def unavailable() -> str | None:
    """Why a server cannot run here, or None."""
    if binaries() is None:
        return "the PyPI package `pgserver` (PostgreSQL's binaries) is not installed"
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed"
    return None
