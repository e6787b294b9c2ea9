# shellcheck shell=bash
# Helpers shared by deploy/kafka.sh and deploy/postgres.sh. Source it after
# setting SERVICE (the name in messages), HOST and LOG_FILE.

log() { printf '%s: %s\n' "$SERVICE" "$*"; }
die() { printf '%s: ERROR: %s\n' "$SERVICE" "$*" >&2; exit 1; }

# True when something accepts TCP connections on $HOST:$1.
port_open() {
    # shellcheck disable=SC2016  # $0/$1 are expanded by the inner bash
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

# Describe whoever listens on port $1 (best effort).
port_owner() {
    if command -v ss >/dev/null 2>&1; then
        ss -ltnpH "sport = :$1" 2>/dev/null || true
    fi
}

print_log_tail() {
    if [[ -s $LOG_FILE ]]; then
        echo "---- last 40 lines of $LOG_FILE ----" >&2
        tail -n 40 "$LOG_FILE" >&2
        echo "----" >&2
    fi
}

# Serialize concurrent runs of one script: take_lock DIR LOCKFILE.
take_lock() {
    mkdir -p "$1"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$2"
        flock -w 180 9 || die "another $SERVICE script is busy (lock $2)"
    fi
}
