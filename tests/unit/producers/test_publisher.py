"""CommandPublisher checks arguments before sending anything (no broker needed: nothing is sent)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_settings.config import load
from processor.core.fold import decide
from processor.core.state import PartitionState
from producers.publisher import CommandPublisher, InvalidCommand
from schemas.commands import AddNode, Command, DrainNode, GangMember, Release, SetPolicy, SubmitGang, SubmitPod
from schemas.events import CommandRejected


@pytest.fixture
def publisher() -> Iterator[CommandPublisher]:
    # An unreachable address: validation fails before anything is produced.
    publisher = CommandPublisher(load(bootstrap="127.0.0.1:1", environ={}), "t.commands")
    publisher.sent = []  # type: ignore[attr-defined]
    publisher.send = lambda key, value: publisher.sent.append((key, value))  # type: ignore[method-assign,attr-defined]
    yield publisher
    publisher._producer = None  # nothing reached the producer: no delivery to wait for


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.add_node("lab", "n 1", cpu_milli=1, memory_mib=1), "node_id"),
        (lambda p: p.add_node("lab", "n1", cpu_milli=0, memory_mib=1), "cpu_milli"),
        (lambda p: p.add_node("lab", "n1", cpu_milli=1, memory_mib=1, gpu_count=2, gpu_model="bad model"), "model"),
        (lambda p: p.add_node("lab", "n1", cpu_milli=1, memory_mib=1, gpu_model="A100"), "gpu_count 0"),
        (lambda p: p.submit_pod("lab", "p1"), "requests no GPU"),
        (lambda p: p.submit_pod("lab", "p1", num_gpu=2, gpu_milli=500), "multi-GPU"),
        (lambda p: p.submit_pod("lab", "p1", num_gpu=1, gpu_milli=1500), "gpu_milli"),
        (lambda p: p.submit_pod("", "p1", cpu_milli=1), "cluster"),
        (lambda p: p.release("lab", ""), "pod_id"),
        (lambda p: p.set_policy("lab", "no-such-policy"), "unknown policy"),
        (lambda p: p.cordon_node("lab", "n1", command_id="has space"), "command_id"),
        (lambda p: p.submit_gang("lab", "g1", []), "has 0 members"),
        (lambda p: p.submit_gang("lab", "g1", [GangMember("m", cpu_milli=1)], min_members=2), "min_members"),
        (lambda p: p.submit_gang("lab", "g1", [GangMember("m", cpu_milli=1)] * 2), "twice"),
        (lambda p: p.submit_pod("lab", "p1", cpu_milli=1, depends_on=["p1"]), "itself"),
        (lambda p: p.submit_pod("lab", "p1", cpu_milli=1, time_limit_ms=0), "time_limit_ms"),
        (lambda p: p.release_gang("lab", ""), "gang_id"),
        (lambda p: p.set_policy("lab", queue_order="lifo"), "queue_order"),
    ],
)
def test_invalid_arguments_raise_clear_value_errors(publisher: CommandPublisher, call, message: str) -> None:  # type: ignore[no-untyped-def]
    """Each invalid argument raises a ValueError naming it, and nothing is queued for delivery."""
    with pytest.raises(ValueError, match=message):
        call(publisher)
    assert publisher.sent == []  # type: ignore[attr-defined]


def test_gang_and_tick_commands_are_sent_keyed_by_cluster(publisher: CommandPublisher) -> None:
    """submit_gang, release_gang and tick encode the new commands; the fold decodes them as sent."""
    from schemas.fastcodec import decode_command

    members = [GangMember("w0", 8, 1000, 8000, 65536), GangMember("w1", 8, 1000, 8000, 65536)]
    publisher.submit_gang("lab", "train", members, topology_required="topology/rack", time_limit_ms=3_600_000)
    publisher.release_gang("lab", "train")
    publisher.tick("lab")
    sent = [decode_command(value) for _, value in publisher.sent]  # type: ignore[attr-defined]
    assert [type(c.payload).__name__ for c in sent] == ["SubmitGang", "ReleaseGang", "Tick"]
    assert sent[0].payload.members == tuple(members) and sent[0].payload.topology_required == "topology/rack"


def test_command_id_is_the_callers_or_a_fresh_uuid(publisher: CommandPublisher) -> None:
    """A given command_id is returned as is; without one, each command gets a distinct uuid4."""
    assert publisher.drain_node("lab", "n1", command_id="drain-1") == "drain-1"
    first, second = publisher.uncordon_node("lab", "n1"), publisher.uncordon_node("lab", "n1")
    assert first != second and len(first) == 36
    assert [key for key, _ in publisher.sent] == [b"lab"] * 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "command",
    [
        Command("c1", "lab", 0, AddNode("n1", 0, 1)),
        Command("c1", "lab", 0, AddNode("n1", 1, 1, "bad model", 2)),
        Command("c1", "lab", 0, SubmitPod("p1", num_gpu=2, gpu_milli=500)),
        Command("c1", "lab", 0, SubmitPod("p 1", cpu_milli=1)),
        Command("c1", "", 0, Release("p1")),
        Command("c1", "lab", -1, DrainNode("n1")),
        Command("c1", "lab", 0, SetPolicy("no-such-policy")),
        Command("c1", "lab", 0, SubmitGang("g1")),
        Command("c1", "lab", 0, SubmitGang("g1", members=(GangMember("m", 1, 500),), depends_on=("m",))),
        Command("c1", "lab", 0, SubmitPod("p1", cpu_milli=1, dependency="before")),
    ],
)
def test_the_publisher_refuses_what_the_fold_rejects_with_the_same_code(
    publisher: CommandPublisher, command: Command
) -> None:
    """One set of stateless checks: the publisher's error carries the code of the fold's CommandRejected."""
    rejected = decide(PartitionState(), command)[-1].payload
    assert isinstance(rejected, CommandRejected)
    with pytest.raises(InvalidCommand) as raised:
        publisher.publish(command)
    assert raised.value.code == rejected.code and str(raised.value) == rejected.message
    assert publisher.sent == []  # type: ignore[attr-defined]
