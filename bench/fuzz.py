"""Fuzzing the public API as a benchmark: no generated request may reach INTERNAL or
UNKNOWN, hang, or take a service out of SERVING.

A local cluster is started through the same launcher as `make run` (the embedded
default: every service, the injection host with its CPU LLM included), then every public
RPC of `hippo.memory.v1.MemoryService` gets `--per-rpc` generated requests (Chat a small
`--chat` sample: each one generates with the CPU LLM, seconds per call), a few dozen in
flight. Requests are sent as raw bytes through a generic call (no serializer), so the
fuzzer can send what no stub would:

  valid      well-formed requests on a few fuzz users and many sessions (they write)
  field      a well-formed message whose fields take boundary and malformed values:
             ints 0/-1/2^31-1/-2^31/2^63-1/2^64-1, strings empty, at and over their
             byte limits (ASCII and multi-byte), NUL, zero-width and bidi characters,
             BOMs, control tokens (<start_of_turn>), metadata at and over every limit,
             timestamps at and beyond 0001..9999 and the epoch, unknown enum values
  wire       bytes no encoder writes: random bytes, truncated and bit-flipped
             encodings, invalid UTF-8 (lone surrogates, overlong forms) inside string
             fields, unknown and duplicated fields, nesting deeper than the parser's
             recursion limit, length prefixes longer than the message

Reported per RPC: the count of each status code, INTERNAL and UNKNOWN (target 0), hangs
(calls still unanswered after `--hang-seconds`, which no call should ever need: target 0)
and, at the end, whether every service still answers SERVING on grpc.health.v1. The
first examples of each INTERNAL/UNKNOWN/hang are written to bench/out/fuzz.json with the
request bytes (hex), to reproduce them. The generator is importable
(`Generator(seed).request(rpc)`): the gateway's tests run a fixed sample of it.

    .venv/bin/python bench/fuzz.py [--per-rpc 10000] [--seed 1] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hippo.memory.v1 import memory_pb2

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
SERVICE = "hippo.memory.v1.MemoryService"


@dataclass(frozen=True)
class Rpc:
    name: str
    request: type[Message]
    streaming: bool = False  # a server stream of replies
    uploading: bool = False  # a client stream of requests

    @property
    def path(self) -> str:
        return f"/{SERVICE}/{self.name}"


RPCS: tuple[Rpc, ...] = (
    Rpc("Remember", memory_pb2.RememberRequest),
    Rpc("Recall", memory_pb2.RecallRequest),
    Rpc("BuildContext", memory_pb2.BuildContextRequest),
    Rpc("GetSession", memory_pb2.GetSessionRequest),
    Rpc("VerifyAudit", memory_pb2.VerifyAuditRequest),
    Rpc("ListAuditEntries", memory_pb2.ListAuditEntriesRequest),
    Rpc("ReportOutcome", memory_pb2.ReportOutcomeRequest),
    Rpc("ListMemories", memory_pb2.ListMemoriesRequest),
    Rpc("GetMemory", memory_pb2.GetMemoryRequest),
    Rpc("ListSessions", memory_pb2.ListSessionsRequest),
    Rpc("ListUsers", memory_pb2.ListUsersRequest),
    Rpc("Chat", memory_pb2.ChatRequest, streaming=True),
    Rpc("UpdateMemoryMetadata", memory_pb2.UpdateMemoryMetadataRequest),
    # After the reads and the metadata change: by then they have stored memories to reach.
    Rpc("Forget", memory_pb2.ForgetRequest),
    Rpc("ExportUser", memory_pb2.ExportUserRequest, streaming=True),
    Rpc("ImportTurns", memory_pb2.ImportTurnsRequest, uploading=True),
)
BY_NAME = {r.name: r for r in RPCS}

# -- values ----------------------------------------------------------------------------

INT32 = [0, 1, -1, 2, 10, 100, 101, 255, 256, 1000, 1001, 2048, 2049, 131072, 131073]
INT32 += [2**31 - 1, -(2**31), 2**15, -(2**15)]
UINT64 = [0, 1, 2, 7, 1000, 2**31 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
INT64 = [0, -1, 1, -(2**63), 2**63 - 1, 2**31, -(2**31)]
SECONDS = [0, -1, 1, 1_683_504_000, -62_135_596_800, -62_135_596_801]
SECONDS += [253_402_300_799, 253_402_300_800, 2**63 - 1, -(2**63), -2_208_988_800]
NANOS = [0, 1, 999_999_999, 1_000_000_000, -1, 2**31 - 1, -(2**31)]
ODD = [
    "\x00",
    "a\x00b",
    "\u200b",
    "\ufeff",
    "\u200b\ufeff\u2060",
    "\u202e\u2066evil\u2069",
    "\u200f\u200e",
    "\u3164",
    "\u00a0",
    "\r\n\t\x0b\x0c",
    "\x01\x02\x1b[31m\x7f",
    "<start_of_turn>user\n",
    "<end_of_turn>",
    "<bos><eos><pad>",
    "</memory><memory>",
    '"><script>',
    "e\u0301\u0301\u0301\u0301",
    "\U0001f600\U0001f469\u200d\U0001f4bb",
    "\uffff\ufffe\U0010ffff",
    "\u0000\u0001" * 8,
    "%s%n{0}${x}",
    "' OR 1=1 --",
    "../../etc/passwd",
]
WORDS = "alpha beta gamma delta handleSubmit ERR_CONNECTION_REFUSED Caroline adopted a puppy"
WORDS += " meeting Tuesday 3pm invoice 42 Lisbon blue whale jazz sourdough"
WORDS_LIST = WORDS.split()
# Byte limits of memory.proto.
TEXT, QUERY, NOTE, META_VALUE, META_KEY, STOP = 32 * 1024, 4 * 1024, 4 * 1024, 1024, 64, 64
LONE_SURROGATE = b"\xed\xa0\x80"
BAD_UTF8 = [LONE_SURROGATE, b"\xff", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"a\x80"]


class Generator:
    """Requests for every public RPC, reproducible from `seed`. `request(rpc)` returns
    (kind, the serialized bytes): kind is valid, field or wire."""

    def __init__(self, seed: int, users: int = 8, sessions: int = 400) -> None:
        self.rng = random.Random(seed)
        self.users = [f"fz{seed}-u{i}" for i in range(users)]
        self.sessions = [f"s{i}" for i in range(sessions)]
        self.memory_ids: list[str] = []  # seen in replies, for Forget (the runner adds)
        self.audit_seqs: list[int] = []  # seen in replies, for ReportOutcome
        # (user, memory id) pairs listed by ListMemories: stored and whose owner is known,
        # so GetMemory and UpdateMemoryMetadata also reach the memory, not only NOT_FOUND.
        self.owned: list[tuple[str, str]] = []

    # -- primitives ------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def words(self, lo: int = 1, hi: int = 12) -> str:
        return " ".join(self.rng.choices(WORDS_LIST, k=self.rng.randint(lo, hi)))

    def odd_text(self, limit: int) -> str:
        r = self.rng.random()
        if r < 0.35:
            return self.rng.choice(ODD) * self.rng.randint(1, 3)
        if r < 0.5:
            return self.words() + self.rng.choice(ODD) + self.words()
        if r < 0.6:
            return ""
        if r < 0.7:
            return "a" * self.rng.choice([limit - 1, limit, limit + 1])
        if r < 0.8:  # multi-byte right at / over the byte limit
            return "é" * (limit // 2) + self.rng.choice(["", "x"])
        if r < 0.85:
            return "\U0001f600" * (limit // 4 + self.rng.choice([0, 1]))
        if r < 0.9:
            return "x" * self.rng.choice([limit * 4, 300_000])
        return "".join(chr(self.rng.randint(1, 0xD7FF)) for _ in range(self.rng.randint(1, 64)))

    def text(self, limit: int, p_odd: float) -> str:
        return self.odd_text(limit) if self.chance(p_odd) else self.words()

    def ident(self, p_odd: float, pool: Sequence[str]) -> str:
        if not self.chance(p_odd):
            return self.rng.choice(pool)
        return self.rng.choice(
            [
                "",
                "a" * 128,
                "a" * 129,
                "has space",
                "ü-user",
                "a\x00b",
                "\u200b",
                "../x",
                "x" * 10_000,
                self.rng.choice(ODD),
                "-",
                ".",
                "a:b@c.d-e_f",
            ]
        )

    def int32(self, valid: Sequence[int], p_odd: float) -> int:
        return self.rng.choice(INT32) if self.chance(p_odd) else self.rng.choice(valid)

    def enum(self, valid: Sequence[int], p_odd: float) -> Any:  # Any: the stubs' enum types
        if self.chance(p_odd):
            return self.rng.choice([0, -1, 99, 2**31 - 1, -(2**31), max(valid) + 1])
        return self.rng.choice(valid)

    def timestamp(self, target: Any, p_odd: float) -> None:
        if self.chance(p_odd):
            target.seconds = self.rng.choice(SECONDS)
            target.nanos = self.rng.choice(NANOS)
        else:
            target.seconds = self.rng.randint(1_500_000_000, 1_800_000_000)
            target.nanos = self.rng.randrange(1_000_000_000)

    def scope(self, target: memory_pb2.Scope, p_odd: float, session: bool = True) -> None:
        target.user_id = self.ident(p_odd, self.users)
        if session or self.chance(0.5):
            target.session_id = self.ident(p_odd, self.sessions)

    def metadata(self, p_odd: float) -> dict[str, str]:
        if not self.chance(p_odd):
            out = {"speaker": self.rng.choice(["Caroline", "Melanie", "bot"])}
            return out if self.chance(0.5) else {}
        r = self.rng.random()
        if r < 0.2:
            return {f"k{i}": "v" for i in range(self.rng.choice([32, 33, 200]))}
        if r < 0.4:
            return {"k" * self.rng.choice([64, 65, 1000]): "v"}
        if r < 0.6:
            return {"k": "v" * self.rng.choice([1024, 1025, 100_000])}
        if r < 0.7:
            return {"speaker": "s" * self.rng.choice([256, 257, 1024])}
        if r < 0.8:
            return {"attachment": self.odd_text(META_VALUE)}
        return {self.rng.choice(ODD) or "k": self.rng.choice(ODD)}

    def filter(self, p_odd: float) -> dict[str, str]:
        """A metadata filter: mostly none or a declared key, else undeclared keys, too
        many entries or odd values."""
        if not self.chance(p_odd):
            if self.chance(0.7):
                return {}
            return {"speaker": self.rng.choice(["Caroline", "Melanie", "bot"])}
        r = self.rng.random()
        if r < 0.3:
            return {"not-declared": "x"}
        if r < 0.5:
            return {"speaker": self.odd_text(META_VALUE)}
        if r < 0.7:
            return {f"k{i}": "v" for i in range(self.rng.choice([8, 9, 100]))}
        return self.metadata(1.0)

    # -- messages --------------------------------------------------------------------

    def message(self, rpc: str, p_odd: float) -> Message:
        build: Callable[[float], Message] = getattr(self, f"_{rpc.lower()}")
        return build(p_odd)

    def _remember(self, p: float) -> Message:
        m = memory_pb2.RememberRequest()
        self.scope(m.scope, p)
        n = self.rng.choice([0, 64, 65, 200]) if self.chance(p / 4) else self.rng.randint(1, 3)
        roles = [1, 2, 3, 4]
        for i in range(n):
            t = m.turns.add()
            t.role = self.enum(roles, p)
            # Big texts only in a few turns: every turn is embedded.
            t.text = self.text(TEXT, p if i < 3 else 0.0)
            if self.chance(0.5):
                self.timestamp(t.time, p)
            if self.chance(0.3):
                t.client_id = self.ident(p, [f"c{self.rng.randrange(10**6)}", "dup", "dup"])
            for k, v in self.metadata(p).items():
                t.metadata[k] = v
        if self.chance(0.3):
            m.idempotency_key = self.ident(p, [f"k{self.rng.randrange(10**6)}"])
        m.wait_searchable = self.chance(0.05)
        return m

    def _recall(self, p: float) -> Message:
        m = memory_pb2.RecallRequest()
        self.scope(m.scope, p, session=False)
        m.query = self.text(QUERY, p)
        m.mode = self.enum([0, 1, 2, 3], p)
        m.top_k = self.int32([0, 1, 5, 10, 100], p)
        if self.chance(0.3):
            self.timestamp(m.time_range.start, p)
        if self.chance(0.3):
            self.timestamp(m.time_range.end, p)
        roles = self.rng.choice([0, 5, 50]) if self.chance(p / 2) else self.rng.randint(0, 2)
        for _ in range(roles):
            m.roles.append(self.enum([1, 2, 3, 4], p))
        for k, v in self.filter(p).items():
            m.metadata[k] = v
        return m

    def _forget(self, p: float) -> Message:
        m = memory_pb2.ForgetRequest()
        which = self.rng.random()
        if which < 0.6 or self.chance(p / 4):
            self.scope(m.memory_ids.scope, p, session=False)
            known = self.memory_ids or ["m-none"]
            n = self.rng.choice([0, 1000, 1001]) if self.chance(p / 4) else self.rng.randint(1, 4)
            for _ in range(n):
                m.memory_ids.memory_ids.append(
                    self.ident(p, known) if n < 50 else f"m{self.rng.randrange(10**9)}"
                )
        elif which < 0.8:
            self.scope(m.session, p)
        elif which < 0.95:
            m.user_id = self.ident(p, self.users)
        return m  # else: no target at all

    def _buildcontext(self, p: float) -> Message:
        m = memory_pb2.BuildContextRequest()
        self.scope(m.scope, p)
        m.query = self.text(QUERY, p)
        m.token_budget = self.int32([0, 256, 512, 2048], p)
        m.layout = self.enum([0, 1, 2, 3], p)
        m.mode = self.enum([0, 1, 2, 3], p)
        m.top_k = self.int32([0, 1, 10, 100], p)
        return m

    def _getsession(self, p: float) -> Message:
        m = memory_pb2.GetSessionRequest()
        self.scope(m.scope, p)
        return m

    def _verifyaudit(self, p: float) -> Message:
        m = memory_pb2.VerifyAuditRequest()
        if self.chance(p):
            m.from_seq, m.to_seq = self.rng.choice(UINT64), self.rng.choice(UINT64)
        elif self.chance(0.3):  # a small range keeps most Verify calls cheap
            m.from_seq = self.rng.randint(1, 50)
            m.to_seq = m.from_seq + self.rng.randint(0, 50)
        else:
            m.from_seq = m.to_seq = self.rng.randint(1, 500)
        return m

    def _listauditentries(self, p: float) -> Message:
        m = memory_pb2.ListAuditEntriesRequest()
        self.scope(m.scope, p, session=False)
        m.page_size = self.int32([0, 1, 10, 100, 1000], p)
        if self.chance(p):
            m.page_token = self.rng.choice(
                [
                    "garbage",
                    "v1.",
                    "v1.e30",  # {}
                    "v1.eyJhIjotMSwicyI6IngifQ",  # {"a":-1,"s":"x"}
                    "v1.eyJhIjoxZTMwMCwicyI6IngifQ",  # {"a":1e300,...}
                    "v2." + "A" * 40,
                    "v1." + "=" * 3,
                    self.odd_text(512),
                ]
            )
        return m

    def page_token(self, p: float) -> str:
        if not self.chance(p):
            return ""
        return self.rng.choice(
            [
                "garbage",
                "v1.",
                "v1.e30",  # {}
                "v1.eyJrIjpbLTEsMF0sImIiOiJ4In0",  # {"k":[-1,0],"b":"x"}
                "v1.eyJrIjpbMWUzMDAsMV0sImIiOiJ4In0",  # {"k":[1e300,1],"b":"x"}
                "v1.eyJrIjpudWxsfQ",  # {"k":null}
                "v2." + "A" * 40,
                "v1." + "A" * 2000,
                self.odd_text(512),
            ]
        )

    def _listmemories(self, p: float) -> Message:
        m = memory_pb2.ListMemoriesRequest()
        self.scope(m.scope, p, session=False)
        if self.chance(0.5):
            self.timestamp(m.time_range.start, p)
        if self.chance(0.3):
            self.timestamp(m.time_range.end, p)
        for _ in range(self.rng.choice([0, 0, 1, 2, 5]) if self.chance(p) else 1):
            if self.chance(0.4):
                m.roles.append(self.enum([1, 2, 3, 4], p))
        m.order = self.enum([0, 1, 2], p)
        m.page_size = self.int32([0, 1, 10, 50, 1000], p)
        m.page_token = self.page_token(p)
        for k, v in self.filter(p).items():
            m.metadata[k] = v
        return m

    def _memory(self, p: float) -> tuple[str, str]:
        """(user_id, memory_id): often a stored memory with its owner, else odd ones."""
        if self.owned and self.chance(0.5) and not self.chance(p):
            return self.rng.choice(self.owned)
        user = self.ident(p, self.users)
        if self.memory_ids and not self.chance(p):
            return user, self.rng.choice(self.memory_ids)
        return user, self.ident(p, ["m-absent", "0" * 32])

    def _getmemory(self, p: float) -> Message:
        m = memory_pb2.GetMemoryRequest()
        m.user_id, m.memory_id = self._memory(p)
        return m

    def _listsessions(self, p: float) -> Message:
        m = memory_pb2.ListSessionsRequest()
        m.user_id = self.ident(p, self.users)
        m.page_size = self.int32([0, 1, 10, 50, 1000], p)
        m.page_token = self.page_token(p)
        return m

    def _listusers(self, p: float) -> Message:
        m = memory_pb2.ListUsersRequest()
        m.page_size = self.int32([0, 1, 10, 50, 1000], p)
        m.page_token = self.page_token(p)
        return m

    def _updatememorymetadata(self, p: float) -> Message:
        m = memory_pb2.UpdateMemoryMetadataRequest()
        m.user_id, m.memory_id = self._memory(p)
        for k, v in self.metadata(p).items():
            m.set[k] = v
        n = self.rng.choice([0, 32, 33, 500]) if self.chance(p / 2) else self.rng.randint(0, 2)
        for _ in range(n):
            m.remove.append(self.rng.choice(["speaker", "k", "topic"]) if n < 3 else self.words())
        return m

    def _exportuser(self, p: float) -> Message:
        return memory_pb2.ExportUserRequest(user_id=self.ident(p, self.users))

    def _importturns(self, p: float) -> Message:
        m = memory_pb2.ImportTurnsRequest()
        n = self.rng.choice([0, 256, 257]) if self.chance(p / 4) else self.rng.randint(1, 3)
        for i in range(n):
            r = m.records.add()
            odd = p if i < 3 else 0.0  # big or odd values in a few records only
            known = self.memory_ids or ["m-none"]
            r.memory_id = (
                self.ident(odd, known) if self.chance(0.3) else f"imp-{self.rng.randrange(10**9)}"
            )
            self.scope(r.scope, odd)
            r.role = self.enum([1, 2, 3, 4], odd)
            r.text = self.text(TEXT, odd)
            if self.chance(0.8):
                self.timestamp(r.time, odd)
            for k, v in self.metadata(odd).items():
                r.metadata[k] = v
            if self.chance(0.2):
                r.sequence = self.rng.choice([0, -1, 2**62])
        return m

    def _reportoutcome(self, p: float) -> Message:
        m = memory_pb2.ReportOutcomeRequest()
        self.scope(m.scope, p, session=False)
        seqs = self.audit_seqs or [1]
        m.audit_seq = self.rng.choice(UINT64) if self.chance(p) else self.rng.choice(seqs)
        m.kind = self.enum([1, 2, 3, 4], p)
        m.note = self.text(NOTE, p) if self.chance(0.7) else ""
        return m

    def _chat(self, p: float) -> Message:
        m = memory_pb2.ChatRequest()
        self.scope(m.scope, p)
        m.message = self.text(TEXT, p)
        m.token_budget = self.int32([0, 512], p)
        m.params.max_new_tokens = self.int32([1, 4, 8], p / 2)
        if self.chance(p):
            m.params.temperature = self.rng.choice([float("nan"), float("inf"), -1.0, 2.5, 2.0])
            m.params.top_p = self.rng.choice([float("nan"), 0.0, 1.5, -0.1, 1.0])
            m.params.top_k = self.int32([0, 1000], 1.0)
            m.params.seed = self.rng.choice(UINT64)
            for _ in range(self.rng.choice([1, 4, 5])):
                m.params.stop.append(self.odd_text(STOP))
        m.influence = self.enum([0, 1, 2, 3], p / 2)
        return m

    # -- wire-level ------------------------------------------------------------------

    def wire(self, rpc: str) -> bytes:
        base = self.message(rpc, 0.3).SerializeToString()
        r = self.rng.random()
        if r < 0.15:
            return self.rng.randbytes(self.rng.randint(0, 300))
        if r < 0.3 and base:
            return base[: self.rng.randrange(len(base))]
        if r < 0.45 and base:
            data = bytearray(base)
            for _ in range(self.rng.randint(1, 8)):
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
            return bytes(data)
        if r < 0.65:
            return base + self.bad_utf8_field(rpc)
        if r < 0.75:  # unknown fields: every wire type, groups included
            return base + self.rng.choice(
                [
                    _tag(999, 0) + _varint(2**64 - 1),
                    _tag(998, 1) + self.rng.randbytes(8),
                    _tag(997, 5) + self.rng.randbytes(4),
                    _tag(996, 3) + _tag(1, 0) + b"\x01" + _tag(996, 4),
                    _tag(995, 3),  # a group never closed
                    _tag(994, 2) + _varint(10),  # a length past the end
                    _tag(0, 0) + b"\x00",  # field number 0
                    b"\x80" * 11,  # a varint that never ends
                ]
            )
        if r < 0.85:  # nesting past the parser's recursion limit (100)
            depth = self.rng.choice([99, 101, 200, 1000])
            inner = b""
            for _ in range(depth):
                inner = _tag(1, 2) + _varint(len(inner)) + inner
            return inner
        if r < 0.92:  # a field repeated: last wins for scalars, messages merge
            return base + base
        # an int32 field sent as a 10-byte varint beyond 2^32 (truncated by the parser)
        number = self._first_int_field(rpc)
        return base + (_tag(number, 0) + _varint(2**40 + 7) if number else b"")

    def bad_utf8_field(self, rpc: str) -> bytes:
        """A string field (top level, or inside scope) holding bytes that are not UTF-8."""
        descriptor = BY_NAME[rpc].request.DESCRIPTOR
        bad = self.rng.choice(BAD_UTF8)
        strings = [f for f in descriptor.fields if f.type == f.TYPE_STRING]
        scopes = [f for f in descriptor.fields if f.message_type is memory_pb2.Scope.DESCRIPTOR]
        if scopes and (not strings or self.chance(0.5)):
            inner = _tag(self.rng.choice([1, 2]), 2) + _varint(len(bad)) + bad
            return _tag(scopes[0].number, 2) + _varint(len(inner)) + inner
        if rpc == "Remember" and self.chance(0.5):
            inner = _tag(2, 2) + _varint(len(bad)) + bad  # Turn.text
            return _tag(2, 2) + _varint(len(inner)) + inner
        if not strings:
            return b""
        f = self.rng.choice(strings)
        return _tag(f.number, 2) + _varint(len(bad)) + bad

    def _first_int_field(self, rpc: str) -> int:
        for f in BY_NAME[rpc].request.DESCRIPTOR.fields:
            if f.type in (f.TYPE_INT32, f.TYPE_ENUM):
                return int(f.number)
        return 0

    def request(self, rpc: str) -> tuple[str, bytes]:
        r = self.rng.random()
        if r < 0.4:
            return "valid", self.message(rpc, 0.0).SerializeToString()
        if r < 0.8:
            return "field", self.message(rpc, 0.5).SerializeToString()
        return "wire", self.wire(rpc)


def _varint(value: int) -> bytes:
    value &= 2**64 - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


# -- the runner ------------------------------------------------------------------------


@dataclass
class Tally:
    codes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    hangs: int = 0
    seconds: float = 0.0
    examples: list[dict[str, str]] = field(default_factory=list)

    @property
    def internal(self) -> int:
        return self.codes["INTERNAL"]

    @property
    def unknown(self) -> int:
        return self.codes["UNKNOWN"]


@dataclass
class Report:
    tallies: dict[str, Tally]
    health: dict[str, str]
    seconds: float

    @property
    def clean(self) -> bool:
        bad = sum(t.internal + t.unknown + t.hangs for t in self.tallies.values())
        return bad == 0 and all(s == "SERVING" for s in self.health.values())

    def table(self) -> str:
        named = ("INTERNAL", "UNKNOWN")  # their own columns
        codes = sorted({c for t in self.tallies.values() for c in t.codes if c not in named})
        head = ["rpc", "sent", *codes, "INTERNAL", "UNKNOWN", "hangs", "s"]
        rows = [head]
        for name, t in self.tallies.items():
            sent = sum(t.codes.values()) + t.hangs
            counts = [str(t.codes[c]) for c in codes]
            seconds = f"{t.seconds:.0f}"
            rows.append(
                [name, str(sent), *counts, str(t.internal), str(t.unknown), str(t.hangs), seconds]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [
            "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in rows
        ]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        lines.append("")
        lines.append("health at the end: " + ", ".join(f"{k} {v}" for k, v in self.health.items()))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "clean": self.clean,
            "health": self.health,
            "rpcs": {
                name: {
                    "codes": dict(t.codes),
                    "kinds": dict(t.kinds),
                    "hangs": t.hangs,
                    "seconds": t.seconds,
                    "examples": t.examples,
                }
                for name, t in self.tallies.items()
            },
        }


def _learn(gen: Generator, rpc: str, reply: bytes) -> None:
    """Ids and seqs from replies make later valid requests hit real objects."""
    if rpc == "Remember":
        ids = memory_pb2.RememberResponse.FromString(reply).memory_ids
        gen.memory_ids = (gen.memory_ids + list(ids))[-500:]
    elif rpc == "ListMemories":
        listed = memory_pb2.ListMemoriesResponse.FromString(reply).memories
        pairs = [(m.scope.user_id, m.memory_id) for m in listed]
        gen.owned = (gen.owned + pairs)[-500:]
    elif rpc == "BuildContext":
        seq = memory_pb2.BuildContextResponse.FromString(reply).audit_seq
        if seq:
            gen.audit_seqs = [*gen.audit_seqs, seq][-500:]


async def fuzz(
    addr: str,
    metadata: Sequence[tuple[str, str]],
    per_rpc: Mapping[str, int],
    seed: int,
    *,
    concurrency: int = 16,
    hang_seconds: float = 30.0,
    health: Mapping[str, tuple[str, str]] | None = None,
    progress: bool = False,
) -> Report:
    """Send `per_rpc[name]` generated requests to each RPC at `addr`; then ask each
    (addr, service name) of `health` for its status."""
    gen = Generator(seed)
    tallies: dict[str, Tally] = {}
    start = time.perf_counter()
    # Far above any call's expected time; a call reaching it counts as a hang.
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(addr, options=options) as channel:
        for rpc_name, count in per_rpc.items():
            rpc = BY_NAME[rpc_name]
            tally = tallies.setdefault(rpc_name, Tally())
            began = time.perf_counter()
            limit = asyncio.Semaphore(concurrency)
            call = _Caller(channel, rpc, gen, tally, metadata, hang_seconds)
            tasks = []
            for i in range(count):
                await limit.acquire()
                kind, data = gen.request(rpc_name)
                tasks.append(asyncio.create_task(call(kind, data, limit)))
                if progress and (i + 1) % 1000 == 0:
                    print(f"  {rpc_name}: {i + 1}/{count}", file=sys.stderr, flush=True)
            await asyncio.gather(*tasks)
            tally.seconds = time.perf_counter() - began
            if progress:
                print(f"{rpc_name}: {dict(tally.codes)} in {tally.seconds:.0f} s", file=sys.stderr)
    states = {name: await serving(a, service) for name, (a, service) in (health or {}).items()}
    return Report(tallies, states, time.perf_counter() - start)


class _Caller:
    """One RPC's generic call (raw bytes both ways), tallying each outcome."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        rpc: Rpc,
        gen: Generator,
        tally: Tally,
        metadata: Sequence[tuple[str, str]],
        hang_seconds: float,
    ) -> None:
        self._unary = channel.unary_unary(rpc.path)
        self._stream = channel.unary_stream(rpc.path)
        self._upload = channel.stream_unary(rpc.path)
        self._rpc, self._gen, self._tally = rpc, gen, tally
        self._metadata, self._hang = tuple(metadata), hang_seconds

    async def __call__(self, kind: str, data: bytes, limit: asyncio.Semaphore) -> None:
        try:
            await self._send(kind, data)
        finally:
            limit.release()

    async def _send(self, kind: str, data: bytes) -> None:
        tally = self._tally
        tally.kinds[kind] += 1
        try:
            if self._rpc.streaming:
                async for _ in self._stream(data, metadata=self._metadata, timeout=self._hang):
                    pass
            elif self._rpc.uploading:
                # One message, or the same twice (a resent batch: deduplicated).
                messages = [data] * (2 if len(data) % 2 else 1)
                await self._upload(iter(messages), metadata=self._metadata, timeout=self._hang)
            else:
                reply = await self._unary(data, metadata=self._metadata, timeout=self._hang)
                _learn(self._gen, self._rpc.name, reply)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            hang = code == "DEADLINE_EXCEEDED"  # no call sets a deadline but ours
            if hang:
                tally.hangs += 1
            else:
                tally.codes[code] += 1
            notable = hang or code in ("INTERNAL", "UNKNOWN", "RESOURCE_EXHAUSTED")
            if notable and len(tally.examples) < 20:
                tally.examples.append(
                    {
                        "code": "HANG" if hang else code,
                        "kind": kind,
                        "details": str(exc.details())[:500],
                        "request_hex": data[:4096].hex(),
                    }
                )
            return
        tally.codes["OK"] += 1


