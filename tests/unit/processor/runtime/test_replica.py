"""The live replica over the embedded log: restore, follow, what-if, explain, listings."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from gpufold.state_view import list_pods
from logs.embedded import EmbeddedLog
from logs.embedded_replica import EmbeddedReplicaSource
from processor.core.snapshot import state_hash
from processor.runtime.loop import Processor
from processor.runtime.replica import Replica
from schemas import COMMAND, registry
from schemas.commands import AddNode, Command, DrainNode, GangMember, Release, Retry, SetPolicy, SubmitGang, SubmitPod
from schemas.fastcodec import encode_event
from tests import workload

T0 = 1_767_225_600_000


def cmd(command_id: str, payload: object, cluster: str = "lab", t: int = 0) -> Command:
    return Command(command_id, cluster, T0 + t, payload)  # type: ignore[arg-type]


def append(log: EmbeddedLog, commands: list[Command]) -> list[tuple[int, int]]:
    encode = registry().codec(COMMAND).encode
    return log.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in commands)


@pytest.fixture()
def log(tmp_path: Path) -> EmbeddedLog:
    with EmbeddedLog(tmp_path / "log.sqlite", partitions=2) as handle:
        yield handle


def lab() -> list[Command]:
    return [
        cmd("c0", SetPolicy("best-fit")),
        cmd("c1", AddNode("a100-1", 96_000, 786_432, "A100", 8)),
        cmd("c2", AddNode("t4-1", 32_000, 131_072, "T4", 2, {"zone": "z1"})),
        cmd("c3", SubmitPod("train-1", "research", 0, 8, 1000, 64_000, 524_288, ("A100",))),
        cmd("c4", SubmitPod("nb-1", "alice", 0, 1, 250, 2_000, 8_192)),
        cmd("c5", SubmitPod("h100-job", "research", 0, 2, 1000, 8_000, 16_384, ("H100",))),  # rejected: unknown model
        cmd("c6", SubmitPod("train-2", "research", 0, 4, 1000, 32_000, 65_536, ("A100",))),  # queued: A100 full
    ]


def replica_of(log: EmbeddedLog) -> Replica:
    replica = Replica(EmbeddedReplicaSource(log.path))
    replica.restore()
    return replica


def test_replica_follows_the_log_beyond_the_processor(log: EmbeddedLog) -> None:
    """The replica folds every appended command, committed by the processor or not, to the same state."""
    append(log, lab()[:4])
    Processor(log, snapshot_every=2).run_until_idle()
    append(log, lab()[4:])
    replica = replica_of(log)
    assert replica.position()["lag"] == 0
    pods = replica.pods(cluster="lab")
    assert [(p["pod_id"], p["state"]) for p in pods["pods"]] == [
        ("nb-1", "running"),
        ("train-1", "running"),
        ("train-2", "pending"),
    ]
    Processor(log).run_until_idle()
    committed = {p: Processor(log).folder(p).state for p in range(log.partitions)}
    assert replica.state_hashes() == {p: state_hash(s) for p, s in committed.items()}


def test_the_cli_and_the_api_list_pods_in_one_shape(log: EmbeddedLog) -> None:
    """`gpufold state pods` and /v1/pods give the same fields and values for a pod (status: running | pending);
    the API also keeps its old ``state`` field, equal to ``status``, and the live reasons of a pending pod."""
    append(log, lab())
    Processor(log).run_until_idle()
    cli = list_pods({p: Processor(log).folder(p).state for p in range(log.partitions)}, "lab")
    api = replica_of(log).pods(cluster="lab")["pods"]
    assert {p["status"] for p in cli} == {"running", "pending"}
    for cli_row, api_row in zip(cli, api, strict=True):
        assert api_row["state"] == api_row["status"]
        extra = {"state", "reasons"} if api_row["status"] == "pending" else {"state"}
        assert {k: v for k, v in api_row.items() if k not in extra} == cli_row


def test_what_if_events_equal_the_published_ones_byte_for_byte(log: EmbeddedLog) -> None:
    """A what-if at the head gives exactly the event frames the processor publishes for the same commands."""
    append(log, lab())
    Processor(log, snapshot_every=3).run_until_idle()
    replica = replica_of(log)
    before = replica.state_hashes()
    asked = [
        cmd("w1", Release("train-1"), t=100),  # frees the A100 node: train-2 is placed from the queue
        cmd("w2", SubmitPod("nb-2", "bob", 0, 1, 500, 1_000, 1_024), t=101),
        cmd("w3", DrainNode("t4-1"), t=102),
        cmd("w4", Release("never"), t=103),  # rejected
    ]
    answer = replica.what_if(asked, hashes=True)
    assert replica.state_hashes() == before, "the what-if changed the live state"
    placed = append(log, asked)
    assert [(r.partition, r.offset) for r in answer.results] == placed
    Processor(log).run_until_idle()
    published = {}
    for partition in range(log.partitions):
        for record in log.read(log.topics.events, partition):
            published.setdefault(partition, []).append(bytes(record.value))
    wanted = [encode_event(e) for r in answer.results for e in r.events]
    partition = answer.results[0].partition
    assert published[partition][-len(wanted) :] == wanted
    kinds = [type(e.payload).__name__ for e in answer.results[0].events]
    assert kinds == ["PodReleased", "PodScheduled"]
    replica.catch_up()
    assert replica.state_hashes()[partition] == answer.state_hashes[partition]


def test_explain_is_recomputed_on_the_state_now(log: EmbeddedLog) -> None:
    """A queued pod's reasons follow capacity changes: the stored ones are frozen, explain is not."""
    append(
        log,
        [
            cmd("n1", AddNode("v100-1", 64_000, 262_144, "V100", 4)),
            cmd("n2", AddNode("a100-1", 64_000, 262_144, "A100", 1)),
            cmd("p1", SubmitPod("fill", "t", 0, 1, 1000, 1_000, 1_024, ("A100",))),
            cmd("p2", SubmitPod("queued", "t", 0, 2, 1000, 1_000, 1_024, ("A100",))),
        ],
    )
    replica = replica_of(log)
    first = replica.explain("lab", "queued")
    assert first is not None and first.state == "pending"
    assert [(r["code"], r["nodes"]) for r in first.reasons] == [("GPU_MODEL_MISMATCH", 1), ("INSUFFICIENT_GPU", 1)]
    assert "another GPU model" in first.reasons[0]["message"]
    # Every A100 node has 1 GPU: no node could ever hold 2, so no "free 2 GPUs on a100-1".
    assert first.nearest is None
    assert first.message == "waiting for 2 whole GPUs: no node of model A100 has 2 GPUs (the largest has 1)"
    assert not any(r["change"] == "free_capacity" for r in first.would_fit_if)
    hog = SubmitPod("hog", "t", 10, 3, 1000, 1_000, 1_024, ("A100",))  # higher priority: placed first
    append(log, [cmd("p3", hog), cmd("n3", AddNode("a100-2", 64_000, 262_144, "A100", 4))])
    replica.catch_up()
    now = replica.explain("lab", "queued")
    assert now is not None
    assert [(r["code"], r["nodes"]) for r in now.reasons] == [("INSUFFICIENT_GPU", 2), ("GPU_MODEL_MISMATCH", 1)]
    assert now.nearest is not None and now.nearest.node_id == "a100-2"
    assert now.nearest.message == "node a100-2 lacks 1 whole free GPU(s)"
    assert "nearest miss: node a100-2 lacks 1 whole free GPU(s)" in now.message
    assert any(r["change"] == "add_node" for r in now.would_fit_if)
    running = replica.explain("lab", "fill")
    assert running is not None and running.state == "running" and running.node_id == "a100-1"
    assert replica.explain("lab", "nope") is None


