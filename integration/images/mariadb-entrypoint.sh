#!/bin/bash
# Entrypoint of ticketing-test/mariadb:10.11 (Debian's mariadb-server).
# Follows the env contract of the official mariadb/mysql images, so that
# testcontainers-go's modules/mysql works unchanged. MARIADB_* wins over MYSQL_*:
#   MARIADB_ROOT_PASSWORD / MYSQL_ROOT_PASSWORD       root password, root@'%' and root@localhost
#   MARIADB_ALLOW_EMPTY_ROOT_PASSWORD / MYSQL_ALLOW_EMPTY_PASSWORD
#                                                     required if no root password
#   MARIADB_USER / MYSQL_USER, MARIADB_PASSWORD / MYSQL_PASSWORD
#                                                     extra user@'%' (all rights on the database)
#   MARIADB_DATABASE / MYSQL_DATABASE                 database created at init
#   MYSQL_TCP_PORT or `--port=N` on the command line  server port (default 3306;
#                                                     mariadbd reads MYSQL_TCP_PORT itself)
#   /docker-entrypoint-initdb.d/*.sql|*.sql.gz|*.sh   run once, at init, into the database
# Not supported: *_RANDOM_ROOT_PASSWORD, *_ROOT_HOST, time zone tables
# (the official image loads them at init; here CONVERT_TZ with names gives NULL).
# Debian's config (/etc/mysql/mariadb.conf.d/50-server.cnf) binds 127.0.0.1 by
# default; pass `--bind-address=127.0.0.1` anyway. TCP opens only when the
# init is finished, so "port is listening" means ready.
set -Eeuo pipefail
if [ $# -eq 0 ] || [ "${1:0:1}" = '-' ]; then set -- mariadbd "$@"; fi
case "$1" in mysqld|mariadbd) ;; *) exec "$@" ;; esac
DATADIR=/var/lib/mysql SOCK=/run/mysqld/mysqld.sock

# As root: own the data and socket dirs, then re-exec as mysql.
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$DATADIR" /run/mysqld
  chown mysql:mysql "$DATADIR" /run/mysqld
  exec setpriv --reuid=mysql --regid=mysql --init-groups "$BASH_SOURCE" "$@"
fi

root_pw="${MARIADB_ROOT_PASSWORD:-${MYSQL_ROOT_PASSWORD:-}}"
empty_ok="${MARIADB_ALLOW_EMPTY_ROOT_PASSWORD:-${MYSQL_ALLOW_EMPTY_PASSWORD:-}}"
user="${MARIADB_USER:-${MYSQL_USER:-}}"
pass="${MARIADB_PASSWORD:-${MYSQL_PASSWORD:-}}"
db="${MARIADB_DATABASE:-${MYSQL_DATABASE:-}}"

if [ ! -d "$DATADIR/mysql" ]; then
  if [ -z "$root_pw" ] && [ -z "$empty_ok" ]; then
    echo "error: set MARIADB_ROOT_PASSWORD/MYSQL_ROOT_PASSWORD or MARIADB_ALLOW_EMPTY_ROOT_PASSWORD/MYSQL_ALLOW_EMPTY_PASSWORD" >&2
    exit 1
  fi
  if [ -n "$user" ] && [ -z "$pass" ]; then
    echo "error: MARIADB_USER/MYSQL_USER is set but MARIADB_PASSWORD/MYSQL_PASSWORD is not" >&2
    exit 1
  fi
  mariadb-install-db --datadir="$DATADIR" --auth-root-authentication-method=normal \
    --skip-test-db --skip-name-resolve >/dev/null

  # Temporary server without TCP, so the real port opens only when ready.
  mariadbd "${@:2}" --datadir="$DATADIR" --socket="$SOCK" --skip-networking &
  pid=$!
  for _ in $(seq 600); do
    mariadb-admin --socket="$SOCK" -uroot ping >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "error: temporary mariadbd exited during init" >&2; exit 1; }
    sleep 0.1
  done
  sql() { mariadb --socket="$SOCK" -uroot "$@"; }
  str() { printf "%s" "$1" | sed "s/\\\\/\\\\\\\\/g; s/'/''/g"; }  # inside '...'
  ident() { printf "%s" "$1" | sed 's/`/``/g'; }                   # inside `...`
  # One statement per line (a failing statement stops the init: set -e, mariadb exits 1).
  {
    echo "SET @@SESSION.SQL_LOG_BIN=0;"
    echo "DROP USER IF EXISTS root@'127.0.0.1', root@'::1';"
    echo "EXECUTE IMMEDIATE CONCAT('DROP USER IF EXISTS root@\\'', @@hostname, '\\'');"
    echo "CREATE USER 'root'@'%' IDENTIFIED BY '$(str "$root_pw")';"
    echo "GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;"
    echo "ALTER USER 'root'@'localhost' IDENTIFIED BY '$(str "$root_pw")';"
    if [ -n "$db" ]; then echo "CREATE DATABASE IF NOT EXISTS \`$(ident "$db")\`;"; fi
    if [ -n "$user" ] && [ "$user" != root ]; then
      echo "CREATE USER '$(str "$user")'@'%' IDENTIFIED BY '$(str "$pass")';"
      if [ -n "$db" ]; then echo "GRANT ALL ON \`$(ident "$db")\`.* TO '$(str "$user")'@'%';"; fi
    fi
    echo "FLUSH PRIVILEGES;"
  } | sql

  # From here root needs its password (MYSQL_PWD keeps it off the command line).
  export MYSQL_PWD="$root_pw"
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh)     if [ -x "$f" ]; then echo "running $f"; "$f"; else echo "sourcing $f"; . "$f"; fi ;;
      *.sql)    echo "running $f"; sql ${db:+"$db"} <"$f" ;;
      *.sql.gz) echo "running $f"; gunzip -c "$f" | sql ${db:+"$db"} ;;
      *)        if [ -e "$f" ]; then echo "ignoring $f"; fi ;;
    esac
  done
  unset MYSQL_PWD
  kill "$pid"
  wait "$pid" || true
  echo "MariaDB init process done. Ready for start up."
fi
exec "$@"
