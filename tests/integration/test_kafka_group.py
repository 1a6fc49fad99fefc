"""Two processor instances share the partitions; when one dies the other takes its partitions over."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka_support import CommittedWatcher, check_exactly_once, command_stream, new_topics, publish, start_processor

from schemas.partitioner import cluster_partition

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMANDS = 16_000
PARTITIONS = 4


def _last_assignment(log: Path) -> set[int]:
    """The partitions an instance logged as assigned last."""
    text = log.read_text() if log.exists() else ""
    assigned = [json.loads(line)["msg"] for line in text.splitlines() if '"assigned partitions' in line]
    return set(json.loads(assigned[-1].removeprefix("assigned partitions "))) if assigned else set()


def _holds_partitions(log: Path) -> bool:
    """Whether an instance holds a proper, non-empty part of the partitions."""
    return 0 < len(_last_assignment(log)) < PARTITIONS


def test_survivor_takes_over_the_partitions_of_a_killed_instance(kafka_bootstrap: str, tmp_path: Path) -> None:
    """With two instances in one group, killing one moves its partitions to the other; nothing is lost or doubled."""
    topics = new_topics(kafka_bootstrap, "group", PARTITIONS)
    group = topics.commands + ".group"
    options = ["--group", group, "--snapshot-every", "1000", "--batch-size", "200", "--session-timeout-ms", "6000"]
    first = start_processor(kafka_bootstrap, topics, *options, "--instance-id", "a", log=tmp_path / "a.log")
    second = start_processor(kafka_bootstrap, topics, *options, "--instance-id", "b", log=tmp_path / "b.log")
    watcher = CommittedWatcher(kafka_bootstrap, topics, group, PARTITIONS)
    try:

        def both_alive() -> bool:
            return first.poll() is None and second.poll() is None

        deadline = time.monotonic() + 60
        # Commands are published once the group has split the partitions between the two instances.
        while not all(_holds_partitions(tmp_path / name) for name in ("a.log", "b.log")):
            assert both_alive() and time.monotonic() < deadline, "the group never split the partitions"
            time.sleep(0.1)
        commands = command_stream(COMMANDS, clusters=8, seed=3)
        owned = _last_assignment(tmp_path / "a.log")
        # The last quarter goes out after the kill: the killed instance's partitions then always have work that
        # only a takeover can fold, however far it got (a fast fold may finish its share before a kill timed on
        # committed offsets lands; the survivor was then stopped before it ever took over).
        cut = len(commands) * 3 // 4
        before, after = commands[:cut], commands[cut:]
        assert any(cluster_partition(command.cluster, PARTITIONS) in owned for command in after)
        per_partition = Counter(cluster_partition(command.cluster, PARTITIONS) for command in before)
        publish(kafka_bootstrap, topics, before)
        # Kill the first instance in the middle of its own partitions.
        goal = sum(per_partition[p] for p in owned) // 3
        while sum(offset for p, offset in watcher.offsets().items() if p in owned) < goal:
            assert both_alive() and time.monotonic() < deadline + 120, "no progress on the first one's partitions"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait()
        publish(kafka_bootstrap, topics, after)
        assert watcher.wait_for(COMMANDS, 180, alive=lambda: second.poll() is None) == COMMANDS
    finally:
        watcher.close()
        for process in (first, second):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        second_status = second.wait(60)
        first.wait(60)
    assert second_status == 0
    survivor_log = (tmp_path / "b.log").read_text()
    assert survivor_log.count('"assigned partitions') >= 2, "the survivor never took over the dead one's partitions"
    check_exactly_once(kafka_bootstrap, topics)
