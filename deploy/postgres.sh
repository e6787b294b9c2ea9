#!/usr/bin/env bash
# Local PostgreSQL cluster for turnlog, from Debian's packages. No Docker needed.
#
#   deploy/postgres.sh start | stop | restart | status
#
# Installs the `postgresql` package if no server binaries are found under
# /usr/lib/postgresql/*/bin, then runs a private cluster (NOT Debian's
# "main" cluster, which is left alone) on 127.0.0.1 only, with password
# (scram-sha-256) auth over TCP, and creates role/database turnlog.
#
# Environment:
#   TURNLOG_STATE_DIR          state root          (default: $HOME/.cache/turnlog)
#   TURNLOG_PG_PORT            TCP port            (default: 5433)
#   TURNLOG_PG_BIN             server bin dir      (default: newest /usr/lib/postgresql/*/bin)
#   TURNLOG_PG_START_TIMEOUT   seconds to wait for pg_isready (default: 60)
#   TURNLOG_PG_STOP_TIMEOUT    seconds for a fast shutdown before an immediate one (default: 60)
#
# Layout:
#   $STATE/postgres/       data directory (owned by the OS user that runs the server)
#   $STATE/postgres-run/   unix socket directory
#   $STATE/postgres.log    server log
#
# Running as root: PostgreSQL refuses to run as root, so the server runs as
# the `postgres` OS user (created by the Debian package) via runuser. Run as
# a normal user: the server runs as that user and no privileges are needed
# (except to apt-get install the binaries once).
set -euo pipefail

readonly DB_NAME=turnlog DB_USER=turnlog DB_PASSWORD=turnlog
readonly HOST=127.0.0.1

STATE=${TURNLOG_STATE_DIR:-$HOME/.cache/turnlog}
PORT=${TURNLOG_PG_PORT:-5433}
START_TIMEOUT=${TURNLOG_PG_START_TIMEOUT:-60}
STOP_TIMEOUT=${TURNLOG_PG_STOP_TIMEOUT:-60}

PGDATA_DIR=$STATE/postgres
RUN_DIR=$STATE/postgres-run
LOG_FILE=$STATE/postgres.log
DSN="postgresql+psycopg://$DB_USER:$DB_PASSWORD@$HOST:$PORT/$DB_NAME"

SERVICE=postgres
# shellcheck source=deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    echo "usage: $0 {start|stop|restart|status}" >&2
    exit 2
}

# ---------------------------------------------------------------- helpers

# OS user that owns the cluster and runs the server.
if [[ $EUID -eq 0 ]]; then
    PG_OS_USER=postgres
else
    PG_OS_USER=$(id -un)
fi
# initdb names the bootstrap superuser after the OS user; local (unix
# socket) connections use peer auth, so the two must match.
PG_SUPERUSER=$PG_OS_USER

# Run a command as the cluster's OS user, from a directory it can read
# (avoids "could not change directory to /root" warnings).
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        (cd / && runuser -u "$PG_OS_USER" -- "$@")
    else
        (cd / && "$@")
    fi
}

APT_UPDATED=""
apt_install_postgres() {
    if [[ $EUID -ne 0 ]]; then
        die "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin.
Install them as root, then re-run:  sudo apt-get update && sudo apt-get install -y postgresql"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "PostgreSQL server binaries not found and apt-get is unavailable; install PostgreSQL server 15+ and set TURNLOG_PG_BIN"
    log "PostgreSQL server binaries not found; installing Debian's postgresql package"
    if [[ -z $APT_UPDATED ]]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q || die "apt-get update failed"
        APT_UPDATED=yes
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql ||
        die "apt-get install postgresql failed"
}

# Newest /usr/lib/postgresql/<ver>/bin holding initdb+pg_ctl, or the one
# matching the major version of an existing data directory.
find_pg_bin() {
    local want="" d best=""
    if [[ -n ${TURNLOG_PG_BIN:-} ]]; then
        [[ -x $TURNLOG_PG_BIN/initdb && -x $TURNLOG_PG_BIN/pg_ctl ]] ||
            die "TURNLOG_PG_BIN=$TURNLOG_PG_BIN has no initdb/pg_ctl"
        echo "$TURNLOG_PG_BIN"
        return 0
    fi
    [[ -f $PGDATA_DIR/PG_VERSION ]] && want=$(<"$PGDATA_DIR/PG_VERSION")
    while IFS= read -r d; do
        [[ -x $d/initdb && -x $d/pg_ctl && -x $d/postgres ]] || continue
        if [[ -n $want ]]; then
            [[ $d == "/usr/lib/postgresql/$want/bin" ]] && best=$d
        else
            best=$d # list is version-sorted: the last one wins
        fi
    done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -V)
    [[ -n $best ]] || return 1
    echo "$best"
}

