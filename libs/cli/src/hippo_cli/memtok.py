"""`hippo memtok ...`: operator commands on the injection service's memtok store."""

from __future__ import annotations

import importlib
import sys

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
    if not module.store_path(settings).exists():
        click.echo(f"no memtok store at {module.store_path(settings)}", err=True)
        sys.exit(1)
    model, layer, done = module.rebuild(settings)
    click.echo(f"rebuilt {done} memtoks for {model} at layer {layer}")
