#!/usr/bin/env bash
# One entry point for a fresh machine: install turnlog, start Kafka and Postgres, run the demo or the tests.
#
#   bash deploy/dev.sh demo [turnlog demo options...]   # the demo on Postgres, report in demo-report.json
#   bash deploy/dev.sh test [--only TIER] [pytest options...]  # the whole test suite, tier by tier (tests/tiers.py),
#                                                       # the adapter tests on each framework's floor release last
#                                                       # (deploy/adapter_floors.sh; TURNLOG_ADAPTER_FLOORS=0 skips them)
#   bash deploy/dev.sh lint                             # ruff and mypy, no services (CI runs it before test)
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

# ruff (the repository), then mypy on the package `turnlog`; fails if either finds anything.
# mypy cannot see the package-dir mapping (turnlog -> turnlog/, turnlog.sinks -> sinks/, ...;
# pyproject.toml) through the editable install's import hook, so the folders are linked into
# build/mypy/turnlog as the package they are installed as, and each error is printed at its real path.
lint() {
  install "test,adapters,otel,lint,bench"   # what `test` installs (mypy checks the adapters against the frameworks), and the bench's plotting
  cd "$root"
  local status=0 tree="build/mypy"
  echo "dev.sh: ruff check"
  "$python" -m ruff check || status=1
  rm -rf "$tree"
  "$python" - "$tree" <<'PY'
import os
import sys
import tomllib

tree = sys.argv[1]
with open("pyproject.toml", "rb") as f:
    package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
for package, folder in sorted(package_dir.items()):  # "turnlog" before its subpackages
    target = os.path.join(tree, *package.split("."))
    if package == "turnlog":
        os.makedirs(target)
        for name in os.listdir(folder):
            if name != "__pycache__":
                os.symlink(os.path.abspath(os.path.join(folder, name)), os.path.join(target, name))
    else:
        os.symlink(os.path.abspath(folder), target)
PY
  echo "dev.sh: mypy -p turnlog"
  MYPYPATH="$tree" "$python" -m mypy -p turnlog | "$python" -c '
import os, sys
for line in sys.stdin:  # build/mypy/turnlog/sinks/base.py:12: ... -> sinks/base.py:12: ...
    path, colon, rest = line.partition(":")
    if colon and path.endswith(".py") and os.path.exists(path):
        path = os.path.relpath(os.path.realpath(path))
    sys.stdout.write(path + colon + rest)
' || status=1
  return "$status"
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
  lint)
    lint
    ;;
  test)
    setup "test,adapters,adapter-tests,otel"  # otel: the tracing tests export real spans (tests/integration/test_tracing.py)
    bash "$here/browser.sh"
    bash "$here/prometheus.sh" install  # promtool: the alert rules' unit tests (tests/external_tools/test_alert_rules.py)
    cd "$root"
    export TURNLOG_TEST_BOOTSTRAP_SERVERS="$TURNLOG_BOOTSTRAP_SERVERS" TURNLOG_TEST_DATABASE_URL="$TURNLOG_DATABASE_URL"
    export TURNLOG_TEST_REQUIRE_EXTRAS=1  # the extras are installed above: a framework that fails to import is an error
    # Tier by tier (tests/tiers.py: unit, external_tools, integration, cluster, crash, adapter_floors),
    # then the time of each and the slowest tests. pytest options given here go to every tier.
    PYTHON="$python" exec "$python" -m tests.tiers "$@"
    ;;
  *)
    echo "usage: bash deploy/dev.sh {setup|demo|test|lint} [options]" >&2
    exit 2
    ;;
esac
