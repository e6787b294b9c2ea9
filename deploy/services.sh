#!/usr/bin/env bash
# Start/stop/inspect all local services turnlog needs: Kafka, then PostgreSQL.
#
#   deploy/services.sh start | stop | restart | status
#
# start   kafka.sh start, then postgres.sh start (stops at the first failure)
#         TURNLOG_KAFKA_NODES=3: the local 3-node Kafka cluster instead of the single broker
# stop    stops both; succeeds when they are already stopped
# status  status of both; exit 0 only when both are running
# See deploy/README.md for environment variables.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR

kafka() { bash "$SCRIPT_DIR/kafka.sh" "$@"; }
postgres() { bash "$SCRIPT_DIR/postgres.sh" "$@"; }

do_start() {
    kafka start
    postgres start
}

do_stop() {
    local rc=0
    postgres stop || rc=1
    kafka stop || rc=1
    return "$rc"
}

do_status() {
    local rc=0
    kafka status || rc=3
    postgres status || rc=3
    return "$rc"
}

case ${1:-} in
    start) do_start ;;
    stop) do_stop ;;
    restart) do_stop; do_start ;;
    status) do_status ;;
    *)
        echo "usage: $0 {start|stop|restart|status}" >&2
        exit 2
        ;;
esac
