"""Issue #24's properties over random streams with cohort trees (``SetCohort``, contract v4): cohorts with random
parents (cycles and trees too deep among them, refused), own quotas, borrowing and lending limits; tenants in
them with all ``SetQuota.preemption`` policies; pods and gangs of several priorities coming and going, failures
and time. After every command:

(a) no tenant runs more than its nominal plus what it may borrow, and no cohort tree holds more than its
tenants' and cohorts' nominal quotas in all; on every key, every cohort with a parent uses at most its subtree
quota plus its borrowing limit and every root at most its subtree quota; the pools the state keeps as pods start
and stop are those computed from scratch; the headroom the read side shows is what admission lets through; no
path of the tree is longer than 8 cohorts;
(d) every command ends, with no halted cluster.

Quotas and the tree are set before the work comes: lowering a quota or a cohort's under running work evicts
nothing (its new work waits), so the limits of (a) are checked from the first pod until a later ``SetCohort`` or
``RemoveCohort`` changes the tree (most are refused: cycles, parents, unknown cohorts); the pools are checked
against those computed from scratch after every command.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core import cohort_tree, quota_keys, quotas
from processor.core.fold import decide
from processor.core.state import ClusterState, PartitionState
from schemas.commands import (
    AddNode,
    Command,
    CommandPayload,
    GangMember,
    MarkNodeFailed,
    Release,
    ReleaseGang,
    RemoveCohort,
    SetCohort,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
)
from tests.strategies import quota_preemptions

COHORTS = ("root", "left", "right", "deep", "deeper")
TENANTS = ("t1", "t2", "t3", "t4")
PODS = tuple(f"p{i}" for i in range(14))
GANGS = ("g0", "g1")
MAYBE = st.sampled_from((None, None, 0, 1, 2, 4))


@st.composite
def cohort_streams(draw: st.DrawFn) -> list[Command]:
    bodies: list[CommandPayload] = [SetPolicy("first-fit", -1)]
    for i in range(draw(st.integers(2, 4))):
        bodies.append(AddNode(f"n{i}", 32_000, 65_536, draw(st.sampled_from(("A100", "A100", "H100"))), 4))
    for _ in range(draw(st.integers(1, 6))):
        cohort = draw(st.sampled_from(COHORTS))
        parent = draw(st.sampled_from((None, *COHORTS)))
        limited = parent is not None and parent != cohort
        bodies.append(
            SetCohort(
                cohort,
                parent,
                {draw(st.sampled_from(("A100", "*"))): draw(st.integers(0, 4))} if draw(st.booleans()) else {},
                borrowing_limit_gpus=draw(MAYBE) if limited else None,
                lending_limit_gpus=draw(MAYBE) if limited else None,
            )
        )
    for tenant in TENANTS:
        nominal = {"A100": draw(st.integers(0, 4))}
        if draw(st.booleans()):
            nominal["*"] = draw(st.integers(0, 2))
        cohort = draw(st.sampled_from((*COHORTS, None)))
        bodies.append(
            SetQuota(
                tenant,
                cohort=cohort,
                nominal_gpus=nominal,
                borrowing_limit_gpus=draw(MAYBE) if cohort is not None else None,
                lending_limit_gpus=draw(MAYBE) if cohort is not None else None,
                preemption=draw(quota_preemptions()),
            )
        )
    pods = st.builds(
        SubmitPod,
        st.sampled_from(PODS),
        st.sampled_from(TENANTS),
        st.integers(0, 4),
        st.integers(1, 3),
        st.just(1000),
        st.just(1000),
        st.just(1024),
        preemptible=st.sampled_from((True, True, True, False)),
    )
    gang = st.builds(
        lambda gang_id, tenant, priority, sizes, min_members: SubmitGang(
            gang_id,
            tenant,
            priority,
            tuple(GangMember(f"{gang_id}-{i}", n, 1000, 1000, 1024) for i, n in enumerate(sizes)),
            min_members=min_members,
        ),
        st.sampled_from(GANGS),
        st.sampled_from(TENANTS),
        st.integers(0, 4),
        st.lists(st.integers(1, 2), min_size=1, max_size=3),
        st.sampled_from((None, 1)),
    )
    payloads = st.one_of(
        pods,
        pods,
        pods,
        gang,
        st.builds(Release, st.sampled_from((*PODS, "g0-0", "g1-1"))),
        st.builds(ReleaseGang, st.sampled_from(GANGS)),
        st.builds(MarkNodeFailed, st.sampled_from(("n0", "n1"))),
        st.builds(SetCohort, st.sampled_from(COHORTS), st.sampled_from(COHORTS)),  # refused unless it changes nothing
        st.builds(RemoveCohort, st.sampled_from(COHORTS)),
        st.just(Tick()),
    )
    bodies += draw(st.lists(payloads, min_size=15, max_size=45))
    return [Command(f"cmd-{i}", "c0", 1000 * (i + 1), payload, "hypothesis") for i, payload in enumerate(bodies)]


def _check_limits(cluster: ClusterState) -> None:
    for (cohort, key), pool in sorted(cluster.pools.items()):
        spec = cluster.cohort_specs.get(cohort)
        if spec is None or spec.parent is None:
            assert pool.in_use <= pool.lent, f"root {cohort!r} uses {pool.in_use} of {pool.lent} on {key}"
        else:
            limit = cohort_tree.borrowing_limit(spec, key)
            if limit is not None:
                assert pool.in_use <= pool.lent + limit, f"{cohort!r} beyond its borrowing limit on {key}"
    for cohort, key in sorted(cluster.pools):  # the read side's headroom is exactly what admission lets through
        room = cohort_tree.headroom(cluster.cohort_specs, cluster.pools, cohort, key)
        assert cohort_tree.blocked(cluster.cohort_specs, cluster.pools, cohort, key, room) is None
        assert cohort_tree.blocked(cluster.cohort_specs, cluster.pools, cohort, key, room + 1) is not None
    nominal_of: dict[tuple[str, str], int] = {}  # (root, key) -> nominal quota of the tree's tenants and cohorts
    held_of: dict[tuple[str, str], int] = {}
    for tenant, quota in sorted(cluster.quotas.items()):
        for key in quota_keys.limited_keys(quota):
            used = quotas.used(cluster, tenant, quota, key)
            amount = quota_keys.nominal(quota, key) or 0
            limit = quota_keys.borrowing_limit(quota, key)
            if quota.cohort is None:
                assert used <= amount, f"{tenant} runs {used} > nominal {amount} on {key} without a cohort"
                continue
            if limit is not None:
                assert used <= amount + limit, f"{tenant} runs {used} > {amount} + {limit} on {key}"
            root = cohort_tree.root_of(cluster.cohort_specs, quota.cohort)
            nominal_of[(root, key)] = nominal_of.get((root, key), 0) + amount
            held_of[(root, key)] = held_of.get((root, key), 0) + used
    for name, spec in sorted(cluster.cohort_specs.items()):
        root = cohort_tree.root_of(cluster.cohort_specs, name)
        for key, amount in cohort_tree.own_nominal(spec).items():
            nominal_of[(root, key)] = nominal_of.get((root, key), 0) + amount
    for pair, held in sorted(held_of.items()):
        assert held <= nominal_of.get(pair, 0), f"tree {pair[0]!r} holds {held} > {nominal_of.get(pair)} on {pair[1]}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=cohort_streams())
def test_no_tenant_or_cohort_exceeds_what_the_tree_lends_and_every_command_ends(commands: list[Command]) -> None:
    state = PartitionState()
    work_started = changed = False
    for offset, command in enumerate(commands):
        payload = command.payload
        if isinstance(payload, SubmitPod | SubmitGang):
            work_started = True
        events = decide(state, command, offset)
        assert events, "every command yields at least one event"
        assert not any(event.type_name == "ClusterHalted" for event in events), events[-1]
        cluster = state.clusters.get(command.cluster)
        if cluster is None:
            continue
        for name in cluster.cohort_specs:
            assert len(cohort_tree.ancestors(cluster.cohort_specs, name)) <= 8
        fresh = cohort_tree.build_pools(cluster.cohort_specs, cluster.cohorts, cluster.quotas, cluster.usage)
        assert cluster.pools == fresh, "the pools kept as pods start and stop are those computed from scratch"
        if work_started and isinstance(payload, SetCohort | RemoveCohort):
            changed = changed or any(event.type_name == "CohortChanged" for event in events)
        if work_started and not changed:
            _check_limits(cluster)
