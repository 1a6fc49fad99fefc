"""Adversarial command streams for one cluster: the shapes that crash, hang or stall the fold (issue #20).

Each builder returns a deterministic list of :class:`schemas.commands.Command` for the cluster
:data:`CLUSTER`, parameterised by size; no randomness except :func:`mixed_stream`, which draws from a
seeded ``random.Random``. The commands whose cost is the point have ids starting with :data:`ATTACK`
(``x-``); the rest only build the state they hit. Each docstring records what main (d76cefd) did with
the stream when this module was written: the events of the worst command, its CPU time on the pure-Python
hot path (2 shared cores, loaded), or the exception; and the issue's figure where it gives one.

``bench/worst_case.py`` times them at 10,000 nodes and 100,000 running pods;
``tests/property/test_fold_terminates.py`` asserts that each folds to the end in bounded work.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import TypeVar

from schemas.commands import (
    AddNode,
    Command,
    CommandPayload,
    CordonNode,
    Defragment,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Quota,
    Release,
    ReleaseGang,
    RemoveNode,
    RemoveQuota,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
)

T = TypeVar("T")

CLUSTER = "adv"
ATTACK = "x-"
"""Command id prefix of the commands an adversarial stream is built to make expensive."""
GPUS = 8
CPU = 128_000
MEMORY = 1_048_576


class Stream:
    """Commands under construction: ids, event time (``step`` ms apart) and the attack marks."""

    def __init__(self, step: int = 1_000) -> None:
        self.commands: list[Command] = []
        self.clock = 0
        self.step = step

    def add(self, payload: CommandPayload, *, attack: bool = False, after: int | None = None) -> None:
        """Append one command, ``after`` ms (default: ``step``) after the previous one."""
        self.clock += self.step if after is None else after
        prefix = ATTACK if attack else ""
        self.commands.append(Command(f"{prefix}{len(self.commands)}", CLUSTER, self.clock, payload, "adversary"))

    def extend(self, payloads: Iterable[CommandPayload], *, attack: bool = False) -> None:
        for payload in payloads:
            self.add(payload, attack=attack)


def node_id(i: int) -> str:
    return f"n{i:06d}"


def nodes(count: int, *, gpus: int = GPUS, model: str = "A100", start: int = 0, **labels: str) -> list[AddNode]:
    """``count`` alike nodes (``gpus`` GPUs, 128 cores, 1 TiB), ids from ``start``, zero-padded."""
    return [AddNode(node_id(start + i), CPU, MEMORY, model, gpus, dict(labels)) for i in range(count)]


def fill(
    count: int, pods: int, *, tenant: str = "t", priority: int = 0, prefix: str = "f", **extra: object
) -> list[SubmitPod]:
    """``pods`` pods that fill every GPU of ``count`` empty 8-GPU nodes under first-fit (``pods // count`` a node):
    per node ``k`` pods hold the 8 GPUs exactly (k <= 8: whole GPUs, the last one takes the rest; 8 < k <= 16:
    whole GPUs and half shares); past 16 a node, the rest are CPU-only. ``extra``: more SubmitPod fields."""
    per_node = max(1, pods // max(count, 1))
    out: list[SubmitPod] = []
    for n in range(count):
        for j, (num_gpu, milli) in enumerate(_node_shapes(per_node)):
            pod_id = f"{prefix}{n}-{j}"
            out.append(SubmitPod(pod_id, tenant, priority, num_gpu, milli, 1_000, 1_024, **extra))  # type: ignore[arg-type]
    return out


def _node_shapes(k: int) -> list[tuple[int, int]]:
    """(num_gpu, gpu_milli) of ``k`` pods that hold exactly the 8 GPUs of a node (placed in this order)."""
    if k <= GPUS:
        return [(1 + GPUS - k, 1000)] + [(1, 1000)] * (k - 1)
    whole = max(0, 2 * GPUS - k)
    halves = 2 * (GPUS - whole)
    return [(1, 1000)] * whole + [(1, 500)] * halves + [(0, 0)] * (k - whole - halves)


def first_fit(reserve_after_ms: int = -1) -> SetPolicy:
    """First-fit (so fills land node by node) and, by default, no reservations (a case turns them on)."""
    return SetPolicy("first-fit", reserve_after_ms)


# ---------------------------------------------------------------- crashes: recursion


def reclaim_chase() -> list[Command]:
    """Reclaim and priority preemption chase each other inside one command.

    One 8-GPU node. Tenants ``lender`` and ``borrower`` share cohort ``lab``, 4 GPUs nominal each; the
    borrower's gang of two 4-GPU members (priority 10) runs on all 8, borrowing 4. The lender submits a
    1-GPU pod (priority 0), inside its nominal quota: it reclaims, which evicts the whole gang; the gang is
    re-placed at once by preempting the lender's pod (higher priority; with the pod gone its borrowing fits
    the pool again); the pod is re-placed by reclaiming again; and so on.

    main (d76cefd): the attack ``SubmitPod`` emits 1,200 events, then ``RecursionError``.
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(1))
    s.add(SetQuota("lender", "lab", {"A100": 4}))
    s.add(SetQuota("borrower", "lab", {"A100": 4}))
    members = tuple(GangMember(f"g-{i}", 4, 1000, 1000, 1024) for i in range(2))
    s.add(SubmitGang("g", "borrower", 10, members))
    s.add(SubmitPod("lend", "lender", 0, 1, 1000, 1000, 1024), attack=True)
    return s.commands


