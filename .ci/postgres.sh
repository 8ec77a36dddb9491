#!/usr/bin/env bash
# Start or stop a throw-away PostgreSQL server (the operating system's package) for the tests.
#
#   eval "$(.ci/postgres.sh start)"   # prints export lines: KLRELEASE_TEST_POSTGRES, PG_TEST_DIR
#   .ci/postgres.sh stop "$PG_TEST_DIR"
#
# The cluster lives in a new temporary directory, listens on 127.0.0.1 on a free port, trusts
# local connections (it is a test server) and runs as the postgres user when started by root.
set -euo pipefail

bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/initdb" ] && { echo "$d"; return; }
    done
    command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return; }
    echo "no PostgreSQL server found (apt-get install postgresql)" >&2
    exit 1
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "${1:-}" in
start)
    BIN=$(bindir)
    DIR=$(mktemp -d /tmp/klrelease-pg.XXXXXX)
    [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
    PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_owner "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 >"$DIR/initdb.log"
    as_owner "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c max_connections=300" start \
        >"$DIR/pg_ctl.log"
    echo "export KLRELEASE_TEST_POSTGRES=postgresql://postgres@127.0.0.1:$PORT/postgres"
    echo "export PG_TEST_DIR=$DIR"
    ;;
stop)
    DIR=${2:?give the directory printed by start}
    as_owner "$(bindir)/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null || true
    rm -rf "$DIR"
    ;;
*)
    echo "usage: $0 start | stop DIR" >&2
    exit 2
    ;;
esac
