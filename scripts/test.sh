#!/usr/bin/env bash
# Starts Kafka and PostgreSQL (throwaway, on free loopback ports), runs the whole
# test suite against them, and stops them whatever happens. `make test` and
# .ci/run call this; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export GPUFOLD_RUN_DIR="${GPUFOLD_RUN_DIR:-$PWD/.services}"
mkdir -p "$GPUFOLD_RUN_DIR"

stop_services() {
  bash scripts/kafka.sh stop >/dev/null 2>&1 || true
  bash scripts/postgres.sh stop >/dev/null 2>&1 || true
}
trap stop_services EXIT

echo "== Chromium for the dashboard's browser test (installed with apt-get if missing)"
bash scripts/chromium.sh ensure

echo "== starting Kafka and PostgreSQL"
bash scripts/postgres.sh start > "$GPUFOLD_RUN_DIR/postgres.start.log" 2>&1 &
pg_pid=$!
if ! bash scripts/kafka.sh start; then
  echo "Kafka did not start" >&2
  exit 1
fi
if ! wait "$pg_pid"; then
  cat "$GPUFOLD_RUN_DIR/postgres.start.log" >&2
  echo "PostgreSQL did not start" >&2
  exit 1
fi
cat "$GPUFOLD_RUN_DIR/postgres.start.log"
# shellcheck disable=SC1091
source "$GPUFOLD_RUN_DIR/kafka.env"
# shellcheck disable=SC1091
source "$GPUFOLD_RUN_DIR/postgres.env"

echo "== running the tests"
.venv/bin/python -m pytest "$@"
