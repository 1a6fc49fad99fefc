#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests and CI.
#
#   scripts/postgres.sh start     init a fresh cluster in a temp dir and start it (reuses a running one)
#   scripts/postgres.sh stop      stop the server and delete its temp dir (all data is gone)
#   scripts/postgres.sh restart   stop and start the SAME data dir on the SAME port (data kept)
#   scripts/postgres.sh status    exit 0 if our server is running, 3 if not
#
# State lives in ${GPUFOLD_RUN_DIR:-$PWD/.services}:
#   postgres.env     `export GPUFOLD_DATABASE_URL=...` (sourceable; contains the password)
#   postgres.state   the temp dir, port, password and binary dir of the running server
#   postgres.lock    serializes concurrent runs of this script
#
# The server is ours alone: it never uses or touches a cluster that the Debian
# package created or a system service. It listens on 127.0.0.1 only (plus a unix
# socket inside its temp dir), on a free port picked at start.
#
# Environment:
#   GPUFOLD_RUN_DIR            where state and postgres.env go (default: $PWD/.services)
#   GPUFOLD_POSTGRES_PORT      use this port instead of picking a free one
#   GPUFOLD_POSTGRES_TIMEOUT   seconds to wait for the server (default: 60)
set -euo pipefail

PROG="postgres.sh"
RUN_DIR="${GPUFOLD_RUN_DIR:-$PWD/.services}"
STATE_FILE="$RUN_DIR/postgres.state"
ENV_FILE="$RUN_DIR/postgres.env"
TIMEOUT="${GPUFOLD_POSTGRES_TIMEOUT:-60}"
DB_NAME="gpufold"
DB_USER="gpufold"
OS_USER="postgres"   # initdb and pg_ctl refuse to run as root
TMP_PREFIX="gpufold-postgres."

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

# --- binaries ---------------------------------------------------------------

BINDIR=""

has_server_bins() {
    [[ -n "$1" && -x "$1/initdb" && -x "$1/pg_ctl" && -x "$1/postgres" && -x "$1/psql" ]]
}

find_bindir() {
    local dir candidate
    BINDIR=""
    if command -v pg_config >/dev/null 2>&1; then
        # Debian's pg_config (libpq-dev) may name a version whose server is not installed.
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if has_server_bins "$dir"; then BINDIR="$dir"; return 0; fi
    fi
    # Newest installed major version first.
    while IFS= read -r candidate; do
        if has_server_bins "$candidate"; then BINDIR="$candidate"; return 0; fi
    done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5,5 -rn)
    if command -v initdb >/dev/null 2>&1; then
        # Resolve symlinks (e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb).
        dir="$(dirname "$(readlink -f "$(command -v initdb)")")"
        if has_server_bins "$dir"; then BINDIR="$dir"; return 0; fi
    fi
    return 1
}

install_postgres() {
    [[ $EUID -eq 0 ]] || die "PostgreSQL server binaries not found and not root to install them; install the 'postgresql' package"
    command -v apt-get >/dev/null 2>&1 || die "PostgreSQL server binaries not found and no apt-get to install them"
    log "PostgreSQL server binaries not found; installing the 'postgresql' package with apt-get"
    # Keep the package from starting the system cluster it creates: we run our own server.
    local added_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        added_policy=1
    fi
    local rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
    } >&2 || rc=$?
    if [[ -n "$added_policy" ]]; then rm -f /usr/sbin/policy-rc.d; fi
    [[ $rc -eq 0 ]] || die "apt-get install postgresql failed (exit $rc)"
}

ensure_bindir() {
    if find_bindir; then return 0; fi
    install_postgres
    find_bindir || die "installed 'postgresql' but still found no initdb/pg_ctl/postgres/psql"
}

# --- running as the unprivileged user ---------------------------------------

ensure_os_user() {
    [[ $EUID -eq 0 ]] || return 0
    if ! id -u "$OS_USER" >/dev/null 2>&1; then
        log "creating system user '$OS_USER'"
        useradd --system --user-group --home-dir /var/lib/postgresql --no-create-home \
            --shell /bin/bash --comment "PostgreSQL administrator" "$OS_USER"
    fi
}

# Run a command as $OS_USER when root (as ourselves otherwise), from a directory
# that user can read (the caller's cwd may be root-only). fd 9 (our lock) is closed:
# the server must not inherit it, or it would hold the lock for as long as it runs.
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        (cd / && runuser -u "$OS_USER" -- "$@" 9>&-)
    else
        (cd / && "$@" 9>&-)
    fi
}

