"""Priority preemption: the fewest, cheapest lower-priority victims, whole gangs, explained, all or nothing."""

from __future__ import annotations

import pytest

from processor.core.preemption_index import Content, PreemptionIndex, pending_entry
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from processor.core.state import ClusterState
from schemas.codes import QueueReasonCode
from schemas.commands import AddNode, Command, GangMember, Release, SetPolicy, SubmitGang, SubmitPod, V1Command
from schemas.events import Event
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, types

MINUTE = 60_000


def gpus(pod_id: str, count: int, priority: int = 0, **fields: object) -> SubmitPod:
    return SubmitPod(pod_id, priority=priority, num_gpu=count, gpu_milli=1000, cpu_milli=1000, **fields)  # type: ignore[arg-type]


def cluster(*sizes: int) -> Fold:
    """Nodes n0, n1, ... of the given GPU counts (first-fit, no reservations)."""
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i, size in enumerate(sizes):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", size))
    return fold


def rebuilt(state: ClusterState) -> Content:
    """The preemption index rebuilt from the cluster's nodes, every node filed."""
    return PreemptionIndex.rebuilt(state.nodes).content(state.nodes)


def of(events: list[Event], name: str) -> list[Event]:
    return [event for event in events if event.type_name == name]


def test_a_pod_that_fits_nowhere_preempts_a_lower_priority_pod_and_takes_its_node() -> None:
    """The victim is preempted (PodPreempted then PodEvicted), the preemptor starts there, the victim requeues."""
    fold = cluster(2)
    fold.run(gpus("low", 2))
    events = fold.run(gpus("high", 2, priority=5))
    assert types(events) == ["PodPreempted", "PodEvicted", "PodScheduled", "PodQueued"]
    preempted, evicted, scheduled, queued = (event.payload for event in events)
    assert (preempted.pod_id, preempted.node_id, preempted.by, preempted.reason) == ("low", "n0", "high", "priority")
    assert "preempted by pod 'high'" in preempted.message
    assert evicted.reason == "preempted:priority"
    assert (scheduled.pod.pod_id, scheduled.node_id, scheduled.preempted) == ("high", "n0", ("low",))
    assert queued.pod.pod_id == "low" and queued.requeued


def test_the_lowest_victim_priority_wins_over_fewer_victims() -> None:
    """n0 holds one pod of priority 3, n1 two of priority 1: the two of priority 1 go."""
    fold = cluster(2, 2)
    fold.run_all(gpus("mid", 2, priority=3), gpus("a", 1, priority=1), gpus("b", 1, priority=1))
    events = fold.run(gpus("top", 2, priority=9))
    assert sorted(e.payload.pod_id for e in of(events, "PodPreempted")) == ["a", "b"]
    assert of(events, "PodScheduled")[0].payload.node_id == "n1"


def test_fewer_victims_win_at_the_same_priority() -> None:
    """n0 holds two 1-GPU pods, n1 one 2-GPU pod, all priority 0: the single pod on n1 goes."""
    fold = cluster(2, 2)
    fold.run_all(gpus("a", 1), gpus("b", 1), gpus("c", 2))
    events = fold.run(gpus("top", 2, priority=1))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["c"]


def test_less_work_lost_wins_among_equal_victim_counts() -> None:
    """Two equal candidates: the pod that started later loses less work, so it is preempted."""
    fold = cluster(1, 1)
    fold.run(gpus("old", 1), at=MINUTE)
    fold.run(gpus("young", 1), at=30 * MINUTE)
    events = fold.run(gpus("top", 1, priority=1), at=31 * MINUTE)
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["young"]
    assert of(events, "PodScheduled")[0].payload.scores["gpu_seconds_lost"] == 60.0


def test_ties_break_on_the_node_id() -> None:
    """Identical victims started at the same time: the one on the smaller node id goes."""
    fold = cluster(1, 1)
    fold.run(gpus("x", 1), at=MINUTE)
    fold.run(gpus("y", 1), at=MINUTE)
    events = fold.run(gpus("top", 1, priority=1), at=2 * MINUTE)
    assert of(events, "PodPreempted")[0].payload.node_id == "n0"


