"""`python -m hippo_core.healthcheck ADDR[/SERVICE]...`: exit 0 iff every target is SERVING.

The container HEALTHCHECK of every image and the chart's `helm test` pod run this. It
imports only grpc and the health stubs (not hippo_core's runtime), so a probe costs a
fraction of a second of CPU instead of loading settings, logging and tracing. A target
without `/SERVICE` checks the liveness key `""`; with it, that service's readiness.

Under TLS (`--tls-ca`, with the pod's own certificate as `--tls-cert`/`--tls-key`: an
internal service answers only callers with one) the chart probes with this instead of
kubelet's gRPC probes, which cannot speak TLS. `--tls-server-name` is the name the
server's certificate is checked for (a probe dials 127.0.0.1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(addr: str, args: argparse.Namespace) -> grpc.Channel:
    if not args.tls_ca:
        return grpc.insecure_channel(addr)

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    credentials = grpc.ssl_channel_credentials(
        read(args.tls_ca), read(args.tls_key), read(args.tls_cert)
    )
    name = [("grpc.ssl_target_name_override", args.tls_server_name)]
    return grpc.secure_channel(addr, credentials, options=name if args.tls_server_name else [])


def check(target: str, timeout: float, args: argparse.Namespace | None = None) -> str:
    """'SERVING', 'NOT_SERVING', or 'FAILED (<code>)': NOT_FOUND for a service the
    server does not know, UNAVAILABLE or DEADLINE_EXCEEDED when nothing answers (or
    the TLS handshake fails)."""
    addr, _, service = target.partition("/")
    with _channel(addr, args or argparse.Namespace(tls_ca=None)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return f"FAILED ({exc.code().name})"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hippo_core.healthcheck")
    parser.add_argument("targets", nargs="+", metavar="ADDR[/SERVICE]")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per check")
    parser.add_argument("--tls-ca", help="CA bundle (PEM): TLS on")
    parser.add_argument("--tls-cert", help="client certificate (PEM)")
    parser.add_argument("--tls-key", help="its private key (PEM)")
    parser.add_argument("--tls-server-name", help="name the server's certificate must carry")
    args = parser.parse_args(argv)
    ok = True
    for target in args.targets:
        status = check(target, args.timeout, args)
        print(f"{target}: {status}")
        ok = ok and status == "SERVING"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
