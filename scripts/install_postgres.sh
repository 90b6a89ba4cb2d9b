#!/usr/bin/env bash
# Unpack Debian's PostgreSQL server into a folder (default .venv/postgres): the cluster
# mode's database for `make run-cluster` and the tests. Nothing is installed on the
# machine and no service starts: the packages are downloaded with `apt-get download` and
# unpacked with `dpkg-deb -x`, like `make prometheus`. Shared libraries the server needs
# that this machine lacks are unpacked beside it (hippo_core.pgserver puts them on
# LD_LIBRARY_PATH); where the machine already has a library, its own copy is used.
set -euo pipefail
dest=${1:-.venv/postgres}
version=${POSTGRES_VERSION:-15}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

download() {
    apt-get download -qq "$@" 2>/dev/null || { apt-get update -qq && apt-get download -qq "$@"; }
}

packages="postgresql-$version postgresql-client-$version libpq5"
# Runtime libraries of the server that are not installed here. Left out on purpose:
# LLVM (JIT only; the servers Hippo starts run with jit=off) and Perl modules (the
# postgresql-common wrappers, which Hippo does not use).
for dep in $(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances "postgresql-$version" 2>/dev/null \
        | grep -E '^lib' | sort -u); do
    case "$dep" in libllvm*|libz3-*|*-perl|libperl*) continue ;; esac
    if ! dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'ok installed'; then
        packages="$packages $dep"
    fi
done
# shellcheck disable=SC2086
download $packages
for deb in ./*.deb; do dpkg-deb -x "$deb" "$dest"; done

bin="$dest/usr/lib/postgresql/$version/bin"
libs="$dest/usr/lib/x86_64-linux-gnu:$dest/usr/lib"
missing=$(LD_LIBRARY_PATH="$libs" ldd "$bin/postgres" "$bin/initdb" "$bin/pg_ctl" | grep 'not found' || true)
if [ -n "$missing" ]; then
    echo "PostgreSQL $version was unpacked but cannot run here; missing libraries:" >&2
    echo "$missing" >&2
    exit 1
fi
"$bin/postgres" --version
touch "$dest/.installed"
