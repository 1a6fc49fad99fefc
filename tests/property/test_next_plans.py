"""A gang's next member may skip the preemption search: ``preemption.NextPlans`` answers as the search would.

``gang_preemption`` places a gang's members one by one, each by the preemption search, evicting on trial. When a
member's victims are pods of no gang on the node it takes, that node alone changed before the next member of the
same shape; ``NextPlans`` then answers from the search's merged stream of nodes kept (the filed runs and the
pending buckets, least bound first), the nodes taken asked again. Here, after every third command of random
mixed streams, chains of such members are placed on trial for probe shapes and priorities, and at every step an
answer of ``NextPlans`` is the node-by-node search's answer (``preemption._plan_pod_exact``); where it answers
None, the index's search is run (and must agree too) and a new one made, as ``gang_preemption`` does.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core import preemption
from processor.core.decision import cluster_policy
from processor.core.fold import decide
from processor.core.gang_preemption import changes_its_node_alone
from processor.core.policies.base import Choice
from processor.core.preemption_plans import ANY_VICTIM, PodPlan, Trial
from processor.core.resources import PodShape
from processor.core.state import ClusterState, PartitionState
from schemas.events import PodSpec
from tests.adversarial import ATTACK, SeededChooser, gang_preempts, gang_preempts_spread, mixed_stream

PROBES = (
    PodShape(1, 1000, 1000, 1024, (), (), (), None, 0),
    PodShape(1, 500, 1000, 1024, (), (), (), None, 0),
    PodShape(2, 1000, 1000, 1024, (), (), (), None, 0),
    PodShape(0, 0, 8000, 1024, (), (), (), None, 0),
)
PRIORITIES = (5, 11)
CHAIN = 12  # members placed on trial per probe, at most


def _plan(plan: PodPlan | None) -> tuple[str, tuple[str, ...], tuple[int, int, int]] | None:
    return None if plan is None else (plan.node_id, tuple(pod.spec.pod_id for pod in plan.victims), plan.cost)


def _member(shape: PodShape, priority: int, number: int) -> PodSpec:
    return PodSpec(
        f"probe-{number}", "probe", priority, shape.num_gpu, shape.gpu_milli, shape.cpu_milli, shape.memory_mib,
        (), {}, (), 0, 10**9 + number,
    )  # fmt: skip


def _chain(cluster: ClusterState, shape: PodShape, priority: int, now: int, members: int = CHAIN) -> tuple[int, int]:
    """Members of the shape placed on trial one by one as ``gang_preemption`` does; (searches, answers kept)."""
    trial = Trial(cluster)
    policy = cluster_policy(cluster)
    searches = answers = 0
    plans: preemption.NextPlans | None = None
    try:
        for number in range(members):
            exact = preemption._plan_pod_exact(cluster, shape, priority, now, ANY_VICTIM)
            plan = plans.next(cluster) if plans is not None else None
            if plan is None:
                searches += 1
                plan = preemption.plan_pod(cluster, shape, priority, now, None, ANY_VICTIM)
                plans = None
                if plan is not None and changes_its_node_alone(plan, ANY_VICTIM):
                    plans = preemption.NextPlans(cluster, shape, priority, now, plan)
            else:
                answers += 1
                if not changes_its_node_alone(plan, ANY_VICTIM):
                    plans = None
            assert _plan(plan) == _plan(exact), (shape, priority, number, searches, answers)
            if plan is None:
                break
            node = cluster.nodes[plan.node_id]
            for unit in plan.units:
                for pod in unit.pods:
                    trial.evict(pod)
            trial.allocate(_member(shape, priority, number), Choice(node.node_id, policy.choose_gpus(node, shape), {}))
    finally:
        trial.rollback()
    return searches, answers


def _check_stream(seed: int, nodes: int) -> tuple[int, int]:
    """Chains after every third command of a mixed stream; (searches, answers kept)."""
    commands = mixed_stream(SeededChooser(seed), 120, nodes)
    state = PartitionState()
    searches = answers = 0
    for offset, command in enumerate(commands):
        decide(state, command, offset)
        if offset % 3:
            continue
        for cluster in state.clusters.values():
            if cluster.halted is not None:
                continue
            for shape in PROBES:
                for priority in PRIORITIES:
                    searched, answered = _chain(cluster, shape, priority, state.clock)
                    searches, answers = searches + searched, answers + answered
    return searches, answers


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.sampled_from((2, 4, 6)))
def test_next_plans_answer_as_the_node_by_node_search(seed: int, nodes: int) -> None:
    _check_stream(seed, nodes)  # a stream may run no preemptible work the probes can take: then nothing is checked


def test_the_chains_check_answers() -> None:
    """The streams above do meet what they check: on this seed, hundreds of answers kept."""
    searches, answers = _check_stream(0, 4)
    assert answers > 100 and searches > 50


def _attacked(commands: list) -> ClusterState:
    attack = next(i for i, command in enumerate(commands) if command.command_id.startswith(ATTACK))
    state = PartitionState()
    for offset, command in enumerate(commands[:attack]):
        decide(state, command, offset)
    (cluster,) = state.clusters.values()
    return cluster


def test_a_gang_whose_members_take_one_node_s_cheapest_victims_searches_once() -> None:
    """One node runs the cluster's newest (cheapest) pods; a gang's members take them one after the other."""
    cluster = _attacked(gang_preempts(20, 40, pods=200))
    searches, answers = _chain(cluster, PodShape(1, 1000, 1000, 1024, (), (), (), None, 0), 10, cluster.clock, 20)
    assert (searches, answers) == (1, 19)


def test_a_gang_whose_members_each_take_another_node_s_victim_searches_once() -> None:
    """Each node's newest pod is the next cheapest victim: a gang's members take them node after node, from the
    filed runs and then the pending buckets, with no search, refresh or filing between."""
    cluster = _attacked(gang_preempts_spread(40, 40, pods=400))
    searches, answers = _chain(cluster, PodShape(1, 1000, 1000, 1024, (), (), (), None, 0), 10, cluster.clock, 30)
    assert (searches, answers) == (1, 29)
