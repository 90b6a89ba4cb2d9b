"""`hippo audit verify | tail | show`: the audit log from the terminal.

`verify` and `tail` are operator commands that talk to the audit service directly
(`HIPPO_CLI_AUDIT_ADDR`); `show` goes through the gateway's public ListAuditEntries, so it
sees only the tenant of the CLI's API key, as any caller would.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
from datetime import UTC, datetime
from typing import Any

import click
from google.protobuf import json_format

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo.memory.v1 import memory_pb2
from hippo_cli import api
from hippo_cli.settings import CliSettings
from hippo_core import client

_PRIVATE = {
    audit_pb2.PRIVATE_STATE_READABLE: "readable",
    audit_pb2.PRIVATE_STATE_ERASED: "erased",
    audit_pb2.PRIVATE_STATE_SEALED: "sealed",
}


def _when(time_us: int) -> str:
    return datetime.fromtimestamp(time_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _line(seq: int, when: str, kind: str, user: str, session: str, ids: Any, body: Any) -> str:
    who = f"{user}/{session}" if session else user or "-"
    shown = ",".join(ids[:3]) + (f",+{len(ids) - 3}" if len(ids) > 3 else "")
    text = json.dumps(body, separators=(",", ":"), sort_keys=True)
    return f"#{seq:<7} {when}  {kind:<15} {who:<24} {shown or '-'}  {text}"


@click.group()
def audit() -> None:
    """Verify, follow and read the hash-chained audit log."""


@audit.command()
@click.option("--from", "from_seq", type=int, default=0, help="First seq (default: 1).")
@click.option("--to", "to_seq", type=int, default=0, help="Last seq (default: the head).")
@click.option("--chain-only", is_flag=True, help="Skip the signed checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@click.pass_obj
def verify(
    settings: CliSettings, from_seq: int, to_seq: int, chain_only: bool, as_json: bool
) -> None:
    """Recompute the hash chain and check it against the signed checkpoints (exit 1 if bad)."""

    async def call() -> tuple[audit_pb2.VerifyResponse, audit_pb2.HeadResponse]:
        async with client.channel(settings.audit_addr, tls_settings=settings.tls) as channel:
            stub = audit_pb2_grpc.AuditServiceStub(channel)
            head = await stub.Head(audit_pb2.HeadRequest(), timeout=settings.timeout_seconds)
            request = audit_pb2.VerifyRequest(
                from_seq=from_seq, to_seq=to_seq, chain_only=chain_only
            )
            # A long log takes a while: about 10 s per million entries.
            reply = await stub.Verify(request, timeout=max(settings.timeout_seconds, 3600))
            return reply, head

    reply, head = api.run(call())
    cp = reply.latest_checkpoint
    if as_json:
        out: dict[str, Any] = {
            "ok": reply.ok,
            "entries_checked": reply.entries_checked,
            "first_bad_seq": reply.first_bad_seq,
            "reason": reply.reason,
            "head_seq": reply.head_seq,
            "head_hash": reply.head_hash,
            "checkpoints_checked": reply.checkpoints_checked,
            "latest_checkpoint": (
                {
                    "size": cp.size,
                    "hash": cp.hash,
                    "time_us": cp.time_us,
                    "key_id": cp.key_id,
                    # Self-contained evidence: with the public key, anyone can check it
                    # later, off the cluster (docs/audit.md: export checkpoints).
                    "signature": base64.b64encode(cp.signature).decode(),
                }
                if reply.HasField("latest_checkpoint")
                else None
            ),
            "public_key": head.public_key.hex(),
            "writable": head.writable,
            "problem": head.problem,
        }
        click.echo(json.dumps(out))
    else:
        verdict = "OK" if reply.ok else f"FAILED at entry {reply.first_bad_seq}: {reply.reason}"
        click.echo(f"audit log {verdict}")
        click.echo(f"  entries checked   {reply.entries_checked} (head {reply.head_seq})")
        click.echo(f"  head hash         {reply.head_hash}")
        if chain_only:
            click.echo("  checkpoints       not checked (--chain-only)")
        elif reply.HasField("latest_checkpoint"):
            click.echo(
                f"  checkpoints       {reply.checkpoints_checked} valid; latest covers "
                f"{cp.size} entries, signed {_when(cp.time_us)} UTC by key {cp.key_id}"
            )
        else:
            click.echo("  checkpoints       none yet")
        click.echo(f"  signing key       ed25519 {head.public_key.hex()}")
        if not head.writable:
            click.echo(f"  writes refused    {head.problem}")
    sys.exit(0 if reply.ok else 1)


@audit.command()
@click.option("--tenant", default="local", show_default=True, help="Whose entries.")
@click.option("--user", default="", help="Only this user's entries.")
@click.option("--session", default="", help="Only this session's entries.")
@click.option("--type", "types", multiple=True, help="Only these event types (repeatable).")
@click.option("--last", type=int, default=10, show_default=True, help="Start this far back.")
@click.option("--private", is_flag=True, help="Also print the decrypted private details.")
@click.pass_obj
def tail(
    settings: CliSettings,
    tenant: str,
    user: str,
    session: str,
    types: tuple[str, ...],
    last: int,
    private: bool,
) -> None:
    """Print new audit entries as they are appended, until Ctrl-C."""

    async def follow() -> None:
        async with client.channel(settings.audit_addr, tls_settings=settings.tls) as channel:
            stub = audit_pb2_grpc.AuditServiceStub(channel)
            head = await stub.Head(audit_pb2.HeadRequest(), timeout=settings.timeout_seconds)
            request = audit_pb2.StreamRequest(
                tenant=tenant,
                user_id=user,
                session_id=session,
                event_types=list(types),
                after_seq=max(0, head.seq - max(last, 0)),
                include_private=private,
            )
            # A follower has no natural end: a day-long deadline, renewed by running again.
            async for message in stub.Stream(request, timeout=24 * 3600):
                for e in message.entries:
                    body = json_format.MessageToDict(e.body)
                    if e.private_state in _PRIVATE:
                        state = _PRIVATE[e.private_state]
                        private_body = json_format.MessageToDict(e.private_body)
                        body["private"] = private_body if state == "readable" else state
                    line = _line(
                        e.seq,
                        _when(e.time_us),
                        e.event_type,
                        e.user_id,
                        e.session_id,
                        list(e.memory_ids),
                        body,
                    )
                    click.echo(line)

    with contextlib.suppress(KeyboardInterrupt):
        api.run(follow())


@audit.command()
@click.option("--user", required=True, help="Whose entries (in the CLI key's tenant).")
@click.option("--session", default="", help="Only this session's entries.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def show(settings: CliSettings, user: str, session: str, as_json: bool) -> None:
    """Every audit entry of a user (or session), oldest first, through the gateway."""

    async def call() -> list[memory_pb2.AuditEntry]:
        out: list[memory_pb2.AuditEntry] = []
        token = ""
        async with api.gateway(settings) as stub:
            while True:
                page = await stub.ListAuditEntries(
                    memory_pb2.ListAuditEntriesRequest(
                        scope=memory_pb2.Scope(user_id=user, session_id=session),
                        page_size=1000,
                        page_token=token,
                    ),
                    metadata=api.metadata(settings),
                    timeout=settings.timeout_seconds,
                )
                out.extend(page.entries)
                token = page.next_page_token
                if not token:
                    return out

    found = api.run(call())
    for e in found:
        if as_json:
            click.echo(json.dumps(json_format.MessageToDict(e, preserving_proto_field_name=True)))
        else:
            when = e.time.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")
            body = json_format.MessageToDict(e.body)
            click.echo(
                _line(e.seq, when, e.event_type, e.user_id, e.session_id, list(e.memory_ids), body)
            )
    if not found and not as_json:
        click.echo(
            f"no audit entries for user {user!r}" + (f", session {session!r}" if session else "")
        )
