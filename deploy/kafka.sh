#!/usr/bin/env bash
# Local Apache Kafka 4.1.1 (KRaft) built from Apache Kafka's own jars on Maven Central. No Docker needed.
# One node by default (combined broker+controller, node.id=1, the demo's broker); with
# TURNLOG_KAFKA_NODES=3 a replicated cluster of three combined nodes on their own ports and data dirs.
#
#   deploy/kafka.sh start [NODE] | stop [NODE] | restart [NODE] | status | logs [NODE] [-f] | bootstrap
#
# NODE (1..TURNLOG_KAFKA_NODES) acts on one node of the cluster only (a chaos run's or an operator's
# rolling restart); without it, every node. `start` launches every node that is down before it waits
# for any: a KRaft node answers only once a majority of the controllers run. `bootstrap` prints the
# bootstrap servers (host:port,...).
#
# Environment:
#   TURNLOG_STATE_DIR              state root       (default: $HOME/.cache/turnlog)
#   TURNLOG_KAFKA_NODES            nodes            (default: 1; 3 for the local cluster)
#   TURNLOG_KAFKA_PORT             client listener of the single node (default: 9092)
#   TURNLOG_KAFKA_CONTROLLER_PORT  KRaft controller of the single node (default: 9093)
#   TURNLOG_KAFKA_CLUSTER_PORT     client listener of cluster node 1; node N listens on this + N - 1 (default: 9192)
#   TURNLOG_KAFKA_CLUSTER_CONTROLLER_PORT  controller of cluster node 1, likewise (default: 9292)
#   TURNLOG_KAFKA_HEAP             JVM -Xmx per node (default: 1g single, 768m per cluster node)
#   TURNLOG_KAFKA_START_TIMEOUT    seconds to wait for the broker to answer (default: 90)
#   TURNLOG_KAFKA_STOP_TIMEOUT     seconds to wait after SIGTERM before SIGKILL (default: 60)
#
# Layout (single node; a cluster node's files are the same under $STATE/kafka-cluster/node-N/):
#   $STATE/kafka-4.1.1/libs/       jars resolved by Maven from deploy/kafka/pom.xml
#   $STATE/kafka/server.properties broker config (rewritten on every start)
#   $STATE/kafka/data/             log.dirs (topics, KRaft metadata)
#   $STATE/kafka/kafka.log         broker stdout/stderr (previous run: kafka.log.1)
#   $STATE/kafka/kafka.pid         pid of the running broker
set -euo pipefail

readonly KAFKA_VERSION=4.1.1
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly POM=$SCRIPT_DIR/kafka/pom.xml

STATE=${TURNLOG_STATE_DIR:-$HOME/.cache/turnlog}
NODES=${TURNLOG_KAFKA_NODES:-1}
[[ $NODES =~ ^[1-9][0-9]*$ ]] || { echo "kafka: ERROR: TURNLOG_KAFKA_NODES must be a positive integer, not '$NODES'" >&2; exit 2; }
START_TIMEOUT=${TURNLOG_KAFKA_START_TIMEOUT:-90}
STOP_TIMEOUT=${TURNLOG_KAFKA_STOP_TIMEOUT:-60}
readonly HOST=127.0.0.1

LIBS=$STATE/kafka-$KAFKA_VERSION/libs
LIBS_MARKER=$STATE/kafka-$KAFKA_VERSION/libs.complete
if ((NODES == 1)); then
    BASE_DIR=$STATE/kafka
    CLUSTER_ID_FILE=$BASE_DIR/cluster.id
else
    BASE_DIR=$STATE/kafka-cluster
    CLUSTER_ID_FILE=$BASE_DIR/cluster.id
fi
# Replication of the broker's own topics (consumer offsets, transactions): min(3, nodes), min ISR one less.
INTERNAL_RF=$((NODES < 3 ? NODES : 3))
INTERNAL_MIN_ISR=$((INTERNAL_RF > 1 ? INTERNAL_RF - 1 : 1))

