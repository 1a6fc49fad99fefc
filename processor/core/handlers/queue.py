"""Retrying the queue when capacity grew on some nodes, or quota for some tenants (follow-up work).

Invariant: after every command no queued job fits anywhere it may go, within its quota (strict FIFO and
reservations aside), and none that may preempt could make room by preempting lower-priority pods. So
only groups (tenant, preemption, shape) that fit a changed node, or could preempt there, can start now,
and gangs with a member that could; plus, on the whole cluster, the work of the given tenants and of
tenants whose running pods stopped in this command (their quota, and their cohort's pool, grew).
"""

from __future__ import annotations

import heapq
from typing import Any

from processor.core import gangs, node_victims, preemption_plans, quotas, reservations
from processor.core.decision import Decision, Task
from processor.core.handlers.gangs import place_gang, quota_rules_out
from processor.core.handlers.pods import place
from processor.core.resources import PodShape, Signature
from processor.core.state import GANG_QUEUED, ClusterState, Node, lookup, shape_of
from schemas.commands import PREEMPT_LOWER_OR_NEWER, PREEMPTING, STRICT_FIFO
from schemas.events import GangSpec

Entry = tuple[tuple[Any, ...], int, Any, tuple[int, int, str], tuple[str, ...] | None]
"""(order, 0 for a pod group / 1 for a gang, the group, the queue key, the nodes a pod may preempt on)."""


def retry_queue(
    decision: Decision, cluster: ClusterState, node_ids: tuple[str, ...], tenants: set[str] | None
) -> Task | None:
    """Place queued pods and gangs after capacity grew on ``node_ids``, or quota for ``tenants``.

    Candidates are taken in queue order (priority, then FIFO; with quotas, priority, then the tenant's
    weighted dominant share, then FIFO), and a group that cannot start is dropped as a whole. Work:
    O(Q + G) to screen the Q waiting groups and G queued gangs, plus O(S_m + log) per pod placed.
    Under strict FIFO, only the head may start."""
    freed = decision.freed.pop(cluster.name, None) if decision.freed else None
    if freed:
        tenants = (tenants or set()) | quotas.with_peers(cluster, set(freed))
    if not cluster.queue.size and not cluster.gang_queue:
        return None
    if not node_ids and not tenants:
        return None
    if cluster.queue_order == STRICT_FIFO:
        return _start_heads(decision, cluster)
    index = cluster.index
    # Distinct shapes of free capacity: a storm frees many nodes alike (O(Q · S) to screen, S these).
    signatures = list(dict.fromkeys(s for s in map(index.signature_of, node_ids) if s is not None))
    changed = [node for node in (lookup(cluster.nodes, n) for n in node_ids) if node is not None and node.schedulable]
    if not signatures and not tenants:
        return None
    now = decision.now
    fits = index.fits
    fair = cluster.quotas_on
    preempting = decision.may_preempt and bool(changed)
    heap: list[Entry] = []
    # Whether any queued pod could preempt on the changed nodes at all: only if some running pod has a lower
    # priority than the queue's first (the highest priority waiting).
    first = cluster.queue.first()
    pods_preempt = preempting and first is not None and preemption_plans.lower_priority_exists(cluster, -first[0][0])
    equal_only = (
        first is not None and not pods_preempt and preemption_plans.lower_priority_exists(cluster, 1 - first[0][0])
    )
    if preempting and equal_only:
        # Only work of the head's priority runs below it: a group with lower_or_newer_equal_priority may take it
        # (contract v4). O(1): the queue counts its groups per preemption setting.
        pods_preempt = cluster.queue.waits_with(PREEMPT_LOWER_OR_NEWER)
    # Tenants whose quota policy may preempt for a pod its quota has no room for (contract v4): their work is
    # retried on any change. O(tenants with a quota); none unless a tenant set such a policy.
    policed = _policed_tenants(cluster) if fair else None
    if not pods_preempt and not tenants and not policed:
        for key, group in _fitting_heads(decision, cluster, signatures):
            heap.append((_order(cluster, key, group[0], fair), 0, group, key, node_ids))
    else:
        for key, group in cluster.queue.heads():
            tenant, mode, shape = group
            usable = reservations.usable_shape(cluster, key[2], shape, now)
            near: tuple[str, ...] | None = node_ids
            if (tenants and tenant in tenants) or (policed and tenant in policed):
                near = None
            elif not any(fits(signature, usable) for signature in signatures) and not (
                pods_preempt
                and mode in PREEMPTING
                and _may_preempt_on(cluster, usable, preemption_plans.reach(-key[0], mode), changed)
            ):
                continue
            heap.append((_order(cluster, key, tenant, fair), 0, group, key, near))
    for key in cluster.gang_queue:
        spec = cluster.gangs[key[2]].spec
        if not (
            (tenants and spec.tenant in tenants)
            or gangs.may_use(cluster, spec, signatures, now)
            or (preempting and spec.preemption in PREEMPTING and _gang_may_preempt_on(cluster, spec, changed, now))
        ):
            continue
        heap.append((_order(cluster, key, spec.tenant, fair), 1, None, key, None))
    if not heap:
        return None
    heapq.heapify(heap)
    return _retry(decision, cluster, heap, fair)


