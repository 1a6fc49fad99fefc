"""The preemption search answers from the state alone.

``preemption.plan_pod`` searches the preemption index, whose nodes are filed or pending depending on the searches
before (a restored state has every node pending). Its answer must not depend on that: a processor restored from a
snapshot has to decide as the straight fold did. Here every answer is held against the node-by-node search
(``preemption._plan_pod_exact``: each node's least victim set at its own minimal level, the least of all) after
every command of random mixed streams, for probe shapes and priorities, unrestricted and with the restrictions a
command puts on victims (borrowers only, pods evicted earlier, only newer work of the preemptor's priority); and
the stream folded with these probes (which file nodes as they go) gives the same events as without them.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from processor.core import preemption
from processor.core.fold import decide
from processor.core.preemption_plans import ANY_VICTIM, PodPlan, Victims
from processor.core.resources import PodShape
from processor.core.state import ClusterState, PartitionState
from schemas.events import Event
from tests.adversarial import SeededChooser, mixed_stream

PROBES = (
    PodShape(1, 1000, 8000, 1024, (), (), (), None, 0),
    PodShape(4, 1000, 1000, 1024, (), (), (), None, 0),
    PodShape(1, 500, 1000, 1024, (), (), (), None, 0),
    PodShape(0, 0, 30000, 1024, (), (), (), None, 0),
    PodShape(8, 1000, 1000, 1024, (), (), (), None, 0),
)
PRIORITIES = (1, 5, 10, 11)


def _plan(plan: PodPlan | None) -> tuple[str, tuple[str, ...], tuple[int, int, int]] | None:
    return None if plan is None else (plan.node_id, tuple(pod.spec.pod_id for pod in plan.victims), plan.cost)


def _restrictions(cluster: ClusterState, priority: int) -> tuple[Victims, ...]:
    """None; borrowers' pods only (Kueue's rule); not a third of the running pods (evicted earlier in the
    command); and, for a preemptor of ``priority - 1`` that takes newer work of its priority, the pods of that
    priority that arrived after the middle one (``lower_or_newer_equal_priority``), alone and with the third."""
    running = sorted(pod_id for pod_id, pod in cluster.pods.items() if pod.node_id is not None)
    arrivals = sorted(cluster.pods[pod_id].spec.arrival for pod_id in running)
    newer = (priority - 1, arrivals[len(arrivals) // 2] if arrivals else 0)
    protected = dict.fromkeys(running[::3])
    return (
        ANY_VICTIM,
        Victims({}, borrowers_only=True),
        Victims(protected),
        Victims({}, equal=newer),
        Victims(protected, equal=newer),
    )


def _probe(cluster: ClusterState, now: int) -> int:
    """Every probe's answer equals the node-by-node search's; how many found a plan."""
    found = 0
    for shape in PROBES:
        for priority in PRIORITIES:
            for allowed in _restrictions(cluster, priority):
                answer = _plan(preemption.plan_pod(cluster, shape, priority, now, None, allowed))
                exact = _plan(preemption._plan_pod_exact(cluster, shape, priority, now, allowed))
                assert answer == exact, (shape, priority, allowed)
                found += answer is not None
    return found


def _payloads(events: list[list[Event]]) -> list[list[object]]:
    return [[event.payload for event in batch] for batch in events]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(seed=100074, nodes=6)  # the stream whose restored state once preempted otherwise (fuzz regressions)
@given(seed=st.integers(0, 2**32 - 1), nodes=st.sampled_from((2, 4, 6)))
def test_the_preemption_search_answers_by_the_state_alone(seed: int, nodes: int) -> None:
    commands = mixed_stream(SeededChooser(seed), 150, nodes)
    plain = PartitionState()
    plain_events = [decide(plain, command, offset) for offset, command in enumerate(commands)]
    probed = PartitionState()
    probed_events = []
    found = 0
    for offset, command in enumerate(commands):
        probed_events.append(decide(probed, command, offset))
        for cluster in probed.clusters.values():
            found += _probe(cluster, probed.clock)
    assert _payloads(probed_events) == _payloads(plain_events)
    assert found > 0  # the probes met preemptible work
