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
  # The 3-node cluster of tests/integration/test_kafka_chaos.py (which stops it itself unless it died).
  GPUFOLD_RUN_DIR="$GPUFOLD_RUN_DIR/chaos" bash scripts/kafka.sh clean >/dev/null 2>&1 || true
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

if [ "$#" -eq 0 ] && .venv/bin/python -c 'import sys; import build_config; sys.exit(not build_config.built())'; then
  # The hot path runs compiled above (setup.py builds it at install); the property suite runs once more on
  # its pure-Python sources, with fewer examples (tests/unit/test_compiled.py compares the two byte for byte).
  echo "== the property suite on the pure-Python hot path (GPUFOLD_PURE_PYTHON=1, at most 20 examples per test)"
  GPUFOLD_PURE_PYTHON=1 GPUFOLD_PROPERTY_MAX_EXAMPLES=20 .venv/bin/python -m pytest tests/property -q
fi