# --- state ------------------------------------------------------------------

PG_TMP="" PG_PORT="" PG_PASSWORD=""

load_state() {
    PG_TMP="" PG_PORT="" PG_PASSWORD=""
    [[ -f "$STATE_FILE" ]] || return 1
    local key value bindir=""
    while IFS='=' read -r key value; do
        case "$key" in
            tmp) PG_TMP="$value" ;;
            port) PG_PORT="$value" ;;
            password) PG_PASSWORD="$value" ;;
            bindir) bindir="$value" ;;
        esac
    done <"$STATE_FILE"
    [[ -n "$PG_TMP" && -n "$PG_PORT" && -n "$PG_PASSWORD" ]] || die "corrupt state file $STATE_FILE; remove it (and its temp dir in /tmp) by hand"
    # Prefer the binaries that made the cluster; if they are gone (e.g. reinstalled), search again.
    if has_server_bins "$bindir"; then BINDIR="$bindir"; else ensure_bindir; fi
    return 0
}

write_state() {
    mkdir -p "$RUN_DIR"
    (
        umask 077
        printf 'tmp=%s\nport=%s\npassword=%s\nbindir=%s\n' "$PG_TMP" "$PG_PORT" "$PG_PASSWORD" "$BINDIR" >"$STATE_FILE.new"
        mv "$STATE_FILE.new" "$STATE_FILE"
        printf 'export GPUFOLD_DATABASE_URL=%s\n' "$(url "$PG_PASSWORD")" >"$ENV_FILE.new"
        mv "$ENV_FILE.new" "$ENV_FILE"
    )
}

clear_state() { rm -f "$STATE_FILE" "$ENV_FILE"; }

url() { printf 'postgresql+psycopg://%s:%s@127.0.0.1:%s/%s' "$DB_USER" "$1" "$PG_PORT" "$DB_NAME"; }

data_dir() { printf '%s/data' "$PG_TMP"; }
sock_dir() { printf '%s/socket' "$PG_TMP"; }
log_file() { printf '%s/server.log' "$PG_TMP"; }

postmaster_pid() { head -n 1 "$(data_dir)/postmaster.pid" 2>/dev/null || true; }

is_zombie() {
    [[ -n "$1" && -r "/proc/$1/stat" ]] && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" == Z ]]
}

is_running() {
    [[ -n "$PG_TMP" && -d "$(data_dir)" ]] || return 1
    as_pg "$BINDIR/pg_ctl" status -D "$(data_dir)" >/dev/null 2>&1 || return 1
    # A killed postmaster stays a zombie until PID 1 reaps it; pg_ctl still calls that running.
    ! is_zombie "$(postmaster_pid)"
}

# Before starting a stopped cluster: wait (bounded) until a dead postmaster is reaped, or
# the new one refuses to start ("lock file already exists"), and until the port is free.
wait_old_server_gone() {
    local pid deadline=$((SECONDS + TIMEOUT))
    pid="$(postmaster_pid)"
    while is_zombie "$pid" || port_in_use "$PG_PORT"; do
        if ((SECONDS >= deadline)); then
            die "the old server (pid ${pid:-?}) or another process still holds 127.0.0.1:$PG_PORT after ${TIMEOUT}s; run '$0 stop' to wipe it and start afresh"
        fi
        sleep 0.2
    done
}

# Run pg_ctl as $OS_USER; on failure show its output and the server log tail, then die.
pg_ctl_or_die() {
    local what="$1" out
    shift
    if ! out="$(as_pg "$BINDIR/pg_ctl" "$@" 2>&1)"; then
        printf '%s\n' "$out" | sed 's/^/    /' >&2
        log_tail
        die "$what"
    fi
}

log_tail() {
    local f
    f="$(log_file)"
    if [[ -f "$f" ]]; then
        printf '%s: last lines of %s:\n' "$PROG" "$f" >&2
        tail -n 30 "$f" | sed 's/^/    /' >&2
    fi
}

# --- ports and passwords ----------------------------------------------------