def afterok_chain_fails(length: int = 330) -> list[Command]:
    """A chain of ``length`` afterok pods behind a running root that fails.

    ``root`` runs; ``c1`` waits for it, ``c2`` for ``c1``, ... (afterok). ``Release(root, failed)``
    fails ``c1``, which fails ``c2``, ... in one command, one nested call per link.

    main (d76cefd): at 330 links the attack ``Release`` raises ``RecursionError`` after 660 events; at 250 links
    it ends (501 events, 5 ms).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(1))
    s.add(SubmitPod("root", "t", 0, 1, 1000, 1000, 1024))
    for i in range(1, length + 1):
        s.add(SubmitPod(f"c{i}", "t", 0, 1, 1000, 1000, 1024, depends_on=(f"c{i - 1}" if i > 1 else "root",)))
    s.add(Release("root", "failed"), attack=True)
    return s.commands


def dependency_chain(length: int = 4_000) -> list[Command]:
    """Submitting a chain of ``length`` afterany pods costs the square of its length.

    Each submission looks for the cycle it would close by walking back through every waiting job
    (``dependencies.find_cycle``): the k-th ``SubmitPod`` walks k links. The submissions are the attack;
    the root then completes and the chain starts one link per ``Release``.

    main (d76cefd): 4,000 links fold in 5.0 s, the slowest ``SubmitPod`` 5.8 ms; 1,000 links in 0.3 s
    (quadratic; the issue: 3.8 s for 4k links).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(1))
    s.add(SubmitPod("root", "t", 0, 1, 1000, 1000, 1024))
    for i in range(1, length + 1):
        dependency = f"c{i - 1}" if i > 1 else "root"
        s.add(SubmitPod(f"c{i}", "t", 0, 1, 1000, 1000, 1024, depends_on=(dependency,), dependency="afterany"),
              attack=True)  # fmt: skip
    for i in range(0, min(length, 50)):
        s.add(Release("root" if i == 0 else f"c{i}"))
    return s.commands


def preemption_cascade(depth: int = 250) -> list[Command]:
    """A preemption that sets off a chain of ``depth`` preemptions, one nested call per link.

    Nodes ``n0..n{depth}`` with one GPU; node j carries labels ``s{j}`` and ``s{j+1}``, so a pod selecting
    ``s{k}`` fits nodes k-1 and k. Pod ``q{k}`` (priority k, selector ``s{k}``) runs on node k. A pod of
    priority depth+1 selecting only node ``depth`` evicts ``q{depth}``, which is re-placed on node depth-1 by
    evicting ``q{depth-1}``, and so on down to ``q0`` (``_place -> _preempt_for_pod -> _after_preemption ->
    _after_eviction -> _place``).

    main (d76cefd): at depth 250 the attack ``SubmitPod`` raises ``RecursionError`` after 739 events; at depth
    150 it ends, 454 events in 105 ms.
    """
    s = Stream()
    s.add(first_fit())
    for j in range(depth + 1):
        s.add(AddNode(node_id(j), 8_000, 16_384, "A100", 1, {f"s{j}": "1", f"s{j + 1}": "1"}))
    for k in range(depth + 1):
        s.add(SubmitPod(f"q{k}", "t", k, 1, 1000, 1000, 1024, node_selector={f"s{k}": "1"}))
    s.add(SubmitPod("top", "t", depth + 1, 1, 1000, 1000, 1024, node_selector={f"s{depth + 1}": "1"}), attack=True)
    return s.commands