def _policed_tenants(cluster: ClusterState) -> set[str]:
    return {tenant for tenant, quota in cluster.quotas.items() if quotas.has_policy(quota)}


def _retry(decision: Decision, cluster: ClusterState, heap: list[Entry], fair: bool) -> Task:
    """The candidates in order. Measure: entries on the heap, plus the queued pods of their groups; each round
    pops one entry and pushes back at most one (the group's next pod after a placement, or the same entry
    with a fresher order, which it keeps until the next placement)."""
    while heap:
        order, kind, group, key, near = heapq.heappop(heap)
        if fair:  # shares grew with every placement since this entry was pushed: look again
            fresh = _order(cluster, key, group[0] if kind == 0 else cluster.gangs[key[2]].spec.tenant, fair)
            if fresh != order:
                heapq.heappush(heap, (fresh, kind, group, key, near))
                continue
        if kind == 1:
            queued = cluster.gangs.get(key[2])
            if queued is None or queued.state != GANG_QUEUED:
                continue
            if not quota_rules_out(decision, cluster, queued.spec):  # a quota that rules it out: it stays queued
                place_gang(decision, cluster, queued.spec, from_queue=True, requeued=False)
                yield  # what its placement set off, before the next candidate
            continue
        head = cluster.queue.head(group)
        if head != key:  # placed meanwhile (a released reservation retried these nodes first)
            if head is not None:
                heapq.heappush(heap, (_order(cluster, head, group[0], fair), 0, group, head, near))
            continue
        pod = cluster.pods[key[2]]
        started = place(decision, cluster, pod.spec, pod.shape, from_queue=True, requeued=False, near=near)
        yield  # what its placement set off, before the group's next pod
        if not started:
            continue
        following = cluster.queue.head(group)
        if following is not None:
            heapq.heappush(heap, (_order(cluster, following, group[0], fair), 0, group, following, near))


def _fitting_heads(
    decision: Decision, cluster: ClusterState, signatures: list[Signature]
) -> list[tuple[tuple[int, int, str], Any]]:
    """The queued groups' heads whose shape (as placement sees it) fits a node of one of these signatures, in
    the queue's own order of groups. Kept for the rest of the command, per signature, while the queue and the
    reservation stay as they are (``PendingQueue.version``): a storm of T releases onto nodes of S distinct
    free shapes screens the Q waiting groups S times, not T (O(Q · S + T))."""
    reservation = cluster.reservation
    held = None if reservation is None else (reservation.holder_id, reservation.expected_start, decision.now)
    state = (cluster.queue.version, held)
    cache = decision.screens.get(cluster.name)
    if cache is None or cache[0] != state:
        cache = decision.screens[cluster.name] = (state, {})
    found = cache[1]
    fits = cluster.index.fits
    chosen: dict[tuple[int, int, str], Any] = {}
    heads: list[tuple[tuple[int, int, str], Any]] | None = None
    for signature in signatures:
        passing = found.get(signature)
        if passing is None:
            if heads is None:
                heads = cluster.queue.heads()
            passing = found[signature] = [
                (key, group)
                for key, group in heads
                if fits(signature, reservations.usable_shape(cluster, key[2], group[2], decision.now))
            ]
        for key, group in passing:
            chosen[key] = group
    return list(chosen.items())


def _order(cluster: ClusterState, key: tuple[int, int, str], tenant: str, fair: bool) -> tuple[Any, ...]:
    """Retry order: priority, then (with quotas) the tenant's weighted dominant share, then FIFO."""
    if not fair:
        return key
    return (key[0], quotas.dominant_share(cluster, tenant), key[1], key[2])


def _may_preempt_on(cluster: ClusterState, shape: PodShape, priority: int, nodes: list[Node]) -> bool:
    if not preemption_plans.lower_priority_exists(cluster, priority):
        return False
    return any(node_victims.could_preempt_on(node, shape, priority, cluster) for node in nodes)


def _gang_may_preempt_on(cluster: ClusterState, spec: GangSpec, nodes: list[Node], now: int) -> bool:
    level = preemption_plans.reach(spec.priority, spec.preemption)
    if not preemption_plans.lower_priority_exists(cluster, level):
        return False
    # Each distinct shape once, in member order (not sorted: a shape's tolerations have no order; the answer
    # does not depend on the order, the work done before it is found does).
    shapes = dict.fromkeys(reservations.usable_shape(cluster, spec.gang_id, shape_of(m), now) for m in spec.members)
    return any(_may_preempt_on(cluster, shape, level, nodes) for shape in shapes)


def _start_heads(decision: Decision, cluster: ClusterState) -> Task:
    """Strict FIFO: start jobs from the head of the queue until one does not fit. Measure: the queued jobs."""
    while True:
        head = cluster.head()
        if head is None:
            return
        key, kind = head
        if kind == "gang":
            if not place_gang(decision, cluster, cluster.gangs[key[2]].spec, from_queue=True, requeued=False):
                return
        else:
            pod = cluster.pods[key[2]]
            if not place(decision, cluster, pod.spec, pod.shape, from_queue=True, requeued=False):
                return
        yield  # what the placement set off, before the next head
