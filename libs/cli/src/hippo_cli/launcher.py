"""`hippo up`: every service as a local process on loopback, until Ctrl-C.

Start order follows the registry; each service must be SERVING before the next starts
(later services depend on earlier ones). Logs go to var/log/<service>.log as JSON lines.
Ctrl-C or SIGTERM sends SIGTERM to every service, newest first, waits for their graceful
stop, and kills only what outlives its grace period.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from hippo_cli.health import wait_serving
from hippo_cli.registry import SERVICES, ServiceSpec
from hippo_cli.settings import CliSettings


@dataclass
class Running:
    spec: ServiceSpec
    process: subprocess.Popen[bytes]
    addr: str
    metrics: str
    log: Path
    grace: float


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _start(spec: ServiceSpec, data_dir: Path, wiring: dict[str, str]) -> Running:
    os.environ.update(wiring)  # so spec.settings() below reads what the process will
    settings = spec.settings()
    host, port = settings.host, settings.port
    metrics_port = settings.metrics_port
    log = data_dir / "log" / f"{spec.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **wiring, "HF_HUB_OFFLINE": "1"}
    if hasattr(settings, "data_dir"):  # stateful services keep their files under var/<name>
        env.setdefault(f"{spec.env_prefix()}DATA_DIR", str(data_dir / spec.name))
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", spec.module], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return Running(
        spec,
        process,
        f"{host}:{port}",
        f"http://{host}:{metrics_port}/metrics",
        log,
        float(settings.grace_seconds),
    )


def _wiring(settings: CliSettings) -> dict[str, str]:
    """What the local cluster needs that a bare service would not assume: the CLI's key,
    accepted for tenant "local", unless the operator configured keys themselves."""
    if "HIPPO_GATEWAY_API_KEYS" in os.environ:
        return {}
    return {"HIPPO_GATEWAY_API_KEYS": json.dumps({settings.api_key: "local"})}


def _peer_addresses(started: Running) -> dict[str, str]:
    """Tell every later service where `started` listens (`HIPPO_<SVC>_<PEER>_ADDR`), unless
    the operator set that address explicitly."""
    out = {}
    settings = started.spec.settings()
    # A service with an HTTP API next to gRPC (the LLM host's TGI API) is what later
    # services' `llm_url` points at.
    http_port = getattr(settings, "http_port", None)
    for spec in SERVICES:
        fields = spec.settings_type().model_fields
        name = f"{spec.env_prefix()}{started.spec.name.upper()}_ADDR"
        if f"{started.spec.name}_addr" in fields and name not in os.environ:
            out[name] = started.addr
        url = f"{spec.env_prefix()}LLM_URL"
        if http_port and "llm_url" in fields and url not in os.environ:
            out[url] = f"http://{settings.host}:{http_port}"
    return out


def _stop(running: list[Running]) -> None:
    for item in reversed(running):
        if item.process.poll() is None:
            item.process.send_signal(signal.SIGTERM)
    for item in reversed(running):
        try:
            item.process.wait(timeout=item.grace + 5)
        except subprocess.TimeoutExpired:
            click.echo(f"  {item.spec.name} outlived its grace period; killing it", err=True)
            item.process.kill()
            item.process.wait()
        click.echo(f"  {item.spec.name} stopped (exit code {item.process.returncode})")


async def _wait_ready(item: Running, timeout: float, stopping: Callable[[], bool]) -> bool:
    """True once SERVING; False if the process dies, Ctrl-C arrives or time runs out."""
    ready = asyncio.create_task(wait_serving(item.addr, item.spec.full_name, timeout))
    while not ready.done():
        if item.process.poll() is not None or stopping():
            ready.cancel()
            return False
        await asyncio.sleep(0.2)
    return ready.result()


def _banner(running: list[Running], settings: CliSettings) -> None:
    click.echo("\nHippo is up. Services:")
    for item in running:
        click.echo(
            f"  {item.spec.name:<11} grpc {item.addr:<17} metrics {item.metrics}  log {item.log}"
        )
    gateway = next(item.addr for item in running if item.spec.name == "gateway")
    key = settings.api_key if "HIPPO_GATEWAY_API_KEYS" not in os.environ else "<your key>"
    click.echo(
        "\nTry it (in another terminal):\n"
        "  .venv/bin/hippo health\n"
        '  .venv/bin/hippo remember --user alice --session s1 "I moved to Lisbon in May"\n'
        '  .venv/bin/hippo recall "where does she live now?" --user alice\n'
        "  .venv/bin/hippo replay ../shared/data/locomo-dev.json   # a LoCoMo-format file\n"
        "\nor from Python with the generated stubs (the API key goes in the metadata):\n"
        "  import grpc\n"
        "  from hippo.memory.v1 import memory_pb2 as pb, memory_pb2_grpc as rpc\n"
        f"  stub = rpc.MemoryServiceStub(grpc.insecure_channel('{gateway}'))\n"
        "  r = stub.Recall(pb.RecallRequest(scope=pb.Scope(user_id='alice'), query='Lisbon'),\n"
        f"                  metadata=[('x-api-key', '{key}')], timeout=5)\n"
        "  print([(h.memory.text, round(h.fused_score, 3)) for h in r.hits])\n"
        "\nCtrl-C stops everything gracefully."
    )


def up(settings: CliSettings) -> int:
    data_dir = Path(settings.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    running: list[Running] = []
    wiring = _wiring(settings)
    stop = {"now": False}

    def on_signal(signum: int, _: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for spec in SERVICES:
            click.echo(f"starting {spec.name} ...", nl=False)
            item = _start(spec, data_dir, wiring)
            running.append(item)
            wiring.update(_peer_addresses(item))
            started = time.monotonic()
            ready = asyncio.run(
                _wait_ready(item, settings.startup_timeout_seconds, lambda: stop["now"])
            )
            if stop["now"]:
                click.echo(" interrupted")
                return 130
            if not ready:
                click.echo(" failed")
                click.echo(
                    f"{spec.name} did not become SERVING; last log lines:\n{_tail(item.log)}",
                    err=True,
                )
                return 1
            click.echo(f" SERVING on {item.addr} ({time.monotonic() - started:.1f} s)")
        _banner(running, settings)
        while not stop["now"]:
            for item in running:
                if item.process.poll() is not None:
                    click.echo(
                        f"\n{item.spec.name} exited ({item.process.returncode}):\n"
                        + _tail(item.log),
                        err=True,
                    )
                    return 1
            time.sleep(0.3)
        click.echo("\nstopping ...")
        return 0
    finally:
        _stop(running)