def test_a_victim_in_a_gang_takes_its_whole_gang() -> None:
    """Evicting one member evicts every member; the gang goes back to the queue (and is said to go)."""
    fold = cluster(2, 2, 2)
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000) for i in range(2))
    fold.run(SubmitGang("g", members=members))
    fold.run(gpus("p", 2, priority=3))
    events = fold.run(gpus("top", 2, priority=5))
    assert sorted(e.payload.pod_id for e in of(events, "PodPreempted")) == ["g-0", "g-1"]
    assert all("its whole gang 'g'" in e.payload.message for e in of(events, "PodPreempted"))
    assert of(events, "PodScheduled")[0].payload.preempted == ("g-0", "g-1")
    assert "GangQueued" in types(events) and fold.cluster.gangs["g"].state == "queued"


def test_a_gang_member_victim_counts_every_member() -> None:
    """A 1-victim plain pod beats a 2-member gang even when the gang's member alone would make room."""
    fold = cluster(2, 2)
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000) for i in range(2))
    fold.run(SubmitGang("g", members=members), at=MINUTE)
    fold.run(Release("g-1"), at=MINUTE)
    fold.run(gpus("p", 2), at=2 * MINUTE)
    events = fold.run(gpus("top", 2, priority=5), at=3 * MINUTE)
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["p"]


def test_equal_or_higher_priority_pods_are_never_preempted() -> None:
    """A pod of the same priority waits with its usual reasons."""
    fold = cluster(2)
    fold.run(gpus("a", 2, priority=5))
    assert types(fold.run(gpus("b", 2, priority=5))) == ["PodQueued"]


def test_nothing_is_preempted_when_the_pod_would_still_not_fit() -> None:
    """Evicting every lower-priority pod would leave it short (a higher one holds the rest): nothing moves."""
    fold = cluster(4)
    fold.run_all(gpus("keep", 2, priority=9), gpus("low", 2))
    events = fold.run(gpus("top", 4, priority=5))
    assert types(events) == ["PodQueued"]
    assert fold.cluster.pods["low"].running


def test_a_pod_that_says_never_waits_and_says_why() -> None:
    """preemption: never queues it; WAITING_FOR_PREEMPTION counts the nodes where it would fit once they end."""
    fold = cluster(2, 2)
    fold.run_all(gpus("a", 2), gpus("b", 2))
    (event,) = fold.run(gpus("polite", 2, priority=5, preemption="never"))
    reasons = {reason.code: reason for reason in event.payload.reasons}
    assert reasons[QueueReasonCode.WAITING_FOR_PREEMPTION].nodes == 2
    assert "does not preempt" in reasons[QueueReasonCode.WAITING_FOR_PREEMPTION].message


def test_a_command_of_contract_v1_never_preempts() -> None:
    """The same submission written with contract v1 waits, as v1 did."""
    fold = cluster(2)
    fold.run(gpus("low", 2))
    events = decide_v1(fold, gpus("high", 2, priority=5))
    assert types(events) == ["PodQueued"]
    assert fold.cluster.pods["high"].spec.preemption == "never"
    assert QueueReasonCode.WAITING_FOR_PREEMPTION not in {r.code for r in events[0].payload.reasons}


def decide_v1(fold: Fold, payload: SubmitPod) -> list[Event]:
    from processor.core.fold import decide

    fold.count += 1
    return decide(fold.state, V1Command(f"v1-{fold.count}", fold.cluster_name, 1000 * fold.count, payload))


def test_a_victim_that_fits_elsewhere_starts_there_in_the_same_command() -> None:
    """Preempted pods go back to placement at once: the victim finds the free node."""
    fold = cluster(2, 1)
    fold.run(gpus("low", 1))  # first-fit: n0
    fold.run(gpus("other", 1))  # n0
    fold.run(gpus("small", 1, priority=1))  # n1
    events = fold.run(gpus("top", 2, priority=5))
    victims = sorted(e.payload.pod_id for e in of(events, "PodPreempted"))
    assert victims == ["low", "other"]
    assert types(events)[-2:] == ["PodQueued", "PodQueued"]


