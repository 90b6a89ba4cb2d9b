"""A throwaway PostgreSQL server on loopback: `make run-cluster` and the tests use it.

The binaries come from Debian's packages unpacked into the venv by `make postgres`
(`.venv/postgres/usr/lib/postgresql/<version>/bin`), else from a system install; no
system service is involved. PostgreSQL refuses to run as root: when this process is
root, the server runs in a user namespace of its own (`unshare --user`) as uid 65534
(`nobody`) mapped onto the caller's uid, so it owns its data directory without a chown
and without needing a user account on the machine.

Not used by services: they reach PostgreSQL through `database.url` like any client.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SUPERUSER = "hippo"


class PostgresNotFound(RuntimeError):
    pass


def _candidates() -> list[Path]:
    found: list[Path] = []
    configured = os.environ.get("HIPPO_POSTGRES_BIN")
    if configured:
        found.append(Path(configured))
    for root in (Path(sys.prefix) / "postgres", Path("/")):
        versions = sorted((root / "usr/lib/postgresql").glob("*/bin"), reverse=True)
        found.extend(versions)
    on_path = shutil.which("pg_ctl")
    if on_path:
        found.append(Path(on_path).resolve().parent)
    return found


def find_binaries() -> Path:
    """The bin directory holding initdb, pg_ctl and postgres."""
    for directory in _candidates():
        if all((directory / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return directory
    raise PostgresNotFound(
        "no PostgreSQL server binaries found: run `make postgres` (unpacks Debian's "
        "packages into .venv/postgres), or set HIPPO_POSTGRES_BIN to a bin directory"
    )


def _environment(bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Libraries unpacked beside the binaries (make postgres fetches the ones the
    # machine lacks) come first; the system's serve the rest.
    root = bin_dir.parents[3]  # <root>/usr/lib/postgresql/<version>/bin
    libs = [str(p) for p in (root / "usr/lib/x86_64-linux-gnu", root / "usr/lib") if p.is_dir()]
    if libs and root != Path("/"):
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")])
    env.pop("PGDATA", None)
    env["LC_ALL"] = "C"
    return env


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["unshare", "--user", "--map-user=65534", "--map-group=65534"]


@dataclass
class PostgresServer:
    """One server: `start()` initialises `data_dir` when empty and starts it on `port`;
    `stop()` shuts it down fast (open sessions are rolled back)."""

    data_dir: Path
    port: int
    durable: bool = True  # False (tests): no fsync, for speed; a crash may lose data
    max_connections: int = 300
    bin_dir: Path = field(default_factory=find_binaries)

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [*_as_server_user(), str(self.bin_dir / args[0]), *args[1:]]
        result = subprocess.run(
            command,
            env=_environment(self.bin_dir),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}): {result.stderr or result.stdout}"
            )
        return result

    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def start(self, timeout: float = 60) -> PostgresServer:
        if not self.initialised():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            # trust on loopback only: a throwaway cluster for one machine (listen_addresses
            # below); a real deployment brings its own server and credentials.
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                *([] if self.durable else ["--no-sync"]),
            )
        options = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            "-c unix_socket_directories=''",  # TCP only: socket paths have a length limit
            f"-c max_connections={self.max_connections}",
            "-c jit=off",  # make postgres leaves LLVM out (see scripts/install_postgres.sh)
        ]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-o",
            " ".join(options),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
            timeout=timeout + 10,
        )
        return self

    def running(self) -> bool:
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return False
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError, OSError):
            return False
        return True

    def stop(self, timeout: float = 60) -> None:
        if self.running():
            self._run(
                "pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", str(int(timeout)),
                "stop", timeout=timeout + 10,
            )  # fmt: skip

    def create_database(self, name: str) -> str:
        """Create an empty database (UTF-8, template0) and return its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8'")
        return self.url(name)

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        end = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
