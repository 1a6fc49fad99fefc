"""Properties of the node and job lifecycle (issue #25): every retry happens exactly once, at its time; budgets are
never exceeded by voluntary disruptions."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core import budgets
from processor.core.fold import apply, decide
from processor.core.state import PartitionState
from schemas.commands import (
    AddNode,
    Command,
    CommandPayload,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    RecoverNode,
    Release,
    ReleaseGang,
    Retry,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
)
from schemas.events import (
    Event,
    GangQueued,
    GangReleased,
    GangScheduled,
    PodEvicted,
    PodEvictionScheduled,
    PodQueued,
    PodReleased,
    PodRetryScheduled,
    PodScheduled,
)
from tests.property.test_fold_properties import check_state
from tests.strategies import disruption_streams

PODS = tuple(f"p{i}" for i in range(5))
NODES = ("n0", "n1")
RETRIES = (Retry(1, 1_000, 1_000), Retry(2, 2_000, 3_000), Retry(4, 500, 60_000))

retry_payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    st.builds(
        SubmitPod,
        st.sampled_from(PODS),
        num_gpu=st.just(1),
        gpu_milli=st.sampled_from((500, 1000)),
        cpu_milli=st.just(100),
        retry=st.sampled_from((None, *RETRIES)),
        depends_on=st.sampled_from(((), (), ("p0",))),
    ),
    st.builds(Release, st.sampled_from(PODS), st.sampled_from(("failed", "failed", "failed", "completed"))),
    st.builds(DrainNode, st.sampled_from(NODES)),
    st.builds(UncordonNode, st.sampled_from(NODES)),
    st.builds(MarkNodeFailed, st.sampled_from(NODES)),
    st.builds(RecoverNode, st.sampled_from(NODES)),
    st.just(Tick()),
    st.just(Tick()),
)


@st.composite
def retry_streams(draw: st.DrawFn) -> list[Command]:
    """Two small nodes, then pods with retry policies failing often, drains, failures, recoveries and ticks;
    time moves by 0 to 5 s per command, so backoffs end between, at and during commands."""
    bodies: list[CommandPayload] = [AddNode("n0", 8000, 32768, "A100", 2), AddNode("n1", 8000, 32768, "A100", 1)]
    bodies += draw(st.lists(retry_payloads, min_size=10, max_size=60))
    commands, clock = [], 0
    for i, payload in enumerate(bodies):
        clock += draw(st.sampled_from((0, 500, 1_000, 1_000, 2_000, 5_000)))
        commands.append(Command(f"cmd-{i}", "c0", clock, payload, "hypothesis"))
    return commands


def _about(event: Event) -> str | None:
    payload = event.payload
    if isinstance(payload, (PodScheduled, PodQueued)):
        return payload.pod.pod_id
    if isinstance(payload, (PodReleased, PodRetryScheduled, PodEvicted)):
        return payload.pod_id
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=retry_streams())
def test_every_retry_happens_exactly_once_at_its_time(commands: list[Command]) -> None:
    """Each PodRetryScheduled is followed, for its pod, by exactly one placement (started or requeued) stamped
    at not_before, unless the pod was released before; attempts count 1, 2, ... up to max_retries, each after its
    backoff; the invariants hold after every command."""
    state = PartitionState()
    events: list[Event] = []
    for offset, command in enumerate(commands):
        events.extend(decide(state, command, offset))
        check_state(state)
    cluster = state.clusters["c0"]
    attempts: dict[str, int] = {}
    for index, event in enumerate(events):
        payload = event.payload
        if isinstance(payload, PodReleased):
            attempts.pop(payload.pod_id, None)  # it may be submitted again under the same id: counting starts over
        if not isinstance(payload, PodRetryScheduled):
            continue
        pod_id = payload.pod_id
        assert payload.attempt == attempts.get(pod_id, 0) + 1
        attempts[pod_id] = payload.attempt
        later = [e for e in events[index + 1 :] if _about(e) == pod_id]
        retry = next(
            e
            for e in reversed(events[:index])
            if isinstance(e.payload, PodScheduled | PodQueued) and e.payload.pod.pod_id == pod_id
        ).payload.pod.retry
        assert retry is not None and payload.attempt <= retry.max_retries
        assert payload.not_before == event.occurred_at + retry.delay_ms(payload.attempt)
        if not later:  # not due yet: still waiting for it
            assert cluster.clock < payload.not_before and cluster.pods[pod_id].retry_at == payload.not_before
            continue
        first = later[0]
        if isinstance(first.payload, PodReleased):  # cancelled (or ended) while it waited
            assert first.occurred_at <= payload.not_before
            continue
        assert first.occurred_at == payload.not_before, f"retry of {pod_id} at {first.occurred_at}"
        # Exactly once: the next event about the pod is not a second placement by the same timer (an eviction
        # may come next, or its start from the queue if it was queued).
        if len(later) > 1:
            second = later[1].payload
            assert not isinstance(second, PodQueued), f"{pod_id} placed twice"
            assert not (isinstance(second, PodScheduled) and not second.from_queue), f"{pod_id} placed twice"


GANGS = ("g0", "g1")
MEMBERS = tuple(f"{gang}-{i}" for gang in GANGS for i in range(2))

gang_retry_payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    st.builds(
        SubmitGang,
        st.sampled_from(GANGS),
        members=st.builds(
            lambda gpus: (GangMember("", 1, gpus, 100), GangMember("", 1, gpus, 100)),
            st.sampled_from((500, 1000)),
        ),
        min_members=st.sampled_from((None, None, 1)),
        retry=st.sampled_from((None, *RETRIES)),
        depends_on=st.sampled_from(((), (), ("g0",))),
    ),
    st.builds(Release, st.sampled_from(MEMBERS), st.sampled_from(("failed", "failed", "failed", "completed"))),
    st.builds(ReleaseGang, st.sampled_from(GANGS), st.sampled_from(("completed", "cancelled"))),
    st.builds(DrainNode, st.sampled_from(NODES)),
    st.builds(UncordonNode, st.sampled_from(NODES)),
    st.builds(MarkNodeFailed, st.sampled_from(NODES)),
    st.builds(RecoverNode, st.sampled_from(NODES)),
    st.just(Tick()),
    st.just(Tick()),
)


def _named_members(payload: CommandPayload) -> CommandPayload:
    """A drawn gang's members are named after it (g0-0, g0-1)."""
    if isinstance(payload, SubmitGang):
        members = tuple(
            GangMember(f"{payload.gang_id}-{i}", m.num_gpu, m.gpu_milli, m.cpu_milli)
            for i, m in enumerate(payload.members)
        )
        payload.members = members
    return payload