def test_freed_capacity_goes_to_the_preemptor_before_anyone_else() -> None:
    """A queued pod that fits the victim's node waits: the preemptor is placed first (nominated)."""
    fold = cluster(2)
    fold.run(gpus("low", 2))
    fold.run(gpus("waiting", 1, priority=2, preemption="never"))
    events = fold.run(gpus("top", 2, priority=5))
    assert of(events, "PodScheduled")[0].payload.pod.pod_id == "top"
    assert fold.cluster.pods["waiting"].queued


def test_leftover_capacity_of_the_victims_goes_to_the_queue_after_the_preemptor() -> None:
    """The victim held 2 GPUs, the preemptor needs 1: the other GPU goes to the next pod in the queue."""
    fold = cluster(2)
    fold.run(gpus("low", 2))
    fold.run(gpus("waiting", 1, priority=2, preemption="never"))
    events = fold.run(gpus("top", 1, priority=5))
    scheduled = [e.payload.pod.pod_id for e in of(events, "PodScheduled")]
    assert scheduled == ["top", "waiting"]


def test_a_release_lets_a_waiting_pod_preempt_where_it_now_could() -> None:
    """A higher-priority pod held the rest of the node; once it ends, the waiting pod preempts the low one."""
    fold = cluster(4)
    fold.run_all(gpus("keep", 2, priority=9), gpus("low", 2))
    fold.run(gpus("mid", 4, priority=5))
    events = fold.run(Release("keep"))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["low"]
    assert of(events, "PodScheduled")[0].payload.pod.pod_id == "mid"


def test_a_gang_preempts_all_or_nothing() -> None:
    """A 2-member gang of priority 5 takes two nodes from priority-0 pods, in one outcome."""
    fold = cluster(2, 2, 2)
    fold.run_all(gpus("a", 2), gpus("b", 2), gpus("c", 2, priority=9))
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000) for i in range(2))
    events = fold.run(SubmitGang("g", members=members, priority=5))
    assert types(events)[:4] == ["PodPreempted", "PodEvicted", "PodPreempted", "PodEvicted"]
    scheduled = of(events, "GangScheduled")[0].payload
    assert sorted(scheduled.preempted) == ["a", "b"]
    assert {m.node_id for m in scheduled.members} == {"n0", "n1"}
    assert {e.payload.by for e in of(events, "PodPreempted")} == {"g"}


def test_a_gang_that_would_not_fit_even_by_preempting_preempts_nothing() -> None:
    """Three members need three nodes; only two hold lower-priority pods: nothing is evicted."""
    fold = cluster(2, 2, 2)
    fold.run_all(gpus("a", 2), gpus("b", 2), gpus("c", 2, priority=9))
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000) for i in range(3))
    events = fold.run(SubmitGang("g", members=members, priority=5))
    assert types(events) == ["GangQueued"]
    assert all(fold.cluster.pods[p].running for p in ("a", "b", "c"))


def test_a_preemption_replays_from_its_events_and_from_a_snapshot() -> None:
    """The state after a preemption is rebuilt by a snapshot; its tail folds to the same hash."""
    fold = cluster(2, 2)
    fold.run_all(gpus("a", 2), gpus("b", 2))
    fold.run(gpus("top", 2, priority=5))
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert state_hash(restored) == state_hash(fold.state)
    from processor.core.fold import decide

    tail = Command("t1", "c0", 10**7, Release("top"))
    assert [e.to_avro() for e in decide(restored, tail)] == [e.to_avro() for e in decide(fold.state, tail)]
    assert state_hash(restored) == state_hash(fold.state)


def test_the_preemption_index_groups_alike_nodes_and_refiles_only_changed_ones() -> None:
    """Nodes that hold the same pods (start times aside) share a class; a search refiles only marked nodes,
    and a snapshot restore rebuilds the same index."""
    fold = cluster(2, 2, 2)
    fold.run_all(gpus("a", 1), gpus("b", 1), gpus("c", 1), gpus("d", 1), gpus("e", 2))
    index = fold.cluster.preemptible
    index.refresh(fold.cluster.nodes)
    assert sorted(sorted(nodes) for nodes, _ in index.content(fold.cluster.nodes).values()) == [["n0", "n1"], ["n2"]]
    fold.run(Release("a"))
    assert list(index.dirty) == ["n0"]
    events = fold.run(gpus("top", 2, priority=5))
    assert [event.payload.pod_id for event in of(events, "PodPreempted")] == ["e"]  # one victim, the least work
    assert list(index.dirty) == ["n2"]  # n0 refiled by the search; n2 changed by the preemption
    index.refresh(fold.cluster.nodes)
    assert index.content(fold.cluster.nodes) == PreemptionIndex.rebuilt(fold.cluster.nodes).content(fold.cluster.nodes)
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    twin = restored.clusters[fold.cluster.name].preemptible
    twin.refresh(restored.clusters[fold.cluster.name].nodes)
    assert twin.content(restored.clusters[fold.cluster.name].nodes) == index.content(fold.cluster.nodes)