# The ports, folders and files of node $1 (1-based), as globals the functions below use.
select_node() {
    NODE=$1
    if ((NODES == 1)); then
        PORT=${TURNLOG_KAFKA_PORT:-9092}
        CONTROLLER_PORT=${TURNLOG_KAFKA_CONTROLLER_PORT:-9093}
        HEAP=${TURNLOG_KAFKA_HEAP:-1g}
        KDIR=$BASE_DIR
    else
        PORT=$((${TURNLOG_KAFKA_CLUSTER_PORT:-9192} + NODE - 1))
        CONTROLLER_PORT=$((${TURNLOG_KAFKA_CLUSTER_CONTROLLER_PORT:-9292} + NODE - 1))
        HEAP=${TURNLOG_KAFKA_HEAP:-768m}
        KDIR=$BASE_DIR/node-$NODE
    fi
    DATA_DIR=$KDIR/data
    PROPS=$KDIR/server.properties
    LOG4J_SERVER=$KDIR/log4j2.properties
    LOG4J_TOOLS=$KDIR/log4j2-tools.properties
    LOG_FILE=$KDIR/kafka.log
    PID_FILE=$KDIR/kafka.pid
    SERVICE=kafka
    ((NODES == 1)) || SERVICE="kafka node $NODE"
}

# Every node's address, comma-separated: `client` its client listener, host:port (bootstrap.servers);
# `controller` its KRaft controller, id@host:port (controller.quorum.voters). A subshell, so the
# selected node's globals stay as they are.
node_addresses() (
    local i out=""
    for ((i = 1; i <= NODES; i++)); do
        select_node "$i"
        case $1 in
            client) out+="${out:+,}$HOST:$PORT" ;;
            controller) out+="${out:+,}$i@$HOST:$CONTROLLER_PORT" ;;
            *) echo "kafka: ERROR: node_addresses: no kind '$1'" >&2; exit 2 ;;
        esac
    done
    echo "$out"
)

select_node 1
# shellcheck source=deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    echo "usage: $0 {start [NODE]|stop [NODE]|restart [NODE]|status|logs [NODE] [-f]|bootstrap}" >&2
    exit 2
}

# ---------------------------------------------------------------- helpers

# Is $1 a live process running *this* broker (guards against pid reuse)?
is_our_broker() {
    local pid=$1 cmdline
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r /proc/$pid/cmdline ]]; then
        cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" || true)
        [[ $cmdline == *"kafka.Kafka $PROPS"* ]] || return 1
    fi
    return 0
}

# Print the broker pid if it is running. Falls back to scanning /proc when
# the pid file was lost, and then repairs the pid file.
broker_pid() {
    local pid="" p cmdline
    if [[ -f $PID_FILE ]]; then
        pid=$(<"$PID_FILE")
        if is_our_broker "$pid"; then
            echo "$pid"
            return 0
        fi
    fi
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
        if [[ $cmdline == *"kafka.Kafka $PROPS"* ]]; then
            echo "$p" >"$PID_FILE"
            echo "$p"
            return 0
        fi
    done
    return 1
}

need_java() {
    command -v java >/dev/null 2>&1 ||
        die "java not found. Kafka $KAFKA_VERSION needs a Java 17+ runtime: apt-get install -y openjdk-17-jre-headless"
    local ver major
    ver=$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)
    major=${ver%%.*}
    [[ $major == 1 ]] && major=$(echo "$ver" | cut -d. -f2)
    if [[ $major =~ ^[0-9]+$ ]] && ((major < 17)); then
        die "java $ver found, Kafka $KAFKA_VERSION needs Java 17+: apt-get install -y openjdk-17-jre-headless"
    fi
}

