"""Re-fold a partition's commands into a fresh state, publishing nothing: what ``gpufold replay`` does.

Works on any source of command records (the embedded log, a Kafka topic, an
export), so the events a processor published can be checked byte for byte
against the ones the commands derive.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from logs.port import InputRecord, OutputRecord, Placement
from processor.core.state import PartitionState
from processor.runtime.loop import History, PartitionFolder
from schemas.topics import Topics


@dataclass
class Replayed:
    """One partition re-folded: its state and what the fold produced (events as frames, in order)."""

    partition: int
    state: PartitionState
    commands: int = 0
    events: list[tuple[int, bytes]] = field(default_factory=list)  # (command offset, event frame)
    dead_letters: int = 0


def replay_partition(
    partition: int,
    records: Iterable[InputRecord],
    topics: Topics | None = None,
    *,
    keep_events: bool = False,
    placement: Placement | None = None,
    history: History | None = None,
) -> Replayed:
    """Fold command records into a fresh state (no snapshots); keep the event frames if asked. With the log's
    ``placement``, commands on the wrong partition are dead-lettered as the processor does; with the log as
    ``history``, a halted cluster is rebuilt on ``ResumeCluster`` as the processor does."""
    topics = topics or Topics()
    folder = PartitionFolder(partition, topics, snapshot_every=0, placement=placement, history=history)
    result = Replayed(partition, folder.state)
    sink: list[OutputRecord] = []
    for record in records:
        folder.fold(record, sink)
        result.commands += 1
        for output in sink:
            if output.topic == topics.events:
                if keep_events:
                    result.events.append((record.offset, output.value))
            elif output.topic == topics.dead_letters:
                result.dead_letters += 1
        sink.clear()
    return result
