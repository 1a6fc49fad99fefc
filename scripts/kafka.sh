#!/usr/bin/env bash
# A real Apache Kafka broker for development and CI, without Docker.
#
#   scripts/kafka.sh fetch     download Kafka 4.4.0 and its runtime jars (Maven Central) into the cache
#   scripts/kafka.sh start     start one KRaft node (broker+controller) on 127.0.0.1; idempotent
#   scripts/kafka.sh start --brokers 3
#                              start a 3-node KRaft cluster (each node broker+controller, replication 3,
#                              min.insync.replicas 2), pids in $GPUFOLD_RUN_DIR/kafka/broker-<id>.pid; idempotent:
#                              it (re)starts only the nodes that are not running (how bench/chaos.py revives one)
#   scripts/kafka.sh stop      stop it (SIGTERM, then SIGKILL after a grace period); idempotent
#   scripts/kafka.sh restart   stop, then start again on the same ports with the same data (data is kept)
#   scripts/kafka.sh status    exit 0 and print the address if it is running, exit 1 if not
#   scripts/kafka.sh clean     stop it and delete its run directory (data, logs, config)
#
# Needs: bash, java 17+, and (for `fetch` only) maven. No Docker, no Kafka tarball.
#
# Environment (all optional):
#   GPUFOLD_CACHE        jar cache root (default: $HOME/.cache/gpufold); jars go to $GPUFOLD_CACHE/kafka-4.4.0/libs
#   GPUFOLD_RUN_DIR      run directory (default: $PWD/.services); the broker lives in $GPUFOLD_RUN_DIR/kafka/
#                        and `start` writes $GPUFOLD_RUN_DIR/kafka.env (export GPUFOLD_KAFKA_BOOTSTRAP=...)
#   GPUFOLD_KAFKA_PORT, GPUFOLD_KAFKA_CONTROLLER_PORT
#                        fixed ports for the first start (default: two free ports picked at random);
#                        later starts reuse the ports written in server.properties
#   GPUFOLD_KAFKA_START_TIMEOUT  seconds to wait for the broker to answer (default 90)
#   GPUFOLD_KAFKA_STOP_TIMEOUT   seconds to wait after SIGTERM before SIGKILL (default 30)
#   GPUFOLD_KAFKA_HEAP           JVM heap options (default "-Xms256m -Xmx768m")
#   GPUFOLD_KAFKA_JVM_OPTS       more JVM options (default "-XX:TieredStopAtLevel=1": C1 JIT only, which starts
#                                the broker about twice as fast on a busy 2-core machine; set it to "" for the
#                                full C2 JIT, e.g. for long benchmarks)
#   GPUFOLD_KAFKA_CDS            1 (default) keeps a class-data-sharing archive of Kafka's classes next to the
#                                jars, made at the first clean stop and used by later starts; 0 turns it off
#   GPUFOLD_PYTHON       python with confluent_kafka for the readiness check (default: .venv/bin/python of
#                        this repo, then python3; without confluent_kafka, or with GPUFOLD_PYTHON=none, the
#                        Java org.apache.kafka.tools.TopicCommand --list is used)
set -euo pipefail

readonly KAFKA_VERSION=4.4.0
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
readonly SCRIPT_DIR REPO_DIR
readonly POM="$SCRIPT_DIR/kafka/pom.xml"
readonly LOG4J_CONFIG="$SCRIPT_DIR/kafka/log4j2.properties"

readonly CACHE_ROOT="${GPUFOLD_CACHE:-$HOME/.cache/gpufold}"
readonly KAFKA_HOME="$CACHE_ROOT/kafka-$KAFKA_VERSION"
readonly LIBS="$KAFKA_HOME/libs"
readonly MARKER="$LIBS/.complete"

RUN_DIR="${GPUFOLD_RUN_DIR:-$PWD/.services}"
mkdir -p "$RUN_DIR"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
readonly RUN_DIR
readonly KDIR="$RUN_DIR/kafka"
readonly PROPS="$KDIR/server.properties"
readonly DATA_DIR="$KDIR/data"
readonly LOG_DIR="$KDIR/logs"
readonly PID_FILE="$KDIR/kafka.pid"
readonly ENV_FILE="$RUN_DIR/kafka.env"