# Resolve the broker jars with Maven unless a previous resolve of the *same*
# pom completed (the marker stores the pom's checksum).
ensure_jars() {
    local want have=""
    want=$(sha256sum "$POM" | cut -d' ' -f1)
    [[ -f $LIBS_MARKER ]] && have=$(<"$LIBS_MARKER")
    if [[ $have == "$want" && -f $LIBS/kafka_2.13-$KAFKA_VERSION.jar && -f $LIBS/kafka-tools-$KAFKA_VERSION.jar ]]; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 ||
        die "mvn not found; it is needed once to download the Kafka jars from Maven Central: apt-get install -y maven"
    log "resolving Kafka $KAFKA_VERSION jars with Maven into $LIBS (one-time)"
    rm -rf "$LIBS" "$LIBS_MARKER"
    mkdir -p "$LIBS"
    local mvn_log=$STATE/kafka-$KAFKA_VERSION/mvn.log
    if ! mvn -B -q -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
        -DoutputDirectory="$LIBS" -DincludeScope=runtime >"$mvn_log" 2>&1; then
        tail -n 40 "$mvn_log" >&2
        rm -rf "$LIBS"
        die "Maven could not resolve the Kafka jars (full output: $mvn_log)"
    fi
    [[ -f $LIBS/kafka_2.13-$KAFKA_VERSION.jar ]] ||
        die "Maven finished but $LIBS/kafka_2.13-$KAFKA_VERSION.jar is missing"
    echo "$want" >"$LIBS_MARKER"
}

write_configs() {
    mkdir -p "$KDIR" "$DATA_DIR"
    cat >"$PROPS" <<EOF
# Generated by deploy/kafka.sh on every start; edit the script, not this file.
process.roles=broker,controller
node.id=$NODE
controller.quorum.voters=$(node_addresses controller)
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA_DIR
num.partitions=1
default.replication.factor=$INTERNAL_RF
min.insync.replicas=$INTERNAL_MIN_ISR
unclean.leader.election.enable=false
auto.create.topics.enable=false
offsets.topic.replication.factor=$INTERNAL_RF
transaction.state.log.replication.factor=$INTERNAL_RF
transaction.state.log.min.isr=$INTERNAL_MIN_ISR
share.coordinator.state.topic.replication.factor=$INTERNAL_RF
share.coordinator.state.topic.min.isr=$INTERNAL_MIN_ISR
group.initial.rebalance.delay.ms=0
log.retention.hours=168
EOF

    # Broker: INFO to stdout (which nohup sends to kafka.log), chatty loggers quieted.
    cat >"$LOG4J_SERVER" <<'EOF'
status = warn
name = turnlog-kafka
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
# config dumps (hundreds of lines per client/broker start)
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser
logger.appinfo.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
logger.storage.name = org.apache.kafka.storage.internals.log
logger.storage.level = WARN
# one line per __consumer_offsets partition load, and a controller stats line every minute
logger.coordruntime.name = org.apache.kafka.coordinator.common.runtime.CoordinatorRuntime
logger.coordruntime.level = WARN
logger.perfmon.name = org.apache.kafka.controller.EventPerformanceMonitor
logger.perfmon.level = WARN
EOF

    # Command-line tools (storage format, readiness probe): warnings only, to stderr.
    cat >"$LOG4J_TOOLS" <<'EOF'
status = warn
name = turnlog-kafka-tools
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
}

run_tool() {
    java -Xmx256m -Dlog4j2.configurationFile="file:$LOG4J_TOOLS" -cp "$LIBS/*" "$@"
}

# Format the KRaft storage once (static quorum via controller.quorum.voters,
# so a plain `format --cluster-id` is what Kafka 4.1 expects).
ensure_formatted() {
    [[ -f $DATA_DIR/meta.properties ]] && return 0
    local cid
    if [[ -s $CLUSTER_ID_FILE ]]; then
        cid=$(<"$CLUSTER_ID_FILE")
    else
        cid=$(run_tool kafka.tools.StorageTool random-uuid)
        echo "$cid" >"$CLUSTER_ID_FILE"
    fi
    log "formatting storage in $DATA_DIR (cluster id $cid)"
    run_tool kafka.tools.StorageTool format --cluster-id "$cid" --config "$PROPS" --ignore-formatted >/dev/null ||
        die "storage format failed"
}

