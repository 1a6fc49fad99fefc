"""The property suite's checkers hold the fold to its documented rules, no stricter: two streams a fuzzing run
found where a checker flagged correct behaviour, and the violations the same checkers must still catch."""

from __future__ import annotations

import dataclasses

import pytest

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, GangMember, SetQuota, SubmitGang, SubmitPod, UpdateNode
from schemas.events import Event, GangScheduled
from tests.property.test_fold_properties import (
    check_members_start_in_their_domain,
    check_no_priority_inversion,
    check_state,
)


def _fold(payloads: list) -> tuple[PartitionState, list[list[Event]]]:
    state = PartitionState()
    events = []
    for offset, payload in enumerate(payloads):
        command = Command(f"c{offset}", "c0", 1_000 * (offset + 1), payload)
        events.append(decide(state, command, offset))
        check_state(state, events[-1])
    return state, events


def _topology_gang() -> list:
    return [
        AddNode("n1", 16_000, 65_536, "A100", 4, {"rack": "r0"}),
        SubmitGang("g", "t", 1, tuple(GangMember(f"g-{i}", 2, 1000) for i in range(2)), topology_required="rack"),
    ]


def test_a_node_relabelled_under_a_running_topology_gang_breaks_no_check() -> None:
    """UpdateNode moves the gang's node to another rack; its running pods stay (README), the gang keeps its domain."""
    state, _ = _fold([*_topology_gang(), UpdateNode("n1", {"rack": "r1"})])
    cluster = state.clusters["c0"]
    assert cluster.gangs["g"].domain == "r0" and cluster.nodes["n1"].labels == {"rack": "r1"}
    assert all(cluster.pods[f"g-{i}"].node_id == "n1" for i in range(2))


def test_a_gang_started_outside_its_domain_is_still_caught() -> None:
    state, events = _fold(_topology_gang())
    started = next(event for event in events[1] if isinstance(event.payload, GangScheduled))
    wrong = dataclasses.replace(started, payload=dataclasses.replace(started.payload, domain="r9"))
    with pytest.raises(AssertionError, match="outside rack=r9"):
        check_members_start_in_their_domain(state.clusters["c0"], [wrong])


def _full_node_and_a_quota(borrowing_limit: int | None) -> list:
    """One 8-GPU V100 node full of a tenant's priority-0 pods (``t4``, no quota, so never borrowing); tenant
    ``t1`` has a quota of 1 A100 in cohort ``co``, where ``t2`` lends 16 GPUs of any model."""
    return [
        AddNode("n3", 64_000, 65_536, "V100", 8),
        SetQuota("t2", "co", {"*": 16}, borrowing_limit_gpus=0),
        *(SubmitPod(f"low-{i}", "t4", 0, 1, 1000, 1000, 1024) for i in range(8)),
        SetQuota("t1", "co", {"A100": 1}, borrowing_limit_gpus=borrowing_limit),
    ]


def test_a_borrower_waiting_rather_than_taking_work_inside_quota_is_no_inversion() -> None:
    """Kueue's rule: t1 would borrow to run on the V100 node, so it may not preempt t4's pods (not borrowing)."""
    state, events = _fold([*_full_node_and_a_quota(None), SubmitPod("hi", "t1", 6, 1, 1000, 1000, 1024)])
    assert [event.type_name for event in events[-1]] == ["PodQueued"]
    cluster = state.clusters["c0"]
    check_no_priority_inversion(cluster, cluster.clock)


def test_a_pod_that_could_preempt_and_waits_is_still_caught() -> None:
    """No quota in the way: the checker flags a queued high-priority pod beside lower-priority work it could take."""
    state, _ = _fold(
        [
            AddNode("n3", 64_000, 65_536, "V100", 8),
            *(SubmitPod(f"low-{i}", "t4", 0, 1, 1000, 1000, 1024) for i in range(8)),
            SubmitPod("hi", "t1", 6, 1, 1000, 1000, 1024, preemption="never"),
        ]
    )
    cluster = state.clusters["c0"]
    pod = cluster.pods["hi"]
    assert pod.queued
    pod.spec = dataclasses.replace(pod.spec, preemption="lower_priority")  # as if the fold had not tried
    with pytest.raises(AssertionError, match="could preempt on n3"):
        check_no_priority_inversion(cluster, cluster.clock)