# PostgreSQL's OS user must be able to traverse every directory on the way
# to $STATE. With the default state dir under /root (mode 0700) it cannot.
# We grant the *minimum*: search (x) permission, not read, on just the
# components that block it - via a POSIX ACL for the postgres user when
# setfacl exists, else the "other" x bit. That lets postgres open paths it
# already knows the name of, but not list /root. If you would rather not
# touch /root at all, point TURNLOG_STATE_DIR somewhere world-traversable
# (e.g. /var/tmp/turnlog) instead.
ensure_traversable() {
    [[ $EUID -eq 0 ]] || return 0
    local path="" comp
    local -a parts
    IFS=/ read -r -a parts <<<"${STATE#/}"
    for comp in "${parts[@]}"; do
        [[ -n $comp ]] || continue
        path+=/$comp
        if ! as_pg test -x "$path" 2>/dev/null; then
            if command -v setfacl >/dev/null 2>&1 && setfacl -m "u:$PG_OS_USER:x" "$path" 2>/dev/null &&
                as_pg test -x "$path" 2>/dev/null; then
                log "granted $PG_OS_USER search access to $path (ACL u:$PG_OS_USER:x)"
            else
                chmod o+x "$path"
                log "granted search (o+x) on $path so the $PG_OS_USER user can reach $STATE"
            fi
        fi
    done
    as_pg test -x "$STATE" || die "the $PG_OS_USER user still cannot reach $STATE; set TURNLOG_STATE_DIR to a directory it can access"
}

prepare_dirs() {
    mkdir -p "$STATE"
    ensure_traversable
    mkdir -p "$PGDATA_DIR" "$RUN_DIR"
    touch "$LOG_FILE"
    if [[ $EUID -eq 0 ]]; then
        chown "$PG_OS_USER:" "$PGDATA_DIR" "$RUN_DIR" "$LOG_FILE"
    fi
    chmod 0700 "$PGDATA_DIR"
    chmod 0755 "$RUN_DIR"
}

ensure_initdb() {
    [[ -f $PGDATA_DIR/PG_VERSION ]] && return 0
    local -a locale_opt=(--no-locale)
    if locale -a 2>/dev/null | grep -qiE '^c\.utf-?8$'; then
        locale_opt=(--locale=C.UTF-8)
    fi
    log "initializing cluster in $PGDATA_DIR"
    as_pg "$PG_BIN/initdb" -D "$PGDATA_DIR" -U "$PG_SUPERUSER" --encoding=UTF8 "${locale_opt[@]}" \
        --auth-local=peer --auth-host=scram-sha-256 >/dev/null ||
        die "initdb failed"
}

# Our settings live in turnlog.conf (rewritten on every start so env
# changes apply) included from postgresql.conf; pg_hba.conf is ours too.
write_configs() {
    local conf=$PGDATA_DIR/postgresql.conf
    if ! grep -q "^include_if_exists = 'turnlog.conf'" "$conf"; then
        printf "\n# turnlog: local settings written by deploy/postgres.sh\ninclude_if_exists = 'turnlog.conf'\n" >>"$conf"
    fi
    cat >"$PGDATA_DIR/turnlog.conf" <<EOF
# Written by deploy/postgres.sh on every start; edit the script, not this file.
listen_addresses = '$HOST'
port = $PORT
unix_socket_directories = '$SOCKET_DIR'
password_encryption = 'scram-sha-256'
max_connections = 100
shared_buffers = 128MB
# Commit times of rows: the benchmark's turn-to-durable latency (turnlog bench).
track_commit_timestamp = on
EOF
    cat >"$PGDATA_DIR/pg_hba.conf" <<'EOF'
# Written by deploy/postgres.sh.
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  peer
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
EOF
    if [[ $EUID -eq 0 ]]; then
        chown "$PG_OS_USER:" "$PGDATA_DIR/turnlog.conf" "$PGDATA_DIR/pg_hba.conf" "$conf"
    fi
    chmod 0600 "$PGDATA_DIR/turnlog.conf" "$PGDATA_DIR/pg_hba.conf"
}

is_running() {
    [[ -f $PGDATA_DIR/PG_VERSION ]] || return 1
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1
}

server_pid() {
    head -n1 "$PGDATA_DIR/postmaster.pid" 2>/dev/null || true
}

wait_ready() {
    local t0=$SECONDS deadline=$((SECONDS + START_TIMEOUT))
    while true; do
        if "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PORT" -t 2; then
            return 0
        fi
        # pg_ctl -W returns before postmaster.pid exists: give it a few
        # seconds before reading "not running" as "exited".
        if ((SECONDS - t0 >= 5)) && ! is_running; then
            print_log_tail
            die "server exited during startup"
        fi
        if ((SECONDS >= deadline)); then
            print_log_tail
            die "server did not become ready on $HOST:$PORT within ${START_TIMEOUT}s ('$0 stop' to stop it)"
        fi
        sleep 0.5
    done
}

psql_admin() {
    as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCKET_DIR" -p "$PORT" -U "$PG_SUPERUSER" -d postgres "$@"
}