HAVE_CONFLUENT=""
# Does the broker answer a metadata request?
broker_answers() {
    if [[ -z $HAVE_CONFLUENT ]]; then
        if command -v python3 >/dev/null 2>&1 && python3 -c 'import confluent_kafka' 2>/dev/null; then
            HAVE_CONFLUENT=yes
        else
            HAVE_CONFLUENT=no
        fi
    fi
    if [[ $HAVE_CONFLUENT == yes ]]; then
        python3 - "$HOST:$PORT" >/dev/null 2>&1 <<'EOF'
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=5)
sys.exit(0 if md.brokers else 1)
EOF
    else
        timeout 30 java -Xmx128m -Dlog4j2.configurationFile="file:$LOG4J_TOOLS" -cp "$LIBS/*" \
            org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "$HOST:$PORT" >/dev/null 2>&1
    fi
}

# Wait until the broker accepts connections and answers, or fail.
wait_ready() {
    local pid=$1 deadline=$((SECONDS + START_TIMEOUT))
    local found
    while true; do
        if ! kill -0 "$pid" 2>/dev/null; then
            # The launcher may have forked (setsid as a group leader): look again.
            if found=$(broker_pid); then
                pid=$found
                continue
            fi
            print_log_tail
            rm -f "$PID_FILE"
            die "broker process $pid exited during startup"
        fi
        if port_open "$PORT" && broker_answers; then
            return 0
        fi
        if ((SECONDS >= deadline)); then
            print_log_tail
            die "broker did not answer on $HOST:$PORT within ${START_TIMEOUT}s (still running as pid $pid; '$0 stop' to kill it)"
        fi
        sleep 1
    done
}

# ---------------------------------------------------------------- commands

# Launch the selected node unless it runs; prints its pid. Does not wait for it to answer.
launch_node() {
    local pid p
    mkdir -p "$KDIR"
    if pid=$(broker_pid); then
        echo "$pid"
        return 0
    fi
    for p in "$PORT" "$CONTROLLER_PORT"; do
        if port_open "$p"; then
            die "port $HOST:$p is already in use by another process (not this broker); stop it or set TURNLOG_KAFKA_PORT / TURNLOG_KAFKA_CONTROLLER_PORT (a cluster: TURNLOG_KAFKA_CLUSTER_PORT / TURNLOG_KAFKA_CLUSTER_CONTROLLER_PORT).
$(port_owner "$p")"
        fi
    done
    write_configs
    ensure_formatted >&2  # stdout carries only the pid

    [[ -s $LOG_FILE ]] && mv -f "$LOG_FILE" "$LOG_FILE.1"
    log "starting broker (logs: $LOG_FILE)" >&2
    # setsid: own session, so the broker survives the calling shell/terminal.
    # 9>&-: do not leak the lock descriptor into the long-running broker.
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    (
        cd "$KDIR"
        exec "${launcher[@]}" nohup java "-Xmx$HEAP" -Xms256m -server \
            -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
            -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
            -Dlog4j2.configurationFile="file:$LOG4J_SERVER" -Dkafka.logs.dir="$KDIR" \
            -cp "$LIBS/*" kafka.Kafka "$PROPS"
    ) >"$LOG_FILE" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$PID_FILE"
    echo "$pid"
}

# Start node $1, or every node when $1 is empty: launch all that are down, then wait for each.
cmd_start() {
    local t0=$SECONDS i pid nodes=()
    if [[ -n ${1:-} ]]; then nodes=("$1"); else for ((i = 1; i <= NODES; i++)); do nodes+=("$i"); done; fi
    need_java
    ensure_jars
    local -A pids=()
    for i in "${nodes[@]}"; do
        select_node "$i"
        pids[$i]=$(launch_node) || exit 1
    done
    for i in "${nodes[@]}"; do
        select_node "$i"
        wait_ready "${pids[$i]}"
        log "running (pid $(broker_pid)) on $HOST:$PORT"
    done
    SERVICE=kafka
    log "started in $((SECONDS - t0))s; bootstrap.servers=$(node_addresses client)"
}

