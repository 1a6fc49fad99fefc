"""Health that means something: /healthz is 503 with the reason when the fold is dead, behind, or a cluster is
halted; /v1/status gives the lag per partition in commands and seconds; neither waits on a lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from gpufold.server.app import create_app
from gpufold.server.cli import _embedded_positions
from gpufold.server.embedded_processor import EmbeddedProcessor
from gpufold.server.health import HealthMonitor, LagClock, Probes
from gpufold.server.writers import EmbeddedWriter
from logs.embedded_replica import EmbeddedReplicaSource
from processor.core.state import Halt
from processor.runtime.replica import Replica
from tests.unit.gpufold.server.test_app import NODES, line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lag_clock_counts_from_the_oldest_command_not_processed() -> None:
    """Lag in seconds is how long ago the first record beyond the position reached the log."""
    lag = LagClock()
    assert lag.observe(0.0, head=5, position=5) == 0.0
    assert lag.observe(1.0, head=7, position=5) == 0.0  # seen now
    assert lag.observe(3.0, head=9, position=5) == 2.0  # records 5-6 arrived by t=1
    assert lag.observe(4.0, head=9, position=7) == 1.0  # 7-8 arrived by t=3
    assert lag.observe(5.0, head=9, position=9) == 0.0
    assert lag.observe(6.0, head=9, position=9) == 0.0


class Served:
    """A server over the embedded log with its processor thread, a health monitor on a fake clock."""

    def __init__(self, path: Path) -> None:
        self.writer = EmbeddedWriter(path)
        self.processor = EmbeddedProcessor(path, poll=0.02).start()
        self.replica = Replica(EmbeddedReplicaSource(path)).start()
        assert self.replica.restored.wait(30)
        self.clock = Clock()
        probes = Probes(
            replica=self.replica, fold_thread=self.processor, fold_positions=_embedded_positions(path),
            fold_where="in this process",
        )  # fmt: skip
        self.health = HealthMonitor(probes, max_lag_seconds=5, clock=self.clock)
        self.client = TestClient(create_app(replica=self.replica, writer=self.writer, health=self.health))

    def check(self) -> dict:  # type: ignore[type-arg]
        self.replica.catch_up()
        return self.health.check()

    def close(self) -> None:
        self.processor.stop()
        self.replica.stop()
        self.writer.close()


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[Served]:
    running = Served(tmp_path / "log.sqlite")
    yield running
    running.close()


def test_healthz_is_200_when_everything_is_caught_up(served: Served) -> None:
    assert served.client.post("/v1/commands?wait=10&create_cluster=true", json=NODES).status_code == 200
    report = served.check()
    assert report["ok"], report["problems"]
    response = served.client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"ok": True, "problems": []}
    status = served.client.get("/v1/status").json()
    (fold,) = status["fold"]["partitions"]
    assert fold["lag_commands"] == 0 and fold["head"] == fold["committed"] == 2
    assert status["fold"]["where"] == "in this process" and status["fold"]["alive"] is True
    assert status["replica"]["partitions"][0]["lag_seconds"] == 0.0


def test_a_stopped_fold_shows_as_lag_then_503(served: Served) -> None:
    """With the processor stopped, commands wait: the lag grows in commands and seconds, and once it passes
    max_lag_seconds /healthz is 503 naming the partition; writes say so too."""
    served.client.post("/v1/commands?wait=10&create_cluster=true", json=NODES)
    served.processor.stop()
    served.check()
    served.client.post("/v1/commands", json=[line(f"t{i}", {"Tick": {}}) for i in range(3)])
    served.check()
    served.clock.now += 3
    report = served.check()
    (fold,) = report["fold"]["partitions"]
    assert fold["lag_commands"] == 3 and fold["lag_seconds"] == 3.0
    assert report["fold"]["alive"] is False and not report["ok"]
    assert "the fold's thread is not running" in report["problems"]
    served.clock.now += 3
    report = served.check()
    assert any("the fold is 6 s behind on partition 0: 3 command(s) not folded" in p for p in report["problems"])
    response = served.client.get("/healthz")
    assert response.status_code == 503 and response.json()["ok"] is False
    written = served.client.post("/v1/commands", json=line("t9", {"Tick": {}})).json()
    assert written["warning"].startswith("accepted into the log, but:")


def test_a_dead_fold_and_a_halted_cluster_are_503_with_why(served: Served) -> None:
    """A processor whose thread died with an error, and a cluster whose fold halted (ClusterHalted), each make
    /healthz 503 and say which; /metrics shows the halted cluster."""
    served.client.post("/v1/commands?wait=10&create_cluster=true", json=NODES)
    served.health.probes.fold_thread = SimpleNamespace(alive=False, error="InvariantViolation: boom")
    served.check()
    problems = served.client.get("/healthz").json()["problems"]
    assert problems == ["the fold stopped: InvariantViolation: boom"]
    served.health.probes.fold_thread = served.processor
    (lab,) = [s.clusters["lab"] for s in served.replica.states.values() if "lab" in s.clusters]
    lab.halted = Halt(command_id="c-9", offset=7, error="RecursionError", refused=4)  # as the fold leaves it
    served.check()
    answer = served.client.get("/healthz")
    assert answer.status_code == 503
    assert answer.json()["problems"] == [
        "cluster 'lab' is halted: its fold raised on command 'c-9' (RecursionError); 4 of its commands refused "
        "since (CLUSTER_HALTED, kept in the log for a ResumeCluster); the other clusters go on"
    ]
    metrics = served.client.get("/metrics").text
    assert 'gpufold_cluster_halted{cluster="lab"} 1.0' in metrics
    assert 'gpufold_cluster_halted_refused_commands{cluster="lab"} 4.0' in metrics
    assert served.client.get("/v1/status").json()["halted"][0]["command_id"] == "c-9"


def test_wrong_partition_refusals_are_a_warning_not_a_503(served: Served) -> None:
    """Commands dead-lettered as WRONG_PARTITION show in /v1/status (a producer to fix), but the server is healthy."""
    served.client.post("/v1/commands?wait=10&create_cluster=true", json=NODES)
    served.replica.refused["WRONG_PARTITION"] = 2
    served.check()
    status = served.client.get("/v1/status").json()
    assert status["ok"] and status["replica"]["refused"] == {"WRONG_PARTITION": 2}
    assert status["warnings"][0].startswith("2 command(s) dead-lettered as WRONG_PARTITION")
    assert 'gpufold_commands_dead_lettered{code="WRONG_PARTITION"} 2.0' in served.client.get("/metrics").text
    assert served.client.get("/healthz").status_code == 200


def test_a_dead_replica_is_503(served: Served) -> None:
    served.replica.error = "ValueError: the log is damaged"
    report = served.check()
    assert report["problems"] == ["the replica stopped following the log: ValueError: the log is damaged"]


def test_healthz_never_waits_for_the_replica_lock(served: Served) -> None:
    """While the replica's lock is held (a long fold, a big listing), /healthz and /v1/status still answer."""
    served.client.post("/v1/commands?wait=10&create_cluster=true", json=NODES)
    served.check()
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with served.replica._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(5)
        started = time.monotonic()
        assert served.client.get("/healthz").status_code == 200
        assert served.client.get("/v1/status").status_code == 200
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        thread.join()


