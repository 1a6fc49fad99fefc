"""The last-resort fence: a command whose fold raises halts its cluster, not the partition; ResumeCluster.

Faults are injected by wrapping a handler or a follow-up task so that it raises for one pod id: the
fold itself has no known crash left, and these tests must keep working when it has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from processor.core import decision as worklist
from processor.core.errors import InvariantViolation
from processor.core.fold import HANDLERS, decide
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from processor.core.state import PartitionState
from processor.runtime.loop import InputRecord, PartitionFolder
from schemas.codes import RejectionCode
from schemas.commands import AddNode, Command, Release, ResumeCluster, SubmitPod, Tick
from schemas.events import Event
from schemas.fastcodec import encode_command
from schemas.snapshots import decode_snapshot, encode_snapshot
from schemas.topics import Topics
from tests.strategies import clusters_hash, types

MINUTE = 60_000


@pytest.fixture
def faulty_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """SubmitPod of a pod named ``boom`` raises KeyError after the pod was placed (events already emitted)."""
    real = HANDLERS[SubmitPod]

    def handler(decision: Any, command: SubmitPod) -> Any:
        result = real(decision, command)
        if command.pod_id == "boom":
            raise KeyError("boom")
        return result

    monkeypatch.setitem(HANDLERS, SubmitPod, handler)


def commands() -> list[Command]:
    """Two clusters on one partition: a and b, each with a node and a running pod; then a's pod 'boom'."""
    out = []
    for name in ("a", "b"):
        out.append(Command(f"{name}-node", name, MINUTE, AddNode("n1", 32_000, 65_536, "A100", 8)))
        out.append(Command(f"{name}-p1", name, 2 * MINUTE, SubmitPod("p1", num_gpu=1, gpu_milli=1000)))
    out.append(Command("a-boom", "a", 3 * MINUTE, SubmitPod("boom", num_gpu=2, gpu_milli=1000)))
    return out


def fold(state: PartitionState, stream: list[Command]) -> list[Event]:
    events: list[Event] = []
    for command in stream:
        events += decide(state, command)
    return events


def test_a_raising_command_halts_its_cluster_and_publishes_none_of_its_events(faulty_submit: None) -> None:
    """The unit's PodScheduled is dropped; ClusterHalted names the command and the error; the cluster is empty."""
    state = PartitionState()
    fold(state, commands()[:-1])
    sequence = state.sequence
    events = decide(state, commands()[-1])
    assert types(events) == ["ClusterHalted"]
    halted = events[0].payload
    assert (halted.cluster, halted.command_id, halted.error) == ("a", "a-boom", "KeyError: 'boom'")
    assert "ResumeCluster" in halted.message and events[0].sequence == sequence
    assert state.sequence == sequence + 1
    cluster = state.clusters["a"]
    assert cluster.halted is not None and cluster.halted.command_id == "a-boom" and not cluster.nodes
    assert state.clusters["b"].pods["p1"].running  # the other cluster is untouched


def test_a_halted_clusters_commands_are_refused_and_the_others_go_on(faulty_submit: None) -> None:
    """CLUSTER_HALTED for a, at a's clock (which it does not move); b folds as before."""
    state = PartitionState()
    fold(state, commands())
    (refused,) = decide(state, Command("a-later", "a", 9 * MINUTE, Release("p1")))
    assert refused.payload.code == RejectionCode.CLUSTER_HALTED and "a-boom" in refused.payload.message
    assert refused.occurred_at == 3 * MINUTE and state.clusters["a"].clock == 3 * MINUTE
    assert types(decide(state, Command("b-p2", "b", 9 * MINUTE, SubmitPod("p2", cpu_milli=1)))) == ["PodScheduled"]


def test_the_commands_refused_while_halted_are_counted_and_the_count_is_kept(faulty_submit: None) -> None:
    """Health and metrics show how many commands a halted cluster refused: counted by the fold, snapshotted."""
    state = PartitionState()
    fold(state, commands())
    halt = state.clusters["a"].halted
    assert halt is not None and halt.refused == 0
    fold(state, [Command(f"a-later-{i}", "a", 9 * MINUTE, Release("p1")) for i in range(3)])
    fold(state, [Command("b-later", "b", 9 * MINUTE, Release("p1"))])  # another cluster's: not counted
    assert halt.refused == 3
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(state))))
    restored_halt = restored.clusters["a"].halted
    assert restored_halt is not None and restored_halt.refused == 3
    assert state_hash(restored) == state_hash(state)


def test_a_fault_in_follow_up_work_halts_too() -> None:
    """A task on the worklist that raises (here: retrying the queue after a release) halts the cluster."""
    real = worklist.TASKS[worklist.RETRY_QUEUE]

    def retry(decision: Any, cluster: Any, *args: Any) -> Any:
        if "waiting" in cluster.pods:
            raise ZeroDivisionError("injected")
        return real(decision, cluster, *args)

    state = PartitionState()
    fold(state, commands()[:-1])
    fold(state, [Command("a-w", "a", 3 * MINUTE, SubmitPod("waiting", num_gpu=8, gpu_milli=1000))])
    worklist.TASKS[worklist.RETRY_QUEUE] = retry  # in place: a compiled fold reads this very list
    try:
        events = decide(state, Command("a-rel", "a", 4 * MINUTE, Release("p1")))
    finally:
        worklist.TASKS[worklist.RETRY_QUEUE] = real
    assert types(events) == ["ClusterHalted"]  # the PodReleased of the failed unit is not published
    assert events[0].payload.error == "ZeroDivisionError: injected"