readonly START_TIMEOUT="${GPUFOLD_KAFKA_START_TIMEOUT:-90}"
readonly STOP_TIMEOUT="${GPUFOLD_KAFKA_STOP_TIMEOUT:-30}"
readonly HEAP_OPTS="${GPUFOLD_KAFKA_HEAP:--Xms256m -Xmx768m}"
readonly JVM_OPTS="${GPUFOLD_KAFKA_JVM_OPTS--XX:TieredStopAtLevel=1}"
readonly CDS_PENDING="$KDIR/cds.pending"

say() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { printf 'kafka.sh: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed ($2)"; }

# Hold an exclusive lock on file $2 through file descriptor $1 until this script exits (no-op without
# flock). fd 8 guards the jar cache, fd 9 the run directory; the broker is started with both closed so that
# it never inherits a lock.
lock() {
    if command -v flock >/dev/null 2>&1; then
        mkdir -p "$(dirname "$2")"
        eval "exec $1>\"\$2\""
        local wait=$((START_TIMEOUT + STOP_TIMEOUT + 600))
        flock -w "$wait" "$1" || die "another scripts/kafka.sh still holds $2 after ${wait} s"
    fi
}

# A digest of what the pom asks for: comments and white space do not count, so editing a comment does not
# trigger a new download (which would also swap the jars under brokers that other run dirs have running).
pom_digest() {
    tr -d ' \t\r\n' <"$POM" | sed 's/<!--\([^-]\|-[^-]\)*-->//g' | sha256sum | cut -d' ' -f1
}

libs_complete() {
    [[ -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$(pom_digest)" ]]
}

cmd_fetch() {
    if libs_complete; then
        say "Kafka $KAFKA_VERSION jars already in $LIBS"
        return 0
    fi
    need java "Java 17 or newer is needed to run Kafka $KAFKA_VERSION"
    need mvn "Maven is needed once to download Kafka's jars from Maven Central"
    mkdir -p "$KAFKA_HOME"
    lock 8 "$KAFKA_HOME/.fetch.lock"
    if libs_complete; then  # another fetch finished while we waited for the lock
        say "Kafka $KAFKA_VERSION jars already in $LIBS"
        return 0
    fi
    local tmp="$KAFKA_HOME/libs.tmp.$$" log="$KAFKA_HOME/fetch.log" started=$SECONDS
    rm -rf "$tmp"
    say "downloading Kafka $KAFKA_VERSION and its runtime dependencies with Maven into $LIBS ..."
    if ! mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
            -DoutputDirectory="$tmp" >"$log" 2>&1; then
        tail -n 40 "$log" >&2 || true
        rm -rf "$tmp"
        die "maven could not fetch Kafka $KAFKA_VERSION (full log: $log)"
    fi
    local jar
    for jar in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar" \
               "kafka-tools-$KAFKA_VERSION.jar" "log4j-core-"; do
        compgen -G "$tmp/$jar*" >/dev/null || { rm -rf "$tmp"; die "maven finished but $jar is missing (log: $log)"; }
    done
    pom_digest >"$tmp/.complete"
    rm -rf "$LIBS"
    mv "$tmp" "$LIBS"
    say "fetched $(find "$LIBS" -name '*.jar' | wc -l) jars in $((SECONDS - started)) s"
}

# --- process state ------------------------------------------------------------------------------

# The pid of our running broker, or nothing. Checks that the pid really is this run dir's broker.
broker_pid() {
    [[ -f "$PID_FILE" ]] || return 0
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    local cmdline
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    if [[ "$cmdline" == *" kafka.Kafka $PROPS "* ]]; then
        echo "$pid"
    fi
}

bootstrap_address() { echo "127.0.0.1:$(prop gpufold.port)"; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Free TCP ports on 127.0.0.1 (two, or $1), below the kernel's ephemeral range so that outgoing connections
# do not take them between a stop and a restart.
pick_ports() {
    local python="" count="${1:-2}"
    python="$(command -v python3 || true)"
    if [[ -n "$python" ]]; then
        "$python" - "$count" <<'PY'
import random, socket, sys
picked = []
while len(picked) < int(sys.argv[1]):
    port = random.randint(20000, 32000)
    if port in picked:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    picked.append(port)
print(*picked)
PY
    else
        ((count == 2)) || die "python3 is needed to pick $count ports"
        local a b
        while :; do
            a=$((20000 + RANDOM % 12000)); b=$((20000 + RANDOM % 12000))
            [[ $a -ne $b ]] && ! port_in_use "$a" && ! port_in_use "$b" && break
        done
        echo "$a $b"
    fi
}

write_config() {
    local port ctl
    read -r port ctl < <(pick_ports)
    port="${GPUFOLD_KAFKA_PORT:-$port}"
    ctl="${GPUFOLD_KAFKA_CONTROLLER_PORT:-$ctl}"
    [[ "$port" != "$ctl" ]] || die "the broker and controller ports must differ (both $port)"
    port_in_use "$port" && die "port $port is in use by another process"
    port_in_use "$ctl" && die "port $ctl is in use by another process"
    mkdir -p "$KDIR" "$DATA_DIR" "$LOG_DIR"
    cat >"$PROPS" <<EOF
# Written by scripts/kafka.sh: one Kafka $KAFKA_VERSION node in KRaft mode, broker and controller in one
# process, for development and tests only. Later starts reuse this file (same ports, same data).
# gpufold.port=$port
# gpufold.controller.port=$ctl

process.roles=broker,controller
node.id=1
# Static quorum of one voter (storage formatted with a cluster id, kraft.version 0).
controller.quorum.voters=1@127.0.0.1:$ctl

listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER

log.dirs=$DATA_DIR

# Single node: every internal topic and every acks=all write needs only this one replica, so transactions
# (__transaction_state) and consumer groups (__consumer_offsets) work.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0

# Topics are normally created explicitly; auto-creation stays on (Kafka's default) for convenience.
auto.create.topics.enable=true
num.partitions=1

# Small segments: quick log recovery after a SIGKILL, less disk in tests.
log.segment.bytes=33554432
log.retention.hours=24
log.retention.check.interval.ms=60000
# Abort transactions whose producer vanished after 60 s at most (default 15 min), checked every 5 s.
transaction.max.timeout.ms=60000
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000

# Two cores on CI machines.
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
}

# kafka.sh's own bookkeeping (the ports) is kept in comments of server.properties, so Kafka never sees
# unknown keys, and read back from there.
prop() { sed -n "s/^# $1=//p" "$PROPS" | tail -n 1; }

cluster_id() {
    local python=""
    python="$(command -v python3 || true)"
    if [[ -n "$python" ]]; then
        # Like Kafka's Uuid.randomUuid(): URL-safe base64 of 16 random bytes, never starting with "-" (the
        # storage tool's argument parser would take such an id for an option).
        "$python" - <<'PY'
import base64, uuid
while True:
    text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not text.startswith("-"):
        print(text)
        break
PY
    else
        java -cp "$LIBS/*" -Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.logs.dir="$LOG_DIR" \
            kafka.tools.StorageTool random-uuid
    fi
}

format_storage() {
    [[ -f "$DATA_DIR/meta.properties" ]] && return 0
    local id archive share=()
    id="$(cluster_id)"
    archive="$(cds_archive)"
    [[ "${GPUFOLD_KAFKA_CDS:-1}" == 1 && -s "$archive" ]] && share=("-XX:SharedArchiveFile=$archive" -Xlog:cds=off)
    say "formatting $DATA_DIR (cluster id $id)"
    if ! java -Xmx256m -XX:TieredStopAtLevel=1 "${share[@]}" -cp "$LIBS/*" -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
            -Dkafka.logs.dir="$LOG_DIR" \
            kafka.tools.StorageTool format --config "$PROPS" --cluster-id "$id" --ignore-formatted \
            >"$LOG_DIR/format.log" 2>&1; then
        cat "$LOG_DIR/format.log" >&2
        die "formatting the KRaft storage failed"
    fi
}

# A python that can import confluent_kafka, or nothing.
find_python() {
    [[ "${GPUFOLD_PYTHON:-}" == none ]] && return 0
    local py
    for py in "${GPUFOLD_PYTHON:-}" "$REPO_DIR/.venv/bin/python" "$(command -v python3 || true)"; do
        [[ -n "$py" && -x "$py" ]] || continue
        if "$py" -c 'import confluent_kafka' >/dev/null 2>&1; then
            echo "$py"
            return 0
        fi
    done
}

# Does the broker answer a metadata request and list itself as a live broker?
# With a third argument N: does it list at least N live brokers?
broker_answers() {
    local address="$1" python="$2" want="${3:-1}"
    if [[ -n "$python" ]]; then
        "$python" - "$address" "$want" 2>/dev/null <<'PY'
import sys
from confluent_kafka.admin import AdminClient

admin = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0, "socket.connection.setup.timeout.ms": 2000})
metadata = admin.list_topics(timeout=3)
sys.exit(0 if len(metadata.brokers) >= int(sys.argv[2]) else 1)
PY
    else
        # Short client timeouts: against a broker that is not up yet, TopicCommand would wait 60 s.
        printf '%s\n' request.timeout.ms=4000 default.api.timeout.ms=6000 \
            socket.connection.setup.timeout.ms=1000 socket.connection.setup.timeout.max.ms=2000 \
            >"$KDIR/admin-check.properties"
        timeout 30 java -Xmx128m -XX:TieredStopAtLevel=1 -cp "$LIBS/*" -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
            -Dkafka.logs.dir="$LOG_DIR" org.apache.kafka.tools.TopicCommand --bootstrap-server "$address" \
            --command-config "$KDIR/admin-check.properties" --list >/dev/null 2>&1
    fi
}

show_logs() {
    local f shown=0
    for f in "$LOG_DIR/kafka.out" "$LOG_DIR/server.log"; do
        if [[ -s "$f" ]]; then
            printf -- '--- last lines of %s ---\n' "$f" >&2
            tail -n 30 "$f" >&2
            shown=1
        fi
    done
    ((shown)) || say "the broker has logged nothing yet ($LOG_DIR)"
}

wait_ready() {
    local pid="$1" address="$2" python started=$SECONDS
    python="$(find_python)"
    [[ -n "$python" ]] || say "no python with confluent_kafka found; checking with the Java TopicCommand"
    while :; do
        if [[ ! -d "/proc/$pid" ]]; then
            show_logs
            rm -f "$PID_FILE"
            die "the broker process ($pid) exited during startup"
        fi
        if broker_answers "$address" "$python"; then
            return 0
        fi
        if ((SECONDS - started >= START_TIMEOUT)); then
            show_logs
            say "stopping the broker that did not become ready"
            stop_pid "$pid"
            die "the broker did not answer on $address within ${START_TIMEOUT} s (logs: $LOG_DIR)"
        fi
        sleep 1
    done
}

write_env() {
    local address="$1"
    printf 'export GPUFOLD_KAFKA_BOOTSTRAP=%s\n' "$address" >"$ENV_FILE.tmp"
    mv "$ENV_FILE.tmp" "$ENV_FILE"
}

# start_broker MODE: MODE "restart" insists on the recorded ports (clients keep their address); "start"
# moves a stopped broker to new free ports when something else took the recorded ones meanwhile.
start_broker() {
    local mode="$1" pid address
    pid="$(broker_pid)"
    if [[ -n "$pid" ]]; then
        address="$(bootstrap_address)"
        wait_ready "$pid" "$address"
        write_env "$address"
        say "already running (pid $pid) on $address"
        echo "$address"
        return 0
    fi
    rm -f "$PID_FILE"
    libs_complete || cmd_fetch
    need java "Java 17 or newer is needed to run Kafka $KAFKA_VERSION"

    if [[ ! -f "$PROPS" ]]; then
        write_config
    fi
    mkdir -p "$DATA_DIR" "$LOG_DIR"
    local port ctl
    port="$(prop gpufold.port)"
    ctl="$(prop gpufold.controller.port)"
    [[ -n "$port" && -n "$ctl" ]] || die "$PROPS has no recorded ports; run '$0 clean' and start again"
    if [[ -n "${GPUFOLD_KAFKA_PORT:-}" && "$GPUFOLD_KAFKA_PORT" != "$port" ]]; then
        say "warning: ignoring GPUFOLD_KAFKA_PORT=$GPUFOLD_KAFKA_PORT: $RUN_DIR keeps its broker on port $port ('$0 clean' to start afresh)"
    fi
    if port_in_use "$port" || port_in_use "$ctl"; then
        [[ "$mode" == start && -z "${GPUFOLD_KAFKA_PORT:-}" ]] ||
            die "port $port or $ctl (recorded in $PROPS) is in use by another process; stop it or run '$0 clean'"
        local new_port new_ctl
        read -r new_port new_ctl < <(pick_ports)
        say "warning: port $port or $ctl is taken by another process now; moving this broker to $new_port/$new_ctl"
        sed -i -e "s/127\.0\.0\.1:$port\b/127.0.0.1:$new_port/g" -e "s/127\.0\.0\.1:$ctl\b/127.0.0.1:$new_ctl/g" \
            -e "s/^# gpufold\.port=.*/# gpufold.port=$new_port/" \
            -e "s/^# gpufold\.controller\.port=.*/# gpufold.controller.port=$new_ctl/" "$PROPS"
        port="$new_port"
        ctl="$new_ctl"
    fi
    format_storage

    address="127.0.0.1:$port"
    local started=$SECONDS
    cds_options
    # shellcheck disable=SC2086  # HEAP_OPTS and JVM_OPTS are lists of JVM options
    (
        cd "$KDIR"
        exec setsid java $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
            -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError \
            $JVM_OPTS "${CDS_OPTS[@]}" \
            -Djava.awt.headless=true -Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.logs.dir="$LOG_DIR" \
            -cp "$LIBS/*" kafka.Kafka "$PROPS"
    ) </dev/null >>"$LOG_DIR/kafka.out" 2>&1 8>&- 9>&- &
    pid=$!
    echo "$pid" >"$PID_FILE"
    say "started Kafka $KAFKA_VERSION (pid $pid), waiting for $address to answer ..."
    wait_ready "$pid" "$address"
    write_env "$address"
    say "ready in $((SECONDS - started)) s: $address (env: $ENV_FILE)"
    echo "$address"
}

# Class data sharing: a dynamic CDS archive of the classes Kafka loads roughly halves the JVM's start-up.
# The JVM writes it when it exits, so the first start of a (Java version, jar set) pair dumps it to a
# temporary file, and stop_pid keeps that file only after a clean exit (a SIGKILL may leave half a file).
# The archive lives inside the jar directory, so a new fetch drops it; an unusable archive is just ignored.
cds_archive() {
    local key
    key="$(java -version 2>&1 | cksum | cut -d' ' -f1)"
    echo "$LIBS/.cds/kafka-$key.jsa"
}

# Sets CDS_OPTS to the JVM options for CDS, and records a pending dump in $CDS_PENDING.
CDS_OPTS=()
cds_options() {
    CDS_OPTS=()
    discard_pending_cds
    [[ "${GPUFOLD_KAFKA_CDS:-1}" == 1 ]] || return 0
    local archive
    archive="$(cds_archive)"
    if [[ -s "$archive" ]]; then
        CDS_OPTS=("-XX:SharedArchiveFile=$archive")
    elif mkdir -p "$(dirname "$archive")" 2>/dev/null && [[ -w "$(dirname "$archive")" ]]; then
        echo "$archive.$$.tmp" >"$CDS_PENDING"
        CDS_OPTS=("-XX:ArchiveClassesAtExit=$archive.$$.tmp")
    fi
    CDS_OPTS+=(-Xlog:cds=off -Xlog:cds+dynamic=off)
}

discard_pending_cds() {
    [[ -f "$CDS_PENDING" ]] || return 0
    rm -f "$(cat "$CDS_PENDING")" "$CDS_PENDING"
}

# After a clean exit: the pending archive is complete, so it becomes the archive later starts use.
keep_pending_cds() {
    [[ -f "$CDS_PENDING" ]] || return 0
    local pending
    pending="$(cat "$CDS_PENDING")"
    if [[ -s "$pending" ]]; then
        mv -f "$pending" "${pending%.*.tmp}"
    fi
    rm -f "$pending" "$CDS_PENDING"
}

stop_pid() {
    local pid="$1" waited=0
    kill -TERM "$pid" 2>/dev/null || true
    while [[ -d "/proc/$pid" ]] && ((waited < STOP_TIMEOUT * 10)); do
        # A zombie (exited but not yet reaped by its parent) counts as stopped.
        [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)" == Z ]] && break
        sleep 0.1
        waited=$((waited + 1))
    done
    if [[ -d "/proc/$pid" ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)" != Z ]]; then
        say "the broker (pid $pid) did not stop within ${STOP_TIMEOUT} s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while [[ -d "/proc/$pid" ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)" != Z ]]; do
            sleep 0.1
        done
        discard_pending_cds
    else
        keep_pending_cds
    fi
    rm -f "$PID_FILE"
}

stop_broker() {
    local pid
    pid="$(broker_pid)"
    rm -f "$ENV_FILE"
    if [[ -z "$pid" ]]; then
        rm -f "$PID_FILE"
        say "not running"
        return 0
    fi
    local started=$SECONDS
    stop_pid "$pid"
    say "stopped (pid $pid) in $((SECONDS - started)) s"
}

# --- a cluster of N nodes (start --brokers N) ------------------------------------------------------
#
# $KDIR/brokers holds N; node <id> (1..N) keeps its config, data and logs in $KDIR/broker-<id>/ and its pid in
# $KDIR/broker-<id>.pid. Every node is broker and controller (a static quorum of N voters), so the cluster
# survives the loss of any one node: the topics' default and the internal topics have N replicas and
# min.insync.replicas N-1. The ports are picked once and kept, so a node killed and started again comes back
# on the same address.

readonly BROKERS_FILE="$KDIR/brokers"
readonly CLUSTER_HEAP_OPTS="${GPUFOLD_KAFKA_CLUSTER_HEAP:--Xms128m -Xmx512m}"

node_dir() { echo "$KDIR/broker-$1"; }
node_props() { echo "$KDIR/broker-$1/server.properties"; }
node_pid_file() { echo "$KDIR/broker-$1.pid"; }
node_prop() { sed -n "s/^# $2=//p" "$(node_props "$1")" | tail -n 1; }

cluster_size() { if [[ -f "$BROKERS_FILE" ]]; then cat "$BROKERS_FILE"; fi; }

# The pid of node $1 if it runs (checked against its command line, like broker_pid), else nothing.
node_pid() {
    local file pid cmdline
    file="$(node_pid_file "$1")"
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    if [[ "$cmdline" == *" kafka.Kafka $(node_props "$1") "* ]]; then
        echo "$pid"
    fi
}

cluster_bootstrap() {
    local n="$1" id out=""
    for ((id = 1; id <= n; id++)); do
        out+="${out:+,}127.0.0.1:$(node_prop "$id" gpufold.port)"
    done
    echo "$out"
}

write_cluster_config() {
    local n="$1" ports id voters=""
    read -r -a ports < <(pick_ports $((2 * n)))
    for ((id = 1; id <= n; id++)); do
        voters+="${voters:+,}$id@127.0.0.1:${ports[2 * id - 1]}"
    done
    local replicas=$n isr=$((n > 1 ? n - 1 : 1))
    for ((id = 1; id <= n; id++)); do
        local port="${ports[2 * id - 2]}" ctl="${ports[2 * id - 1]}" dir
        dir="$(node_dir "$id")"
        mkdir -p "$dir/data" "$dir/logs"
        cat >"$(node_props "$id")" <<EOF
# Written by scripts/kafka.sh: node $id of a $n-node Kafka $KAFKA_VERSION KRaft cluster (broker and controller
# in one process), for fault tests on one machine. Later starts reuse this file (same ports, same data).
# gpufold.port=$port
# gpufold.controller.port=$ctl

process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters

listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER

log.dirs=$dir/data

# A write survives the loss of one node: $replicas replicas, and acks=all needs $isr of them in sync.
default.replication.factor=$replicas
min.insync.replicas=$isr
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
num.partitions=1
unclean.leader.election.enable=false

# Faults are noticed in seconds rather than Kafka's defaults (9 s broker session, 30 s replica lag): a killed
# or stopped node is fenced, and its leaderships move, while a fault test still runs.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=4000
replica.lag.time.max.ms=8000

log.segment.bytes=33554432
log.retention.hours=24
log.retention.check.interval.ms=60000
transaction.max.timeout.ms=60000
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000

num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
num.replica.fetchers=1
EOF
    done
    echo "$n" >"$BROKERS_FILE"
}

format_node() {
    local id="$1" cluster="$2" dir
    dir="$(node_dir "$id")"
    [[ -f "$dir/data/meta.properties" ]] && return 0
    if ! java -Xmx256m -XX:TieredStopAtLevel=1 -cp "$LIBS/*" -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
            -Dkafka.logs.dir="$dir/logs" \
            kafka.tools.StorageTool format --config "$(node_props "$id")" --cluster-id "$cluster" --ignore-formatted \
            >"$dir/logs/format.log" 2>&1; then
        cat "$dir/logs/format.log" >&2
        die "formatting the KRaft storage of node $id failed"
    fi
}

launch_node() {
    local id="$1" dir archive pid share=()
    dir="$(node_dir "$id")"
    archive="$(cds_archive)"
    # The single broker's class-data archive when there is one; the nodes of a cluster never dump one.
    [[ "${GPUFOLD_KAFKA_CDS:-1}" == 1 && -s "$archive" ]] && share=("-XX:SharedArchiveFile=$archive" -Xlog:cds=off)
    # shellcheck disable=SC2086  # CLUSTER_HEAP_OPTS and JVM_OPTS are lists of JVM options
    (
        cd "$dir"
        exec setsid java $CLUSTER_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
            -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError \
            $JVM_OPTS "${share[@]}" \
            -Djava.awt.headless=true -Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.logs.dir="$dir/logs" \
            -cp "$LIBS/*" kafka.Kafka "$(node_props "$id")"
    ) </dev/null >>"$dir/logs/kafka.out" 2>&1 8>&- 9>&- &
    pid=$!
    echo "$pid" >"$(node_pid_file "$id")"
    say "started node $id (pid $pid) on 127.0.0.1:$(node_prop "$id" gpufold.port)"
}

start_cluster() {
    local n="$1" recorded id
    [[ -z "$(broker_pid)" ]] || die "a single broker runs in $KDIR; stop it first ('$0 stop')"
    recorded="$(cluster_size)"
    if [[ -n "$recorded" && "$recorded" != "$n" ]]; then
        die "$KDIR holds a $recorded-node cluster; run '$0 clean' before starting one of $n"
    fi
    libs_complete || cmd_fetch
    need java "Java 17 or newer is needed to run Kafka $KAFKA_VERSION"
    if [[ -z "$recorded" ]]; then
        [[ ! -f "$PROPS" ]] || die "$KDIR holds a single broker's data; run '$0 clean' first"
        write_cluster_config "$n"
    fi
    local cluster="" started=$SECONDS launched=0
    for ((id = 1; id <= n; id++)); do
        [[ -f "$(node_dir "$id")/data/meta.properties" ]] && continue
        [[ -n "$cluster" ]] || cluster="$(cluster_id)"
        format_node "$id" "$cluster"
    done
    local fresh=()
    for ((id = 1; id <= n; id++)); do
        if [[ -z "$(node_pid "$id")" ]]; then
            rm -f "$(node_pid_file "$id")"
            launch_node "$id"
            fresh+=("$id")
        fi
    done
    launched=${#fresh[@]}
    local address python
    address="$(cluster_bootstrap "$n")"
    python="$(find_python)"
    # Ready when each node started now answers on its own address (the others may still list a node killed a
    # moment ago as alive) and the cluster lists all N.
    while ! all_answer "$n" "$python" "${fresh[@]}"; do
        for ((id = 1; id <= n; id++)); do
            if [[ -z "$(node_pid "$id")" ]]; then
                tail -n 30 "$(node_dir "$id")/logs/kafka.out" >&2 || true
                die "node $id exited during startup (logs: $(node_dir "$id")/logs)"
            fi
        done
        ((SECONDS - started < START_TIMEOUT)) || die "the $n nodes did not all answer within ${START_TIMEOUT} s"
        sleep 1
    done
    write_env "$address"
    say "$n nodes ready ($launched started) in $((SECONDS - started)) s: $address"
    echo "$address"
}

all_answer() {
    local n="$1" python="$2" id
    shift 2
    for id in "$@"; do
        broker_answers "127.0.0.1:$(node_prop "$id" gpufold.port)" "$python" "$n" || return 1
    done
    broker_answers "$(cluster_bootstrap "$n")" "$python" "$n"
}

stop_cluster() {
    local n id pid pids=() waited=0
    n="$(cluster_size)"
    rm -f "$ENV_FILE"
    for ((id = 1; id <= n; id++)); do
        pid="$(node_pid "$id")"
        if [[ -n "$pid" ]]; then
            kill -CONT "$pid" 2>/dev/null || true # a node stopped by a fault test must hear the SIGTERM
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for pid in "${pids[@]}"; do
        while [[ -d "/proc/$pid" ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)" != Z ]]; do
            if ((waited >= STOP_TIMEOUT * 10)); then
                kill -KILL "$pid" 2>/dev/null || true
            fi
            sleep 0.1
            waited=$((waited + 1))
        done
    done
    for ((id = 1; id <= n; id++)); do
        rm -f "$(node_pid_file "$id")"
    done
    say "stopped ${#pids[@]} of $n nodes"
}

cluster_status() {
    local n id pid up=0
    n="$(cluster_size)"
    for ((id = 1; id <= n; id++)); do
        pid="$(node_pid "$id")"
        if [[ -n "$pid" ]]; then
            echo "node $id running (pid $pid) on 127.0.0.1:$(node_prop "$id" gpufold.port)"
            up=$((up + 1))
        else
            echo "node $id not running"
        fi
    done
    ((up > 0))
}

cmd_start() {
    lock 9 "$KDIR.lock"
    if [[ -n "$BROKERS" ]]; then
        start_cluster "$BROKERS"
    elif [[ -n "$(cluster_size)" ]]; then
        start_cluster "$(cluster_size)"
    else
        start_broker start
    fi
}

cmd_stop() {
    lock 9 "$KDIR.lock"
    if [[ -n "$(cluster_size)" ]]; then stop_cluster; else stop_broker; fi
}

cmd_restart() {
    lock 9 "$KDIR.lock"
    local n
    n="$(cluster_size)"
    if [[ -n "$n" ]]; then
        stop_cluster
        start_cluster "$n"
    else
        stop_broker
        start_broker restart
    fi
}

cmd_status() {
    if [[ -n "$(cluster_size)" ]]; then
        cluster_status
        return
    fi
    local pid
    pid="$(broker_pid)"
    if [[ -n "$pid" ]]; then
        echo "running (pid $pid) on $(bootstrap_address)"
        return 0
    fi
    echo "not running"
    return 1
}

cmd_clean() {
    lock 9 "$KDIR.lock"
    if [[ -n "$(cluster_size)" ]]; then stop_cluster; else stop_broker; fi
    rm -rf "$KDIR"
    say "removed $KDIR"
}

BROKERS=""
main() {
    if [[ $# -eq 3 && "$1" == start && "$2" == --brokers ]]; then
        [[ "$3" =~ ^[1-9][0-9]*$ ]] || die "--brokers needs a positive number, got '$3'"
        BROKERS="$3"
        set -- start
    fi
    [[ $# -eq 1 ]] || usage
    case "$1" in
        fetch) cmd_fetch ;;
        start) cmd_start ;;
        stop) cmd_stop ;;
        restart) cmd_restart ;;
        status) cmd_status ;;
        clean) cmd_clean ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