# Send SIGTERM to the selected node; prints its pid, or nothing if it is not running.
signal_node() {
    local pid
    if ! pid=$(broker_pid); then
        rm -f "$PID_FILE"
        log "not running" >&2
        return 0
    fi
    log "stopping broker (pid $pid)" >&2
    kill -TERM "$pid" 2>/dev/null || true
    echo "$pid"
}

# Wait for the selected node, signalled as pid $1, to exit; SIGKILL it at $2 (SECONDS), the
# stop timeout after the signal.
await_node() {
    local pid=$1 deadline=$2
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "still running after ${STOP_TIMEOUT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 0.2
        done
        kill -0 "$pid" 2>/dev/null && die "pid $pid survived SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

# Stop node $1, or every node. Every node gets SIGTERM before any is waited for: stopped one by
# one, the last node would lose its controller quorum (2 of 3 voters) and wait out its
# controlled shutdown until SIGKILL.
cmd_stop() {
    local i pid deadline
    local -a pids=()
    if [[ -n ${1:-} ]]; then
        select_node "$1"
        pid=$(signal_node)
        [[ -n $pid ]] && await_node "$pid" $((SECONDS + STOP_TIMEOUT))
        return 0
    fi
    for ((i = 1; i <= NODES; i++)); do
        select_node "$i"
        pids[i]=$(signal_node)
    done
    deadline=$((SECONDS + STOP_TIMEOUT))  # one stop timeout for all: they stop side by side
    for ((i = 1; i <= NODES; i++)); do
        [[ -n ${pids[i]:-} ]] || continue
        select_node "$i"
        await_node "${pids[i]}" "$deadline"
    done
}

cmd_status() {
    local pid i rc=0
    for ((i = 1; i <= NODES; i++)); do
        select_node "$i"
        if pid=$(broker_pid); then
            if [[ $(ps -o stat= -p "$pid" 2>/dev/null) == T* ]]; then
                log "stopped by a signal (pid $pid, SIGSTOP): it holds $HOST:$PORT but answers nothing"
            elif port_open "$PORT"; then
                log "running (pid $pid) on $HOST:$PORT, data in $DATA_DIR"
            else
                log "process running (pid $pid) but $HOST:$PORT is not accepting connections (starting?)"
            fi
        else
            log "not running"
            rc=3
        fi
    done
    return "$rc"
}

cmd_logs() {
    if [[ ${1:-} =~ ^[0-9]+$ ]]; then
        node_arg "$1"
        shift
    fi
    [[ -f $LOG_FILE ]] || die "no log file yet at $LOG_FILE"
    if [[ ${1:-} == -f ]]; then
        exec tail -n 100 -F "$LOG_FILE"
    fi
    tail -n 200 "$LOG_FILE"
}

# Check that $1 names a node of this cluster, and select it.
node_arg() {
    [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= NODES)) ||
        die "no node '$1': nodes are 1..$NODES (TURNLOG_KAFKA_NODES=$NODES)"
    select_node "$1"
}

# Serialize concurrent start/stop calls on the same state dir (the whole cluster: one lock).

main() {
    [[ $# -ge 1 ]] || usage
    local command=$1 node=${2:-}
    [[ -n $node && $command != logs ]] && node_arg "$node"
    case $command in
        start) take_lock "$BASE_DIR" "$BASE_DIR/.lock"; cmd_start "$node" ;;
        stop) take_lock "$BASE_DIR" "$BASE_DIR/.lock"; cmd_stop "$node" ;;
        restart) take_lock "$BASE_DIR" "$BASE_DIR/.lock"; cmd_stop "$node"; cmd_start "$node" ;;
        status) cmd_status ;;
        logs) shift; cmd_logs "$@" ;;
        bootstrap) node_addresses client ;;
        *) usage ;;
    esac
}

main "$@"
