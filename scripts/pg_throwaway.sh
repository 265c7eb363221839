#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on 127.0.0.1 for tests and trying things out.
#   scripts/pg_throwaway.sh start DIR PORT   # initdb + start; prints the SQLAlchemy URL
#   scripts/pg_throwaway.sh stop DIR
# Uses Debian's postgresql package (apt-get install postgresql). initdb refuses to run as root,
# so as root the cluster runs as the `postgres` user. Trust authentication, loopback only.
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "pg_throwaway: no PostgreSQL server binaries (apt-get install postgresql)" >&2; exit 2; }
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
# postgres must be able to reach DIR: let others traverse (not list) its parents.
allow_traverse() {
  [ "$(id -u)" = 0 ] || return 0
  local p; p=$(dirname "$1")
  while [ "$p" != / ]; do chmod o+x "$p"; p=$(dirname "$p"); done
}
cmd=${1:-}; dir=${2:-}
[ -n "$dir" ] || { echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2; }
case "$cmd" in
  start)
    port=${3:?usage: $0 start DIR PORT}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    allow_traverse "$dir"
    as_pg "'$bin/initdb' -D '$dir/data' -A trust -U postgres >'$dir/initdb.log' 2>&1"
    as_pg "'$bin/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -o \"-c listen_addresses=127.0.0.1 -p $port -k '$dir'\" start >/dev/null"
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    dir=$(cd "$dir" && pwd)
    allow_traverse "$dir"  # something may have tightened a parent since start
    if ! as_pg "'$bin/pg_ctl' -D '$dir/data' -m fast -w stop >/dev/null"; then
      pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)
      [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null || true
    fi
    ;;
  *) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
