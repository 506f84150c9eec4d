"""A throwaway PostgreSQL server for the dashboard's tests: the system's binaries (Debian's
`postgresql` package), a temporary data folder, 127.0.0.1 on a free port, trust auth.

Root cannot run postgres, so as root the server runs as the `postgres` user the package creates.
Without the binaries the tests skip, except under CI=true, where they fail: CI installs them.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from ie_dashboard.serve import free_port

MISSING = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with "
    "`apt-get install -y postgresql` (under CI=true this is a failure, not a skip)"
)


def find_bindir() -> Path | None:
    """pg_ctl on PATH, else the newest Debian /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    return Path(versions[-1]).parent if versions else None


def _runner() -> list[str]:
    """The prefix that runs a server binary as a user that may (root may not)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        pytest.fail("running as root, the PostgreSQL tests need `runuser` to start postgres")
    return ["runuser", "-u", "postgres", "--"]


@dataclass
class PostgresServer:
    bindir: Path
    datadir: Path
    port: int
    runner: list[str]

    def _pg_ctl(self, *args: str) -> None:
        cmd = [*self.runner, str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 "
            # fsync off: the tests stop postgres, never the OS, so what was written survives.
            "-c fsync=off -c max_connections=200"
        )
        log = self.datadir / "server.log"
        try:
            self._pg_ctl("-l", str(log), "-w", "-o", opts, "start")
        except subprocess.CalledProcessError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"postgres did not start: {exc.stderr!r}\n{tail}") from None

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "stop")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def start_server() -> PostgresServer:
    """initdb into a temp folder and start; skips (fails under CI=true) without the binaries."""
    bindir = find_bindir()
    if bindir is None or not (bindir / "initdb").exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    runner = _runner()
    datadir = Path(tempfile.mkdtemp(prefix="ie-dashboard-pg-"))
    if runner:
        shutil.chown(datadir, user="postgres", group="postgres")
    init = [*runner, str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres"]
    init += ["--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]
    subprocess.run(init, check=True, capture_output=True, timeout=120)
    server = PostgresServer(bindir, datadir, free_port(), runner)
    server.start()
    return server


def remove(server: PostgresServer) -> None:
    """Stop the server (if it still runs) and delete its data folder."""
    try:
        server.stop("fast")
    except subprocess.CalledProcessError:
        pass  # already stopped (a test that restarts it failed in between)
    finally:
        shutil.rmtree(server.datadir, ignore_errors=True)
