"""One command's decision: the events it emits, applied as they are emitted, and the work it still has to do.

**The worklist.** A handler never runs another handler's follow-up work itself: it leaves it
(:meth:`Decision.then`) as a work item of one of the kinds below, and :meth:`Decision.run` runs the
items. Items left during one step of a task run right after that step, in the order they were left,
and before anything that was left earlier; a task that is a generator ``yield``\\ s to let the items it
left so far run first, then goes on. That is the order nested calls would have, without the nesting:
the Python stack stays flat however long a cascade is (a chain of 10,000 dependants, a preemption
cascade through every priority), and the worklist holds the cascade instead.

**Termination.** Every task is a bounded loop (its measure is written beside it) that leaves finitely
many items, and no item can be left forever, because what leaves items is bounded per command:

- a pod is a victim at most once per command (:attr:`Decision.evicted`: a pod evicted earlier in the
  command is never chosen as a victim again), and a node or gang can only lose a running pod: a node
  that goes away (a deadline's drain, the command's own drain or failure) evicts the pods on it once
  and takes none afterwards, so a pod is evicted at most three times per command, and evictions and
  the re-placements they cause are at most three times the pods of the cluster;
- a placement moves a job from waiting to running, and only an eviction moves it back;
- a reservation is released at most once per eviction, placement or node change, and the upkeep
  of reservations takes at most :data:`RESERVATION_ROUNDS` rounds per cluster per call;
- a timer fires once, and timers set during a command lie strictly after its time (limits,
  timeouts and retry backoffs are at least 1 ms), except a requeued gang's timeout, which fires at
  most once per eviction; a pod's retries are at most its ``max_retries``. (A ``PREEMPT_CHECK``
  timer is set at the command's own time, after its last deadline fired: it fires at the next command.)

So the items of one command are O(P + Q + T) for its cluster's P pods, Q waiting jobs and T due
timers, each bounded in cost (the table in README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from processor.core.appliers import apply
from processor.core.errors import InvariantViolation
from processor.core.policies import get_policy
from processor.core.policies.base import Policy
from processor.core.state import ClusterState, PartitionState, lookup
from schemas.commands import Command
from schemas.events import Event, EventPayload, PodEvicted, PodReleased, PodRetryScheduled

# ---------------------------------------------------------------- work kinds

RETRY_QUEUE = 0
"""``(cluster, node_ids, tenants)``: capacity grew on these nodes, or quota for these tenants: start what can."""
AFTER_EVICTION = 1
"""``(cluster, evicted_pods, gang_ids, reason)``: gangs that lost members, then evicted pods, back to placement."""
AFTER_PREEMPTION = 2
"""``(cluster, victims)``: the victims of a preemption back to placement, then what they freed to the queue."""
WAKE_DEPENDANTS = 3
"""``(cluster, job_id)``: ``job_id`` ended: fail or start the jobs that waited for it."""
RESERVATION_UPKEEP = 4
"""``(cluster,)``: keep the reservation with the head of the queue (Slurm's backfill rule)."""

LEGACY_TIME = ("v1", "v2")
"""Contracts whose commands keep one clock per partition, and let a borrower preempt anyone lower."""

LEGACY_GANGS = ("v1", "v2", "v3")
"""Contracts whose commands keep the gang, dependency and admission rules of before issue #24 (``V3Command``):
v3 was released without elastic gangs, live dependency binding, one admission rule, weight 0 and
``lower_or_newer_equal_priority``."""

RESERVATION_ROUNDS = 8
"""Rounds of reservation upkeep per call at most: each round releases or makes one reservation."""

Task = Iterator[None]
"""A task that goes on after the work it left: a generator; ``yield`` lets that work run first."""
Item = tuple[int, tuple[Any, ...]]

TASKS: list[Callable[..., Task | None]] = []
"""The function of each work kind, by kind (filled in by :mod:`processor.core.fold`, which imports every room)."""


class Decision:
    """The events of one command, applied to the state as they are emitted, and the work left to do.

    ``now`` is the event time of the next event: a timer's deadline while timers fire, then the
    command's time (the clock)."""

    __slots__ = (
        "_left",
        "_scratch",
        "command",
        "events",
        "evicted",
        "freeable",
        "freed",
        "now",
        "offset",
        "screens",
        "state",
        "touched",
    )

    def __init__(self, state: PartitionState, command: Command, offset: int) -> None:
        self.state = state
        self.command = command
        self.offset = offset
        self.events: list[Event] = []
        self.now = state.clock
        self.touched: dict[str, None] = {}  # clusters whose queue or reservation may need upkeep
        # Tenants (per cluster with quotas) whose running pods stopped: their quota (and their
        # cohort's pool) has room again, so their queued work is retried on the whole cluster.
        self.freed: dict[str, dict[str, None]] = {}
        # Pods evicted in this command, per cluster: none is chosen as a victim twice (termination).
        self.evicted: dict[str, dict[str, None]] = {}
        self._scratch: ClusterState | None = None
        self._left: list[Item] = []
        # Per cluster, what the queue's retry screened in this command (``handlers.queue``): valid while the
        # queue and the reservation stay as they were.
        self.screens: dict[str, tuple[Any, dict[Any, list[Any]]]] = {}
        # (cluster, tenant, priority) -> (events emitted when read, what the tenant's pods below that priority
        # give back to its quota): ``handlers.gangs.quota_rules_out``, valid while no event is emitted.
        self.freeable: dict[tuple[str, str, int], tuple[int, Any]] = {}

    @property
    def legacy(self) -> bool:
        """A command of contract v1 or v2: it keeps its release's semantics where v3 changed them."""
        return self.command.contract in LEGACY_TIME

    @property
    def legacy_gangs(self) -> bool:
        """A command of contract v1, v2 or v3: it keeps its release's gang, dependency and admission rules
        (members beyond ``min_members`` dropped, whole gangs under a quota, timeouts from submission, ...)."""
        return self.command.contract in LEGACY_GANGS

    @property
    def legacy_time(self) -> bool:
        """A command of contract v1 or v2 keeps the partition-wide time of its release (``processor.core.timers``)."""
        return self.command.contract in LEGACY_TIME

    @property
    def kueue_rule(self) -> bool:
        """Whether a preemptor that would borrow may take only borrowers' pods (contract v3 on)."""
        return self.command.contract not in LEGACY_TIME

    @property
    def bounded_search(self) -> bool:
        """Whether a search may stop when its work allowance is spent (contract v3 on; ``Defragment``'s
        planner, ``processor.core.defrag.Allowance``): a command of contract v1 or v2 searches as its release did."""
        return self.command.contract not in LEGACY_TIME

    @property
    def may_preempt(self) -> bool:
        """A command of contract v1 never preempts (v1 had no preemption)."""
        return self.command.contract != "v1"

    @property
    def cluster(self) -> ClusterState:
        """The command's cluster; an empty scratch one until an event creates it."""
        cluster = lookup(self.state.clusters, self.command.cluster)
        if cluster is not None:
            return cluster
        if self._scratch is None:
            self._scratch = ClusterState(self.command.cluster)
        return self._scratch

    def emit(self, payload: EventPayload, cluster: str | None = None) -> None:
        """Apply an event to the state and add it to the command's events."""
        name = self.command.cluster if cluster is None else cluster
        kind = type(payload)
        if kind is PodEvicted or kind is PodReleased or kind is PodRetryScheduled:
            known = lookup(self.state.clusters, name)
            if known is not None:
                pod_id: str = payload.pod_id  # type: ignore[union-attr]
                if kind is PodEvicted:
                    self.evicted.setdefault(name, {})[pod_id] = None
                if known.quotas_on:
                    pod = lookup(known.pods, pod_id)
                    if pod is not None and pod.node_id is not None:
                        self.freed.setdefault(name, {})[pod.spec.tenant] = None
        event = Event(
            self.state.partition,
            self.state.sequence,
            name,
            self.command.command_id,
            self.offset,
            self.now,
            payload,
        )
        apply(self.state, event)
        self.events.append(event)
        self.touched[name] = None

    def evicted_in(self, cluster: ClusterState) -> dict[str, None]:
        """The pods of the cluster evicted so far in this command (none may be a victim again)."""
        return self.evicted.get(cluster.name) or _NONE

    # ------------------------------------------------------------ the worklist

    def then(self, kind: int, *args: Any) -> None:
        """Leave work: it runs after the current step, before anything left earlier (see the module docstring)."""
        self._left.append((kind, args))

    def run(self, task: Task | None) -> None:
        """Run a task (None: it was done at once) and all the work it leaves, to the end.

        Measure: the items still to run plus the steps left in each started task; every step of a
        task ends (its loops are bounded) and what the steps leave is bounded per command (the
        module docstring), so the stack empties."""
        stack: list[Task | Item] = []
        left = self._left
        if task is not None:
            stack.append(task)
        if left:
            stack.extend(reversed(left))
            left.clear()
        tasks = TASKS
        while stack:
            top = stack[-1]
            if type(top) is tuple:  # an item not started yet: start it (a generator runs at its first next())
                stack.pop()
                kind, args = top
                started = tasks[kind](self, *args)
                if started is not None:
                    stack.append(started)
            else:
                try:
                    next(top)  # type: ignore[arg-type]
                except StopIteration:
                    stack.pop()
            if left:
                stack.extend(reversed(left))
                left.clear()

    def forget(self, name: str) -> None:
        """Drop the work left for a cluster and what this command noted about it (the cluster was halted)."""
        self._left.clear()
        self.touched.pop(name, None)
        self.freed.pop(name, None)
        self.evicted.pop(name, None)

    def pending(self) -> int:
        """Work left but not yet run (0 between commands)."""
        return len(self._left)


_NONE: dict[str, None] = {}


def cluster_policy(cluster: ClusterState) -> Policy:
    """The cluster's placement policy (an unknown name is a broken invariant: SetPolicy checks names)."""
    policy = get_policy(cluster.policy)
    if policy is None:
        raise InvariantViolation(f"cluster {cluster.name!r} has unknown policy {cluster.policy!r}")
    return policy