class Restoring:
    """A replica stand-in that is restoring until told it is ready."""

    halted: dict[str, dict[str, object]] = {}

    def __init__(self) -> None:
        self.ready = False

    def status(self) -> dict[str, object]:
        return {"offsets": {"0": 4}, "head": {"0": 4}, "ready": self.ready, "alive": True}


def test_a_503_is_sampled_again_when_the_sample_is_old_so_it_is_never_stale() -> None:
    """The CI failure this answers: serve's replica was ready, yet /healthz still said "restoring" from the last
    sample (taken a moment before). What memory holds (the replica's readiness) is read on every request; what a
    sample reads from I/O (here an extra probe, as a lag) is taken again on the request once the sample is older
    than a period if it was unhealthy, or older than STALE_SECONDS if it was healthy; a fresh one is served."""
    clock = Clock()
    replica = Restoring()
    io: list[str] = []
    health = HealthMonitor(Probes(replica=replica, extra=[lambda: list(io)]), clock=clock)
    assert health.check()["problems"] == ["the replica is restoring the state (not ready yet)"]
    replica.ready = True
    assert health.report()["ok"] and health.report()["problems"] == [], "memory is read now, sample or not"
    io.append("the projection database is unreachable")
    clock.now += 0.6
    assert health.report()["problems"] == io, "an old 503 is sampled again; here the old sample was a 503"
    io.clear()
    assert not health.report()["ok"], "a young 503 from I/O is served as sampled"
    clock.now += 0.6
    assert health.report()["ok"], "an old 503 is sampled again"
    io.append("the projection database is unreachable")
    clock.now += 1
    assert health.report()["ok"], "a young healthy sample is served as it is"
    clock.now += 1.5
    assert not health.report()["ok"], "an old healthy sample (the thread starved) is taken again"


def test_while_a_sample_waits_on_io_the_answer_reads_memory_now() -> None:
    """The second CI failure of the same README test: the sampling thread was inside a sample (waiting on the
    log's lock) when /healthz came, so the request could not take one and served "restoring" although the
    replica was ready. What memory holds (the replica, the threads, halted clusters) is read on the request;
    what the sample read from I/O (here a lag) is kept as sampled."""
    clock = Clock()
    replica = Restoring()
    lagging = ["the fold is 40 s behind on partition 0: 3 command(s) not folded"]
    health = HealthMonitor(Probes(replica=replica, extra=[lambda: lagging]), clock=clock)
    assert health.check()["problems"] == ["the replica is restoring the state (not ready yet)", *lagging]
    replica.ready = True
    clock.now += 0.6
    with health._checking:  # the sampler is busy (e.g. blocked on the log)
        assert health.report()["problems"] == lagging
        lagging.clear()  # the lag clears, but only a sample can tell
        assert not health.report()["ok"]
    assert health.report() == {**health.report(), "ok": True, "problems": []}  # free again: sampled anew