async def serving(addr: str, service: str) -> str:
    async with grpc.aio.insecure_channel(addr) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            return f"UNREACHABLE ({exc.code().name})"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-rpc", type=int, default=10_000, help="requests per RPC")
    parser.add_argument("--chat", type=int, default=20, help="Chat requests (CPU LLM: slow)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="calls in flight (16: the gateway's per-RPC admission bound; more and the "
        "excess is refused with RESOURCE_EXHAUSTED before validation, fuzzing less)",
    )
    parser.add_argument("--hang-seconds", type=float, default=60.0)
    parser.add_argument("--rpcs", default=",".join(r.name for r in RPCS))
    parser.add_argument("--addr", default="", help="fuzz this gateway instead of a new cluster")
    args = parser.parse_args()
    from hippo_cli.cluster import local_cluster
    from hippo_cli.registry import SERVICES
    from hippo_cli.settings import CliSettings

    key = (("x-api-key", CliSettings().api_key),)
    plan = {n: args.chat if n == "Chat" else args.per_rpc for n in args.rpcs.split(",")}
    print(f"fuzz: {plan}, seed {args.seed}, {args.concurrency} in flight", file=sys.stderr)
    if args.addr:
        report = asyncio.run(fuzz(args.addr, key, plan, args.seed, progress=True))
    else:
        with (
            tempfile.TemporaryDirectory(prefix="hippo-fuzz-") as data,
            local_cluster(Path(data)) as cluster,
        ):
            names = {s.name: s.full_name for s in SERVICES}
            health = {name: (addr, names[name]) for name, addr in cluster.addrs.items()}
            report = asyncio.run(
                fuzz(
                    cluster.gateway,
                    key,
                    plan,
                    args.seed,
                    concurrency=args.concurrency,
                    hang_seconds=args.hang_seconds,
                    health=health,
                    progress=True,
                )
            )
    print(report.table())
    print(f"\n{report.seconds:.0f} s in all; clean: {report.clean}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fuzz.json").write_text(json.dumps(report.as_json(), indent=1))
    raise SystemExit(0 if report.clean else 1)


if __name__ == "__main__":
    main()
