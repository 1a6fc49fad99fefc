"""A broker restart in the middle of a stream: the processor recovers, nothing is lost or duplicated."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from kafka_support import (
    REPO,
    CommittedWatcher,
    check_exactly_once,
    command_stream,
    new_topics,
    publish,
    start_processor,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMANDS = 8_000


def _managed_broker(bootstrap: str) -> None:
    status = subprocess.run(
        ["bash", "scripts/kafka.sh", "status"], cwd=REPO, capture_output=True, text=True, timeout=30, check=False
    )
    if status.returncode != 0 or bootstrap not in status.stdout:
        message = f"the broker at {bootstrap} is not the one scripts/kafka.sh manages here ({status.stdout.strip()})"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)


def test_processor_recovers_from_a_broker_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Commands before, during and after `scripts/kafka.sh restart` each get exactly one outcome."""
    _managed_broker(kafka_bootstrap)
    topics = new_topics(kafka_bootstrap, "restart", 2)
    stream = command_stream(COMMANDS, clusters=4, seed=5)
    publish(kafka_bootstrap, topics, stream[: COMMANDS // 2])
    group = topics.commands + ".group"
    log = tmp_path / "processor.log"
    options = ["--group", group, "--instance-id", "restart", "--snapshot-every", "2000", "--batch-size", "500"]
    process = start_processor(kafka_bootstrap, topics, *options, "--transaction-timeout-ms", "10000", log=log)
    watcher = CommittedWatcher(kafka_bootstrap, topics, group, 2)
    finished = False
    try:
        watcher.wait_for(COMMANDS // 8, 120, alive=lambda: process.poll() is None)
        subprocess.run(["bash", "scripts/kafka.sh", "restart"], cwd=REPO, check=True, timeout=180)
        publish(kafka_bootstrap, topics, stream[COMMANDS // 2 :])
        assert watcher.wait_for(COMMANDS, 240, alive=lambda: process.poll() is None) == COMMANDS
        finished = True
    finally:
        watcher.close()
        if process.poll() is None:
            if not finished:
                process.send_signal(signal.SIGUSR1)  # a stack dump in the log, to see where it waits
            process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert status == 0, f"the processor exited with {status}; see {log}"
    check_exactly_once(kafka_bootstrap, topics)