def test_halting_is_deterministic_and_survives_a_snapshot(faulty_submit: None) -> None:
    """The same stream halts the same way twice; a snapshot keeps the halt, restored state refuses alike."""
    first, second = PartitionState(), PartitionState()
    assert [e.to_avro() for e in fold(first, commands())] == [e.to_avro() for e in fold(second, commands())]
    assert state_hash(first) == state_hash(second)
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(first))))
    assert state_hash(restored) == state_hash(first)
    later = Command("a-later", "a", 9 * MINUTE, Tick())
    assert decide(restored, later)[0].to_avro() == decide(first, later)[0].to_avro()


@pytest.mark.parametrize("error", [InvariantViolation("broken"), MemoryError()])
def test_fatal_errors_stop_the_fold_instead(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """A broken invariant and a machine-dependent error are not halts: nothing may be published, so they raise."""

    def handler(decision: Any, command: SubmitPod) -> None:
        raise error

    monkeypatch.setitem(HANDLERS, SubmitPod, handler)
    with pytest.raises(type(error)):
        decide(PartitionState(), Command("x", "a", MINUTE, SubmitPod("p", cpu_milli=1)))


class ListLog:
    """The command log as a list of frames (offset = index), with no snapshot: what a rebuild reads."""

    def __init__(self, stream: list[Command]) -> None:
        self.frames = [encode_command(command) for command in stream]

    def latest_snapshot(self, partition: int) -> bytes | None:
        return None

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        for offset in range(start, min(end, len(self.frames))):
            yield InputRecord(partition, offset, None, self.frames[offset])


def run(folder: PartitionFolder, log: ListLog, start: int) -> None:
    for offset in range(start, len(log.frames)):
        folder.fold(InputRecord(0, offset, None, log.frames[offset]), [])


def test_resume_after_the_upgrade_rebuilds_the_cluster_from_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the fix, ResumeCluster re-folds the log up to the halting command: the cluster is as it was before
    it (p1 running, 'boom' never submitted), it folds again, and commands refused meanwhile stay refused."""
    real = HANDLERS[SubmitPod]

    def handler(decision: Any, command: SubmitPod) -> Any:
        if command.pod_id == "boom":
            raise KeyError("boom")
        return real(decision, command)

    stream = [*commands(), Command("a-refused", "a", 4 * MINUTE, SubmitPod("p9", cpu_milli=1))]
    log = ListLog(stream)
    folder = PartitionFolder(0, Topics(), snapshot_every=0, history=log)
    with monkeypatch.context() as patch:
        patch.setitem(HANDLERS, SubmitPod, handler)
        run(folder, log, 0)
    assert folder.state.clusters["a"].halted is not None
    before = PartitionState()
    fold(before, commands()[:-1])
    log.frames.append(encode_command(Command("resume", "a", 10 * MINUTE, ResumeCluster("fixed in 1.2"))))
    sink: list[Any] = []
    folder.fold(InputRecord(0, len(log.frames) - 1, None, log.frames[-1]), sink)
    cluster = folder.state.clusters["a"]
    assert cluster.halted is None and cluster.pods["p1"].running and "boom" not in cluster.pods
    assert "p9" not in cluster.pods and cluster.clock == 10 * MINUTE
    rebuilt = next(c for c in to_snapshot(folder.state).clusters if c.cluster == "a")
    assert rebuilt.pods == next(c for c in to_snapshot(before).clusters if c.cluster == "a").pods
    events = decide(folder.state, Command("a-again", "a", 11 * MINUTE, SubmitPod("boom", num_gpu=2, gpu_milli=1000)))
    assert types(events) == ["PodScheduled"]


def test_resume_without_the_log_is_refused_and_changes_nothing(faulty_submit: None) -> None:
    """The fold cannot read the log: a ResumeCluster folded without it is refused, and the cluster stays halted
    (one more refused command counted, nothing else changed)."""
    state = PartitionState()
    fold(state, commands())
    before = clusters_hash(state)
    (event,) = decide(state, Command("resume", "a", 10 * MINUTE, ResumeCluster()))
    assert event.payload.code == RejectionCode.CLUSTER_HALTED and "reads its command log" in event.payload.message
    halt = state.clusters["a"].halted
    assert halt is not None and halt.refused == 1  # the only thing it moves (with the idempotency window)
    assert clusters_hash(state) == before


def test_resume_of_a_cluster_that_is_not_halted_is_refused() -> None:
    state = PartitionState()
    fold(state, commands()[:2])
    (event,) = decide(state, Command("resume", "a", 10 * MINUTE, ResumeCluster()))
    assert event.payload.code == RejectionCode.NOT_HALTED
