"""The reservation planner's pod answer, node by node with early stopping, is the sweep's answer.

``reservation_planner._sweep`` is the rule (Slurm's backfill: free running pods on trial in order of their
ends, time limits first, then the oldest pods without one; the first step at which the pod fits decides,
and the policy places it there). ``_plan_pod`` answers the same question node by node, asking the nodes in
order of their first release and stopping once no node left can change the answer. Random clusters, running
pods with and without time limits, and a head of the queue of any shape: both give the same nodes and the
same expected start, under both policies.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from processor.core import reservation_planner
from processor.core.decision import cluster_policy
from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, CordonNode, Release, SetPolicy, SubmitPod
from tests import adversarial as adv

SHAPES = [(1, 1000), (1, 500), (1, 250), (2, 1000), (4, 1000), (8, 1000), (0, 0)]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Command], SubmitPod]:
    stream = adv.Stream()
    stream.add(SetPolicy(draw(st.sampled_from(["first-fit", "best-fit"])), -1))
    node_count = draw(st.integers(1, 12))
    for i in range(node_count):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        model = draw(st.sampled_from(["A100", "H100"]))
        stream.add(AddNode(adv.node_id(i), 64_000, 262_144, model, gpus))
    if node_count > 1 and draw(st.booleans()):
        stream.add(CordonNode(adv.node_id(draw(st.integers(0, node_count - 1)))))
    pods = draw(st.integers(0, 40))
    for j in range(pods):
        num_gpu, milli = draw(st.sampled_from(SHAPES))
        limit = draw(st.one_of(st.none(), st.sampled_from([5_000, 20_000, 60_000])))
        cpu = draw(st.sampled_from([1_000, 8_000, 32_000]))
        after = draw(st.sampled_from([0, 0, 1_000, 2_500]))  # pods started together with one limit end together
        stream.add(SubmitPod(f"p{j}", "t", 0, num_gpu, milli, cpu, 4_096, time_limit_ms=limit), after=after)
        if j and draw(st.integers(0, 4)) == 0:
            stream.add(Release(f"p{draw(st.integers(0, j - 1))}"))
    num_gpu, milli = draw(st.sampled_from(SHAPES))
    models = draw(st.sampled_from([(), ("A100",), ("H100",)]))
    holder = SubmitPod("holder", "t", 0, num_gpu, milli, draw(st.sampled_from([1_000, 48_000])), 8_192, models)
    return stream.commands, holder


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_the_pod_plan_is_the_sweeps_answer(case: tuple[list[Command], SubmitPod]) -> None:
    commands, holder = case
    state = PartitionState()
    for command in commands:
        decide(state, command)
    cluster = state.clusters[adv.CLUSTER]
    last = commands[-1]
    decide(state, Command("holder-cmd", adv.CLUSTER, last.issued_at + 1, holder, "test"))
    policy, now = cluster_policy(cluster), cluster.clock
    # The planner reads only the holder's shape: asked for every pod's shape (running ones too, whose shape
    # often fits somewhere now), it must still give the sweep's answer.
    for holder_id in sorted(cluster.pods):
        expected = reservation_planner._sweep(cluster, holder_id, "pod", policy, now)
        assert reservation_planner._plan_pod(cluster, holder_id, policy, now) == expected, holder_id
        event("a plan" if expected is not None else "no plan")
    # Asked again (every answer kept), and with the kept answers cleared: the same.
    for holder_id in sorted(cluster.pods):
        expected = reservation_planner._sweep(cluster, holder_id, "pod", policy, now)
        assert reservation_planner._plan_pod(cluster, holder_id, policy, now) == expected, holder_id
        cluster.fit_cache.clear()
        cluster.release_order = None
        assert reservation_planner._plan_pod(cluster, holder_id, policy, now) == expected, holder_id


def test_nodes_whose_pods_end_at_the_same_step_are_all_asked() -> None:
    """Two nodes free up at the same end time: the policy chooses between them (best-fit: the smaller), so the
    planner must not stop at the first node of that step."""
    stream = adv.Stream()
    stream.add(SetPolicy("best-fit", -1))
    stream.add(AddNode(adv.node_id(0), 64_000, 262_144, "A100", 8))
    stream.add(AddNode(adv.node_id(1), 64_000, 262_144, "A100", 4))
    stream.add(SubmitPod("eight", "t", 0, 8, 1000, 1_000, 1_024, time_limit_ms=20_000))
    stream.add(SubmitPod("four", "t", 0, 4, 1000, 1_000, 1_024, time_limit_ms=20_000), after=0)
    stream.add(SubmitPod("holder", "t", 0, 1, 1000, 1_000, 1_024))
    state = PartitionState()
    for command in stream.commands:
        decide(state, command)
    cluster = state.clusters[adv.CLUSTER]
    assert cluster.pods["holder"].node_id is None
    ends = cluster.pods["eight"].started_at + 20_000  # type: ignore[operator]
    policy = cluster_policy(cluster)
    assert reservation_planner._sweep(cluster, "holder", "pod", policy, cluster.clock) == ((adv.node_id(1),), ends)
    assert reservation_planner._plan_pod(cluster, "holder", policy, cluster.clock) == ((adv.node_id(1),), ends)
