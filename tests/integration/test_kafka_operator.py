"""The operator's surface on the real broker: the replica and what-if, the write API, export + replay."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kafka_support import (
    GPUFOLD,
    BackgroundProcessor,
    CommittedWatcher,
    check_exactly_once,
    command_stream,
    kafka_config,
    new_topics,
    publish,
    read_topic,
)

from gpufold.kafka_export import KafkaExporter, export_kafka
from gpufold.log_export import import_log
from gpufold.server.app import create_app
from gpufold.server.writers import KafkaWriter
from logs.kafka_replica import KafkaReplicaSource
from processor.runtime.replica import Replica
from schemas.commands import Command, Release, SubmitPod
from schemas.fastcodec import encode_event
from schemas.partitioner import partition_for

pytestmark = pytest.mark.integration
PARTITIONS = 3


def wait_committed(bootstrap: str, topics, group: str, total: int) -> None:  # type: ignore[no-untyped-def]
    watcher = CommittedWatcher(bootstrap, topics, group, PARTITIONS)
    try:
        watcher.wait_for(total, 120)
    finally:
        watcher.close()


def test_replica_on_kafka_and_what_if_equals_the_published_events(kafka_bootstrap: str) -> None:
    """A replica restored from Kafka snapshots answers a what-if with the bytes the processor then publishes."""
    topics = new_topics(kafka_bootstrap, "replica", PARTITIONS)
    group = topics.commands + ".group"
    stream = command_stream(400, clusters=3, nodes=6)
    publish(kafka_bootstrap, topics, stream)
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="replica", snapshot_every=60, group_id=group):
        wait_committed(kafka_bootstrap, topics, group, len(stream))
        replica = Replica(KafkaReplicaSource(kafka_config(kafka_bootstrap), topics))
        replica.restore()
        try:
            assert replica.position()["lag"] == 0
            expected = check_exactly_once(kafka_bootstrap, topics)
            assert replica.state_hashes() == expected.hashes
            t = len(stream) + 10
            asked = [
                Command("wi-1", "c0", t, SubmitPod("wi-pod", num_gpu=1, gpu_milli=500, cpu_milli=1_000), "test"),
                Command("wi-2", "c1", t + 1, SubmitPod("wi-big", num_gpu=8, gpu_milli=1000, cpu_milli=1_000), "test"),
                Command("wi-3", "c1", t + 2, Release("no-such-pod"), "test"),
            ]
            answer = replica.what_if(asked, hashes=True)
            assert replica.state_hashes() == expected.hashes, "the what-if changed the live state"
            publish(kafka_bootstrap, topics, asked)
            wait_committed(kafka_bootstrap, topics, group, len(stream) + len(asked))
            events = read_topic(kafka_bootstrap, topics.events)
            for result in answer.results:
                assert result.partition == partition_for(result.command.cluster.encode(), PARTITIONS)
                published = [
                    r.value
                    for r in events[result.partition]
                    if r.value and b"wi-" in r.value  # the what-if's own
                ]
                wanted = [encode_event(e) for e in result.events]
                assert all(frame in published for frame in wanted), f"{result.command.command_id}: events differ"
            replica.catch_up()
            hashes = replica.state_hashes()
            for partition, value in answer.state_hashes.items():
                assert hashes[partition] == value
        finally:
            replica.stop()


def test_write_api_on_kafka_returns_outcomes(kafka_bootstrap: str) -> None:
    """POST /v1/commands?wait publishes with CommandPublisher and returns the processor's outcome."""
    topics = new_topics(kafka_bootstrap, "writeapi", PARTITIONS)
    config = kafka_config(kafka_bootstrap)
    writer = KafkaWriter(config, topics, PARTITIONS)
    replica = Replica(KafkaReplicaSource(config, topics)).start()
    assert replica.restored.wait(60)
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="writeapi"):
        client = TestClient(create_app(writer=writer, replica=replica))
        node = {"node_id": "n1", "gpu_model": "A100", "gpu_count": 4, "cpu_milli": 32_000, "memory_mib": 65_536}
        added = client.post("/v1/clusters/lab/nodes?wait=60&create_cluster=true", json=node)
        assert added.status_code == 200, added.text
        assert added.json()["outcomes"][0]["kind"] == "NodeAdded"
        again = client.post("/v1/clusters/lab/nodes?wait=30", json={**node, "command_id": "n1-twice"})
        assert again.status_code == 409 and again.json()["outcomes"][0]["code"] == "DUPLICATE_NODE"
        # A retry of the same command on Kafka: its original outcome, found once the replica folded it.
        retried = client.post("/v1/clusters/lab/nodes?wait=30", json={**node, "command_id": "n1-twice"})
        assert retried.status_code == 409, retried.text
        assert retried.json()["commands"][0]["retry"] is True
        assert retried.json()["outcomes"][0]["command_offset"] == again.json()["outcomes"][0]["command_offset"]
        assert client.post("/v1/clusters/Lab/pods", json={"pod_id": "x", "num_gpu": 1}).status_code == 404
        batch = [
            {"cluster": "lab", "payload": {"SubmitPod": {"pod_id": "p1", "num_gpu": 2, "gpu_milli": 1000}}},
            {"cluster": "lab", "payload": {"SubmitPod": {"pod_id": "p2", "num_gpu": 4, "gpu_milli": 1000}}},
        ]
        body = client.post("/v1/commands?wait=30", json=batch).json()
        assert [o["kind"] for o in body["outcomes"]] == ["PodScheduled", "PodQueued"]
        assert body["backend"] == "kafka" and body["complete"]
        refused = client.post("/v1/clusters/lab/pods", json={"pod_id": "p3", "num_gpu": 2, "gpu_milli": 300})
        assert refused.status_code == 422 and refused.json()["code"] == "INVALID_RESOURCES"
        # The replica following Kafka sees what the processor decided (its view of the head is
        # refreshed every half second, so wait for the pods themselves).
        deadline = time.monotonic() + 30
        while True:
            answer = client.get("/v1/pods", params={"cluster": "lab"})
            listed = answer.json()  # 404 until the replica has folded the cluster's first command
            if answer.status_code == 200 and len(listed["pods"]) == 2:
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.1)
        running = client.get("/v1/pods", params={"state": "running", "cluster": "lab"}).json()
        assert [p["pod_id"] for p in running["pods"]] == ["p1"]
        explained = client.get("/v1/clusters/lab/pods/p2/explain").json()
        assert explained["nearest_miss"]["message"] == "node n1 lacks 2 whole free GPU(s)"
        asked = {"cluster": "lab", "payload": {"Release": {"pod_id": "p1"}}}
        what_if = client.post("/v1/what-if", json=asked).json()
        assert [next(iter(e["payload"])) for e in what_if["results"][0]["events"]] == ["PodReleased", "PodScheduled"]
    replica.stop()
    writer.close()


