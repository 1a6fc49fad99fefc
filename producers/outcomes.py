"""Waiting for a command's outcome (``PodScheduled``, ``PodQueued``, ``CommandRejected``, ...) by command_id.

:class:`OutcomeWaiter` reads the events topic with ``read_committed`` (so it only ever sees what the processor
committed) from the end as of its creation (or from the beginning), and returns all the events a command
caused. Create it *before* publishing the commands you want to wait for, or pass ``start="beginning"``::

    with OutcomeWaiter(config, "gpufold.events") as waiter, CommandPublisher(config) as publisher:
        command_id = publisher.submit_pod("lab", "p1", num_gpu=1)
        publisher.flush()
        outcome = waiter.wait(command_id, timeout=10)
        print(outcome.kind)  # "PodScheduled" or "PodQueued" or "CommandRejected"

The events of one command are written in one transaction, contiguously on one partition; an outcome is
complete once a later command's event or the end of that partition has been read.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_settings.config import KafkaConfig
from kafka_settings.topics import watermark_offsets
from schemas import EVENT, DecodeError, registry
from schemas.events import Event

MAX_BUFFERED = 200_000


class OutcomeTimeout(TimeoutError):
    """No outcome for the command within the timeout (the processor may be down or lagging)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The events one command caused, in order."""

    command_id: str
    partition: int
    command_offset: int
    events: tuple[Event, ...]

    @property
    def kind(self) -> str:
        """The first event's type, e.g. ``PodScheduled``: what became of the command."""
        return type(self.events[0].payload).__name__

    @property
    def rejected(self) -> bool:
        return self.kind == "CommandRejected"


class OutcomeWaiter:
    """Reads the events topic and hands out outcomes by command_id (see the module docstring)."""

    def __init__(
        self, config: KafkaConfig, topic: str, *, start: Literal["end", "beginning"] = "end", timeout: float = 10.0
    ) -> None:
        self.topic = topic
        self._decode = registry().codec(EVENT).decode
        self._consumer = Consumer(
            config.client(
                {"fetch.wait.max.ms": 10},
                {
                    "group.id": f"gpufold-outcomes-{id(self)}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "logger": logging.getLogger("gpufold.kafka.rdkafka"),
                },
            )
        )
        try:
            metadata = self._consumer.list_topics(topic, timeout=timeout).topics[topic]
            if metadata.error is not None:
                raise ValueError(f"events topic {topic}: {metadata.error.str()}")
            assignment = []
            for partition in sorted(metadata.partitions):
                low, high = watermark_offsets(self._consumer, TopicPartition(topic, partition), timeout)
                assignment.append(TopicPartition(topic, partition, high if start == "end" else low))
        except KafkaException as exc:
            self._consumer.close()
            raise ValueError(config.scrub(f"cannot read events topic {topic}: {exc}")) from None
        self._consumer.assign(assignment)
        # command_id -> (partition, command_offset, events); complete ones are moved to _done.
        self._open: dict[int, tuple[str, int, list[Event]]] = {}
        self._done: OrderedDict[str, Outcome] = OrderedDict()

    def wait(self, command_id: str, timeout: float = 10.0) -> Outcome:
        """The outcome of ``command_id``; raises :class:`OutcomeTimeout` if it does not come in time."""
        deadline = time.monotonic() + timeout
        while True:
            outcome = self._done.pop(command_id, None)
            if outcome is not None:
                return outcome
            left = deadline - time.monotonic()
            if left <= 0:
                raise OutcomeTimeout(f"no outcome for command {command_id!r} on {self.topic} within {timeout:g} s")
            self._read(min(left, 0.1))

    def _read(self, timeout: float) -> None:
        # poll() returns on the first record; consume(n, timeout) alone would wait for n records or the timeout.
        first = self._consumer.poll(timeout)
        if first is None:
            return
        for message in [first, *self._consumer.consume(1000, 0)]:
            error = message.error()
            partition = message.partition()
            assert partition is not None
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._close_open(partition)
                continue
            try:
                event = Event.from_avro(self._decode(message.value()))  # type: ignore[arg-type]
            except DecodeError:
                continue
            current = self._open.get(partition)
            if current is not None and current[1] != event.command_offset:
                self._close_open(partition)
                current = None
            if current is None:
                self._open[partition] = (event.command_id, event.command_offset, [event])
            else:
                current[2].append(event)

    def _close_open(self, partition: int) -> None:
        current = self._open.pop(partition, None)
        if current is None:
            return
        command_id, offset, events = current
        self._done[command_id] = Outcome(command_id, partition, offset, tuple(events))
        while len(self._done) > MAX_BUFFERED:
            self._done.popitem(last=False)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> OutcomeWaiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
