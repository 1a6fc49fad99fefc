"""Crash safety on the real broker: SIGKILL the processor at random moments, restart it, lose nothing."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
from pathlib import Path

import pytest
from kafka_support import CommittedWatcher, check_exactly_once, command_stream, new_topics, publish, start_processor

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMANDS = 50_000
KILLS = 5
PARTITIONS = 3


def test_sigkill_and_restart_lose_and_duplicate_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Five SIGKILLs during 50,000 commands leave exactly one outcome per command and the uninterrupted state."""
    rng = random.Random(20261130)
    topics = new_topics(kafka_bootstrap, "crash", PARTITIONS)
    publish(kafka_bootstrap, topics, command_stream(COMMANDS, clusters=6, seed=11))
    group = topics.commands + ".group"
    options = ["--group", group, "--instance-id", "crash", "--snapshot-every", "5000", "--batch-size", "1000"]
    options += ["--transaction-timeout-ms", "10000"]
    log = tmp_path / "processor.log"
    watcher = CommittedWatcher(kafka_bootstrap, topics, group, PARTITIONS)
    # Kill points spread over the stream; each kill lands a random few ms after its point is committed,
    # i.e. anywhere in the fold/produce/commit cycle of a later batch.
    points = sorted(rng.sample(range(1_000, COMMANDS - 3_000), KILLS))
    kills = 0
    try:
        for point in points:
            process = start_processor(kafka_bootstrap, topics, *options, log=log)
            try:
                watcher.wait_for(point, 120, alive=lambda p=process: p.poll() is None)  # type: ignore[misc]
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(rng.uniform(0.0, 0.25))
                assert process.poll() is None, f"the processor exited with {process.returncode}; see {log}"
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait()
            kills += 1
        process = start_processor(kafka_bootstrap, topics, *options, log=log)
        try:
            assert watcher.wait_for(COMMANDS, 180, alive=lambda: process.poll() is None) == COMMANDS
        finally:
            process.send_signal(signal.SIGTERM)
            status = process.wait(60)
        assert status == 0, f"graceful stop exited with {status}; see {log}"
    finally:
        watcher.close()
    assert kills == KILLS
    expected = check_exactly_once(kafka_bootstrap, topics)
    assert sum(len(values) for values in expected.events.values()) >= COMMANDS
    assert log.read_text().count("partition") > 0