@st.composite
def gang_retry_streams(draw: st.DrawFn) -> list[Command]:
    """Two small nodes (3 GPUs), then gangs of two 1-GPU (or half-GPU) members with retry policies whose members
    fail often, gang releases, drains, failures, recoveries and ticks; time moves by 0 to 5 s per command."""
    bodies: list[CommandPayload] = [AddNode("n0", 8000, 32768, "A100", 2), AddNode("n1", 8000, 32768, "A100", 1)]
    bodies += [_named_members(p) for p in draw(st.lists(gang_retry_payloads, min_size=10, max_size=60))]
    commands, clock = [], 0
    for i, payload in enumerate(bodies):
        clock += draw(st.sampled_from((0, 500, 1_000, 1_000, 2_000, 5_000)))
        commands.append(Command(f"cmd-{i}", "c0", clock, payload, "hypothesis"))
    return commands


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=gang_retry_streams())
def test_every_gang_retry_happens_exactly_once_at_its_time(commands: list[Command]) -> None:
    """Each PodRetryScheduled of a gang member sends its whole gang back to placement exactly once, stamped at
    not_before (GangScheduled or GangQueued, not from the queue), unless the gang was released before; the gang's
    attempts count 1, 2, ... up to max_retries, each after its backoff; the invariants hold after every command."""
    state = PartitionState()
    events: list[Event] = []
    for offset, command in enumerate(commands):
        events.extend(decide(state, command, offset))
        check_state(state)
    cluster = state.clusters["c0"]
    attempts: dict[str, int] = {}
    for index, event in enumerate(events):
        payload = event.payload
        if isinstance(payload, GangReleased):
            attempts.pop(payload.gang_id, None)  # it may be submitted again under the same id: counting starts over
        if not isinstance(payload, PodRetryScheduled):
            continue
        gang_id = payload.pod_id.rsplit("-", 1)[0]
        spec = next(
            e.payload.gang
            for e in reversed(events[:index])
            if isinstance(e.payload, GangScheduled) and e.payload.gang_id == gang_id
        )
        assert spec.retry is not None and payload.attempt == attempts.get(gang_id, 0) + 1 <= spec.retry.max_retries
        attempts[gang_id] = payload.attempt
        assert payload.not_before == event.occurred_at + spec.retry.delay_ms(payload.attempt)
        # Its other running members were evicted with it, just before, in the same command.
        stopped = [e for e in events[:index] if e.command_id == event.command_id and isinstance(e.payload, PodEvicted)]
        assert all(e.payload.reason == "gang:failed" for e in stopped if e.payload.pod_id.startswith(gang_id + "-"))
        later = [e for e in events[index + 1 :] if _about_gang(e, gang_id)]
        if not later:  # not due yet: still waiting for it
            gang = cluster.gangs[gang_id]
            assert cluster.clock < payload.not_before and gang.retry_at == payload.not_before
            assert gang.state == "retrying" and not gang.placed
            continue
        first = later[0]
        if isinstance(first.payload, GangReleased):  # cancelled while it waited
            assert first.occurred_at <= payload.not_before
            continue
        assert isinstance(first.payload, GangScheduled | GangQueued), f"{gang_id} did {first.payload} while retrying"
        assert first.occurred_at == payload.not_before, f"retry of {gang_id} at {first.occurred_at}"
        if isinstance(first.payload, GangScheduled):
            assert not first.payload.from_queue
        else:
            assert first.payload.requeued
        # Exactly once: the next event about the gang is not a second placement by the same timer (an eviction
        # or a release may come next, or its start from the queue if it was queued).
        if len(later) > 1:
            second = later[1].payload
            assert not isinstance(second, GangQueued), f"{gang_id} placed twice"
            assert not (isinstance(second, GangScheduled) and not second.from_queue), f"{gang_id} placed twice"


