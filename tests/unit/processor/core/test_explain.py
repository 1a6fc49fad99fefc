"""Explain knows every reason the fold knows (quota, strict FIFO, reservation, dependency, gang) and never
proposes a remedy the state rules out."""

from __future__ import annotations

from typing import Any

from processor.core.explain import Explanation, explain
from schemas.codes import QueueReasonCode
from schemas.commands import AddNode, GangMember, Release, SetPolicy, SetQuota, SubmitGang, SubmitPod, Tick
from tests.strategies import Fold, types

MINUTE = 60_000


def explained(fold: Fold, job_id: str, now: int | None = None) -> Explanation:
    found = explain(fold.cluster, job_id, now)
    assert found is not None, job_id
    return found


def codes(found: Explanation) -> list[str]:
    return [r["code"] for r in found.reasons]


def changes(found: Explanation) -> list[str]:
    return [r["change"] for r in found.would_fit_if]


def gpu_cluster(nodes: int = 1, gpus: int = 4) -> Fold:
    fold = Fold()
    fold.run(SetPolicy("first-fit"))
    for i in range(nodes):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", gpus))
    return fold


def test_a_pod_held_by_its_quota_says_so_with_usage_and_limit() -> None:
    """Capacity is free, the quota is not: QUOTA_EXCEEDED with what the tenant runs and may run, no "add a
    node" and no "fits a node now"."""
    fold = gpu_cluster(gpus=4)
    fold.run(SetQuota("acme", nominal_gpus={"A100": 1}))
    fold.run(SubmitPod("a1", "acme", num_gpu=1, gpu_milli=1000))
    assert types(fold.run(SubmitPod("a2", "acme", num_gpu=1, gpu_milli=1000))) == ["PodQueued"]
    found = explained(fold, "a2")
    assert codes(found) == [QueueReasonCode.QUOTA_EXCEEDED]
    assert "runs 1 A100 GPU(s) of its quota of 1 A100 GPU(s)" in found.reasons[0]["message"]
    assert found.fits_now is False and found.message.startswith("held by its quota:")
    assert changes(found) == ["raise_quota"]


def test_a_pod_held_by_strict_fifo_names_the_job_ahead() -> None:
    """Under strict FIFO a small pod behind a big one waits although it fits: WAITING_FOR_EARLIER_JOB, the big
    one named, and no capacity remedy."""
    fold = gpu_cluster(gpus=4)
    fold.run(SetPolicy("first-fit", queue_order="strict-fifo"))
    fold.run(SubmitPod("busy", num_gpu=2, gpu_milli=1000))
    assert types(fold.run(SubmitPod("big", num_gpu=4, gpu_milli=1000))) == ["PodQueued"]
    assert types(fold.run(SubmitPod("small", num_gpu=1, gpu_milli=1000))) == ["PodQueued"]
    found = explained(fold, "small")
    assert codes(found)[0] == QueueReasonCode.WAITING_FOR_EARLIER_JOB and "pod 'big'" in found.reasons[0]["message"]
    assert found.fits_now is False and found.message.startswith("held by strict FIFO")
    assert changes(found) == ["queue_order"]
    head = explained(fold, "big")
    assert QueueReasonCode.WAITING_FOR_EARLIER_JOB not in codes(head)
    assert head.nearest is not None and head.nearest.message == "node n0 lacks 2 whole free GPU(s)"


def reserved() -> Fold:
    """Two 8-GPU nodes nearly full of 1-GPU pods that end at minute 10; an 8-GPU pod waits from minute 1 and
    reserves n0 at minute 6."""
    fold = gpu_cluster(nodes=2, gpus=8)
    for i in range(15):
        fold.run(SubmitPod(f"s{i}", num_gpu=1, gpu_milli=1000, time_limit_ms=10 * MINUTE), at=0)
    fold.run(SubmitPod("big", num_gpu=8, gpu_milli=1000), at=MINUTE)
    fold.run(Tick(), at=7 * MINUTE)
    fold.run(SubmitPod("fill-n1", num_gpu=1, gpu_milli=1000), at=7 * MINUTE)
    fold.run(Release("s0"), at=7 * MINUTE)  # a GPU frees on the reserved n0
    assert types(fold.run(SubmitPod("waits", num_gpu=1, gpu_milli=1000), at=7 * MINUTE)) == ["PodQueued"]
    return fold


