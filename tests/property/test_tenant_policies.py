"""Issue #24's properties over random streams of quotas (every value of every ``SetQuota.preemption`` policy),
cohorts, pods and gangs that may or may not be preemptible, elastic gangs (``disruption`` all or above_min),
releases, failures and time:

(b) no victim violates ``preemptible`` or the policy of the preemptor's tenant (``reclaim_within_cohort``,
``within_tenant``, ``borrow_within_cohort`` with its ceiling), and priority preemption takes only lower
priorities; Kueue's rule holds: a borrower's victims borrow, unless the borrower's ``borrow_within_cohort``
says otherwise;
(d) every command ends, with no halted cluster (a fold that raised would halt it).

Kueue's rule itself (a borrower's victims borrow) is checked where it is decided, by
``test_fold_properties``; hypothesis ``target`` steers the streams toward victims of every reason.

(a), no tenant over nominal + borrowable, is checked on the same streams by ``test_fold_properties``'s
invariants (the sharing streams draw these policies too); (c), minimality against an exhaustive search, is
checked there for priority preemption; the quota policies plan greedily with Kueue's fill-back (README), and
``test_policy_victims_minimal`` checks their victims are minimal by inclusion.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings, target
from hypothesis import strategies as st

from processor.core import quotas
from processor.core.fold import decide
from processor.core.state import ClusterState, PartitionState
from schemas.commands import (
    BORROW_LOWER,
    RECLAIM_LOWER,
    RECLAIM_NEVER,
    WITHIN_LOWER_OR_NEWER,
    WITHIN_NEVER,
    AddNode,
    Command,
    CommandPayload,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    RecoverNode,
    Release,
    ReleaseGang,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
)
from schemas.events import GangQueued, GangScheduled, PodPreempted, PodScheduled, PodSpec
from tests.property.test_fold_properties import check_no_overcommit
from tests.strategies import quota_preemptions, sharing_streams

TENANTS = ("t1", "t2", "t3")
PODS = tuple(f"p{i}" for i in range(12))
GANGS = ("g0", "g1")


@st.composite
def policy_streams(draw: st.DrawFn) -> list[Command]:
    """A small full cluster shared by three tenants of one cohort, each with a policy drawn from every value, and
    pods and gangs (elastic or not, preemptible or not) of several priorities coming and going: victims of every
    reason."""
    bodies: list[CommandPayload] = [SetPolicy("first-fit", -1)]
    for i in range(draw(st.integers(2, 4))):
        bodies.append(AddNode(f"n{i}", 32_000, 65_536, "A100", 4))
    for tenant in TENANTS:
        bodies.append(
            SetQuota(
                tenant,
                cohort=draw(st.sampled_from(("lab", "lab", "lab", None))),
                nominal_gpus={"A100": draw(st.sampled_from((0, 2, 4, 4, 6)))},
                preemption=draw(quota_preemptions()),
            )
        )
    pods = st.builds(
        SubmitPod,
        st.sampled_from(PODS),
        st.sampled_from(TENANTS),
        st.integers(0, 5),
        st.integers(1, 4),
        st.just(1000),
        st.just(1000),
        st.just(1024),
        preemptible=st.sampled_from((True, True, True, False)),
    )
    gang_sizes = st.sampled_from(((1, 1000), (2, 1000)))
    gang = st.builds(
        lambda gang_id, tenant, priority, sizes, min_members, preemptible, disruption, roles: SubmitGang(
            gang_id,
            tenant,
            priority,
            tuple(
                GangMember(f"{gang_id}-{i}", n, m, 1000, 1024, role=("worker" if i % 2 else "ps") if roles else None)
                for i, (n, m) in enumerate(sizes)
            ),
            min_members=min_members if min_members is None or min_members <= len(sizes) else None,
            preemptible=preemptible,
            disruption=disruption,
            min_members_per_role={"ps": 1} if roles and min_members == 1 else ({"worker": 1} if roles else {}),
        ),
        st.sampled_from(GANGS),
        st.sampled_from(TENANTS),
        st.integers(0, 5),
        st.lists(gang_sizes, min_size=2, max_size=4),
        st.sampled_from((None, 1, 2)),
        st.booleans(),
        st.sampled_from(("all", "above_min")),
        st.booleans(),
    )
    policies = quota_preemptions()
    payloads = st.one_of(
        pods,
        pods,
        pods,
        gang,
        st.builds(Release, st.sampled_from((*PODS, "g0-0", "g1-1"))),
        st.builds(ReleaseGang, st.sampled_from(GANGS)),
        st.builds(MarkNodeFailed, st.sampled_from(("n0", "n1"))),
        st.builds(DrainNode, st.sampled_from(("n0", "n1"))),
        st.builds(UncordonNode, st.sampled_from(("n0", "n1"))),
        st.builds(RecoverNode, st.sampled_from(("n0", "n1"))),
        st.builds(SetQuota, st.sampled_from(TENANTS), st.just("lab"), st.just({"A100": 4}), preemption=policies),
        st.just(Tick()),
    )
    bodies += draw(st.lists(payloads, min_size=15, max_size=45))
    return [Command(f"cmd-{i}", "c0", 1000 * (i + 1), payload, "hypothesis") for i, payload in enumerate(bodies)]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_victim(cluster: ClusterState, victim: PodSpec, by: PodSpec, reason: str) -> None:
    assert victim.preemptible, f"{victim.pod_id} is not preemptible but was preempted ({reason}) by {by.pod_id}"
    quota = quotas.quota_of(cluster, by.tenant)
    policy = quota.policy if quota is not None else None
    if reason == "reclaim":
        assert policy is not None and policy.reclaim_within_cohort != RECLAIM_NEVER
        assert victim.tenant != by.tenant
        if policy.reclaim_within_cohort == RECLAIM_LOWER:
            assert victim.priority < by.priority
    elif reason == "within_tenant":
        assert policy is not None and policy.within_tenant != WITHIN_NEVER
        assert victim.tenant == by.tenant
        newer = policy.within_tenant == WITHIN_LOWER_OR_NEWER
        assert victim.priority < by.priority or (
            newer and victim.priority == by.priority and victim.arrival > by.arrival
        )
    elif reason == "borrow_within_cohort":
        assert policy is not None and policy.borrow_within_cohort == BORROW_LOWER
        assert victim.tenant != by.tenant and victim.priority < by.priority
        ceiling = policy.borrow_max_victim_priority
        assert ceiling is None or victim.priority <= ceiling
    else:
        assert reason == "priority", reason
        assert victim.priority < by.priority


def check_running_gangs_keep_their_minimums(cluster: ClusterState, shrunk: set[str], seen: dict[str, int]) -> None:
    """A running gang has at least ``min_members`` and each role's ``min_members_per_role`` members running
    (preemption, drain and failure take a member alone only above them), unless one of its members was released
    on its own since it started."""
    for gang_id, gang in cluster.gangs.items():
        if gang.state != "running" or gang_id in shrunk:
            continue
        running = [cluster.pods[pod_id].spec for pod_id in gang.placed if cluster.pods[pod_id].running]
        assert len(running) >= gang.spec.min_members, f"gang {gang_id} runs {len(running)} < min_members"
        for role, minimum in gang.spec.min_members_per_role.items():
            have = sum(1 for spec in running if spec.role == role)
            assert have >= minimum, f"gang {gang_id} runs {have} < {minimum} of role {role!r}"
            seen["role checked"] = seen.get("role checked", 0) + 1


@SETTINGS
@given(commands=st.one_of(policy_streams(), sharing_streams(max_size=45)))
def test_no_victim_violates_preemptible_or_its_preemptors_policy_and_every_command_ends(commands: list) -> None:
    state = PartitionState()
    specs: dict[str, PodSpec] = {}
    seen: dict[str, int] = {}
    shrunk: set[str] = set()  # gangs a Release of one member may have left below their minimums, until they restart
    for offset, command in enumerate(commands):
        before = {
            pod_id: pod.spec
            for cluster in state.clusters.values()
            for pod_id, pod in cluster.pods.items()
            if pod.running
        }
        events = decide(state, command, offset)
        assert events, "every command yields at least one event"
        assert not any(event.type_name == "ClusterHalted" for event in events), events[-1]
        preemptors: dict[str, PodSpec] = {}
        started: set[str] = set()  # pods that started in this command: a later step may take them again
        for event in events:
            payload = event.payload
            if isinstance(payload, PodScheduled):
                specs[payload.pod.pod_id] = payload.pod
                started.add(payload.pod.pod_id)
                preemptors[payload.pod.pod_id] = payload.pod
            elif isinstance(payload, GangScheduled):
                gang = payload.gang
                preemptors[gang.gang_id] = gang.members[0]  # tenant, priority, arrival and flag are the gang's
        cluster = state.clusters.get(command.cluster)
        requeued = {event.payload.gang_id for event in events if isinstance(event.payload, GangQueued)}
        for event in events:
            payload = event.payload
            if isinstance(payload, PodPreempted):
                victim = before.get(payload.pod_id)
                if victim is None:  # queued before, started earlier in this command (a queue retry), then taken
                    assert payload.pod_id in started, f"{payload.pod_id} preempted but not running"
                    victim = specs[payload.pod_id]
                by = preemptors[payload.by]
                assert cluster is not None
                _check_victim(cluster, victim, by, payload.reason)
                seen[payload.reason] = seen.get(payload.reason, 0) + 1
                gang = cluster.gangs.get(victim.gang_id) if victim.gang_id is not None else None
                if gang is not None and gang.state == "running" and gang.gang_id not in requeued:
                    # Taken alone (disruption above_min): it waits as a member, and its gang runs on.
                    assert gang.spec.disruption == "above_min", f"{victim.pod_id} taken without its gang"
                    assert len(gang.placed) >= gang.spec.min_members, f"gang {gang.gang_id} below min_members"
                    seen["member alone"] = seen.get("member alone", 0) + 1
        if cluster is None:
            continue
        check_no_overcommit(cluster)
        for event in events:
            if isinstance(event.payload, GangScheduled):
                shrunk.discard(event.payload.gang.gang_id)
        if isinstance(command.payload, Release) and command.payload.pod_id in cluster.member_of:
            shrunk.add(cluster.member_of[command.payload.pod_id])
        check_running_gangs_keep_their_minimums(cluster, shrunk, seen)
    for reason, count in sorted(seen.items()):
        note(f"victims by {reason}: {count}")
        target(float(count), label=f"victims by {reason}")
