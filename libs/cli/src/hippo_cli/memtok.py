"""`hippo memtok ...`: operator commands on the injection service's memtok store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click


@click.group()
def memtok() -> None:
    """The memtok store (influence memory) of the injection service."""


@memtok.command()
def rebuild() -> None:
    """Rebuild value vectors from the source words for the current model and layer.

    Runs the injection package's own `hippo-memtok-rebuild` with the injection service's
    settings (HIPPO_INJECTION_*); stop the service first (the store has one owner)."""
    script = shutil.which(
        "hippo-memtok-rebuild",
        path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    if script is None:
        click.echo(
            "error: hippo-memtok-rebuild not found: the injection package is not installed "
            "in this environment",
            err=True,
        )
        sys.exit(2)
    sys.exit(subprocess.run([script], check=False).returncode)


@memtok.command()
@click.option("--user", "user", required=True, help="The user whose mode to record.")
@click.option("--tenant", default="local", show_default=True)
@click.argument("mode", type=click.Choice(["off", "disclose_only", "on", "default"]))
@click.pass_obj
def mode(settings: Any, user: str, tenant: str, mode: str) -> None:
    """Record a user's influence MODE (used when a Chat names none; default clears it)."""
    from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
    from hippo_cli import api
    from hippo_core import client

    values = {
        "off": injection_pb2.INFLUENCE_MODE_OFF,
        "disclose_only": injection_pb2.INFLUENCE_MODE_DISCLOSE_ONLY,
        "on": injection_pb2.INFLUENCE_MODE_ON,
        "default": injection_pb2.INFLUENCE_MODE_UNSPECIFIED,
    }

    async def call() -> int:
        async with client.channel(settings.injection_addr, tls_settings=settings.tls) as channel:
            stub = injection_pb2_grpc.InjectionServiceStub(channel)
            request = injection_pb2.SetUserInfluenceRequest(
                tenant=tenant, user_id=user, mode=values[mode]
            )
            reply = await stub.SetUserInfluence(request, timeout=settings.timeout_seconds)
            return int(reply.mode)

    recorded = api.run(call())
    names = {int(v): k for k, v in values.items()}
    click.echo(f"influence for {tenant}/{user}: {names.get(recorded, str(recorded))}")
