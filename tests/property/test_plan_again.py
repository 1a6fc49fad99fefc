"""A gang's next member may skip the preemption search: ``preemption.plan_again`` answers as the search would.

``gang_preemption`` places a gang's members one by one, each by the preemption search, evicting on trial. When a
member's victims are pods of no gang on the node it takes, that node alone changed before the next member of the
same shape is searched; ``plan_again`` then asks only that node, and answers if its plan costs less than a floor of
every other node's (``preemption.floor_without``). Here, after every command of random mixed streams, chains of
such members are placed on trial for probe shapes and priorities, and at every step

- the floor is at most the cost of every other node's own least plan (each node asked alone), and
- an answer of ``plan_again`` is the node-by-node search's answer (``preemption._plan_pod_exact``).
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
from tests.adversarial import ATTACK, SeededChooser, gang_preempts, mixed_stream

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


def _chain(cluster: ClusterState, shape: PodShape, priority: int, now: int) -> tuple[int, int]:
    """Members of the shape placed on trial one by one as ``gang_preemption`` does; (floors checked, answers)."""
    trial = Trial(cluster)
    policy = cluster_policy(cluster)
    floors = answers = 0
    try:
        plan = preemption.plan_pod(cluster, shape, priority, now, None, ANY_VICTIM)
        floor: tuple[int, int, int] | None = None
        for number in range(CHAIN):
            if plan is None or not changes_its_node_alone(plan, ANY_VICTIM):
                break
            node = cluster.nodes[plan.node_id]
            for unit in plan.units:
                for pod in unit.pods:
                    trial.evict(pod)
            trial.allocate(_member(shape, priority, number), Choice(node.node_id, policy.choose_gpus(node, shape), {}))
            exact = preemption._plan_pod_exact(cluster, shape, priority, now, ANY_VICTIM)
            again, floor = preemption.plan_again(cluster, shape, priority, now, node.node_id, floor)
            if floor is not None:
                floors += 1
                for other in sorted(cluster.nodes):
                    if other != node.node_id:
                        alone = preemption._plan_pod_exact(cluster, shape, priority, now, ANY_VICTIM, [other])
                        assert alone is None or alone.cost >= floor, (other, alone.cost, floor)
            if again is None:
                plan, floor = exact, None  # the search's answer, as the gang's next member would find it
                continue
            answers += 1
            assert _plan(again) == _plan(exact), (shape, priority, number)
            plan = again
    finally:
        trial.rollback()
    return floors, answers


def _check_stream(seed: int, nodes: int) -> tuple[int, int]:
    """Chains after every third command of a mixed stream; (floors checked, answers checked)."""
    commands = mixed_stream(SeededChooser(seed), 120, nodes)
    state = PartitionState()
    floors = answers = 0
    for offset, command in enumerate(commands):
        decide(state, command, offset)
        if offset % 3:
            continue
        for cluster in state.clusters.values():
            if cluster.halted is not None:
                continue
            for shape in PROBES:
                for priority in PRIORITIES:
                    checked, answered = _chain(cluster, shape, priority, state.clock)
                    floors, answers = floors + checked, answers + answered
    return floors, answers


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.sampled_from((2, 4, 6)))
def test_plan_again_answers_as_the_search_and_its_floor_bounds_every_other_node(seed: int, nodes: int) -> None:
    _check_stream(seed, nodes)  # a stream may run no preemptible work the probes can take: then nothing is checked


def test_the_chains_check_floors_and_answers() -> None:
    """The streams above do meet what they check: on these seeds, hundreds of floors and answers."""
    floors, answers = _check_stream(0, 4)
    assert floors > 100 and answers > 50


def test_a_gang_whose_members_take_one_node_s_cheapest_victims_is_answered_without_a_search_each() -> None:
    """The shape ``plan_again`` is for: one node runs the cluster's newest (cheapest) pods; a gang's members take
    them one after the other, each answered from that node alone, as the search would."""
    commands = gang_preempts(20, 40, pods=200)
    attack = next(i for i, command in enumerate(commands) if command.command_id.startswith(ATTACK))
    state = PartitionState()
    for offset, command in enumerate(commands[:attack]):
        decide(state, command, offset)
    (cluster,) = state.clusters.values()
    shape = PodShape(1, 1000, 1000, 1024, (), (), (), None, 0)
    floors, answers = _chain(cluster, shape, 10, state.clock)
    assert floors >= 1
    assert answers >= 3
