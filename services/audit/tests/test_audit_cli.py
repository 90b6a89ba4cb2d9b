"""`hippo audit verify` and `hippo audit tail` against a real audit process."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
from google.protobuf import struct_pb2

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core.testing import service_process, wait_for

HIPPO = str(Path(sys.executable).parent / "hippo")
SERVICE = "hippo.audit.v1.AuditService"


def _append(addr: str, user: str, n: int) -> None:
    body = struct_pb2.Struct()
    body.update({"candidates": 2})
    with grpc.insecure_channel(addr) as channel:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        for _ in range(n):
            entry = audit_pb2.NewEntry(
                tenant="local", actor="gateway", event_type="recall", user_id=user, body=body
            )
            stub.Append(audit_pb2.AppendRequest(entries=[entry]), timeout=10)


def test_verify_reports_ok_then_the_first_bad_entry(tmp_path: Path) -> None:
    env = {"HIPPO_AUDIT_DATA_DIR": str(tmp_path), "HIPPO_AUDIT_GRACE_SECONDS": "2"}
    with service_process("hippo_audit", "HIPPO_AUDIT_", env) as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        _append(proc.addr, "alice", 5)
        cli = {**os.environ, "HIPPO_CLI_AUDIT_ADDR": proc.addr}
        ok = subprocess.run([HIPPO, "audit", "verify"], env=cli, capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith("audit log OK") and "entries checked   5" in ok.stdout
        with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:  # an attacker's edit
            conn.execute("DROP TRIGGER entries_are_never_updated")
            conn.execute("UPDATE entries SET user_id = 'mallory' WHERE seq = 3")
        bad = subprocess.run(
            [HIPPO, "audit", "verify", "--json"], env=cli, capture_output=True, text=True
        )
        assert bad.returncode == 1, bad.stderr
        report = json.loads(bad.stdout)
        assert report["ok"] is False and report["first_bad_seq"] == 3
        assert report["reason"].startswith("hash mismatch") and report["head_seq"] == 5
        assert report["latest_checkpoint"] is None and len(report["public_key"]) == 64


def test_tail_prints_new_entries(tmp_path: Path) -> None:
    env = {"HIPPO_AUDIT_DATA_DIR": str(tmp_path), "HIPPO_AUDIT_GRACE_SECONDS": "2"}
    with service_process("hippo_audit", "HIPPO_AUDIT_", env) as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        _append(proc.addr, "alice", 2)
        cli = {**os.environ, "HIPPO_CLI_AUDIT_ADDR": proc.addr}
        tail = subprocess.Popen(
            [HIPPO, "audit", "tail", "--user", "bob", "--last", "100"],
            env=cli,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(1)
            _append(proc.addr, "bob", 1)
            _append(proc.addr, "alice", 1)
            _append(proc.addr, "bob", 1)
            assert tail.stdout is not None
            lines = [tail.stdout.readline(), tail.stdout.readline()]
        finally:
            tail.terminate()
            tail.wait(timeout=10)
    assert [line.split()[0] for line in lines] == ["#3", "#5"]
    assert all(" recall " in line and " bob " in line for line in lines)