def test_a_search_after_a_mass_change_files_only_the_nodes_that_could_win() -> None:
    """40 nodes changed since the last search: it bounds them by bucket and files the few whose bound can tie
    or beat a plan (the least bounds first), not all of them; the victims are those of a node-by-node search."""
    from processor.core.preemption import PROMOTE_FIRST, plan_pod
    from processor.core.resources import PodShape

    fold = cluster(*[2] * 40)
    for i in range(39):
        fold.run_all(gpus(f"p{i}a", 1), gpus(f"p{i}b", 1))
    fold.run(gpus("big", 2))  # the only node where one victim makes room for 2 GPUs
    index = fold.cluster.preemptible
    assert len(index.dirty) == 40 and not index.classes
    shape = PodShape(2, 1000, 1000, 0, (), (), (), None)
    expected = plan_pod(fold.cluster, shape, 5, fold.state.clock, sorted(fold.cluster.nodes))
    found = plan_pod(fold.cluster, shape, 5, fold.state.clock)
    assert found is not None and expected is not None
    assert (found.node_id, found.cost, found.victims) == (expected.node_id, expected.cost, expected.victims)
    assert [pod.spec.pod_id for pod in found.victims] == ["big"]
    filed = sum(len(nodes) for nodes, _ in index.content(fold.cluster.nodes).values()) - len(index.pending_content())
    assert filed == PROMOTE_FIRST  # big's node and the 15 youngest pairs, then the plan bounds the rest
    assert len(index.pending_content()) == 40 - PROMOTE_FIRST
    index.refresh(fold.cluster.nodes)
    assert index.content(fold.cluster.nodes) == rebuilt(fold.cluster)


@pytest.mark.parametrize(
    "pod",
    [
        gpus("wide", 4, priority=5),  # more GPUs than any node has
        SubmitPod("fat", priority=5, num_gpu=1, gpu_milli=1000, cpu_milli=128_000),  # more CPU than any node
        SubmitPod("big-memory", priority=5, num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=10**7),
        SubmitPod("elsewhere", priority=5, num_gpu=1, gpu_milli=1000, cpu_milli=1000, node_selector={"zone": "b"}),
    ],
    ids=["gpus", "cpu", "memory", "selector"],
)
def test_a_pod_no_node_could_hold_even_emptied_queues_without_refreshing_a_node(pod: SubmitPod) -> None:
    """Decided from the cluster's distinct node capacities: it queues, evicts nobody, and the preemption
    index stays as it was (every changed node still marked, none moved to a pending bucket or a class)."""
    fold = cluster(2, 2, 2)
    fold.run_all(gpus("a", 2), gpus("b", 2), gpus("c", 2))
    index = fold.cluster.preemptible
    assert list(index.dirty) == ["n0", "n1", "n2"]
    events = fold.run(pod)
    assert types(events) == ["PodQueued"]
    assert events[0].payload.pod.pod_id == pod.pod_id and events[0].payload.reasons
    assert list(index.dirty) == ["n0", "n1", "n2"] and not index.pending and not index.classes
    assert {p.node_id for p in fold.cluster.pods.values() if p.spec.pod_id != pod.pod_id} == {"n0", "n1", "n2"}


