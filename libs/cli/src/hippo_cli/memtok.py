"""`hippo memtok ...`: operator commands on the injection service's memtok store."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click


@click.group()
def memtok() -> None:
    """The memtok store (influence memory) of the injection service."""


@memtok.command()
def rebuild() -> None:
    """Rebuild value vectors from the source words for the current model and layer.

    Reads the injection service's settings (HIPPO_INJECTION_*); stop the service first
    (the store has one owner)."""
    module = importlib.import_module("hippo_injection.memtok_rebuild")
    settings_module = importlib.import_module("hippo_injection.settings")
    settings = settings_module.InjectionSettings()
    where = module.missing(settings)  # cluster mode: the database is the store
    if where:
        click.echo(f"no memtok store at {where}", err=True)
        sys.exit(1)
    model, layer, done = module.rebuild(settings)
    click.echo(f"rebuilt {done} memtoks for {model} at layer {layer}")


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
