#!/usr/bin/env bash
# One entry point for a fresh machine: install turnlog, start Kafka and Postgres, run the demo or the tests.
#
#   bash deploy/dev.sh demo [turnlog demo options...]   # the demo on Postgres, report in demo-report.json
#   bash deploy/dev.sh test [pytest options...]         # the whole test suite (unit + integration)
#   bash deploy/dev.sh setup                            # install + start services only
#
# Services keep running afterwards; stop them with `bash deploy/services.sh stop`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${PYTHON:-python3}"
export TURNLOG_DATABASE_URL="${TURNLOG_DATABASE_URL:-postgresql+psycopg://turnlog:turnlog@127.0.0.1:${TURNLOG_PG_PORT:-5433}/turnlog}"
export TURNLOG_BOOTSTRAP_SERVERS="${TURNLOG_BOOTSTRAP_SERVERS:-127.0.0.1:${TURNLOG_KAFKA_PORT:-9092}}"

die() { echo "dev.sh: $*" >&2; exit 1; }

# The extras to install: the tests also drive the framework adapters (LiveKit,
# Pipecat, OpenAI Agents, LangGraph), so `test` installs those too.
install() {
  local extras="${1:-test}"
  command -v "$python" >/dev/null || die "$python not found: install Python 3.11+"
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "turnlog needs Python 3.11+ ($python is $("$python" --version 2>&1))"
  echo "dev.sh: installing turnlog with its extras (pip install -e '.[$extras]')"
  "$python" -m pip install --quiet --disable-pip-version-check -e "${root}[$extras]"
}

setup() {
  install "${1:-test}"
  bash "$here/services.sh" start
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  setup)
    setup
    ;;
  demo)
    setup
    cd "$root"
    exec "$python" -m turnlog.cli demo --database-url "$TURNLOG_DATABASE_URL" --report demo-report.json "$@"
    ;;
  test)
    setup "test,adapters"
    bash "$here/browser.sh"
    cd "$root"
    export TURNLOG_TEST_BOOTSTRAP_SERVERS="$TURNLOG_BOOTSTRAP_SERVERS" TURNLOG_TEST_DATABASE_URL="$TURNLOG_DATABASE_URL"
    exec "$python" -m pytest "$@"
    ;;
  *)
    echo "usage: bash deploy/dev.sh {setup|demo|test} [options]" >&2
    exit 2
    ;;
esac
