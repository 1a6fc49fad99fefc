"""The fence on the embedded log: a command whose fold raises halts its cluster, the processor keeps going, and
after the upgrade ResumeCluster rebuilds the cluster from the log; a replay and the replica agree byte for byte."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufold.replay import replay_partition
from logs.embedded import EmbeddedLog
from logs.embedded_replica import EmbeddedReplicaSource
from processor.core.fold import HANDLERS
from processor.core.snapshot import state_hash
from processor.runtime.loop import Processor
from processor.runtime.replica import Replica
from schemas.commands import AddNode, Command, Release, ResumeCluster, SubmitPod
from schemas.fastcodec import decode_event, encode_command

T0 = 1_767_225_600_000


def append(log: EmbeddedLog, commands: list[Command]) -> None:
    log.append_commands((c.cluster.encode(), encode_command(c)) for c in commands)


def events_of(log: EmbeddedLog, partition: int) -> list[Any]:
    return [decode_event(row.value) for row in log.read(log.topics.events, partition)]


@pytest.fixture()
def log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    with EmbeddedLog(tmp_path / "log.sqlite", partitions=1) as handle:
        yield handle


@pytest.fixture()
def bug(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A bug in today's build: submitting a pod named 'boom' raises (after its placement was emitted)."""
    real = HANDLERS[SubmitPod]

    def handler(decision: Any, command: SubmitPod) -> Any:
        result = real(decision, command)
        if command.pod_id == "boom":
            raise KeyError("boom")
        return result

    monkeypatch.setitem(HANDLERS, SubmitPod, handler)
    yield


def history() -> list[Command]:
    out = []
    for name in ("a", "b"):
        out.append(Command(f"{name}-n", name, T0, AddNode("n1", 32_000, 65_536, "A100", 8)))
        out.append(Command(f"{name}-p", name, T0 + 1000, SubmitPod("p1", num_gpu=1, gpu_milli=1000)))
    out.append(Command("a-boom", "a", T0 + 2000, SubmitPod("boom", num_gpu=2, gpu_milli=1000)))
    out.append(Command("a-next", "a", T0 + 3000, Release("p1")))
    out.append(Command("b-next", "b", T0 + 3000, SubmitPod("p2", num_gpu=1, gpu_milli=1000)))
    return out


def test_a_halted_cluster_does_not_stop_the_partition_and_resumes_after_the_upgrade(
    log: EmbeddedLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = HANDLERS[SubmitPod]

    def buggy(decision: Any, command: SubmitPod) -> Any:
        result = real(decision, command)
        if command.pod_id == "boom":
            raise KeyError("boom")
        return result

    append(log, history())
    with monkeypatch.context() as patch:
        patch.setitem(HANDLERS, SubmitPod, buggy)
        Processor(log, snapshot_every=3).run_until_idle()
    outcomes = {event.command_id: event for event in events_of(log, 0)}
    assert outcomes["a-boom"].type_name == "ClusterHalted"
    assert outcomes["a-next"].payload.code == "CLUSTER_HALTED"
    assert outcomes["b-next"].type_name == "PodScheduled"  # the other cluster went on
    # The upgrade: the bug is gone (monkeypatch undone). The operator resumes the cluster.
    append(log, [Command("resume", "a", T0 + 60_000, ResumeCluster("upgraded to 1.2"))])
    Processor(log, snapshot_every=3).run_until_idle()
    resumed = events_of(log, 0)[-1]
    assert resumed.type_name == "ClusterResumed" and resumed.payload.halted_command_id == "a-boom"
    state = Processor(log).folder(0).state  # restored from the latest snapshot and the tail
    assert state.clusters["a"].halted is None and state.clusters["a"].pods["p1"].running
    # Commands after the resume fold normally, and a replay of the whole log gives the same bytes.
    append(log, [Command("a-again", "a", T0 + 61_000, SubmitPod("boom", num_gpu=2, gpu_milli=1000))])
    Processor(log, snapshot_every=3).run_until_idle()
    assert events_of(log, 0)[-1].type_name == "PodScheduled"


def test_replay_and_replica_rebuild_a_resumed_cluster_as_the_processor_did(log: EmbeddedLog, bug: None) -> None:
    """The fault is still there in this build, so the replay halts at the same command; the resume re-folds
    the log up to it, in the processor, the replay and the replica alike."""
    append(log, [*history(), Command("resume", "a", T0 + 60_000, ResumeCluster())])
    Processor(log, snapshot_every=3).run_until_idle()
    published = [row.value for row in log.read(log.topics.events, 0)]
    end = log.end_offset(log.topics.commands, 0)
    replayed = replay_partition(0, log.read_commands(0, 0, end), log.topics, keep_events=True, history=log)
    assert [frame for _, frame in replayed.events] == published
    replica = Replica(EmbeddedReplicaSource(log.path))
    replica.restore()
    committed = Processor(log).folder(0).state
    assert replica.state_hashes()[0] == state_hash(committed) == state_hash(replayed.state)
