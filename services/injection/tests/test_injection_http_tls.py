"""The TGI HTTP API under TLS: HTTPS with a required client certificate, generation
only for the services allowed to, over real loopback connections with real certificates.
No model is loaded: a caller that passes the check reaches the handler, which answers
503 (TGI's "not ready"), so the test is about who gets in, not about generation."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from hippo_core.certs import Authority, Issued
from hippo_core.errors import Unavailable
from hippo_core.settings import TlsSettings
from hippo_injection.domain.service import InjectionService
from hippo_injection.web.tgi import TgiHttpApi

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}


def not_loaded() -> InjectionService:
    raise Unavailable("the model is loading")


def tls_of(issued: Issued) -> TlsSettings:
    return TlsSettings(
        ca_file=str(issued.ca_file), cert_file=str(issued.cert_file), key_file=str(issued.key_file)
    )


def client_context(ca: Path, issued: Issued | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if issued is not None:
        ctx.load_cert_chain(issued.cert_file, issued.key_file)
    return ctx


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")


@pytest.fixture
async def api(ca: Authority) -> AsyncIterator[str]:
    http = TgiHttpApi(not_loaded, 5.0, 0.5, 4, "test")
    await http.start("127.0.0.1", 0, tls_of(ca.issue("injection")), frozenset({"gateway"}))
    yield f"https://127.0.0.1:{http.port}"
    await http.stop()


async def post(url: str, ctx: ssl.SSLContext, path: str = "/generate") -> tuple[int, dict]:  # type: ignore[type-arg]
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=BODY, ssl=ctx) as resp,
    ):
        return resp.status, await resp.json()


async def test_an_allowed_service_reaches_generation(api: str, ca: Authority) -> None:
    status, body = await post(api, client_context(ca.ca_file, ca.issue("gateway")))
    assert status == 503, body  # past the check: the handler says the model is not ready
    status, _ = await post(api, client_context(ca.ca_file, ca.issue("gateway")), "/")
    assert status == 503


async def test_another_service_is_forbidden_to_generate(api: str, ca: Authority) -> None:
    ctx = client_context(ca.ca_file, ca.issue("retrieval"))
    for path in ("/generate", "/generate_stream", "/"):
        status, body = await post(api, ctx, path)
        assert status == 403
        assert body["error"] == f"retrieval may not call {path}"


async def test_health_is_open_to_any_verified_caller(api: str, ca: Authority) -> None:
    ctx = client_context(ca.ca_file, ca.issue("retrieval"))
    async with aiohttp.ClientSession() as session, session.get(api + "/health", ssl=ctx) as resp:
        assert resp.status == 503  # not ready, but answered


async def test_a_caller_without_a_certificate_fails_the_handshake(api: str, ca: Authority) -> None:
    with pytest.raises(aiohttp.ClientError):
        await post(api, client_context(ca.ca_file, None))


async def test_a_plaintext_caller_gets_nothing(api: str) -> None:
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session:
            await session.post(api.replace("https", "http") + "/generate", json=BODY)


async def test_a_rotated_certificate_is_served_to_later_connections(
    api: str, ca: Authority, tmp_path: Path
) -> None:
    new_ca = Authority(tmp_path / "new-ca")
    trusts_new = client_context(new_ca.ca_file, ca.issue("gateway"))
    with pytest.raises(aiohttp.ClientError):
        await post(api, trusts_new)
    rotated = new_ca.issue("injection")
    served = ca.directory / "injection"
    served.with_suffix(".key").write_bytes(rotated.key_file.read_bytes())
    served.with_suffix(".pem").write_bytes(rotated.cert_file.read_bytes())
    # The next request (on a connection with the old certificate) loads the new files.
    old = client_context(ca.ca_file, ca.issue("gateway"))
    assert (await post(api, old))[0] == 503
    assert (await post(api, trusts_new))[0] == 503
