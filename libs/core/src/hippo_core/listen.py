"""Loopback ports for local clusters and tests that no other process can take meanwhile.

Binding port 0 and closing it to learn a "free" port races twice: the kernel hands the
same range (net.ipv4.ip_local_port_range, 32768-60999 by default) out as the source
port of every outgoing connection, so by the time a service binds the port seconds
later it may be in use; and two launchers may pick the same one. Here ports come from
*below* the ephemeral range, which the kernel never hands out by itself, and each is
reserved in a registry file under an exclusive lock, with the reserving process's pid:
other Hippo launchers and test runs skip it until that process has exited. A reserved
port stays reserved for the life of the reserving process, so a service restarted by
its launcher gets its old port back and its peers' address lists stay right.

Used by the local launcher (`hippo up`), `hippo_cli.cluster` and the test harnesses;
services themselves bind what their settings say.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Below the ephemeral range; above the well-known and most registered service ports.
_FLOOR = 20000
_REGISTRY = "hippo-reserved-ports.json"


def _ephemeral_start() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _registry(directory: Path) -> Iterator[dict[str, int]]:
    """The registry {port: pid}, locked for the block and saved after it; entries of
    processes that have exited are dropped on the way in."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _REGISTRY
    with open(directory / (_REGISTRY + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                raw: dict[str, int] = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                raw = {}
            reserved = {port: pid for port, pid in raw.items() if _alive(int(pid))}
            yield reserved
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(reserved))
            os.replace(tmp, path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def reserve_ports(count: int, *, directory: Path | None = None) -> list[int]:
    """`count` distinct loopback ports, bindable now, below the ephemeral range, and
    reserved for this process (see the module docstring)."""
    high = _ephemeral_start()
    if high - _FLOOR < count:
        raise RuntimeError(f"no room below the ephemeral range (starts at {high})")
    out: list[int] = []
    with _registry(directory or Path(tempfile.gettempdir())) as reserved:
        candidates = list(range(_FLOOR, high))
        random.shuffle(candidates)  # spread out: a stale listener blocks one port, not a run
        for port in candidates:
            if str(port) in reserved or not _bindable(port):
                continue
            reserved[str(port)] = os.getpid()
            out.append(port)
            if len(out) == count:
                return out
    raise RuntimeError(f"only {len(out)} of {count} loopback ports are free")


def reserve_port(*, directory: Path | None = None) -> int:
    """One port, as `reserve_ports`."""
    return reserve_ports(1, directory=directory)[0]