# Role and database, only when missing.
ensure_role_and_db() {
    if [[ $(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'") != 1 ]]; then
        log "creating role $DB_USER"
        psql_admin -c "CREATE ROLE $DB_USER WITH LOGIN CREATEDB PASSWORD '$DB_PASSWORD'"
    fi
    if [[ $(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'") != 1 ]]; then
        log "creating database $DB_NAME"
        psql_admin -c "CREATE DATABASE $DB_NAME OWNER $DB_USER"
    fi
    # Prove the DSN works: TCP + password auth.
    PGPASSWORD=$DB_PASSWORD PGCONNECT_TIMEOUT=5 "$PG_BIN/psql" -X -q -tA \
        -h "$HOST" -p "$PORT" -U "$DB_USER" -d "$DB_NAME" -c 'SELECT 1' >/dev/null ||
        die "could not log in as $DB_USER over TCP at $HOST:$PORT"
}

setup() {
    if [[ $EUID -eq 0 ]] && ! command -v runuser >/dev/null 2>&1; then
        die "runuser (util-linux) is needed to run PostgreSQL as the $PG_OS_USER user: apt-get install -y util-linux"
    fi
    if ! PG_BIN=$(find_pg_bin); then
        if [[ -f $PGDATA_DIR/PG_VERSION ]]; then
            die "$PGDATA_DIR was created by PostgreSQL $(<"$PGDATA_DIR/PG_VERSION") but /usr/lib/postgresql/$(<"$PGDATA_DIR/PG_VERSION")/bin is missing; install postgresql-$(<"$PGDATA_DIR/PG_VERSION") or delete $PGDATA_DIR"
        fi
        apt_install_postgres
        PG_BIN=$(find_pg_bin) || die "postgresql installed but no initdb/pg_ctl under /usr/lib/postgresql/*/bin"
    fi
    if [[ $EUID -eq 0 ]] && ! id "$PG_OS_USER" >/dev/null 2>&1; then
        die "OS user '$PG_OS_USER' does not exist (normally created by Debian's postgresql-common package): apt-get install -y postgresql"
    fi
    # unix socket paths are limited to 107 bytes; fall back to /tmp.
    SOCKET_DIR=$RUN_DIR
    if ((${#RUN_DIR} + 20 > 107)); then
        SOCKET_DIR=/tmp
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local t0=$SECONDS
    setup
    if is_running; then
        wait_ready
        ensure_role_and_db
        log "already running (pid $(server_pid)) on $HOST:$PORT"
        log "DSN: $DSN"
        return 0
    fi
    if port_open "$PORT"; then
        die "port $HOST:$PORT is already in use by another process (not this cluster); stop it or set TURNLOG_PG_PORT.
$(port_owner "$PORT")"
    fi
    prepare_dirs
    ensure_initdb
    write_configs
    if [[ -s $LOG_FILE ]]; then # keep the previous run's log as postgres.log.1
        mv -f "$LOG_FILE" "$LOG_FILE.1"
        touch "$LOG_FILE"
        if [[ $EUID -eq 0 ]]; then chown "$PG_OS_USER:" "$LOG_FILE"; fi
    fi
    log "starting PostgreSQL $(<"$PGDATA_DIR/PG_VERSION") (logs: $LOG_FILE)"
    # -W: do not let pg_ctl wait; we poll pg_isready below with our own deadline.
    # setsid: own session, so the server survives the calling shell/terminal.
    # 9>&-: do not leak the lock descriptor into the server.
    local -a launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    if ! as_pg "${launcher[@]}" "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -l "$LOG_FILE" -W start >/dev/null 9>&-; then
        print_log_tail
        die "pg_ctl start failed"
    fi
    wait_ready
    ensure_role_and_db
    log "started (pid $(server_pid)) in $((SECONDS - t0))s on $HOST:$PORT"
    log "DSN: $DSN"
}

cmd_stop() {
    setup
    if ! is_running; then
        log "not running"
        return 0
    fi
    log "stopping (pid $(server_pid))"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t "$STOP_TIMEOUT" stop >/dev/null; then
        log "fast shutdown did not finish in ${STOP_TIMEOUT}s, using immediate shutdown"
        as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -m immediate -w -t 30 stop >/dev/null ||
            die "could not stop the server in $PGDATA_DIR"
    fi
    log "stopped"
}

cmd_status() {
    if ! PG_BIN=$(find_pg_bin); then
        log "not installed (no /usr/lib/postgresql/*/bin)"
        return 3
    fi
    if is_running; then
        if "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PORT" -t 2; then
            log "running (pid $(server_pid)) on $HOST:$PORT, data in $PGDATA_DIR"
            log "DSN: $DSN"
        else
            log "process running (pid $(server_pid)) but not accepting connections on $HOST:$PORT"
        fi
        return 0
    fi
    log "not running"
    return 3
}

main() {
    [[ $# -ge 1 ]] || usage
    case $1 in
        start) take_lock "$STATE" "$STATE/.postgres.lock"; cmd_start ;;
        stop) take_lock "$STATE" "$STATE/.postgres.lock"; cmd_stop ;;
        restart) take_lock "$STATE" "$STATE/.postgres.lock"; cmd_stop; cmd_start ;;
        status) cmd_status ;;
        *) usage ;;
    esac
}

main "$@"
