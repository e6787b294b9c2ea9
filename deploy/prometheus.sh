#!/usr/bin/env bash
# A local Prometheus for turnlog, from Debian's packages. No Docker needed.
#
#   deploy/prometheus.sh install | start | stop | restart | status
#
# install: Debian's `prometheus` package via apt-get when promtool is missing (the alert rules'
#          unit tests need it; CI runs this before the tests). The package's own service is
#          neither started nor used: when systemd runs, it is stopped and disabled after the install.
# start:   our own Prometheus (installs first if needed) on 127.0.0.1 only, with
#          deploy/observability/prometheus.yml (2 s scrapes) and its alert rules, scraping what the
#          file_sd targets files in $STATE/prometheus/targets/*.json name (docs/observability.md).
#
# Environment:
#   TURNLOG_STATE_DIR                state root   (default: $HOME/.cache/turnlog)
#   TURNLOG_PROMETHEUS_PORT          HTTP port    (default: 9090)
#   TURNLOG_PROMETHEUS_RETENTION     TSDB retention (default: 2d)
#   TURNLOG_PROMETHEUS_START_TIMEOUT seconds to wait for /-/ready (default: 60)
#   TURNLOG_PROMETHEUS_STOP_TIMEOUT  seconds after SIGTERM before SIGKILL (default: 30)
#   TURNLOG_PROMTOOL                 promtool binary (default: promtool on PATH, else /usr/bin/promtool)
#
# Layout:
#   $STATE/prometheus/prometheus.yml, alerts.yml  copies of deploy/observability/'s (rewritten on every start)
#   $STATE/prometheus/targets/*.json              file_sd targets files (drop yours here)
#   $STATE/prometheus/data/                       the TSDB (kept between runs)
#   $STATE/prometheus/prometheus.log              server log (previous run: prometheus.log.1)
#   $STATE/prometheus/prometheus.pid              pid of the running server
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly CONFIG_SOURCE=$SCRIPT_DIR/observability
readonly HOST=127.0.0.1

STATE=${TURNLOG_STATE_DIR:-$HOME/.cache/turnlog}
PORT=${TURNLOG_PROMETHEUS_PORT:-9090}
RETENTION=${TURNLOG_PROMETHEUS_RETENTION:-2d}
START_TIMEOUT=${TURNLOG_PROMETHEUS_START_TIMEOUT:-60}
STOP_TIMEOUT=${TURNLOG_PROMETHEUS_STOP_TIMEOUT:-30}

PDIR=$STATE/prometheus
CONFIG=$PDIR/prometheus.yml
TARGETS_DIR=$PDIR/targets
DATA_DIR=$PDIR/data
LOG_FILE=$PDIR/prometheus.log
PID_FILE=$PDIR/prometheus.pid

SERVICE=prometheus
# shellcheck source=deploy/lib.sh
source "$SCRIPT_DIR/lib.sh"

usage() {
    echo "usage: $0 {install|start|stop|restart|status}" >&2
    exit 2
}

[[ $PORT =~ ^[0-9]+$ ]] && ((PORT >= 1 && PORT <= 65535)) ||
    die "TURNLOG_PROMETHEUS_PORT must be a port number (1-65535), not '$PORT'"

# ---------------------------------------------------------------- helpers

promtool_path() {
    if [[ -n ${TURNLOG_PROMTOOL:-} ]]; then
        echo "$TURNLOG_PROMTOOL"
    else
        command -v promtool 2>/dev/null || echo /usr/bin/promtool
    fi
}

prometheus_path() {
    command -v prometheus 2>/dev/null || echo /usr/bin/prometheus
}

# The package's own service (prometheus.service) must not run: it would scrape and store on its own.
keep_package_service_off() {
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
        if systemctl is-enabled --quiet prometheus 2>/dev/null || systemctl is-active --quiet prometheus 2>/dev/null; then
            log "stopping and disabling the package's own prometheus.service (deploy/prometheus.sh runs its own)"
            systemctl disable --now prometheus >/dev/null 2>&1 || log "could not disable prometheus.service; stop it yourself"
        fi
    fi
}

cmd_install() {
    local promtool prometheus
    promtool=$(promtool_path)
    prometheus=$(prometheus_path)
    if [[ -x $promtool && -x $prometheus ]]; then
        log "present: $("$promtool" --version 2>&1 | head -n1)"
        return 0
    fi
    if [[ -n ${TURNLOG_PROMTOOL:-} && ! -x $TURNLOG_PROMTOOL ]]; then
        die "TURNLOG_PROMTOOL=$TURNLOG_PROMTOOL is not an executable"
    fi
    if [[ $EUID -ne 0 ]]; then
        die "promtool/prometheus not found. Install them as root, then re-run:  sudo apt-get update && sudo apt-get install -y --no-install-recommends prometheus"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "promtool not found and apt-get is unavailable; install Prometheus 2.x and set TURNLOG_PROMTOOL / PATH"
    log "installing Debian's prometheus package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || {
        apt-get update -q || die "apt-get update failed"
        apt-get install -y -q --no-install-recommends prometheus || die "apt-get install prometheus failed"
    }
    keep_package_service_off
    promtool=$(promtool_path)
    [[ -x $promtool ]] || die "prometheus installed but $promtool is missing"
    log "installed: $("$promtool" --version 2>&1 | head -n1)"
}

