"""The capacity index files a node a command changed once per read, not at every change (issue #20).

It watches ``ClusterState._file`` and the ``index`` property, which a compiled build cannot swap: the compiled
pass of CI skips it and the pure-Python pass of the property suite runs it (``scripts/test.sh``).
"""

from __future__ import annotations

import pytest

import build_config
from processor.core import state as state_module
from processor.core.capacity import CapacityIndex
from processor.core.fold import decide
from processor.core.state import ClusterState, PartitionState
from tests import adversarial


def test_one_command_files_each_node_it_changed_once_between_reads_of_the_capacity_index(monkeypatch) -> None:
    """A gang whose members each take another node moves each of its nodes on trial, on rollback, by the
    eviction and by the placement, more than ``UNINDEXED_AT_MOST`` changes apart. A node is filed only when the
    index is read (once for all its changes before) or when the command ends, not at every change past the
    bound (as when the bound was kept on every change: up to four times between two reads); after the command
    at most that many wait, and the index is what a rebuild gives."""
    if build_config.is_compiled(state_module):
        pytest.skip("compiled: the filing cannot be watched here; the pure-Python pass of the property suite runs it")
    nodes = state_module.UNINDEXED_AT_MOST + 44  # each member's node more than the bound apart
    commands = adversarial.gang_preempts_spread(nodes, nodes)
    attack = next(i for i, command in enumerate(commands) if command.command_id.startswith(adversarial.ATTACK))
    state = PartitionState()
    for offset, command in enumerate(commands[:attack]):
        decide(state, command, offset)
    (cluster,) = state.clusters.values()
    segments: list[list[str]] = [[]]  # the nodes filed since each read of the index (the first: before any)
    file, read = ClusterState._file, ClusterState.index.fget

    def filing(self: ClusterState, node_id: str) -> None:
        segments[-1].append(node_id)
        file(self, node_id)

    def reading(self: ClusterState) -> CapacityIndex:
        segments.append([])
        return read(self)

    monkeypatch.setattr(ClusterState, "_file", filing)
    monkeypatch.setattr(ClusterState, "index", property(reading))
    events = decide(state, commands[attack], attack)
    monkeypatch.undo()
    scheduled = {event.payload.node_id for event in events if type(event.payload).__name__ == "PodScheduled"}
    assert len(scheduled) == nodes  # every member placed, each on a node of its own
    for segment in segments:
        assert len(segment) == len(set(segment)), "a node was filed twice with no read of the index in between"
    assert sum(len(segment) for segment in segments) >= nodes  # the changed nodes were filed (not left waiting)
    assert len(cluster.unindexed) <= state_module.UNINDEXED_AT_MOST
    schedulable = {n: node.signature() for n, node in cluster.nodes.items() if node.schedulable}
    assert cluster.index.content() == CapacityIndex().rebuilt(schedulable).content()