def test_nearest_miss_names_the_missing_share(log: EmbeddedLog) -> None:
    """For a share, the nearest miss says how many GPU milli the closest GPU lacks."""
    append(
        log,
        [
            cmd("n1", AddNode("n17", 64_000, 262_144, "A100", 1)),
            cmd("p1", SubmitPod("a", "t", 0, 1, 750, 1_000, 1_024)),
            cmd("p2", SubmitPod("b", "t", 0, 1, 500, 1_000, 1_024)),
        ],
    )
    replica = replica_of(log)
    explained = replica.explain("lab", "b")
    assert explained is not None and explained.nearest is not None
    assert explained.nearest.message == "node n17 lacks 250 GPU milli"
    assert explained.reasons[0]["code"] == "INSUFFICIENT_GPU_SHARE"


def test_listings_match_a_scan_of_the_state(log: EmbeddedLog) -> None:
    """Every filter combination of the pod listing equals a brute-force scan of the fold state."""
    append(log, list(workload.commands(3_000, nodes=30)))
    replica = replica_of(log)
    cluster = replica._cluster("c1")
    assert cluster is not None
    pods = cluster.pods
    for state in (None, "running", "pending"):
        for tenant in (None, "acme"):
            for node_id in (None, "node-0003"):
                want = sorted(
                    pid
                    for pid, p in pods.items()
                    if (state is None or (p.running == (state == "running")))
                    and (tenant is None or p.spec.tenant == tenant)
                    and (node_id is None or p.node_id == node_id)
                )
                got = replica.pods(state=state, cluster="c1", tenant=tenant, node_id=node_id, limit=1000)
                assert [p["pod_id"] for p in got["pods"]] == want[:1000]
                assert got["total"] == len(want)
    page = replica.pods(state="running", cluster="c1", offset=5, limit=3)
    every = replica.pods(state="running", cluster="c1", limit=1000)
    assert page["pods"] == every["pods"][5:8]
    nodes = replica.nodes(cluster="c1", limit=1000)
    assert nodes["total"] == len(cluster.nodes)
    node = next(n for n in nodes["nodes"] if n["node_id"] == "node-0003")
    assert sum(g["allocated_milli"] for g in node["gpus"]) == cluster.nodes["node-0003"].gpu_milli_allocated
    assert sum(len(g["pods"]) for g in node["gpus"]) == sum(
        len(pods[pid].gpus) for pid in cluster.nodes["node-0003"].pods
    )
    tenants = replica.tenants("c1")["tenants"]
    assert sum(t["gpu_milli"] for t in tenants) == cluster.gpu_milli_allocated
    assert replica.history("c1")["points"], "no history sampled"


