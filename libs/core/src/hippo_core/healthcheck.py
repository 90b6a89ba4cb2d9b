"""`python -m hippo_core.healthcheck ADDR[/SERVICE]...`: exit 0 iff every target is SERVING.

The container HEALTHCHECK of every image and the chart's `helm test` pod run this. It
imports only grpc and the health stubs (not hippo_core's runtime), so a probe costs a
fraction of a second of CPU instead of loading settings, logging and tracing. A target
without `/SERVICE` checks the liveness key `""`; with it, that service's readiness.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, timeout: float) -> str:
    """'SERVING', 'NOT_SERVING', or 'FAILED (<code>)': NOT_FOUND for a service the
    server does not know, UNAVAILABLE or DEADLINE_EXCEEDED when nothing answers."""
    addr, _, service = target.partition("/")
    with grpc.insecure_channel(addr) as channel:
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
    args = parser.parse_args(argv)
    ok = True
    for target in args.targets:
        status = check(target, args.timeout)
        print(f"{target}: {status}")
        ok = ok and status == "SERVING"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