# ---------------------------------------------------------------- seconds per command


def gang_preempts(
    node_count: int = 500, members: int = 1_024, *, topology: bool = False, pods: int | None = None
) -> list[Command]:
    """One gang of ``members`` 1-GPU members that must preempt, on ``node_count`` full 8-GPU nodes.

    Every node runs 8 one-GPU pods of priority 0 (or ``pods // node_count`` pods that hold its 8 GPUs, see
    :func:`fill`); the gang (priority 10) fits only by preempting 1,024 of them (128 nodes' worth);
    ``gang_preemption.plan_gang`` places member by member, each a preemption search.
    ``topology``: the gang requires one ``block`` (every node is in block ``b0``): the search for each member
    once went node by node over the domain (O(M · N)), then bounded every node of the domain once per member
    shape; it now searches the preemption index with the domain as a node-selector label.

    main (d76cefd): with ``topology`` the attack ``SubmitGang`` (4,097 events) takes 5.2 s at 500 nodes,
    10.7 s at 1,000; without, 0.39 s at 500 (the issue: 6.9 s at 500 nodes, 19 s at 1,000, 50 s at 2,000).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count, block="b0"))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS))
    gang = tuple(GangMember(f"g-{i}", 1, 1000, 1000, 1024) for i in range(members))
    s.add(SubmitGang("g", "t", 10, gang, topology_required="block" if topology else None), attack=True)
    return s.commands


def gang_preempts_spread(node_count: int = 500, members: int = 1_024, *, pods: int | None = None) -> list[Command]:
    """:func:`gang_preempts` where each member's cheapest victim is on another node: after the fill, every node's
    first pod is released and a new 1-GPU pod started there, node after node, so the newest pod of the cluster,
    the one a member evicts first, is one per node and each node's next is older than every other node's newest.

    Before ``preemption.NextPlans`` (which answers each member from the search's merged stream of nodes, the next
    node's victim each time), every member was searched, its node refreshed and the next ones filed (BENCHMARKS.md
    has the times): the worst case of a member-by-member search, measured beside the first."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS))
    s.extend(Release(f"f{n}-0") for n in range(node_count))
    s.extend(SubmitPod(f"r{n}", "t", 0, 1, 1000, 1_000, 1_024) for n in range(node_count))  # first-fit: r{n} on n
    gang = tuple(GangMember(f"g-{i}", 1, 1000, 1000, 1024) for i in range(members))
    s.add(SubmitGang("g", "t", 10, gang), attack=True)
    return s.commands


def lender_reclaims(node_count: int = 1_400, pods: int | None = None) -> list[Command]:
    """One lender pod reclaims from a borrower that runs on every node.

    Cohort ``lab``: ``lender`` and ``borrower`` have half the GPUs each as nominal quota; the borrower runs
    8 one-GPU pods on every node (borrowing the lender's half). The lender's 1-GPU pod reclaims: for every
    node the fold tries a plan on trial, and each step lists the candidates over all the borrower's pods
    (``quotas.reclaim_candidates``): O(N · P).

    main (d76cefd): the attack ``SubmitPod`` (4 events) takes 29 s at 1,400 nodes (the issue: 3.3 s at 1,400
    nodes, 17.5 s at 2,000).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    half = node_count * GPUS // 2
    s.add(SetQuota("lender", "lab", {"A100": half}))
    s.add(SetQuota("borrower", "lab", {"A100": half}))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS, tenant="borrower"))
    s.add(SubmitPod("lend", "lender", 0, 1, 1000, 1000, 1024), attack=True)
    return s.commands


def borrower_meets_guaranteed_work(
    node_count: int = 1_000, pods: int | None = None, submits: int = 20
) -> list[Command]:
    """Pods that would borrow to run, on a cluster full of work inside its tenant's nominal quota.

    Cohort ``lab``: ``owner``'s nominal quota is every GPU and it runs them all at priority 0; ``spare`` lends a
    nominal quota it does not use, so ``borrower``'s pods (priority 10) pass their quota check but find no room.
    They may preempt only borrowers' pods (Kueue's rule), and none borrows: at the lowest victim level no node
    offers a victim, so each search is answered node by node (``preemption._plan_pod_exact``), O(N · L), and
    each pod waits. ``submits`` such pods, each a search."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    s.add(SetQuota("owner", "lab", {"A100": node_count * GPUS}))
    s.add(SetQuota("spare", "lab", {"A100": node_count * GPUS}))
    s.add(SetQuota("borrower", "lab", {"A100": 0}))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS, tenant="owner"))
    for i in range(submits):
        s.add(SubmitPod(f"b{i}", "borrower", 10, 1, 1000, 1000, 1024), attack=True)
    return s.commands


