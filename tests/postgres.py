"""A throwaway PostgreSQL server for tests: Debian's binaries, a temp dir, a loopback port.

`PostgresServer.start()` runs `initdb` into a fresh temp dir and starts the
`postgres` server as a child process listening on 127.0.0.1 only (and a
socket in the temp dir); `stop()` shuts that one process down by its PID
and removes the dir. As root, both run as the `postgres` user (PostgreSQL
refuses to run as root). `make test` installs the binaries (`apt-get
install postgresql`) when they are missing.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import psycopg
import pytest

_SEARCH_DIRS = ("/usr/lib/postgresql/*/bin",)
_START_TIMEOUT_SECONDS = 30.0
_STOP_TIMEOUT_SECONDS = 30.0
_USER = "harness"


class PostgresUnavailable(Exception):
    """The PostgreSQL server binaries are not installed on this machine."""


def find_binaries() -> Path:
    """The directory holding `initdb` and `postgres`.

    Raises:
        PostgresUnavailable: neither PATH nor Debian's install dir has them.
    """
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    for pattern in _SEARCH_DIRS:
        candidates.extend(Path(p) for p in sorted(glob.glob(pattern), reverse=True))
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "postgres").is_file():
            return directory
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, postgres) are not on PATH nor under "
        "/usr/lib/postgresql/*/bin; `make test` installs them with `apt-get install postgresql`"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _spawn(
    root: Path, command: list[str], user: pwd.struct_passwd | None
) -> subprocess.Popen[bytes]:
    as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid}
    with (root / "server.log").open("ab") as log:
        if user is not None:
            os.chown(root / "server.log", user.pw_uid, user.pw_gid)
        return subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, **as_user)


@attrs.define(eq=False)
class PostgresServer:
    """One running server; `dsn(schema)` gives a connection string confined to a schema."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]
    command: list[str]
    _schemas: itertools.count[int] = attrs.field(factory=itertools.count, init=False)

    @classmethod
    def start(cls, *, durable: bool = False) -> PostgresServer:
        """initdb into a new temp dir and start the server on a free loopback port.

        Tests run with `fsync=off` (a crash of the test machine loses nothing
        that matters); `durable=True` keeps PostgreSQL's defaults, for benchmarks.

        Raises:
            PostgresUnavailable: the binaries are missing.
            RuntimeError: initdb or the server failed (the message holds its log).
        """
        binaries = find_binaries()
        user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid}
        data = root / "data"
        initdb = subprocess.run(
            [binaries / "initdb", "-D", data, "-U", _USER, "--auth=trust", "-E", "UTF8",
             "--no-sync", "--no-instructions"],
            cwd=root, capture_output=True, check=False, **as_user,
        )  # fmt: skip
        if initdb.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"initdb failed: {initdb.stderr.decode(errors='replace')}")
        port = _free_port()
        fast = [] if durable else ["-c", "fsync=off", "-c", "full_page_writes=off"]
        command = [
            str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
            "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", *fast,
        ]  # fmt: skip
        server = cls(root=root, port=port, process=_spawn(root, command, user), command=command)
        try:
            server._wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def admin_dsn(self) -> str:
        """The DSN of the server's default database, as the superuser."""
        return f"postgresql://{_USER}@127.0.0.1:{self.port}/postgres"

    def new_schema(self) -> str:
        """A DSN whose tables live in a new, empty schema (a fresh store per test)."""
        name = f"t{next(self._schemas)}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as connection:
            connection.execute(f"CREATE SCHEMA {name}".encode())
        return f"{self.admin_dsn}?options=-csearch_path%3D{name}"

    def stop(self) -> None:
        """Shut the server down by its PID (fast shutdown), wait for it, remove its dir."""
        try:
            self.halt()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def halt(self) -> None:
        """Shut the server down by its PID (fast shutdown) and wait; its data dir stays."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(_STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def resume(self) -> None:
        """Start the halted server again on the same data dir and port; wait until it answers."""
        user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self.process = _spawn(self.root, self.command, user)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {self._log()}")
            try:
                psycopg.connect(self.admin_dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres did not accept connections: {self._log()}"
                    ) from exc
                time.sleep(0.05)

    def _log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A started server, stopped by PID on exit; skips the test when PostgreSQL is unavailable."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()
