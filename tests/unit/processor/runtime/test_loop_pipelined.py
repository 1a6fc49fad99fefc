"""The pipelined commit (issue #21): batch N+1 is folded while batch N's transaction commits, its outputs go out
only after N committed, and a failed N takes N+1's folded state down with it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from gpufold.replay import replay_partition
from logs.embedded import EmbeddedLog
from logs.port import OutputRecord
from processor.core.snapshot import state_hash
from processor.runtime.loop import Processor
from schemas.commands import AddNode, Command, SubmitPod
from schemas.fastcodec import encode_command


class Aborted(Exception):
    """What the fake log raises for a failed transaction (the Kafka log's BatchAborted)."""


class PipelinedLog:
    """The embedded log behind the Kafka log's commit_async/wait_committed: a transaction "runs" between the two
    calls and commits (or fails) when waited for. Records every step, in order."""

    def __init__(self, log: EmbeddedLog, fail: set[int] | None = None) -> None:
        self._log = log
        self.steps: list[tuple[str, int]] = []
        self.fail = fail or set()
        self._pending: tuple[int, list[OutputRecord], dict[int, int]] | None = None
        self._batches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def commit_async(self, outputs: list[OutputRecord], positions: dict[int, int]) -> None:
        assert self._pending is None, "a transaction began while the previous one was in flight"
        self._batches += 1
        self.steps.append(("begin", self._batches))
        self._pending = (self._batches, outputs, positions)

    def wait_committed(self, also: Iterable[int] = ()) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        number, outputs, positions = pending
        self.steps.append(("wait", number))
        if number in self.fail:
            for partition in {*positions, *also}:
                self._log.seek(partition, self._log.committed(partition))
            raise Aborted(f"transaction {number} aborted")
        self._log.commit(outputs, positions)
        self.steps.append(("committed", number))


def _commands(count: int) -> list[tuple[bytes, bytes]]:
    frames = []
    for index in range(count):
        cluster = f"lab-{index % 5}"
        payload = (
            AddNode(f"n{index}", 64_000, 512_000, "A100", 8)
            if index < 6
            else SubmitPod(f"p{index}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)
        )
        frames.append((cluster.encode(), encode_command(Command(f"c{index}", cluster, 1_000 + index, payload, "t"))))
    return frames


def _reference(path: Path) -> dict[int, str]:
    with EmbeddedLog(path) as log:
        return {
            p: state_hash(replay_partition(p, log.read_commands(p, 0, log.end_offset(log.topics.commands, p))).state)
            for p in range(log.partitions)
            if log.end_offset(log.topics.commands, p)
        }


def test_the_next_batch_is_folded_before_the_previous_commits_and_begins_after(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with EmbeddedLog(path, partitions=2) as inner:
        inner.append_commands(_commands(60))
        log = PipelinedLog(inner)
        processor = Processor(log, batch_size=10, snapshot_every=0)  # type: ignore[arg-type]
        assert processor.pipeline
        assert processor.run_batch(0) == 10
        assert log.steps == [("begin", 1)] and processor.processed == 0  # in flight, not counted yet
        assert processor.run_batch(0) == 10
        # Batch 2 was polled and folded with batch 1 in flight; its transaction began after batch 1 committed.
        assert log.steps == [("begin", 1), ("wait", 1), ("committed", 1), ("begin", 2)]
        assert processor.processed == 10
        processor.run_until_idle()
        assert processor.processed == 60 and log._pending is None
        states = {p: state_hash(folder.state) for p, folder in processor.folders.items()}
    assert states == _reference(path)


def test_a_failed_transaction_rebuilds_the_batch_folded_on_top_of_it(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with EmbeddedLog(path, partitions=2) as inner:
        inner.append_commands(_commands(60))
        log = PipelinedLog(inner, fail={2})
        processor = Processor(log, batch_size=10, snapshot_every=0)  # type: ignore[arg-type]
        processor.run_batch(0)
        processor.run_batch(0)  # batch 2 in flight
        with pytest.raises(Aborted):
            processor.run_batch(0)  # batch 3 folded on top of batch 2, which then fails
        assert processor.folders == {}, "both batches' partitions are rebuilt from what was committed"
        assert processor.processed == 10
        log.fail.clear()
        processor.run_until_idle()
        assert processor.processed == 60
        states = {p: state_hash(folder.state) for p, folder in processor.folders.items()}
        events = sum(inner.count(inner.topics.events, p) for p in range(2))
    assert states == _reference(path)
    with EmbeddedLog(path) as check:
        ends = {p: check.end_offset(check.topics.commands, p) for p in range(2)}
        replayed = sum(
            len(replay_partition(p, check.read_commands(p, 0, ends[p]), keep_events=True).events) for p in range(2)
        )
    assert events == replayed, "no event lost or duplicated"


def test_without_pipelining_each_batch_commits_before_the_next_poll(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path / "log.sqlite", partitions=2) as inner:
        inner.append_commands(_commands(20))
        log = PipelinedLog(inner)
        processor = Processor(log, batch_size=10, snapshot_every=0, pipeline=False)  # type: ignore[arg-type]
        processor.run_batch(0)
        assert log.steps == [] and processor.processed == 10  # committed through the log's plain commit
