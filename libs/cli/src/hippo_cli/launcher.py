"""`hippo up`: every service as local processes on loopback, until Ctrl-C.

Two shapes:
- embedded (`make run`): one process per service, SQLite files under `var/<service>`,
  the ports of each service's settings;
- cluster (`make run-cluster`, `--cluster`): a throwaway PostgreSQL under
  `var/cluster/postgres` as the state of record, and `--replicas` (2) interchangeable
  processes of every service, each with its own data dir (`var/cluster/<svc>-<n>`) and
  ports reserved below the ephemeral range; every peer address is the list of all
  replicas (`ipv4:a,b`), balanced round robin by the channel.

Start order follows the registry; all replicas of a service must be SERVING before the
next service starts (later services depend on earlier ones). Logs go to
`<data_dir>/log/<replica>.log` as JSON lines; where each replica listens goes to
`<data_dir>/run/endpoints.json` (see endpoints.py), for the other `hippo` commands.

A replica that exits is restarted, as Kubernetes would: logged, on its old ports and
data dir, after a backoff that doubles per crash (0.5 s to 30 s) and resets once the
replica has stayed up a minute. Ctrl-C or SIGTERM stops every replica, newest first,
gracefully, killing only what outlives its grace period, then PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from hippo_cli import endpoints
from hippo_cli.health import wait_serving
from hippo_cli.registry import SERVICES, ServiceSpec
from hippo_cli.settings import CliSettings
from hippo_core.certs import Authority, Issued
from hippo_core.files import secret_file
from hippo_core.listen import reserve_ports
from hippo_core.pgserver import PostgresServer
from hippo_core.settings import TlsSettings

DATABASE = "hippo"
RESTART_MIN_S, RESTART_MAX_S, STABLE_S = 0.5, 30.0, 60.0


@dataclass
class Replica:
    spec: ServiceSpec
    index: int
    env: dict[str, str]  # the process's whole environment, kept for restarts
    addr: str
    metrics: str
    http: str
    log: Path
    grace: float
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    crashes: int = 0  # in a row; reset once the replica stays up STABLE_S
    restart_at: float | None = None

    @property
    def name(self) -> str:
        return f"{self.spec.name}-{self.index}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.spec.module],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started = time.monotonic()
        self.restart_at = None

    def endpoint(self) -> endpoints.Endpoint:
        pid = self.process.pid if self.process is not None else 0
        return endpoints.Endpoint(
            self.spec.name, self.index, self.addr, self.metrics, pid, self.http
        )


@dataclass
class Cluster:
    """What `up` started, and the wiring later services get."""

    data_dir: Path
    cluster: bool
    replicas: list[Replica] = field(default_factory=list)
    wiring: dict[str, str] = field(default_factory=dict)
    postgres: PostgresServer | None = None
    certs: dict[str, Issued] = field(default_factory=dict)  # `--tls`: service -> its files

    @property
    def operator(self) -> TlsSettings | None:
        """What the launcher's own health checks (and the banner's commands) call with."""
        issued = self.certs.get("operator")
        if issued is None:
            return None
        return TlsSettings(
            ca_file=str(issued.ca_file),
            cert_file=str(issued.cert_file),
            key_file=str(issued.key_file),
        )

    def of(self, service: str) -> list[Replica]:
        return [r for r in self.replicas if r.spec.name == service]

    def save_endpoints(self) -> None:
        endpoints.write(self.data_dir, [r.endpoint() for r in self.replicas])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _replicas(spec: ServiceSpec, count: int, up: Cluster) -> list[Replica]:
    """The replicas of `spec`, configured (not started)."""
    os.environ.update(up.wiring)  # so spec.settings() reads what the processes will
    settings = spec.settings()
    prefix = spec.env_prefix()
    fields = spec.settings_type().model_fields
    # A port whose default and value are 0 is an API turned off (the gateway's OpenAI
    # endpoint): it stays off rather than getting a reserved port in cluster mode.
    port_fields = [
        n
        for n in fields
        if n.endswith("port") and (fields[n].default != 0 or getattr(settings, n) != 0)
    ]
    out = []
    for index in range(count):
        env = {**os.environ, **up.wiring, "HF_HUB_OFFLINE": "1"}
        ports = {name: int(getattr(settings, name)) for name in port_fields}
        if up.cluster:
            # Every replica on ports of its own, reserved for this launcher's life: a
            # restarted replica gets the same ones back, so its peers' lists stay right.
            ports = dict(zip(port_fields, reserve_ports(len(port_fields)), strict=True))
            env.update({f"{prefix}{name.upper()}": str(port) for name, port in ports.items()})
            env[f"{prefix}HOST"] = "127.0.0.1"
        host = "127.0.0.1" if up.cluster else settings.host
        name = f"{spec.name}-{index}" if up.cluster else spec.name
        if hasattr(settings, "data_dir"):  # stateful services keep their files apart
            if up.cluster:  # one data dir per replica, whatever the environment says
                env[f"{prefix}DATA_DIR"] = str(up.data_dir / "cluster" / name)
            else:
                env.setdefault(f"{prefix}DATA_DIR", str(up.data_dir / name))
        if up.cluster and up.postgres is not None and hasattr(settings, "database"):
            env.setdefault(f"{prefix}DATABASE__URL", up.postgres.url(DATABASE))
        issued = up.certs.get(spec.name)
        if issued is not None:
            env.setdefault(f"{prefix}TLS__CA_FILE", str(issued.ca_file))
            env.setdefault(f"{prefix}TLS__CERT_FILE", str(issued.cert_file))
            env.setdefault(f"{prefix}TLS__KEY_FILE", str(issued.key_file))
        http_port = ports.get("http_port")
        scheme = "https" if issued is not None else "http"
        out.append(
            Replica(
                spec,
                index,
                env,
                f"{host}:{ports['port']}",
                f"http://{host}:{ports['metrics_port']}/metrics",
                f"{scheme}://{host}:{http_port}" if http_port else "",
                up.data_dir / "log" / f"{name}.log",
                float(settings.grace_seconds),
            )
        )
    return out


def _peer_wiring(group: list[Replica]) -> dict[str, str]:
    """Tell every later service where `group` listens (`HIPPO_<SVC>_<PEER>_ADDR`: all its
    replicas), unless the operator set that address explicitly. A service with an HTTP
    API beside gRPC (the LLM host's TGI API) is what later services' `llm_url` points at:
    one replica's (the TGI client takes one URL; put a load balancer in front for more)."""
    spec = group[0].spec
    out = {}
    target = endpoints.target([r.addr for r in group])
    for other in SERVICES:
        fields = other.settings_type().model_fields
        name = f"{other.env_prefix()}{spec.name.upper()}_ADDR"
        if f"{spec.name}_addr" in fields and name not in os.environ:
            out[name] = target
        url = f"{other.env_prefix()}LLM_URL"
        if group[0].http and "llm_url" in fields and url not in os.environ:
            out[url] = group[0].http
    return out


def new_signing_key() -> bytes:
    """A fresh audit checkpoint signing key, as HIPPO_AUDIT_SIGNING_KEY takes it: base64
    of 32 random bytes (an Ed25519 private key is any 32 bytes)."""
    return base64.b64encode(secrets.token_bytes(32))


def _cluster_secrets(up: Cluster) -> dict[str, str]:
    """Secrets every replica of a service must share, made once per data dir: the audit
    signing key (checkpoints are verified with one key), unless configured."""
    if "HIPPO_AUDIT_SIGNING_KEY" in os.environ:
        return {}
    key = secret_file(up.data_dir / "cluster" / "audit-signing.key", new_signing_key)
    return {"HIPPO_AUDIT_SIGNING_KEY": key.decode().strip()}


def _make_certs(up: Cluster) -> None:
    """`--tls`: a throwaway CA under <data_dir>/tls, made afresh each start, and one
    certificate per service plus the operator's (the `hippo` commands)."""
    directory = up.data_dir / "tls"
    for old in ("ca.pem", "ca.key"):
        (directory / old).unlink(missing_ok=True)
    ca = Authority(directory)
    for name in [spec.name for spec in SERVICES] + ["operator"]:
        up.certs[name] = ca.issue(name)


def _start_postgres(up: Cluster, settings: CliSettings) -> str:
    port = settings.postgres_port or reserve_ports(1)[0]
    server = PostgresServer(up.data_dir / "cluster" / "postgres" / "data", port)
    server.start()
    up.postgres = server
    import psycopg  # cluster mode only

    with psycopg.connect(server.url(), autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if exists.fetchone() is None:
            conn.execute(f"CREATE DATABASE {DATABASE}")
    return server.url(DATABASE)


def _stop(up: Cluster) -> None:
    for replica in reversed(up.replicas):
        if replica.process is not None and replica.process.poll() is None:
            replica.process.send_signal(signal.SIGTERM)
    for replica in reversed(up.replicas):
        if replica.process is None:
            continue
        try:
            replica.process.wait(timeout=replica.grace + 5)
        except subprocess.TimeoutExpired:
            click.echo(f"  {replica.name} outlived its grace period; killing it", err=True)
            replica.process.kill()
            replica.process.wait()
        label = replica.name if up.cluster else replica.spec.name
        click.echo(f"  {label} stopped (exit code {replica.process.returncode})")
    if up.postgres is not None:
        up.postgres.stop()
        click.echo("  postgres stopped")
    endpoints.remove(up.data_dir)


async def _wait_ready(
    group: list[Replica],
    timeout: float,
    stopping: Callable[[], bool],
    tls: TlsSettings | None = None,
) -> bool:
    """True once every replica is SERVING; False if one dies, Ctrl-C arrives or time runs
    out."""
    waits = [
        asyncio.create_task(wait_serving(r.addr, r.spec.full_name, timeout, tls=tls)) for r in group
    ]
    try:
        while not all(w.done() for w in waits):
            dead = any(r.process is not None and r.process.poll() is not None for r in group)
            if dead or stopping():
                return False
            await asyncio.sleep(0.2)
        return all(w.result() for w in waits)
    finally:
        for w in waits:
            w.cancel()


def _supervise(up: Cluster, stopping: Callable[[], bool]) -> None:
    """Restart replicas that exit, with backoff, until asked to stop."""
    while not stopping():
        now = time.monotonic()
        for replica in up.replicas:
            process = replica.process
            if process is None:
                continue
            if process.poll() is None:
                if replica.crashes and now - replica.started > STABLE_S:
                    replica.crashes = 0
                continue
            if replica.restart_at is None:
                replica.crashes += 1
                wait = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** (replica.crashes - 1))
                replica.restart_at = now + wait
                click.echo(
                    f"\n{replica.name} exited ({process.returncode}); restarting in {wait:.1f} s "
                    f"(crash {replica.crashes} in a row). Last log lines:\n{_tail(replica.log, 5)}",
                    err=True,
                )
            elif now >= replica.restart_at:
                replica.start()
                up.save_endpoints()
                pid = replica.process.pid if replica.process is not None else 0
                click.echo(f"{replica.name} restarted (pid {pid})", err=True)
        time.sleep(0.2)


def _banner(up: Cluster, settings: CliSettings) -> None:
    mode = "cluster mode, PostgreSQL" if up.cluster else "embedded"
    mode += ", mTLS" if up.certs else ""
    click.echo(f"\nHippo is up ({mode}). Services:")
    for r in up.replicas:
        label = r.name if up.cluster else r.spec.name
        click.echo(f"  {label:<13} grpc {r.addr:<17} metrics {r.metrics}  log {r.log}")
        openai = r.env.get(f"{r.spec.env_prefix()}OPENAI_PORT", "0")
        if openai.isdigit() and int(openai):
            host, scheme = r.addr.rpartition(":")[0], "https" if up.certs else "http"
            click.echo(f"  {'':<13} OpenAI-compatible API {scheme}://{host}:{openai}/v1")
    if up.postgres is not None:
        click.echo(f"  {'postgres':<13} {up.postgres.url(DATABASE)}  data {up.postgres.data_dir}")
    gateway = endpoints.target([r.addr for r in up.of("gateway")])
    # The CLI's key, unless the operator configured the gateway's keys themselves.
    key = settings.api_key if "HIPPO_GATEWAY_API_KEYS" in up.wiring else "<your key>"
    operator = up.operator
    tls_env = ""
    channel = f"grpc.insecure_channel('{gateway}'"
    if operator is not None:
        # The operator's certificate: the gateway needs only the CA, the internal
        # services (hippo health, audit verify, reindex) the certificate too.
        tls_env = (
            "  (TLS: every service requires a certificate from this CA; the commands\n"
            "  below need the operator's)\n"
            f"  export HIPPO_CLI_TLS__CA_FILE={operator.ca_file}\n"
            f"  export HIPPO_CLI_TLS__CERT_FILE={operator.cert_file}\n"
            f"  export HIPPO_CLI_TLS__KEY_FILE={operator.key_file}\n"
        )
        channel = (
            f"grpc.secure_channel('{gateway}', "
            f"grpc.ssl_channel_credentials(open('{operator.ca_file}', 'rb').read())"
        )
    click.echo(
        "\nTry it (in another terminal; the commands find the replicas in "
        f"{endpoints.path(up.data_dir)}):\n" + tls_env + "  .venv/bin/hippo health\n"
        '  .venv/bin/hippo remember --user alice --session s1 "I moved to Lisbon in May"\n'
        '  .venv/bin/hippo recall "where does she live now?" --user alice\n'
        "  .venv/bin/hippo replay ../shared/data/locomo-dev.json   # a LoCoMo-format file\n"
        "\nor from Python with the generated stubs (the API key goes in the metadata):\n"
        "  import grpc\n"
        "  from hippo.memory.v1 import memory_pb2 as pb, memory_pb2_grpc as rpc\n"
        f"  stub = rpc.MemoryServiceStub({channel}"
        + (", options=[('grpc.lb_policy_name', 'round_robin')]))\n" if up.cluster else "))\n")
        + "  r = stub.Recall(pb.RecallRequest(scope=pb.Scope(user_id='alice'), query='Lisbon'),\n"
        f"                  metadata=[('x-api-key', '{key}')], timeout=5)\n"
        "  print([(h.memory.text, round(h.fused_score, 3)) for h in r.hits])\n"
        "\nA replica that exits is restarted. Ctrl-C stops everything gracefully."
    )


def up(
    settings: CliSettings, *, cluster: bool = False, replicas: int = 1, tls: bool = False
) -> int:
    data_dir = Path(settings.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    state = Cluster(data_dir, cluster)
    if tls:
        _make_certs(state)
    replicas = replicas if cluster else 1
    if "HIPPO_GATEWAY_API_KEYS" not in os.environ:
        # The CLI's key, an admin of tenant "local" (the `hippo audit` commands read the
        # log), unless the operator configured keys.
        state.wiring["HIPPO_GATEWAY_API_KEYS"] = json.dumps(
            {settings.api_key: {"tenant": "local", "roles": ["admin"]}}
        )
    stop = {"now": False}

    def on_signal(signum: int, _: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping = lambda: stop["now"]  # noqa: E731
    try:
        if cluster:
            click.echo("starting postgres ...", nl=False)
            started = time.monotonic()
            url = _start_postgres(state, settings)
            state.wiring.update(_cluster_secrets(state))
            click.echo(f" ready at {url} ({time.monotonic() - started:.1f} s)")
        for spec in SERVICES:
            click.echo(f"starting {spec.name} ...", nl=False)
            group = _replicas(spec, replicas, state)
            for replica in group:
                replica.start()
            state.replicas.extend(group)
            state.save_endpoints()
            state.wiring.update(_peer_wiring(group))
            started = time.monotonic()
            timeout = settings.startup_timeout_seconds
            ready = asyncio.run(_wait_ready(group, timeout, stopping, state.operator))
            if stop["now"]:
                click.echo(" interrupted")
                return 130
            if not ready:
                click.echo(" failed")
                for replica in group:
                    click.echo(
                        f"{replica.name} did not become SERVING; last log lines:\n"
                        f"{_tail(replica.log)}",
                        err=True,
                    )
                return 1
            where = ", ".join(r.addr for r in group)
            click.echo(f" SERVING on {where} ({time.monotonic() - started:.1f} s)")
        _banner(state, settings)
        _supervise(state, stopping)
        click.echo("\nstopping ...")
        return 0
    finally:
        _stop(state)