port_in_use() {
    # A connect that succeeds means something listens there.
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pick_port() {
    if [[ -n "${GPUFOLD_POSTGRES_PORT:-}" ]]; then
        port_in_use "$GPUFOLD_POSTGRES_PORT" && die "GPUFOLD_POSTGRES_PORT=$GPUFOLD_POSTGRES_PORT is already in use on 127.0.0.1"
        printf '%s' "$GPUFOLD_POSTGRES_PORT"
        return 0
    fi
    local py port
    for py in python3 python; do
        if command -v "$py" >/dev/null 2>&1 &&
            port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' 2>/dev/null)" &&
            [[ -n "$port" ]]; then
            printf '%s' "$port"
            return 0
        fi
    done
    local _
    for _ in $(seq 1 100); do
        port=$((20000 + RANDOM % 30000))
        if ! port_in_use "$port"; then printf '%s' "$port"; return 0; fi
    done
    die "found no free TCP port on 127.0.0.1"
}

new_password() {
    # Hex only: safe in a URL and inside SQL quotes.
    od -An -N16 -tx1 /dev/urandom | tr -d ' \n'
}

# --- server -----------------------------------------------------------------

pg_ctl_start() {
    # -w waits until the server accepts connections, at most $TIMEOUT seconds.
    pg_ctl_or_die "PostgreSQL did not start on 127.0.0.1:$PG_PORT within ${TIMEOUT}s" \
        start -D "$(data_dir)" -l "$(log_file)" -w -t "$TIMEOUT"
}

psql_admin() {
    as_pg "$BINDIR/psql" -X -w -q -v ON_ERROR_STOP=1 -h "$(sock_dir)" -p "$PG_PORT" -U postgres -d postgres "$@"
}

# Bounded wait until the app role can log in over TCP with its password.
wait_ready() {
    local deadline=$((SECONDS + TIMEOUT)) err=""
    while :; do
        if err="$(PGPASSWORD="$PG_PASSWORD" PGCONNECT_TIMEOUT=5 as_pg "$BINDIR/psql" -X -w -q -At \
            -h 127.0.0.1 -p "$PG_PORT" -U "$DB_USER" -d "$DB_NAME" -c 'SELECT 1' 2>&1 >/dev/null)"; then
            return 0
        fi
        if ((SECONDS >= deadline)); then
            log_tail
            die "PostgreSQL on 127.0.0.1:$PG_PORT did not accept connections as '$DB_USER' within ${TIMEOUT}s: $err"
        fi
        sleep 0.2
    done
}

init_cluster() {
    PG_PORT="$(pick_port)"
    PG_PASSWORD="$(new_password)"
    PG_TMP="$(mktemp -d "/tmp/${TMP_PREFIX}XXXXXXXX")"
    mkdir -p "$(sock_dir)"
    chmod 700 "$PG_TMP"
    if [[ $EUID -eq 0 ]]; then chown -R "$OS_USER:" "$PG_TMP"; fi
    # Record the temp dir before anything can fail, so `stop` can clean it up.
    write_state

    log "initializing a cluster in $(data_dir) (PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}'))"
    # Local (unix socket) superuser access is trust: the socket dir is private to $OS_USER.
    # TCP needs a password. --no-sync: nothing here needs to survive a machine crash.
    as_pg "$BINDIR/initdb" -D "$(data_dir)" -U postgres --encoding=UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 --no-sync >"$PG_TMP/initdb.log" 2>&1 || {
        sed 's/^/    /' "$PG_TMP/initdb.log" >&2
        die "initdb failed"
    }
    # Throwaway test server: durability is traded for speed. fsync, synchronous_commit
    # and full_page_writes off lose data only on an OS crash or power loss, never on a
    # server restart (pg_ctl stop/restart flushes everything), so `restart` keeps data.
    cat >>"$(data_dir)/postgresql.conf" <<EOF

# --- gpufold throwaway test server (scripts/postgres.sh) ---
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$(sock_dir)'
max_connections = 100
fsync = off
synchronous_commit = off
full_page_writes = off
logging_collector = off
log_min_messages = warning
EOF
}

create_app_db() {
    psql_admin <<EOF
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') THEN
        CREATE ROLE $DB_USER LOGIN PASSWORD '$PG_PASSWORD';
    ELSE
        ALTER ROLE $DB_USER LOGIN PASSWORD '$PG_PASSWORD';
    END IF;
END
\$\$;
EOF
    if [[ "$(psql_admin -At -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
        psql_admin -c "CREATE DATABASE $DB_NAME OWNER $DB_USER"
    fi
}

report() {
    log "PostgreSQL $1 at $(url '***')"
    log "source $ENV_FILE to get GPUFOLD_DATABASE_URL"
    printf '%s\n' "$(url '***')"
}

# --- commands ---------------------------------------------------------------

cmd_start() {
    ensure_bindir
    ensure_os_user
    if load_state; then
        if is_running; then
            write_state
            report "already running"
            return 0
        fi
        if [[ -d "$(data_dir)" && -f "$(data_dir)/PG_VERSION" ]]; then
            # Stopped (e.g. crashed) but its data dir is still there: bring it back as it was.
            log "starting the existing cluster in $(data_dir) on 127.0.0.1:$PG_PORT"
            wait_old_server_gone
            pg_ctl_start
            wait_ready
            write_state
            report "started"
            return 0
        fi
        log "stale state (temp dir $PG_TMP is gone); starting afresh"
        cleanup_tmp
        clear_state
    fi
    local t0=$SECONDS
    init_cluster
    pg_ctl_start
    create_app_db
    wait_ready
    report "started in $((SECONDS - t0))s"
}

cleanup_tmp() {
    # Only ever delete a dir we made (guards against a corrupt state file).
    case "$PG_TMP" in
        /tmp/"$TMP_PREFIX"*) rm -rf -- "$PG_TMP" ;;
        "") ;;
        *) log "not deleting unexpected temp dir '$PG_TMP'" ;;
    esac
}