def test_what_ifs_do_not_grow_memory(log: EmbeddedLog) -> None:
    """Hundreds of what-ifs on an fgd-plus cluster leave memory flat (forks are not kept by policy memos)."""
    append(log, list(workload.commands(800, nodes=30)))
    append(log, [cmd("fgd", SetPolicy("fgd-plus"), cluster="c1")])
    replica = replica_of(log)

    def ask(i: int) -> None:
        replica.what_if([cmd(f"w{i}", SubmitPod(f"w{i}", "t", 0, 1, 500, 500, 1_024), cluster="c1")])

    for i in range(20):
        ask(i)
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(20, 50):
            ask(i)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        for i in range(50, 170):
            ask(i)
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert second - first < 2_000_000, f"memory grew by {second - first} bytes over 120 what-ifs"


def test_pod_index_follows_gangs_timers_and_dependencies(log: EmbeddedLog) -> None:
    """After a stream with gangs, time limits, reservations and dependencies, listings equal a scan of the state."""
    from tests.unit.test_whatif_fork import CLUSTERS, stream

    append(log, stream(2, 400))
    replica = replica_of(log)
    for name in CLUSTERS:
        cluster = replica._cluster(name)
        assert cluster is not None
        for state in ("running", "pending"):
            want = sorted(pid for pid, p in cluster.pods.items() if p.running == (state == "running"))
            got = replica.pods(state=state, cluster=name, limit=1000)
            assert [p["pod_id"] for p in got["pods"]] == want, (name, state)


def test_history_has_a_point_per_change_bounded_and_from_the_first_event(log: EmbeddedLog) -> None:
    """A point per event time that changed the cluster (no 60 s steps), at most ``history_points`` (halved
    when full, the last kept), from the first event (never 1970); the last point is the state now."""
    from processor.runtime.replica import fragmentation_of

    commands = list(workload.commands(800, nodes=10))
    append(log, commands)
    full = Replica(EmbeddedReplicaSource(log.path), history_points=100_000)
    full.restore()
    times = [p["t"] for p in full.history("c1")["points"]]
    assert times == sorted(set(times)) and times[0] == min(c.issued_at for c in commands if c.cluster == "c1")
    assert len(times) > 500
    bounded = Replica(EmbeddedReplicaSource(log.path), history_points=50)
    bounded.restore()
    points = bounded.history("c1")["points"]
    assert 25 <= len(points) <= 51 and points[0]["t"] == times[0] and points[-1]["t"] == times[-1]
    cluster = bounded._cluster("c1")
    assert cluster is not None
    assert points[-1]["gpu_milli_allocated"] == cluster.gpu_milli_allocated
    assert points[-1]["fragmentation_pct"] == round(fragmentation_of(cluster), 3)


def test_jobs_waiting_for_their_retry_are_listed_after_the_queue_with_the_reason(log: EmbeddedLog) -> None:
    """A failed pod and a failed gang waiting for their retries are outside the queue: the queue listing shows
    them after the queued jobs, waiting, with WAITING_FOR_RETRY and the time their retry is due."""
    retry = Retry(max_retries=2, backoff_ms=60_000)
    members = (GangMember("g-0", num_gpu=2, gpu_milli=1000), GangMember("g-1", num_gpu=2, gpu_milli=1000))
    append(
        log,
        [
            cmd("r0", AddNode("a100-1", 96_000, 786_432, "A100", 8)),
            cmd("r1", SubmitPod("solo", "alice", 0, 1, 1000, 1000, 1024, retry=retry), t=1),
            cmd("r2", SubmitGang("g", "research", members=members, min_members=1, retry=retry), t=2),
            cmd("r3", Release("solo", "failed"), t=1_000),
            cmd("r4", Release("g-0", "failed"), t=2_000),
            cmd("r5", Release("g-1", "failed"), t=3_000),
        ],
    )
    replica = replica_of(log)
    jobs = {job["id"]: job for job in replica.queue("lab")["jobs"]}
    assert set(jobs) == {"solo", "g"}
    for job_id, due in (("solo", T0 + 61_000), ("g", T0 + 63_000)):
        (reason,) = jobs[job_id]["reasons"]
        assert jobs[job_id]["state"] == "waiting" and jobs[job_id]["position"] is None
        assert reason["code"] == "WAITING_FOR_RETRY" and f"retry 1 is due at event time {due} ms" in reason["message"]
