"""The names of the four gpufold logs, on Kafka and in the embedded log alike.

=================  ==========================================================================
commands           the source of truth: keyed by cluster (``schemas.partitioner``), kept forever
events             the fold's output, same partition count as commands (partition p -> p)
snapshots          one key per partition (the latest snapshot survives compaction)
dead letters       undecodable command records with their position and error
=================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names; the events topic has the same partitions as the commands topic."""

    commands: str = "gpufold.commands"
    events: str = "gpufold.events"
    snapshots: str = "gpufold.snapshots"
    dead_letters: str = "gpufold.dead-letters"


def topics_for(prefix: str = "gpufold") -> Topics:
    """The topic names under a prefix (``gpufold`` -> ``gpufold.commands``, ...)."""
    return Topics(f"{prefix}.commands", f"{prefix}.events", f"{prefix}.snapshots", f"{prefix}.dead-letters")