cmd_stop() {
    if [[ ! -f "$STATE_FILE" ]]; then
        rm -f "$ENV_FILE"
        log "PostgreSQL is not running (no $STATE_FILE)"
        return 0
    fi
    load_state
    if is_running; then
        log "stopping PostgreSQL on 127.0.0.1:$PG_PORT"
        if ! as_pg "$BINDIR/pg_ctl" stop -D "$(data_dir)" -m fast -w -t "$TIMEOUT" >/dev/null 2>&1 && is_running; then
            log "fast shutdown did not finish in ${TIMEOUT}s; shutting down immediately"
            pg_ctl_or_die "could not stop PostgreSQL (data dir $(data_dir))" \
                stop -D "$(data_dir)" -m immediate -w -t "$TIMEOUT"
        fi
    fi
    cleanup_tmp
    clear_state
    log "PostgreSQL stopped and its data deleted"
}

cmd_restart() {
    if ! load_state || [[ ! -f "$(data_dir)/PG_VERSION" ]]; then
        log "no cluster to restart; starting a new one"
        cmd_start
        return
    fi
    ensure_os_user
    local t0=$SECONDS
    local out=""
    if is_running; then
        log "restarting PostgreSQL on 127.0.0.1:$PG_PORT (data kept)"
        # Fast shutdown (aborts open transactions, checkpoints committed data), then start
        # the same data dir; the port and password live in the data dir, so they stay.
        if ! out="$(as_pg "$BINDIR/pg_ctl" restart -D "$(data_dir)" -l "$(log_file)" -m fast -w -t "$TIMEOUT" 2>&1)"; then
            if is_running; then
                printf '%s\n' "$out" | sed 's/^/    /' >&2
                log_tail
                die "pg_ctl restart failed"
            fi
            # It died under us (e.g. killed) during the restart: start it below.
            log "the server was gone during restart; starting it again"
        fi
    else
        log "PostgreSQL was stopped; starting it on 127.0.0.1:$PG_PORT (data kept)"
    fi
    if ! is_running; then
        wait_old_server_gone
        pg_ctl_start
    fi
    wait_ready
    write_state
    report "restarted in $((SECONDS - t0))s"
}

cmd_status() {
    if load_state && is_running; then
        log "PostgreSQL is running at $(url '***') (data dir $(data_dir))"
        return 0
    fi
    log "PostgreSQL is not running"
    return 3
}

usage() {
    echo "usage: $0 {start|stop|restart|status}" >&2
    exit 2
}

[[ $# -eq 1 ]] || usage
case "$1" in start | stop | restart | status) ;; *) usage ;; esac

# One command at a time per run dir (e.g. two `make` targets starting services at once).
mkdir -p "$RUN_DIR"
exec 9>"$RUN_DIR/postgres.lock"
flock -w "$((TIMEOUT * 2))" 9 || die "another $PROG holds $RUN_DIR/postgres.lock"

case "$1" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_restart ;;
    status) cmd_status ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