def newer_equal_priority_absent(node_count: int = 1_000, pods: int | None = None, submits: int = 5) -> list[Command]:
    """Pods that may preempt newer work of their own priority (``lower_or_newer_equal_priority``) on a cluster
    full of older work of that priority, and nothing lower: every node's lowest victim level is the pod's own,
    where no pod may go. The index's search met every node and each gave nothing (O(N · L) on main: ~400 ms pure
    at 10,000 nodes); now a search finds no plan below the pod's priority, then asks only the nodes that run a
    newer pod of it (none here), after reading the pods of the nodes of that priority: O(their pods)."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS, priority=10))
    for i in range(submits):
        s.add(SubmitPod(f"e{i}", "t", 10, 1, 1000, 1000, 1024, preemption="lower_or_newer_equal_priority"), attack=True)
    return s.commands


def defragment_target(node_count: int = 1_000, budget: int = 100) -> list[Command]:
    """``Defragment`` with a target on ``node_count`` nodes that each run 7 movable 1-GPU pods.

    The target wants a whole 8-GPU node: 7 moves make room on any node, and ``defrag_target.make_room`` tried
    subsets of the movable pods of every node (up to ``TARGET_SUBSETS``), each move looking for a
    destination.

    main (d76cefd): the attack ``Defragment`` (7 moves) takes 4.0 s at 200 nodes, 22 s at 1,000 (the issue:
    16 s at 1,000 nodes, 148 s at 5,000).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    for n in range(node_count):
        s.extend(SubmitPod(f"m{n}-{j}", "t", 0, 1, 1000, 1000, 1024, movable=True) for j in range(GPUS))
    s.extend(Release(f"m{n}-{GPUS - 1}") for n in range(node_count))  # one free GPU on every node
    s.add(SubmitPod("big", "t", 0, GPUS, 1000, 1000, 1024))
    s.add(Defragment(budget, "big"), attack=True)
    return s.commands