def _about_gang(event: Event, gang_id: str) -> bool:
    """An event about the gang itself or one of its members leaving (not the members' PodScheduled that follow
    every GangScheduled)."""
    payload = event.payload
    if isinstance(payload, GangScheduled | GangQueued | GangReleased):
        return payload.gang_id == gang_id
    if isinstance(payload, PodEvicted | PodReleased | PodRetryScheduled):
        return payload.pod_id.startswith(gang_id + "-")
    return False


def _voluntary(payload: object) -> bool:
    """An eviction a drain or a NoExecute taint decides (budgets apply), as opposed to a failure or a removal."""
    if isinstance(payload, PodEvictionScheduled):
        return payload.respect_budgets
    voluntary = ("drain", "gang:drain", "node_updated", "gang:node_updated")  # a drain, or a NoExecute taint
    return isinstance(payload, PodEvicted) and payload.reason in voluntary


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=disruption_streams())
def test_budgets_are_never_exceeded_by_voluntary_disruptions(commands: list[Command]) -> None:
    """Applied one by one, no eviction a drain decides under budgets raises a budget's count of unavailable pods
    past its max_unavailable (failures may: they ignore budgets but count, and then drains wait); drains without
    respect_budgets are left out of the check (they say so)."""
    state, shadow = PartitionState(), PartitionState()
    unbudgeted: set[str] = set()  # nodes drained with respect_budgets false: their evictions are not checked
    for offset, command in enumerate(commands):
        payload = command.payload
        if isinstance(payload, DrainNode) and not payload.respect_budgets:
            unbudgeted.add(f"{command.cluster}/{payload.node_id}")
        for event in decide(state, command, offset):
            cluster = shadow.clusters.get(event.cluster)
            before = {b: budgets.unavailable(cluster, cluster.budgets[b]) for b in cluster.budgets} if cluster else {}
            apply(shadow, event)
            node_id = getattr(event.payload, "node_id", None)
            if not _voluntary(event.payload) or f"{event.cluster}/{node_id}" in unbudgeted:
                continue
            if isinstance(event.payload, PodEvicted) and event.payload.reason.startswith("gang:"):
                continue  # the rest of a gang: checked as a whole with the member whose eviction took it
            cluster = shadow.clusters[event.cluster]
            for budget_id, budget in cluster.budgets.items():
                after = budgets.unavailable(cluster, budget)
                assert after <= budget.max_unavailable or after <= before.get(budget_id, 0), (
                    f"budget {budget_id} at {after} > {budget.max_unavailable} after {event.payload}"
                )
        check_state(state)
