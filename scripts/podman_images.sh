#!/usr/bin/env bash
# Build the six service images with podman on a machine that reaches no image registry
# (the dev machines): a base image is made from Debian's packages with mmdebstrap and
# passed as PYTHON_IMAGE; pip reads the machine's own configuration (wheel directory,
# CA bundle), mounted into the build. On a host that reaches a registry, plain
# `docker build -f services/<svc>/Dockerfile .` needs none of this.
#
#   scripts/podman_images.sh [service ...]     (default: all six, prometheus, postgres;
#                                              `make images`)
#
# Needs podman, runc and mmdebstrap (Debian: apt-get install podman runc mmdebstrap).
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${HIPPO_IMAGE_TAG:-0.1.0}
BASE=${HIPPO_BASE_IMAGE:-localhost/hippo-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}

for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install podman runc mmdebstrap)" >&2; exit 2; }
done

if ! podman image exists "$BASE"; then
  echo "== base image $BASE from Debian bookworm (mmdebstrap)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # python-is-python3: the Dockerfiles call `python`, as in the official image.
  mmdebstrap --quiet --variant=minbase \
    --include=python3.11,python3.11-venv,python-is-python3,ca-certificates \
    bookworm "$tmp/rootfs.tar" "$MIRROR"
  podman import --quiet --change 'CMD ["python3"]' "$tmp/rootfs.tar" "$BASE" >/dev/null
fi

# What this machine's pip uses, handed to the build: a wheel directory and the CA
# bundle (a TLS-intercepting proxy signs PyPI's certificate here).
build_args=(--build-arg "PYTHON_IMAGE=$BASE")
mounts=()
links=$(pip config get global.find-links 2>/dev/null || true)
links=${PIP_FIND_LINKS:-$links}
if [[ -n "$links" && -d "$links" ]]; then
  mounts+=(-v "$links:$links:ro"); build_args+=(--build-arg "PIP_FIND_LINKS=$links")
fi
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [[ -f "$ca" ]]; then
  mounts+=(-v "$ca:/etc/hippo-build-ca.crt:ro"); build_args+=(--build-arg "PIP_CERT=/etc/hippo-build-ca.crt")
fi

services=("$@")
[[ ${#services[@]} -gt 0 ]] || services=(embedding audit retrieval summariser gateway injection prometheus postgres)
for svc in "${services[@]}"; do
  if [[ $svc == prometheus || $svc == postgres ]]; then
    # No registry here: Debian's package on the same base (postgres: cluster mode).
    echo "== hippo-$svc:debian"
    podman build --quiet --format docker --network host --build-arg "BASE_IMAGE=$BASE" \
      -f "deploy/podman/$svc.Containerfile" -t "hippo-$svc:debian" deploy/podman >/dev/null
    continue
  fi
  [[ -f services/$svc/Dockerfile ]] || { echo "error: no service '$svc' (services/$svc/Dockerfile)" >&2; exit 2; }
  extra=()
  # The CPU torch wheel lies in the wheel directory; PyPI stands in for the PyTorch index.
  [[ $svc == injection || $svc == embedding ]] && extra=(--build-arg TORCH_INDEX_URL=https://pypi.org/simple)
  echo "== hippo-$svc:$TAG"
  start=$(date +%s)
  # --format docker: OCI images drop HEALTHCHECK.
  podman build --quiet --format docker --network host "${mounts[@]}" "${build_args[@]}" "${extra[@]}" \
    -f "services/$svc/Dockerfile" -t "hippo-$svc:$TAG" . >/dev/null
  echo "   built in $(( $(date +%s) - start )) s, $(podman image inspect --format '{{.Size}}' "hippo-$svc:$TAG" | awk '{printf "%.0f MB", $1/1e6}')"
done