def test_export_from_kafka_replays_to_productions_state_hash(kafka_bootstrap: str, tmp_path: Path) -> None:
    """log export --bootstrap, log import and replay reproduce each partition's state_hash, whole or up to an offset."""
    topics = new_topics(kafka_bootstrap, "export", PARTITIONS)
    group = topics.commands + ".group"
    stream = command_stream(600, clusters=4, nodes=6)
    publish(kafka_bootstrap, topics, stream)
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="export", snapshot_every=100, group_id=group):
        wait_committed(kafka_bootstrap, topics, group, len(stream))
    production = check_exactly_once(kafka_bootstrap, topics)  # the hash of the state the published events build

    out = tmp_path / "export"
    prefix = topics.commands.rsplit(".", 1)[0]
    exported = subprocess.run(
        [*GPUFOLD, "log", "export", str(out), "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix,
         "--group", group],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert f"commands: {len(stream)} record(s)" in exported.stdout
    log = tmp_path / "laptop.sqlite"
    counts = import_log(out, log)
    assert counts["snapshots"] >= 1 and counts["events"] == sum(len(e) for e in production.events.values())
    replayed = subprocess.run(
        [*GPUFOLD, "replay", "--log", str(log), "--json", "--check"], capture_output=True, text=True, timeout=120
    )
    assert replayed.returncode == 0, replayed.stderr
    data = json.loads(replayed.stdout)
    assert {p["partition"]: p["state_hash"] for p in data["partitions"]} == production.hashes
    assert all(check["ok"] for check in data["check"])

    # Up to an offset, one cluster's partition: the same hash as folding that prefix.
    cluster = "c2"
    partition = partition_for(cluster.encode(), PARTITIONS)
    commands = read_topic(kafka_bootstrap, topics.commands)[partition]
    cut = commands[len(commands) // 2].offset
    with KafkaExporter(kafka_config(kafka_bootstrap), topics, group=group) as exporter:
        partial = export_kafka(exporter, tmp_path / "partial", clusters=[cluster], until_offset=cut)
    assert partial["commands"] == cut + 1
    import_log(tmp_path / "partial", tmp_path / "partial.sqlite")
    prefix_state = subprocess.run(
        [*GPUFOLD, "replay", "--log", str(tmp_path / "partial.sqlite"), "--partition", str(partition), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert prefix_state.returncode == 0, prefix_state.stderr
    from kafka_support import Record, refold

    prefix_records = {partition: [Record(partition, r.offset, r.key, r.value) for r in commands[: cut + 1]]}
    expected = refold(prefix_records, topics, PARTITIONS)
    assert json.loads(prefix_state.stdout)["partitions"][0]["state_hash"] == expected.hashes[partition]


def test_gpufold_serve_on_kafka(kafka_bootstrap: str) -> None:
    """`gpufold serve --bootstrap` wires the Kafka replica and writer: submit with ?wait, then list the pod."""
    import signal
    import socket

    import httpx

    topics = new_topics(kafka_bootstrap, "serve", PARTITIONS)
    prefix = topics.commands.rsplit(".", 1)[0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if k != "GPUFOLD_DATABASE_URL"}  # no projection here
    server = subprocess.Popen(
        [*GPUFOLD, "serve", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--port", str(port),
         "--processor-group", topics.commands + ".group"],
        stderr=subprocess.PIPE, text=True, env=environ,
    )  # fmt: skip
    try:
        assert "Kafka" in server.stderr.readline()  # type: ignore[union-attr]
        with (
            BackgroundProcessor(kafka_bootstrap, topics, instance_id="serve"),
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=90) as client,
        ):
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/v1/replica").json()["ready"]:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "gpufold serve did not come up"
                time.sleep(0.2)
            node = {"node_id": "n1", "gpu_model": "T4", "gpu_count": 2, "cpu_milli": 8_000, "memory_mib": 16_384}
            assert client.post("/v1/clusters/lab/nodes?wait=60&create_cluster=true", json=node).json()["complete"]
            pod = client.post("/v1/clusters/lab/pods?wait=30", json={"pod_id": "p1", "num_gpu": 1, "gpu_milli": 500})
            assert pod.json()["outcomes"][0]["kind"] == "PodScheduled", pod.text
            deadline = time.monotonic() + 30
            while client.get("/v1/pods", params={"state": "running"}).json()["total"] != 1:
                assert time.monotonic() < deadline, "the replica did not see the pod"
                time.sleep(0.1)
            # Health reads the processor group's committed offsets: caught up, every partition listed.
            deadline = time.monotonic() + 30
            while True:
                status = client.get("/v1/status").json()
                partitions = status["fold"]["partitions"]
                if status["ok"] and partitions and all(p["lag_commands"] == 0 for p in partitions):
                    break
                assert time.monotonic() < deadline, (status["problems"], partitions)
                time.sleep(0.2)
            assert status["fold"]["where"] == f"Kafka group {topics.commands}.group"
            assert sum(p["committed"] for p in partitions) >= 2
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) in (0, -signal.SIGTERM)
