"""The fence on the real broker: a command whose fold raises halts its cluster, not the partition, and
ResumeCluster (after the upgrade) rebuilds it from the commands topic."""

from __future__ import annotations

from typing import Any

import pytest
from kafka_support import BackgroundProcessor, new_topics, publish, read_topic

from processor.core.fold import HANDLERS
from schemas.commands import AddNode, Command, Release, ResumeCluster, SubmitPod
from schemas.fastcodec import decode_event

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000


def outcomes(bootstrap: str, topic: str) -> dict[str, Any]:
    """The last event of each command (its outcome), by command id, over every partition."""
    out: dict[str, Any] = {}
    for records in read_topic(bootstrap, topic).values():
        for record in records:
            event = decode_event(record.value)
            out[event.command_id] = event
    return out


def test_a_raising_command_halts_one_cluster_and_resume_rebuilds_it(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = new_topics(kafka_bootstrap, "halt", 1)  # one partition: both clusters share it
    stream = []
    for name in ("a", "b"):
        stream.append(Command(f"{name}-n", name, T0, AddNode("n1", 32_000, 65_536, "A100", 8)))
        stream.append(Command(f"{name}-p", name, T0 + 1000, SubmitPod("p1", num_gpu=1, gpu_milli=1000)))
    stream += [
        Command("a-boom", "a", T0 + 2000, SubmitPod("boom", num_gpu=2, gpu_milli=1000)),
        Command("a-next", "a", T0 + 3000, Release("p1")),
        Command("b-next", "b", T0 + 3000, SubmitPod("p2", num_gpu=1, gpu_milli=1000)),
    ]
    publish(kafka_bootstrap, topics, stream)
    real = HANDLERS[SubmitPod]

    def buggy(decision: Any, command: SubmitPod) -> Any:
        result = real(decision, command)
        if command.pod_id == "boom":
            raise KeyError("boom")
        return result

    with monkeypatch.context() as patch:
        patch.setitem(HANDLERS, SubmitPod, buggy)
        with BackgroundProcessor(kafka_bootstrap, topics, instance_id="halt-1", stop_when_idle=3) as processor:
            assert processor.wait() == 0  # the processor did not crash-loop: it stopped when idle
    seen = outcomes(kafka_bootstrap, topics.events)
    assert seen["a-boom"].type_name == "ClusterHalted" and seen["a-boom"].payload.error == "KeyError: 'boom'"
    assert seen["a-next"].payload.code == "CLUSTER_HALTED"
    assert seen["b-next"].type_name == "PodScheduled"
    # After the upgrade (the bug is gone), the operator resumes the cluster.
    publish(kafka_bootstrap, topics, [Command("resume", "a", T0 + 60_000, ResumeCluster("1.2"))])
    publish(kafka_bootstrap, topics, [Command("a-again", "a", T0 + 61_000, Release("p1"))])
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="halt-2", stop_when_idle=3) as processor:
        assert processor.wait() == 0
    seen = outcomes(kafka_bootstrap, topics.events)
    assert seen["resume"].type_name == "ClusterResumed", seen["resume"].payload
    assert seen["resume"].payload.halted_command_id == "a-boom"
    assert seen["a-again"].type_name == "PodReleased"  # p1 ran again in the rebuilt cluster
