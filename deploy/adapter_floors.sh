#!/usr/bin/env bash
# Run each framework adapter's tests on the oldest release its extra declares (pyproject.toml:
# the ">=" bound of the extra), each in a venv of its own; the main environment has the newest.
#
#   bash deploy/adapter_floors.sh [EXTRA...]          # EXTRA: livekit pipecat openai-agents langgraph (default: all)
#   bash deploy/adapter_floors.sh --build [EXTRA...]  # only build (or refresh) the venvs; no service needed
#
# The services must be running (bash deploy/services.sh start); TURNLOG_TEST_BOOTSTRAP_SERVERS and
# TURNLOG_TEST_DATABASE_URL as for the main test run (dev.sh test sets them).
# A venv is kept under $TURNLOG_STATE_DIR/venvs (default $HOME/.cache/turnlog/venvs), keyed by the
# floor and by pyproject.toml's hash, so a later run only reinstalls turnlog itself (--no-deps, seconds);
# a venv for an older pyproject.toml is removed when its successor is built.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${PYTHON:-python3}"
venvs="${TURNLOG_STATE_DIR:-$HOME/.cache/turnlog}/venvs"

die() { echo "adapter_floors.sh: $*" >&2; exit 1; }

# extra -> test module
declare -A TESTS=([livekit]=test_livekit [pipecat]=test_pipecat [openai-agents]=test_openai_agents [langgraph]=test_langgraph)

# "<package>==<floor>" of an extra, from its "<package>>=<floor>,..." requirement in pyproject.toml.
floor_of() {
  "$python" - "$root/pyproject.toml" "$1" <<'PY'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
requirements = extras.get(sys.argv[2])
if not requirements or len(requirements) != 1:
    sys.exit(f"extra {sys.argv[2]!r}: expected one requirement in pyproject.toml, got {requirements!r}")
match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*(,.*)?", requirements[0])
if match is None:
    sys.exit(f"extra {sys.argv[2]!r}: {requirements[0]!r} has no '>=' lower bound")
print(f"{match.group(1)}=={match.group(2)}")
PY
}

venv_for() {  # extra requirement -> venv path (built if missing)
  local extra="$1" requirement="$2" key venv
  key="$(sha256sum "$root/pyproject.toml" | cut -c1-12)"
  venv="$venvs/${extra}-${requirement#*==}-${key}"
  if [ ! -f "$venv/.ready" ]; then
    echo "adapter_floors.sh: building $venv ($requirement and turnlog's test extra)" >&2
    rm -rf "$venv" "$venvs/${extra}-"*
    mkdir -p "$venvs"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "${root}[test]" "$requirement" \
      || die "cannot install $requirement with turnlog[test] into $venv (see pip's error above)"
    touch "$venv/.ready"
  else
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$root" \
      || die "cannot install turnlog into $venv"
  fi
  echo "$venv"
}

build_only=0
if [ "${1:-}" = --build ]; then
  build_only=1
  shift
fi
extras=("$@")
[ ${#extras[@]} -gt 0 ] || extras=(livekit pipecat openai-agents langgraph)
cd "$root"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# One floor: its venv, then its adapter tests; everything it prints goes to $logs/<extra>.log.
floor() {
  local extra="$1" module requirement venv installed
  module="${TESTS[$extra]:-}"
  [ -n "$module" ] || die "unknown extra $extra (one of: ${!TESTS[*]})"
  requirement="$(floor_of "$extra")" || die "cannot read the floor of $extra"
  venv="$(venv_for "$extra" "$requirement")"
  if [ "$build_only" = 1 ]; then
    echo "adapter_floors.sh: $venv ready"
    return 0
  fi
  installed="$("$venv/bin/python" -m pip show "${requirement%%==*}" 2>/dev/null | sed -n 's/^Version: //p')"
  echo "adapter_floors.sh: tests/adapters/$module.py on ${requirement%%==*} $installed (the floor)"
  # TURNLOG_TEST_REPORTS (set by tests/tiers.py): a JUnit XML report per floor in that folder.
  TURNLOG_TEST_REQUIRE_EXTRAS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "tests/adapters/$module.py" \
    ${TURNLOG_TEST_REPORTS:+"--junitxml=$TURNLOG_TEST_REPORTS/adapter_floors-$extra.xml"}
}

# The floors side by side (each venv is its own, each test its own topics, groups and database): their
# tests mostly wait on real-time audio and the pipeline. Each one's output is printed whole, in order.
declare -A pids=()
for extra in "${extras[@]}"; do
  floor "$extra" >"$logs/$extra.log" 2>&1 &
  pids[$extra]=$!
done
status=0
for extra in "${extras[@]}"; do
  wait "${pids[$extra]}" || { status=1; echo "adapter_floors.sh: $extra FAILED" >>"$logs/$extra.log"; }
  cat "$logs/$extra.log"
done
exit "$status"
