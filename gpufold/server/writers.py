"""Where the write API puts commands: the embedded log (append) or Kafka (``CommandPublisher``).

Both answer with where each command went and can wait for outcomes: the events the processor
committed for it (``PodScheduled``, ``PodQueued``, ``CommandRejected``, ...).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_settings.config import KafkaConfig
from logs.embedded import EmbeddedLog
from producers.outcomes import Outcome  # one Outcome for the client library and the server
from schemas import COMMAND, registry
from schemas.commands import Command
from schemas.events import Event
from schemas.fastcodec import decode_event
from schemas.partitioner import partition_for
from schemas.topics import Topics


@dataclass(frozen=True, slots=True)
class Placed:
    command_id: str
    cluster: str
    partition: int
    offset: int | None  # known on the embedded log; Kafka's is in the outcome


class WriteError(RuntimeError):
    """The log could not take the commands (nothing, or not all, was written): HTTP 503."""


class CommandWriter(Protocol):
    backend: str

    def write(self, commands: list[Command], wait: float | None = None) -> tuple[list[Placed], list[Outcome | None]]:
        """Write the commands in order; with ``wait`` seconds, also each one's outcome (None if not in time)."""
        ...

    def close(self) -> None: ...


class EmbeddedWriter:
    """Appends to an embedded log file (one SQLite handle per thread) and reads outcomes from its events."""

    backend = "embedded"

    def __init__(self, path: str | os.PathLike[str], topics: Topics | None = None, poll: float = 0.02) -> None:
        self.path = path
        self.topics = topics or Topics()
        self.poll = poll
        self._local = threading.local()
        self._encode = registry().codec(COMMAND).encode
        self._log()  # create the file now, so the replica can open it read-only

    def _log(self) -> EmbeddedLog:
        log = getattr(self._local, "log", None)
        if log is None:
            log = self._local.log = EmbeddedLog(self.path, topics=self.topics)
        return log

    def write(self, commands: list[Command], wait: float | None = None) -> tuple[list[Placed], list[Outcome | None]]:
        log = self._log()
        frames = [(c.cluster.encode(), self._encode(c.to_avro())) for c in commands]
        try:
            positions = log.append_commands(frames)
        except Exception as error:
            raise WriteError(f"cannot append to {self.path}: {error}") from error
        placed = [Placed(c.command_id, c.cluster, p, o) for c, (p, o) in zip(commands, positions, strict=True)]
        if wait is None:
            return placed, []
        deadline = time.monotonic() + wait
        outcomes: list[Outcome | None] = [None] * len(placed)
        while True:
            for i, item in enumerate(placed):
                if outcomes[i] is None and item.offset is not None and log.committed(item.partition) > item.offset:
                    outcomes[i] = self._outcome(log, item.partition, item.offset)
            if all(o is not None for o in outcomes) or time.monotonic() >= deadline:
                return placed, outcomes
            time.sleep(self.poll)

    def _outcome(self, log: EmbeddedLog, partition: int, offset: int) -> Outcome | None:
        """The events of the command at ``offset``: a binary search on the events' command offsets."""
        topic = self.topics.events

        def first_at_or_after(index: int) -> Event | None:
            # An imported Kafka topic has gaps (transaction markers): take the next record there is.
            record = next(log.read(topic, partition, index, None, chunk=1), None)
            return None if record is None else decode_event(record.value)

        low, high = 0, log.end_offset(topic, partition)
        while low < high:  # the first event offset whose command offset is >= the command's
            middle = (low + high) // 2
            event = first_at_or_after(middle)
            if event is not None and event.command_offset < offset:
                low = middle + 1
            else:
                high = middle
        events = []
        for record in log.read(topic, partition, low, None, chunk=64):
            event = decode_event(record.value)
            if event.command_offset != offset:
                break
            events.append(event)
        if not events:
            return None  # a dead letter: the command did not decode
        return Outcome(events[0].command_id, partition, offset, tuple(events))

    def close(self) -> None:
        log = getattr(self._local, "log", None)
        if log is not None:
            log.close()
            self._local.log = None


class KafkaWriter:
    """Publishes with one shared ``CommandPublisher``; waits with an ``OutcomeWaiter`` made before publishing."""

    backend = "kafka"

    def __init__(self, config: KafkaConfig, topics: Topics, partitions: int) -> None:
        from producers.publisher import CommandPublisher

        self.config = config
        self.topics = topics
        self.partitions = partitions
        self._publisher = CommandPublisher(config, topics.commands, source="gpufold-api")
        self._lock = threading.Lock()

    def write(self, commands: list[Command], wait: float | None = None) -> tuple[list[Placed], list[Outcome | None]]:
        from producers.outcomes import OutcomeTimeout, OutcomeWaiter
        from producers.publisher import DeliveryError

        waiter = OutcomeWaiter(self.config, self.topics.events) if wait is not None else None
        try:
            try:
                with self._lock:
                    for command in commands:
                        self._publisher.publish(command)
                    self._publisher.flush()
            except (DeliveryError, ValueError) as error:
                raise WriteError(self.config.scrub(str(error))) from None
            placed = [
                Placed(c.command_id, c.cluster, partition_for(c.cluster.encode(), self.partitions), None)
                for c in commands
            ]
            if waiter is None:
                return placed, []
            deadline = time.monotonic() + (wait or 0.0)
            outcomes: list[Outcome | None] = []
            for item in placed:
                try:
                    got = waiter.wait(item.command_id, max(0.0, deadline - time.monotonic()))
                    outcomes.append(got)
                except OutcomeTimeout:
                    outcomes.append(None)
            return placed, outcomes
        finally:
            if waiter is not None:
                waiter.close()

    def close(self) -> None:
        self._publisher.close()


def outcome_json(outcome: Outcome | None, to_json: Any) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {
        "command_id": outcome.command_id,
        "kind": outcome.kind,
        "partition": outcome.partition,
        "command_offset": outcome.command_offset,
        "events": [to_json(event) for event in outcome.events],
    }
