"""Crash safety on the real broker: SIGKILL the processor at random moments, restart it, lose nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from kafka_support import check_exactly_once, command_stream, fold_through_sigkills, new_topics, publish

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
    # Kill points spread over the stream; each kill lands a random few ms after its point is committed,
    # i.e. anywhere in the fold/produce/commit cycle of a later batch.
    points = sorted(rng.sample(range(1_000, COMMANDS - 3_000), KILLS))
    fold_through_sigkills(kafka_bootstrap, topics, PARTITIONS, options, COMMANDS, points, rng, log)
    expected = check_exactly_once(kafka_bootstrap, topics)
    assert sum(len(values) for values in expected.events.values()) >= COMMANDS