def tick_time_limits(limits: int = 2_000, shapes: int = 2_000) -> list[Command]:
    """One ``Tick`` fires ``limits`` time limits while ``shapes`` distinct shapes wait in the queue.

    ``limits`` one-GPU pods with the same time limit run on 8-GPU nodes; ``shapes`` pods, each of its own
    memory size (too large for any node), wait. The ``Tick`` past the deadline releases every pod, and each
    release retries the queue (``_capacity_grew``: every waiting group is screened): O(limits · shapes).

    main (d76cefd): the attack ``Tick`` (4,001 events) takes 8.3 s (the issue: 3.3 s).
    """
    s = Stream()
    s.add(first_fit())
    node_count = -(-limits // GPUS)
    s.extend(nodes(node_count))
    for i in range(shapes):
        s.add(SubmitPod(f"w{i}", "t", 0, 1, 1000, 1000, MEMORY + 1 + i))
    s.extend(fill(node_count, limits, time_limit_ms=3_600_000))
    s.add(Tick(), attack=True, after=3_600_000)
    return s.commands


def unfit_queue_head(pods: int = 4_000, ticks: int = 20) -> list[Command]:
    """One queued pod whose ``node_selector`` no node has, at the head of the queue, with ``pods`` running.

    Reservations are on (after 0 ms). The head waits, the reservation planner finds no nodes for it and
    makes none, so the next command plans again: every ``Tick`` frees every running pod on trial.

    main (d76cefd): with 4,000 running pods each attack ``Tick`` takes 98-108 ms (the issue: 97 ms instead of
    0.01 ms).
    """
    s = Stream()
    s.add(first_fit(reserve_after_ms=0))
    node_count = -(-pods // GPUS)
    s.extend(nodes(node_count))
    s.extend(fill(node_count, pods, time_limit_ms=86_400_000))
    s.add(SubmitPod("typo", "t", 5, 1, 1000, 1000, 1024, node_selector={"zone": "no-such-zone"}))
    for _ in range(ticks):
        s.add(Tick(), attack=True)
    return s.commands


def ordinary_mixed(node_count: int = 1_000, commands: int = 5_000, seed: int = 7) -> list[Command]:
    """An ordinary day: ``bench/fold_throughput.py``'s submit/release mix with drains, node failures and
    repairs, and a big pod that waits for a whole idle node, reservations on (the default 5 minutes).

    Every 97th command drains a node, every 131st fails one, and each is back (uncordoned, or removed
    and added again) 40 commands later; every 500th submission is an 8-GPU pod (48 cores), which
    waits for an idle 8-GPU node. All commands are the attack.

    main (d76cefd): at 1,000 nodes and 5,000 commands, 853 us a command against 44 us for
    ``bench/fold_throughput.py``'s stream in the same run (19x; ``Release`` 1.1 ms, ``DrainNode`` 9 ms,
    ``AddNode`` 12 ms on average), with ~1,200 pods queued at the end (the issue: ~20x).
    """
    rng = random.Random(seed)
    s = Stream(step=1_000)
    s.add(SetPolicy("best-fit"))
    kinds = [(8, 96_000, 786_432), (8, 64_000, 524_288), (4, 32_000, 262_144), (2, 16_000, 131_072)]
    for i in range(node_count):
        gpus, cpu, memory = kinds[rng.randrange(len(kinds))]
        s.add(AddNode(node_id(i), cpu, memory, "A100", gpus))
    shapes = [(1, 1000, 8_000, 32_768), (1, 500, 4_000, 16_384), (1, 250, 2_000, 8_192), (2, 1000, 16_000, 65_536),
              (4, 1000, 32_000, 131_072), (0, 0, 4_000, 8_192)]  # fmt: skip
    running: list[str] = []
    fill_to = node_count * 6
    pending: dict[int, list[CommandPayload]] = {}
    submitted = 0

    def submit(attack: bool) -> None:
        nonlocal submitted
        submitted += 1
        if submitted % 100 == 0:
            s.add(SubmitPod(f"big{submitted}", "t", 0, 8, 1000, 48_000, 65_536), attack=attack)
            return
        num_gpu, milli, cpu, memory = shapes[rng.randrange(len(shapes))]
        pod_id = f"p{submitted}"
        running.append(pod_id)
        s.add(SubmitPod(pod_id, "t", 0, num_gpu, milli, cpu, memory), attack=attack)

    for _ in range(fill_to):
        submit(False)
    for i in range(commands):
        for payload in pending.pop(i, ()):
            s.add(payload, attack=True)
        if i % 97 == 96:
            target = node_id(rng.randrange(node_count))
            s.add(DrainNode(target), attack=True)
            pending.setdefault(i + 40, []).append(UncordonNode(target))
        elif i % 131 == 130:
            n = rng.randrange(node_count)
            s.add(MarkNodeFailed(node_id(n), "xid 79"), attack=True)
            gpus, cpu, memory = kinds[n % len(kinds)]
            pending.setdefault(i + 40, []).extend(
                [RemoveNode(node_id(n), True), AddNode(node_id(node_count + i), cpu, memory, "A100", gpus)]
            )
        elif i % 2 == 0 or not running:
            submit(True)
        else:
            s.add(Release(running.pop(0)), attack=True)
    return s.commands


# ---------------------------------------------------------------- random mixed streams


class Chooser:
    """Where a random stream's choices come from: a seeded ``random.Random`` (:class:`SeededChooser`) or
    hypothesis (``tests/property/test_fold_terminates.py``), so one generator serves both."""

    def pick(self, options: Sequence[T]) -> T:
        raise NotImplementedError

    def integer(self, low: int, high: int) -> int:
        raise NotImplementedError


class SeededChooser(Chooser):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)


MIXED_TENANTS = ("t1", "t2", "t3", "t4")
MIXED_KINDS = (
    ("pod",) * 10
    + ("gang",) * 4
    + ("release",) * 5
    + ("release-gang",) * 2
    + ("quota",) * 2
    + ("tick",) * 2
    + ("drain", "fail", "uncordon", "add", "defragment")
)


def mixed_stream(choose: Chooser, commands: int = 200, node_count: int = 6) -> list[Command]:
    """A random mixed stream for one small cluster: pods and gangs (``min_members``, topology) of several
    tenants and priorities that may or may not preempt, with dependencies and time limits; quotas in one
    cohort with borrowing and lending limits; releases, gang releases, drains, failures, repairs, new
    nodes, ``Defragment`` and ticks; event time moves by seconds to minutes.

    Small on purpose (``node_count`` nodes of 2-8 GPUs, a few tenants) so jobs contend, reclaim and
    preempt each other. ``tests/property/test_fold_terminates.py`` records the seeds of
    ``mixed_stream(SeededChooser(seed))`` that crash or hang main.
    """
    s = Stream()
    s.add(SetPolicy(str(choose.pick(("first-fit", "best-fit", "spread"))), int(choose.pick((-1, 0, 60_000)))))
    for i in range(node_count):
        s.add(AddNode(node_id(i), 32_000, 131_072, "A100", int(choose.pick((2, 4, 8))), {"rack": f"r{i % 2}"}))
    for tenant in MIXED_TENANTS:
        if choose.pick((True, True, False)):
            s.add(_quota(choose, tenant))
    jobs: list[str] = []  # every pod and gang id submitted, for dependencies and releases
    pods: list[str] = []
    gangs: list[str] = []
    added = node_count
    for n in range(commands):
        kind = choose.pick(MIXED_KINDS)
        after = int(choose.pick((0, 1_000, 1_000, 5_000, 30_000, 120_000)))
        payload: CommandPayload
        if kind == "pod":
            pod_id = f"p{n}"
            num_gpu, milli = choose.pick(((1, 1000), (1, 1000), (2, 1000), (4, 1000), (1, 500), (0, 0)))
            payload = SubmitPod(
                pod_id,
                str(choose.pick(MIXED_TENANTS)),
                int(choose.pick((0, 0, 1, 5, 10))),
                num_gpu,
                milli,
                int(choose.pick((500, 2_000, 8_000))),
                1_024,
                time_limit_ms=choose.pick((None, None, None, 10_000, 200_000)),
                depends_on=_depends(choose, jobs),
                dependency=str(choose.pick(("afterok", "afterany"))),
                preemption=str(choose.pick(("lower_priority", "lower_priority", "lower_priority", "never"))),
                movable=bool(choose.pick((False, True))),
            )
            jobs.append(pod_id)
            pods.append(pod_id)
        elif kind == "gang":
            gang_id = f"g{n}"
            size = choose.integer(2, 4)
            num_gpu = int(choose.pick((1, 2, 4)))
            members = tuple(GangMember(f"{gang_id}-{i}", num_gpu, 1000, 1_000, 1_024) for i in range(size))
            payload = SubmitGang(
                gang_id,
                str(choose.pick(MIXED_TENANTS)),
                int(choose.pick((0, 1, 5, 10, 10))),
                members,
                min_members=choose.pick((None, None, 1, size - 1)),
                topology_required=choose.pick((None, None, "rack")),
                timeout_ms=choose.pick((None, None, 60_000)),
                time_limit_ms=choose.pick((None, None, 100_000)),
                depends_on=_depends(choose, jobs),
                dependency=str(choose.pick(("afterok", "afterany"))),
                preemption=str(choose.pick(("lower_priority", "lower_priority", "never"))),
            )
            jobs.append(gang_id)
            gangs.append(gang_id)
        elif kind == "release" and pods:
            payload = Release(str(choose.pick(tuple(pods[-12:]))), str(choose.pick(("completed", "failed"))))
        elif kind == "release-gang" and gangs:
            payload = ReleaseGang(str(choose.pick(tuple(gangs[-6:]))), str(choose.pick(("completed", "cancelled"))))
        elif kind == "quota":
            payload = _quota(choose, str(choose.pick(MIXED_TENANTS)))
        elif kind == "drain":
            payload = DrainNode(node_id(choose.integer(0, added - 1)))
        elif kind == "fail":
            payload = MarkNodeFailed(node_id(choose.integer(0, added - 1)), "xid 79")
        elif kind == "uncordon":
            payload = UncordonNode(node_id(choose.integer(0, added - 1)))
        elif kind == "add":
            payload = AddNode(
                node_id(added), 32_000, 131_072, "A100", int(choose.pick((4, 8))), {"rack": f"r{added % 2}"}
            )
            added += 1
        elif kind == "defragment":
            payload = Defragment(int(choose.pick((1, 4))), choose.pick((None, *pods[-3:])))
        else:
            payload = Tick()
        s.add(payload, attack=True, after=after)
    return s.commands


def _quota(choose: Chooser, tenant: str) -> SetQuota:
    cohort = choose.pick(("lab", "lab", "lab", None))
    return SetQuota(
        tenant,
        cohort,
        {"A100": int(choose.pick((0, 2, 4, 8)))},
        borrowing_limit_gpus=choose.pick((None, None, 0, 4)) if cohort else None,
        lending_limit_gpus=choose.pick((None, None, 2)) if cohort else None,
        weight=int(choose.pick((1, 1, 2))),
    )


def _depends(choose: Chooser, jobs: list[str]) -> tuple[str, ...]:
    if not jobs or choose.pick((True, True, False)):
        return ()
    return (str(choose.pick(tuple(jobs[-8:]))),)


# ---------------------------------------------------------------- more shapes, found by reading processor/core


def queued_big_gang(node_count: int = 1_000, members: int = 1_024, releases: int = 20) -> list[Command]:
    """A big gang that waits, and pods that come and go: every ``Release`` retries the gang in full.

    ``node_count`` full 8-GPU nodes run 1-GPU pods of priority 10; a gang of ``members`` 1-GPU members at
    priority 10 may preempt, but only lower-priority pods, of which there are too few (one node's worth at
    priority 0), so it waits. Each ``Release`` of a pod frees a GPU its members fit: ``_capacity_grew`` retries the gang
    (``gangs.try_place`` member by member, then ``gang_preemption.plan_gang``), which fails again.
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    s.extend(fill(1, GPUS, prefix="low"))
    s.extend(fill(node_count - 1, (node_count - 1) * GPUS, priority=10))
    gang = tuple(GangMember(f"g-{i}", 1, 1000, 1000, 1024) for i in range(members))
    s.add(SubmitGang("g", "t", 10, gang))
    for i in range(releases):
        s.add(Release(f"f{i}-0"), attack=True)
    return s.commands


def unique_node_labels(node_count: int = 1_000, pods: int | None = None, submits: int = 20) -> list[Command]:
    """Every node carries its own ``hostname`` label (as every Kubernetes node does): no two nodes share a
    capacity signature, so the index holds one group per node and a placement looks at all of them.

    ``submits`` pods of 1 GPU are submitted (attack) after a fill that leaves one GPU free on every node
    (``pods=0``: no fill; each placement of the fill costs what an attack costs, O(N), so at 10,000 nodes and
    100,000 pods the fill alone takes tens of minutes).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(AddNode(node_id(i), CPU, MEMORY, "A100", GPUS, {"hostname": node_id(i)}) for i in range(node_count))
    total = pods if pods is not None else node_count * GPUS
    if total:
        s.extend(fill(node_count, total))
        s.extend(Release(f"f{n}-1") for n in range(node_count))  # one GPU (at least) free on every node
    for i in range(submits):
        s.add(SubmitPod(f"u{i}", "t", 0, 1, 1000, 1000, 1024), attack=True)
    return s.commands


def distinct_priorities(node_count: int = 1_000, pods: int | None = None, submits: int = 5) -> list[Command]:
    """Every running pod has a priority of its own: each node is a class of the preemption index of its own
    and every priority level is a level, so a preempting pod's search visits every node and level.

    The cluster is full; ``submits`` 8-GPU pods of the top priority preempt one node each (attack).
    """
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    total = pods if pods is not None else node_count * GPUS
    fills = fill(node_count, total)
    for i, pod in enumerate(fills):
        pod.priority = i
    s.extend(fills)
    for i in range(submits):
        s.add(SubmitPod(f"top{i}", "t", len(fills) + 1, GPUS, 1000, 1000, 1024), attack=True)
    return s.commands


def never_preempting_waits(node_count: int = 1_000, pods: int | None = None, submits: int = 20) -> list[Command]:
    """Pods that say ``preemption: never`` and fit nowhere: each one's queue reason counts the nodes where it
    would fit once lower-priority pods end (``_waiting_for_preemption``), node by node over the cluster."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS))
    for i in range(submits):
        s.add(SubmitPod(f"nv{i}", "t", 10, 1, 1000, 1000, 1024, preemption="never"), attack=True)
    return s.commands


def wide_gang_released(node_count: int = 1_024, shapes: int = 2_000) -> list[Command]:
    """A gang of one 8-GPU member per node (at most 1,024: ``MAX_GANG_MEMBERS``) ends while ``shapes``
    distinct shapes wait: ``_capacity_grew`` gets every node the gang held and screens every waiting group
    against each of their signatures."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    gang = tuple(GangMember(f"w-{i}", GPUS, 1000, 1000, 1024) for i in range(node_count))
    s.add(SubmitGang("wide", "t", 0, gang))
    for i in range(shapes):
        s.add(SubmitPod(f"s{i}", "t", 0, 1, 1000, 1000, MEMORY + 1 + i))
    s.add(ReleaseGang("wide"), attack=True)
    return s.commands


def consolidate(node_count: int = 1_000, pods: int | None = None) -> list[Command]:
    """``Defragment`` without a target on a cluster of movable GPU shares: half shares, every GPU half used."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    count = pods if pods is not None else node_count * GPUS
    per_node = max(1, min(count // node_count, GPUS))
    for n in range(node_count):
        s.extend(SubmitPod(f"h{n}-{j}", "t", 0, 1, 500, 1000, 1024, movable=True) for j in range(2 * per_node))
        s.extend(Release(f"h{n}-{j}") for j in range(0, 2 * per_node, 2))
    s.add(Defragment(100), attack=True)
    return s.commands


def baseline(node_count: int = 1_000, pods: int | None = None, rounds: int = 1_000) -> list[Command]:
    """Not adversarial: the yardstick. A full cluster (:func:`fill`), then ``rounds`` times a ``Release`` and a
    plain ``SubmitPod`` of the same shape, which starts where the released pod ran (both are the attack)."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    fills = fill(node_count, pods if pods is not None else node_count * GPUS)
    s.extend(fills)
    for i in range(min(rounds, len(fills))):
        pod = fills[(i * 7919) % len(fills)] if len(fills) > 7919 else fills[i]
        s.add(Release(pod.pod_id), attack=True)
        s.add(SubmitPod(f"b{i}", "t", 0, pod.num_gpu, pod.gpu_milli, 1_000, 1_024), attack=True)
    return s.commands


def queue_retries(node_count: int = 1_000, pods: int | None = None, shapes: int = 2_000) -> list[Command]:
    """Commands that retry the whole queue: ``shapes`` distinct shapes of tenant ``q`` wait on a full cluster,
    and each attack command makes every one of them look again (quota grown, default quota set, strict FIFO
    lifted, quota removed), or evicts and re-places (drain, forced removal), or changes a node (cordon,
    uncordon, add). Covers the command types the other cases do not."""
    s = Stream()
    s.add(first_fit())
    s.extend(nodes(node_count))
    s.add(SetQuota("q", "lab", {"A100": 8}))
    s.extend(fill(node_count, pods if pods is not None else node_count * GPUS))
    for i in range(shapes):
        s.add(SubmitPod(f"s{i}", "q", 0, 1, 1000, 1000 + i, 1024))
    s.add(SetQuota("q", "lab", {"A100": 16}), attack=True)
    s.add(SetPolicy(default_quota=Quota(nominal_gpus={"A100": 8})), attack=True)
    s.add(SetPolicy(queue_order="strict-fifo"), attack=True)
    s.add(SetPolicy(queue_order="skip-ahead"), attack=True)
    s.add(RemoveQuota("q"), attack=True)
    s.add(CordonNode(node_id(0)), attack=True)
    s.add(UncordonNode(node_id(0)), attack=True)
    s.add(DrainNode(node_id(1)), attack=True)
    s.add(RemoveNode(node_id(2), True), attack=True)
    s.add(AddNode(node_id(node_count), 1_000, 1_024, "A100", 1), attack=True)
    return s.commands
