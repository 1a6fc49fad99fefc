"""Idempotency: a repeated command id changes nothing, within a bounded window that snapshots carry."""

from __future__ import annotations

from processor.core.fold import decide
from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.state import DEFAULT_SEEN_WINDOW, PartitionState
from schemas.codes import RejectionCode
from schemas.commands import AddNode, Command, CordonNode, Release, SubmitPod
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import clusters_hash


def run(state: PartitionState, command_id: str, payload: object) -> list:
    return decide(state, Command(command_id, "c0", 0, payload))  # type: ignore[arg-type]


def test_repeated_command_is_rejected_and_changes_nothing() -> None:
    """Resending a SubmitPod with the same id does not submit a second time: DUPLICATE_COMMAND, allocation unchanged."""
    state = PartitionState()
    run(state, "add", AddNode("n1", 4000, 4096))
    run(state, "submit", SubmitPod("p1", cpu_milli=1000))
    before = clusters_hash(state)
    (event,) = run(state, "submit", SubmitPod("p1", cpu_milli=1000))
    assert (event.payload.code, event.payload.command_id) == (RejectionCode.DUPLICATE_COMMAND, "submit")
    (event,) = run(state, "submit", Release("p1"))  # same id, other payload: still a duplicate
    assert event.payload.code == RejectionCode.DUPLICATE_COMMAND
    assert clusters_hash(state) == before
    assert list(state.seen) == ["add", "submit"]


def test_rejected_command_id_is_remembered_too() -> None:
    """A command refused by the domain is an outcome: resending it with the same id is a duplicate."""
    state = PartitionState()
    (event,) = run(state, "cordon", CordonNode("ghost"))
    assert event.payload.code == RejectionCode.UNKNOWN_NODE
    run(state, "add", AddNode("ghost", 1000, 1000))
    (event,) = run(state, "cordon", CordonNode("ghost"))
    assert event.payload.code == RejectionCode.DUPLICATE_COMMAND


def test_window_forgets_the_oldest_ids_first() -> None:
    """With a window of 3 the 4th new id evicts the 1st, which is accepted again; newer ones stay duplicates."""
    state = PartitionState(seen_window=3)
    for i in range(4):
        run(state, f"id{i}", AddNode(f"n{i}", 1000, 1000))
    assert list(state.seen) == ["id1", "id2", "id3"]
    (event,) = run(state, "id3", AddNode("n9", 1000, 1000))
    assert event.payload.code == RejectionCode.DUPLICATE_COMMAND
    (event,) = run(state, "id0", AddNode("n9", 1000, 1000))
    assert event.type_name == "NodeAdded"
    assert list(state.seen) == ["id2", "id3", "id0"]


def test_duplicate_does_not_refresh_an_ids_place_in_the_window() -> None:
    """Rejecting a duplicate does not move its id to the newest end of the window."""
    state = PartitionState(seen_window=2)
    run(state, "a", AddNode("n1", 1000, 1000))
    run(state, "b", AddNode("n2", 1000, 1000))
    run(state, "a", AddNode("n3", 1000, 1000))
    run(state, "c", AddNode("n4", 1000, 1000))
    assert list(state.seen) == ["b", "c"]


def test_default_window_is_documented_size() -> None:
    """A fresh partition remembers the documented number of command ids."""
    assert PartitionState().seen_window == DEFAULT_SEEN_WINDOW == 100_000


def test_snapshot_carries_the_window_and_its_order() -> None:
    """A state restored from a snapshot rejects the same duplicates and forgets ids in the same order."""
    state = PartitionState(seen_window=3)
    for i in range(4):
        run(state, f"id{i}", AddNode(f"n{i}", 1000, 1000))
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(state))))
    assert (restored.seen_window, list(restored.seen)) == (3, ["id1", "id2", "id3"])
    (event,) = run(restored, "id2", AddNode("n9", 1000, 1000))
    assert event.payload.code == RejectionCode.DUPLICATE_COMMAND
    run(restored, "id4", AddNode("n9", 1000, 1000))
    assert list(restored.seen) == ["id2", "id3", "id4"]
