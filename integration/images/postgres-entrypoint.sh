#!/bin/bash
# Entrypoint of ticketing-test/postgres:15 (Debian's postgresql-15).
# Follows the env contract of the official postgres image, so that
# testcontainers-go's modules/postgres works unchanged:
#   POSTGRES_PASSWORD          superuser password (required unless
#                              POSTGRES_HOST_AUTH_METHOD=trust)
#   POSTGRES_USER              superuser name (default postgres)
#   POSTGRES_DB                database created at init (default = user)
#   POSTGRES_HOST_AUTH_METHOD  auth for TCP connections (default scram-sha-256)
#   POSTGRES_INITDB_ARGS       extra initdb arguments (split on spaces)
#   PGPORT                     server port (default 5432); read by postgres
#                              itself, by pg_ctl and by psql
#   PGDATA                     data directory (default /var/lib/postgresql/data)
#   /docker-entrypoint-initdb.d/*.sql|*.sql.gz|*.sh  run once, at init
# Differences from the official image (on purpose, for host networking):
#   - listen_addresses stays at PostgreSQL's default 'localhost' (the official
#     image sets '*'); pass `-c listen_addresses=127.0.0.1` anyway.
#   - TCP from 127.0.0.1 also requires the password (official: trust).
# Readiness: like the official image, a temporary server (unix socket only)
# runs the init, so "database system is ready to accept connections" is
# logged twice on first start; wait for the 2nd one or for a SQL round trip.
set -Eeuo pipefail
export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
if [ $# -eq 0 ] || [ "${1:0:1}" = '-' ]; then set -- postgres "$@"; fi

# As root: own the data and socket dirs, then re-exec as postgres.
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
    echo "error: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
    exit 1
  fi
  pw=()
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    pw=(--pwfile="$pwfile")
  fi
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words
  initdb --username="$user" "${pw[@]}" --auth-local=trust --auth-host="$auth" \
    --encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-} >/dev/null
  if [ -n "${pwfile:-}" ]; then rm -f "$pwfile"; fi
  echo "host all all all $auth" >>"$PGDATA/pg_hba.conf"

  # Temporary server on the unix socket only: nothing can connect over TCP
  # before the init scripts have run.
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -p ${PGPORT:-5432}" start
  psql=(psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password --username "$user" -p "${PGPORT:-5432}")
  if [ "$db" != postgres ]; then
    # psql variables quote the name correctly (works only on stdin, not -c)
    echo 'CREATE DATABASE :"db";' | "${psql[@]}" --dbname postgres -v db="$db" >/dev/null
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh)     if [ -x "$f" ]; then echo "running $f"; "$f"; else echo "sourcing $f"; . "$f"; fi ;;
      *.sql)    echo "running $f"; "${psql[@]}" --dbname "$db" -f "$f" ;;
      *.sql.gz) echo "running $f"; gunzip -c "$f" | "${psql[@]}" --dbname "$db" ;;
      *)        if [ -e "$f" ]; then echo "ignoring $f"; fi ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop
  echo "PostgreSQL init process complete; ready for start up."
fi
exec "$@"