# Is $1 a live process running *this* Prometheus (guards against pid reuse)?
is_ours() {
    local pid=$1 cmdline
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r /proc/$pid/cmdline ]]; then
        cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" || true)
        [[ $cmdline == *"--config.file=$CONFIG "* ]] || return 1
    fi
    return 0
}

server_pid() {
    local pid
    [[ -f $PID_FILE ]] || return 1
    pid=$(<"$PID_FILE")
    is_ours "$pid" || return 1
    echo "$pid"
}

answers_ready() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --max-time 2 "http://$HOST:$PORT/-/ready" >/dev/null 2>&1
    else
        port_open "$PORT"
    fi
}

# Copy the configuration and the rules into $PDIR (relative paths resolve there) and check them.
write_config() {
    mkdir -p "$PDIR" "$TARGETS_DIR" "$DATA_DIR"
    cp "$CONFIG_SOURCE/prometheus.yml" "$CONFIG"
    cp "$CONFIG_SOURCE/alerts.yml" "$PDIR/alerts.yml"
    local out
    if ! out=$("$(promtool_path)" check config "$CONFIG" 2>&1); then
        printf '%s\n' "$out" >&2
        die "promtool check config $CONFIG failed"
    fi
}

wait_ready() {
    local pid=$1 deadline=$((SECONDS + START_TIMEOUT))
    while true; do
        if ! kill -0 "$pid" 2>/dev/null; then
            print_log_tail
            rm -f "$PID_FILE"
            die "prometheus (pid $pid) exited during startup"
        fi
        answers_ready && return 0
        if ((SECONDS >= deadline)); then
            print_log_tail
            die "prometheus did not answer on $HOST:$PORT within ${START_TIMEOUT}s (still running as pid $pid; '$0 stop' to stop it)"
        fi
        sleep 0.5
    done
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local pid t0=$SECONDS
    cmd_install >/dev/null
    if pid=$(server_pid); then
        write_config
        kill -HUP "$pid"  # re-read the configuration and the rules just copied
        wait_ready "$pid"
        log "already running (pid $pid) on http://$HOST:$PORT (configuration reloaded); targets: $TARGETS_DIR/*.json"
        return 0
    fi
    if port_open "$PORT"; then
        die "port $HOST:$PORT is already in use by another process (not this Prometheus); stop it or set TURNLOG_PROMETHEUS_PORT.
$(port_owner "$PORT")"
    fi
    write_config
    [[ -s $LOG_FILE ]] && mv -f "$LOG_FILE" "$LOG_FILE.1"
    log "starting (logs: $LOG_FILE)"
    # setsid: own session, so the server survives the calling shell; 9>&-: do not leak the lock.
    local -a launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    (
        cd "$PDIR"
        exec "${launcher[@]}" "$(prometheus_path)" "--config.file=$CONFIG" \
            "--storage.tsdb.path=$DATA_DIR" "--storage.tsdb.retention.time=$RETENTION" \
            "--web.listen-address=$HOST:$PORT" --web.enable-lifecycle
    ) >"$LOG_FILE" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$PID_FILE"
    wait_ready "$pid"
    log "started (pid $pid) in $((SECONDS - t0))s on http://$HOST:$PORT; targets: $TARGETS_DIR/*.json"
}

cmd_stop() {
    local pid deadline
    if ! pid=$(server_pid); then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "still running after ${STOP_TIMEOUT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

cmd_status() {
    local pid
    if [[ ! -x $(promtool_path) ]]; then
        log "not installed ('$0 install')"
        return 3
    fi
    if pid=$(server_pid); then
        if answers_ready; then
            log "running (pid $pid) on http://$HOST:$PORT, data in $DATA_DIR, targets: $TARGETS_DIR/*.json"
        else
            log "process running (pid $pid) but not ready on $HOST:$PORT"
        fi
        return 0
    fi
    log "not running"
    return 3
}

main() {
    [[ $# -ge 1 ]] || usage
    case $1 in
        install) cmd_install ;;
        start) take_lock "$STATE" "$STATE/.prometheus.lock"; cmd_start ;;
        stop) take_lock "$STATE" "$STATE/.prometheus.lock"; cmd_stop ;;
        restart) take_lock "$STATE" "$STATE/.prometheus.lock"; cmd_stop; cmd_start ;;
        status) cmd_status ;;
        *) usage ;;
    esac
}

main "$@"