def test_a_reservation_names_its_holder_never_an_empty_miss() -> None:
    """A pod that fits only on reserved nodes says whose they are and until when (no "node n0 lacks " with
    nothing after it); the holder says it holds them, with its expected start."""
    fold = reserved()
    found = explained(fold, "waits", 7 * MINUTE)
    assert QueueReasonCode.NODE_RESERVED in codes(found)
    assert "reserved for pod 'big'" in found.message
    assert found.nearest is None or found.nearest.lacks
    assert "lacks " not in found.message or found.message.rstrip().split("lacks ")[1]
    assert found.reservation is not None and found.reservation["holder_id"] == "big"
    assert "time_limit" in changes(found)
    start = fold.cluster.reservation.expected_start
    holder = explained(fold, "big", 7 * MINUTE)
    assert holder.reservation is not None and holder.reservation["expected_start"] == start
    assert "holds a reservation of 1 node(s) (n0)" in holder.message
    assert f"in {(start - 7 * MINUTE) / 1000:g} s" in holder.message


def test_a_pod_waiting_for_its_dependency() -> None:
    fold = gpu_cluster()
    fold.run(SubmitPod("first", num_gpu=1, gpu_milli=1000))
    fold.run(SubmitPod("second", num_gpu=1, gpu_milli=1000, depends_on=("first",)))
    found = explained(fold, "second")
    assert found.state == "waiting" and codes(found) == [QueueReasonCode.WAITING_FOR_DEPENDENCY]
    assert "first" in found.message


def test_a_queued_gang_and_its_members_are_explained() -> None:
    """A gang that does not fit, asked by its id or by a member's: the gang, its members and why (a member that
    fits no node now, or all that do not fit at once); no longer "neither pending nor running"."""
    fold = gpu_cluster(nodes=2, gpus=4)
    fold.run(SubmitPod("busy", num_gpu=2, gpu_milli=1000))
    members = (GangMember("w0", 4, 1000), GangMember("w1", 4, 1000), GangMember("w2", 4, 1000))
    assert types(fold.run(SubmitGang("train", members=members)))[0] == "GangQueued"
    for job in ("train", "w2"):
        found = explained(fold, job)
        assert found.kind == "gang" and found.state == "pending"
        assert found.gang is not None and [m["pod_id"] for m in found.gang["members"]] == ["w0", "w1", "w2"]
        assert codes(found)[0] == QueueReasonCode.GANG_DOES_NOT_FIT
        assert "not all 3 at once" in found.message
    fold.run(Release("busy"))
    assert explained(fold, "train").message.startswith("gang 'train' is queued")
    fold.run(AddNode("n2", 64_000, 262_144, "A100", 4))
    running = explained(fold, "w0")
    assert running.state == "running" and running.gang is not None and running.gang["state"] == "running"


def test_no_impossible_remedy_for_a_pod_no_node_can_hold() -> None:
    """An 8-GPU pod on 1-GPU nodes: "no node of model A100 has 8 GPUs", no "free 8 GPUs on node X"."""
    fold = gpu_cluster(nodes=3, gpus=1)
    fold.run(SubmitPod("wide", num_gpu=8, gpu_milli=1000, gpu_models=("A100",)))
    found = explained(fold, "wide")
    assert found.nearest is None and "free_capacity" not in changes(found)
    assert found.message == "waiting for 8 whole GPUs: no node of model A100 has 8 GPUs (the largest has 1)"
    (add,) = [r for r in found.would_fit_if if r["change"] == "add_node"]
    assert "8 whole GPUs" in add["message"]


def test_the_json_shape() -> None:
    fold = gpu_cluster()
    fold.run(SubmitPod("p", num_gpu=8, gpu_milli=1000))
    body: dict[str, Any] = explained(fold, "p").as_json()
    assert {"kind", "state", "reasons", "would_fit_if", "gang", "reservation", "nearest_miss"} <= set(body)
