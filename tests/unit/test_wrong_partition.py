"""One writer per cluster: a command on a partition that is not murmur2(cluster) mod the partition count, or keyed
other than its cluster, is dead-lettered with WRONG_PARTITION and never folded (issue #21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold.cli import main
from gpufold.replay import replay_partition
from logs.embedded import EmbeddedLog
from logs.port import InputRecord, OutputRecord, Placement
from processor.core.snapshot import state_hash
from processor.runtime.loop import PartitionFolder, Processor
from schemas.codes import DeadLetterCode
from schemas.commands import AddNode, Command, SubmitPod
from schemas.dead_letters import decode_dead_letter
from schemas.fastcodec import encode_command
from schemas.partitioner import partition_for
from schemas.topics import Topics

PARTITIONS = 3
TOPICS = Topics()


def _cluster_on(partition: int) -> str:
    return next(
        name for name in (f"lab-{i}" for i in range(100)) if partition_for(name.encode(), PARTITIONS) == partition
    )


HOME = _cluster_on(0)  # a cluster whose commands belong on partition 0
AWAY = _cluster_on(1)  # one whose commands belong on partition 1


def _frame(cluster: str, serial: int, payload: object | None = None) -> bytes:
    payload = payload or AddNode(f"n{serial}", 64_000, 512_000, "A100", 8)
    return encode_command(Command(f"{cluster}-{serial}", cluster, 1_000 + serial, payload, "test"))  # type: ignore[arg-type]


def _fold(records: list[InputRecord], placement: Placement | None) -> tuple[PartitionFolder, list[OutputRecord]]:
    folder = PartitionFolder(0, TOPICS, snapshot_every=0, placement=placement)
    out: list[OutputRecord] = []
    for record in records:
        folder.fold(record, out)
    return folder, out


def test_a_command_of_another_partitions_cluster_is_dead_lettered_not_folded() -> None:
    good = InputRecord(0, 0, HOME.encode(), _frame(HOME, 0))
    stray = InputRecord(0, 1, AWAY.encode(), _frame(AWAY, 1))
    after = InputRecord(0, 2, HOME.encode(), _frame(HOME, 2))
    folder, out = _fold([good, stray, after], Placement(PARTITIONS))
    assert [o.topic for o in out] == [TOPICS.events, TOPICS.dead_letters, TOPICS.events]
    letter = decode_dead_letter(out[1].value)
    assert letter.code == DeadLetterCode.WRONG_PARTITION == "WRONG_PARTITION"
    assert (letter.partition, letter.offset, letter.key, letter.value) == (0, 1, AWAY.encode(), stray.value)
    assert "belongs on partition 1" in letter.error and "this record is on partition 0" in letter.error
    assert repr(AWAY.encode()) in letter.error
    assert AWAY not in folder.state.clusters, "nothing of the stray command reached the state"
    assert folder.state.next_offset == 3
    assert folder.refused == {"WRONG_PARTITION": 1}
    # The state is the one the two good commands alone give (the stray one moved nothing, not even the clock).
    alone, _ = _fold([good, InputRecord(0, 2, HOME.encode(), after.value)], None)
    alone.state.next_offset = folder.state.next_offset
    assert state_hash(alone.state) == state_hash(folder.state)


@pytest.mark.parametrize("key", [b"someone-else", None, b""])
def test_a_key_other_than_the_cluster_is_refused_even_on_the_right_partition(key: bytes | None) -> None:
    folder, out = _fold([InputRecord(0, 0, key, _frame(HOME, 0))], Placement(PARTITIONS))
    assert [o.topic for o in out] == [TOPICS.dead_letters]
    letter = decode_dead_letter(out[0].value)
    assert letter.code == "WRONG_PARTITION"
    assert f"with key {key!r}" in letter.error and f"with key {HOME.encode()!r}" in letter.error
    assert folder.state.clusters == {}


def test_without_a_placement_or_before_checked_from_commands_fold_as_before() -> None:
    """Records folded by a processor older than the check (below checked_from) re-fold as they did then."""
    stray = [InputRecord(0, 0, AWAY.encode(), _frame(AWAY, 0)), InputRecord(0, 1, b"x", _frame(AWAY, 1))]
    for placement in (None, Placement(PARTITIONS, checked_from=2)):
        folder, out = _fold(stray, placement)
        assert [o.topic for o in out] == [TOPICS.events, TOPICS.events]
        assert set(folder.state.clusters[AWAY].nodes) == {"n0", "n1"}
    folder, out = _fold(stray, Placement(PARTITIONS, checked_from=1))
    assert [o.topic for o in out] == [TOPICS.events, TOPICS.dead_letters]


def test_undecodable_bytes_keep_a_dead_letter_without_a_code() -> None:
    _, out = _fold([InputRecord(0, 0, HOME.encode(), b"\x00garbage")], Placement(PARTITIONS))
    letter = decode_dead_letter(out[0].value)
    assert letter.code is None


def test_a_re_fold_does_not_count_refusals_again() -> None:
    folder, _ = _fold([InputRecord(0, 0, AWAY.encode(), _frame(AWAY, 0))], Placement(PARTITIONS))
    folder.fold_silently([InputRecord(0, 1, AWAY.encode(), _frame(AWAY, 1))])
    assert folder.refused == {"WRONG_PARTITION": 1}
    assert folder.state.next_offset == 2


def test_the_embedded_log_applies_the_same_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A command appended (or imported) onto another cluster's partition of an embedded log is never folded, the
    replay agrees with the processor, and `gpufold log info` shows the refusal."""
    path = tmp_path / "log.sqlite"
    pod = SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)
    with EmbeddedLog(path, partitions=PARTITIONS) as log:
        log.append_commands([(HOME.encode(), _frame(HOME, 0))])
        log.append(TOPICS.commands, [(0, AWAY.encode(), _frame(AWAY, 1))])  # AWAY belongs on partition 1
        log.append(TOPICS.commands, [(0, HOME.encode(), _frame(AWAY, 2, pod))])  # key says HOME, body AWAY
        log.append_commands([(AWAY.encode(), _frame(AWAY, 3))])
        processor = Processor(log)
        processor.run_until_idle()
        assert processor.refused() == {"WRONG_PARTITION": 2}
        letters = [decode_dead_letter(r.value) for r in log.read(TOPICS.dead_letters, 0)]  # type: ignore[arg-type]
        assert [(d.offset, d.code) for d in letters] == [(1, "WRONG_PARTITION"), (2, "WRONG_PARTITION")]
        home = processor.folders[0].state
        assert AWAY not in home.clusters
        assert list(processor.folders[1].state.clusters[AWAY].nodes) == ["n3"]  # only the one on its partition
        replayed = replay_partition(0, log.read_commands(0, 0, 3), log.topics, placement=log.placement(0))
        assert state_hash(replayed.state) == state_hash(home) and replayed.dead_letters == 2
    assert main(["log", "info", "--log", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [p["wrong_partition"] for p in info["partitions"]] == [2, 0, 0]


def test_the_replica_skips_what_the_processor_refuses(tmp_path: Path) -> None:
    """The live replica (what-if, pods, nodes) folds what the processor folds: a stray command moves nothing."""
    from logs.embedded_replica import EmbeddedReplicaSource
    from processor.runtime.replica import Replica

    path = tmp_path / "log.sqlite"
    with EmbeddedLog(path, partitions=PARTITIONS) as log:
        log.append_commands([(HOME.encode(), _frame(HOME, 0))])
        log.append(TOPICS.commands, [(0, AWAY.encode(), _frame(AWAY, 1))])
        log.append(TOPICS.commands, [(0, b"not-the-cluster", _frame(HOME, 2))])
        processor = Processor(log)
        processor.run_until_idle()
        folded = state_hash(processor.folders[0].state)
    replica = Replica(EmbeddedReplicaSource(path))
    replica.restore()
    assert state_hash(replica.states[0]) == folded
    assert AWAY not in replica.states[0].clusters and list(replica.states[0].clusters[HOME].nodes) == ["n0"]
    assert replica.position()["refused"] == {"WRONG_PARTITION": 2}  # GET /v1/replica shows it
