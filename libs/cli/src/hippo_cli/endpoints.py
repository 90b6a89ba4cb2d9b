"""Where the replicas of a local cluster listen: written by `hippo up` (and rewritten when
it restarts one), read by the other `hippo` commands, tests and benchmarks.

`<data_dir>/run/endpoints.json` holds, per service, one entry per replica (its gRPC
address, /metrics URL, HTTP API if any, pid). A command whose address setting was not
given explicitly (HIPPO_CLI_<SVC>_ADDR) reaches the service through this file: with two
replicas, through both (`ipv4:a,b`, balanced round robin by the channel).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from hippo_core.files import write_atomic


@dataclass(frozen=True)
class Endpoint:
    service: str
    replica: int
    addr: str  # host:port of the gRPC server
    metrics: str  # URL of /metrics
    pid: int
    http: str = ""  # base URL of an HTTP API beside gRPC (the LLM host's TGI API)

    @property
    def name(self) -> str:
        return f"{self.service}-{self.replica}"


def path(data_dir: Path) -> Path:
    return Path(data_dir) / "run" / "endpoints.json"


def write(data_dir: Path, endpoints: list[Endpoint]) -> None:
    target = path(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps([asdict(e) for e in endpoints], indent=1).encode()
    write_atomic(target, body, mode=0o644)


def read(data_dir: Path) -> dict[str, list[Endpoint]]:
    """Replicas by service ({} when no cluster wrote the file, or it is unreadable)."""
    try:
        rows = json.loads(path(data_dir).read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, list[Endpoint]] = {}
    for row in rows:
        endpoint = Endpoint(**row)
        out.setdefault(endpoint.service, []).append(endpoint)
    return out


def remove(data_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path(data_dir))


def addresses(target: str) -> list[str]:
    """The addresses of a target: an `ipv4:a,b` list one by one, anything else as it is
    (a `dns:///` name resolves inside the channel, not here)."""
    if target.startswith("ipv4:"):
        return target.removeprefix("ipv4:").split(",")
    return [target]


def target(addrs: list[str]) -> str:
    """A gRPC target for every address: a single one as it is, several as an `ipv4:`
    list (the channel balances calls round robin over them)."""
    if len(addrs) == 1:
        return addrs[0]
    return "ipv4:" + ",".join(addrs)