def test_past_the_bound_on_marked_nodes_each_new_mark_moves_the_oldest_to_its_pending_bucket() -> None:
    """With room for two marked nodes, filling six leaves the last two marked and the first four pending,
    with the entries a refresh would give them; a search still chooses what the node-by-node search chooses,
    and the index, refreshed, equals one rebuilt from scratch."""
    from processor.core.preemption import plan_pod
    from processor.core.resources import PodShape

    fold = cluster(*[2] * 6)
    index = fold.cluster.preemptible
    index.eager_after = 2
    index.refresh(fold.cluster.nodes)  # the six new nodes, marked, run nothing: no bucket
    for i in range(6):  # first-fit: p0a and p0b on n0, then n1, ...
        fold.run_all(gpus(f"p{i}a", 1), gpus(f"p{i}b", 1))
    assert list(index.dirty) == ["n4", "n5"]
    nodes = fold.cluster.nodes
    assert index.pending_content() == {f"n{i}": pending_entry(nodes[f"n{i}"]) for i in range(4)}
    fold.run(Release("p1a"))  # a pending node marked again (refiled at the next refresh): n4, the oldest, pends
    assert list(index.dirty) == ["n5", "n1"] and index.pending_content()["n4"] == pending_entry(nodes["n4"])
    shape = PodShape(2, 1000, 1000, 0, (), (), (), None)
    expected = plan_pod(fold.cluster, shape, 5, fold.state.clock, sorted(nodes))
    found = plan_pod(fold.cluster, shape, 5, fold.state.clock)
    assert found is not None and expected is not None
    assert (found.node_id, found.cost, found.victims) == (expected.node_id, expected.cost, expected.victims)
    index.refresh(nodes)
    assert index.content(nodes) == rebuilt(fold.cluster)


def test_a_what_if_fork_preempts_on_its_own_copy_of_the_preemption_index() -> None:
    """The fork shares the live index until it refiles; its preemption leaves the live index as it was."""
    from processor.core.fold import decide
    from processor.runtime.whatif import fork

    fold = cluster(2, 2)
    fold.run_all(gpus("a", 2), gpus("b", 2))
    live = fold.cluster.preemptible
    live.refresh(fold.cluster.nodes)
    before = live.content(fold.cluster.nodes)
    twin = fork(fold.state)
    events = decide(twin, Command("w1", fold.cluster.name, 10**7, gpus("top", 2, priority=5)))
    assert of(events, "PodPreempted")
    forked = twin.clusters[fold.cluster.name]
    forked.preemptible.refresh(forked.nodes)
    assert forked.preemptible.content(forked.nodes) == rebuilt(forked) != before
    assert live.content(fold.cluster.nodes) == before == rebuilt(fold.cluster)


def test_the_capacity_index_files_changed_nodes_on_read_and_keeps_a_bounded_number_waiting() -> None:
    """A node changed since the capacity index was last read waits to be filed (a gang's members and victims
    move a node many times in one command); reading the index files every waiting node first, and past
    ``UNINDEXED_AT_MOST`` a change files the oldest waiting node at once, so no read pays for a mass change
    made before it. Whatever waits, a read sees the index a rebuild from the nodes would give."""
    from processor.core import state as state_module
    from processor.core.capacity import CapacityIndex

    def rebuilt(cluster: ClusterState) -> dict:
        schedulable = {n: node.signature() for n, node in cluster.nodes.items() if node.schedulable}
        return CapacityIndex().rebuilt(schedulable).content()

    fold = Fold()
    count = state_module.UNINDEXED_AT_MOST + 50
    for i in range(count):
        fold.run(AddNode(f"n{i:04d}", 64_000, 512_000, "A100", 8))
    cluster = fold.cluster
    assert len(cluster.unindexed) == state_module.UNINDEXED_AT_MOST  # the oldest 50 were filed as more came
    assert next(iter(cluster.unindexed)) == "n0050"
    assert sorted(cluster.capacity.content()[next(iter(cluster.capacity.content()))]) == [
        f"n{i:04d}" for i in range(50)
    ]
    assert cluster.index.content() == rebuilt(cluster)  # the read filed the rest
    assert not cluster.unindexed
    fold.run(SubmitPod("p", "t", 0, 8, 1000, 1000, 1024))  # fills n0000 whole
    assert fold.placement("p") == "n0000"
    assert cluster.index.content() == rebuilt(cluster)
    assert cluster.index.signature_of("n0000").gpu_free == (0,) * 8  # type: ignore[union-attr]
