#!/bin/sh
# First start: a cluster in $PGDATA (a volume) with the role and database `hippo`,
# password from POSTGRES_PASSWORD, scram-sha-256 everywhere. Then the server, on the
# pod's loopback only; its socket in /tmp (the root filesystem is read-only).
set -eu
BIN=/usr/lib/postgresql/15/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set for the first start}"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  "$BIN/initdb" -D "$PGDATA" -U hippo --pwfile="$pwfile" --auth=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  "$BIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses='' -k /tmp" -w start >/dev/null
  PGPASSWORD="$POSTGRES_PASSWORD" "$BIN/createdb" -h /tmp -U hippo hippo
  "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec "$BIN/postgres" -D "$PGDATA" -c listen_addresses=127.0.0.1 -k /tmp
