"""Hypothesis strategies for fold commands, and a small harness shared by the fold tests.

Ids come from a small space (5 nodes, 8 pods, 2 clusters, a few models) so that
duplicates, unknown ids, busy nodes and releases of released pods happen often.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from processor.core.fold import decide
from processor.core.snapshot import to_snapshot
from processor.core.state import PartitionState
from schemas import EVENT, registry
from schemas.commands import (
    BORROW_MODES,
    RECLAIM_MODES,
    WITHIN_TENANT_MODES,
    AddNode,
    Command,
    CommandPayload,
    CordonNode,
    Defragment,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Quota,
    QuotaPreemption,
    RecoverNode,
    Release,
    ReleaseGang,
    RemoveDisruptionBudget,
    RemoveNode,
    RemoveQuota,
    Retry,
    SetDisruptionBudget,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Taint,
    Tick,
    Toleration,
    UncordonNode,
    UpdateNode,
)
from schemas.events import Event
from schemas.snapshots import encode_snapshot_body
from tests.adversarial import Chooser, T, mixed_stream

NODE_IDS = tuple(f"n{i}" for i in range(5))
POD_IDS = tuple(f"p{i}" for i in range(8))
MODELS = ("A100", "V100")
POLICIES = ("first-fit", "best-fit", "spread")
TAINTS = (Taint("dedicated", "ml"), Taint("spot", "", "NoExecute"), Taint("soft", "", "PreferNoSchedule"))
TOLERATIONS = (
    Toleration("dedicated", "Equal", "ml"),
    Toleration("spot", "Exists"),
    Toleration("", "Exists"),
    Toleration("dedicated", "Equal", "other", "NoSchedule"),
)


# ---------------------------------------------------------------- payload strategies


@st.composite
def add_nodes(draw: st.DrawFn) -> AddNode:
    model = draw(st.sampled_from(("A100", "V100", "")))
    gpu_count = draw(st.sampled_from((1, 2, 4, 8))) if model else 0
    return AddNode(
        draw(st.sampled_from(NODE_IDS)),
        cpu_milli=draw(st.sampled_from((4000, 8000, 32000))),
        memory_mib=draw(st.sampled_from((8192, 65536))),
        gpu_model=model,
        gpu_count=gpu_count,
        labels=draw(st.sampled_from(({}, {"zone": "a"}, {"zone": "b", "disk": "ssd"}))),
        taints=tuple(draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique=True))),
        gpu_memory_mib=draw(st.sampled_from((0, 0, 16_384, 40_960))) if gpu_count else 0,
    )


@st.composite
def submit_pods(draw: st.DrawFn) -> SubmitPod:
    kind = draw(st.sampled_from(("cpu", "share", "whole", "whole")))
    if kind == "cpu":
        num_gpu, gpu_milli = 0, 0
    elif kind == "share":
        num_gpu, gpu_milli = 1, draw(st.sampled_from((100, 250, 500, 700)))
    else:
        num_gpu, gpu_milli = draw(st.sampled_from((1, 2, 4))), 1000
    cpu = draw(st.sampled_from((0, 500, 2000, 6000))) if kind != "cpu" else draw(st.sampled_from((500, 2000, 6000)))
    return SubmitPod(
        draw(st.sampled_from(POD_IDS)),
        tenant=draw(st.sampled_from(("t1", "t2"))),
        priority=draw(st.sampled_from((0, 0, 1, 5))),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        cpu_milli=cpu,
        memory_mib=draw(st.sampled_from((0, 1024, 8192, 40000))),
        gpu_models=tuple(draw(st.sampled_from(((), (), ("A100",), ("V100",), ("V100", "A100"))))),
        node_selector=draw(st.sampled_from(({}, {}, {"zone": "a"}, {"zone": "b", "disk": "ssd"}))),
        tolerations=tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2))),
        gpu_memory_mib=draw(st.sampled_from((0, 0, 8_192, 20_000, 40_000))) if num_gpu else 0,
    )


node_ids = st.sampled_from(NODE_IDS)


@st.composite
def update_nodes(draw: st.DrawFn) -> UpdateNode:
    """New labels and/or taints (None keeps them), NoExecute among them often."""
    labels = draw(st.sampled_from((None, {}, {"zone": "a"}, {"zone": "b", "disk": "ssd"})))
    taints = draw(st.one_of(st.none(), st.lists(st.sampled_from(TAINTS), max_size=2, unique=True).map(tuple)))
    return UpdateNode(draw(node_ids), labels, taints)


payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    add_nodes(),
    submit_pods(),
    submit_pods(),
    submit_pods(),
    submit_pods(),
    st.builds(Release, st.sampled_from(POD_IDS)),
    st.builds(Release, st.sampled_from(POD_IDS)),
    st.builds(Release, st.sampled_from(POD_IDS)),
    st.builds(RemoveNode, node_ids, st.booleans()),
    st.builds(CordonNode, node_ids),
    st.builds(UncordonNode, node_ids),
    st.builds(DrainNode, node_ids),
    st.builds(MarkNodeFailed, node_ids, st.sampled_from(("", "ecc"))),
    st.builds(SetPolicy, st.sampled_from((*POLICIES, "no-such-policy"))),
    st.builds(RecoverNode, node_ids),
    update_nodes(),
)


@st.composite
def command_streams(draw: st.DrawFn, min_size: int = 8, max_size: int = 60) -> list[Command]:
    """A stream of commands: a few AddNodes, then a mix of everything.

    About one command in twelve reuses an earlier command id; one in eight goes to a second cluster.
    """
    bodies = draw(st.lists(add_nodes(), min_size=2, max_size=5))
    bodies += draw(st.lists(payloads, min_size=min_size, max_size=max_size))
    commands: list[Command] = []
    for i, payload in enumerate(bodies):
        command_id = f"cmd-{i}"
        if commands and draw(st.sampled_from(_ONE_IN_TWELVE)):
            command_id = draw(st.sampled_from(commands)).command_id
        cluster = draw(st.sampled_from(_CLUSTERS))
        commands.append(Command(command_id, cluster, 1_000 * i, payload, source="hypothesis"))
    return commands


# sampled_from draws uniformly (plain integers are biased towards 0).
_ONE_IN_TWELVE = (False,) * 11 + (True,)
_CLUSTERS = ("c0",) * 7 + ("c1",)


# ---------------------------------------------------------------- harness


@dataclass
class Fold:
    """A partition state with a counter for command ids and offsets: the fold as a test drives it."""

    state: PartitionState = field(default_factory=PartitionState)
    cluster_name: str = "c0"
    count: int = 0

    def run(self, payload: CommandPayload, command_id: str | None = None, at: int | None = None) -> list[Event]:
        """Decide one command (a fresh id unless given; issued 1 s after the previous one unless ``at``)."""
        self.count += 1
        issued_at = 1000 * self.count if at is None else at
        return decide(self.state, Command(command_id or f"cmd-{self.count}", self.cluster_name, issued_at, payload))

    def run_all(self, *payloads: CommandPayload) -> list[Event]:
        events: list[Event] = []
        for payload in payloads:
            events.extend(self.run(payload))
        return events

    @property
    def cluster(self) -> Any:
        return self.state.clusters[self.cluster_name]

    def placement(self, pod_id: str) -> str | None:
        """The node a pod runs on (None if queued)."""
        return self.cluster.pods[pod_id].node_id


def types(events: list[Event]) -> list[str]:
    return [event.type_name for event in events]


def encode_events(events: list[Event]) -> list[bytes]:
    codec = registry().codec(EVENT)
    return [codec.encode(event.to_avro()) for event in events]


def clusters_hash(state: PartitionState) -> str:
    """A hash of the allocation state only (clusters, nodes, pods): no position, clock, timers, idempotency window
    or count of commands a halted cluster refused (bookkeeping that a refusal moves, like the window)."""
    snapshot = to_snapshot(state)
    snapshot.next_offset, snapshot.sequence, snapshot.seen, snapshot.clock = 0, 0, (), 0
    for cluster in snapshot.clusters:  # pending reservation checks are timers: time passing pops them
        cluster.reserve_checks = ()
        cluster.preempt_checks = ()
        cluster.clock = 0  # each cluster's clock, as the partition's above
        if cluster.halted is not None:
            cluster.halted.refused = 0
    return hashlib.sha256(encode_snapshot_body(snapshot)).hexdigest()


# ---------------------------------------------------------------- wild values (anything the schema can carry)

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
SIZES32 = st.one_of(st.sampled_from((-1, 0, 1, 2, 1000, 1001, 64, 65)), INT32)
SIZES64 = st.one_of(st.sampled_from((-1, 0, 1, 1000, 100_000_000, 100_000_001, 1 << 30, (1 << 30) + 1)), INT64)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_VALID_IDS = st.sampled_from(("n0", "n1", "p0", "p1", "zone", "c0"))
WILD_IDS = st.one_of(
    _VALID_IDS, _VALID_IDS, _VALID_IDS, st.sampled_from(("", " ", "a\nb", "x" * 254, "\u00e9t\u00e9")), TEXT
)

wild_payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    st.builds(
        AddNode,
        WILD_IDS,
        SIZES64,
        SIZES64,
        st.one_of(st.sampled_from(("", "A100", "bad model", "-x")), TEXT),
        SIZES32,
        st.dictionaries(WILD_IDS, TEXT, max_size=2),
        st.lists(
            st.builds(Taint, WILD_IDS, TEXT, st.one_of(st.sampled_from(("NoSchedule", "NoExecute")), TEXT)), max_size=2
        ).map(tuple),
    ),
    st.builds(
        SubmitPod,
        WILD_IDS,
        WILD_IDS,
        INT32,
        SIZES32,
        SIZES32,
        SIZES64,
        SIZES64,
        st.lists(st.one_of(st.sampled_from(MODELS), TEXT), max_size=2).map(tuple),
        st.dictionaries(WILD_IDS, TEXT, max_size=2),
        st.lists(
            st.builds(Toleration, WILD_IDS, st.one_of(st.sampled_from(("Equal", "Exists")), TEXT), TEXT, TEXT),
            max_size=2,
        ).map(tuple),
    ),
    st.builds(Release, WILD_IDS, TEXT),
    st.builds(RemoveNode, WILD_IDS, st.booleans()),
    st.builds(CordonNode, WILD_IDS),
    st.builds(UncordonNode, WILD_IDS),
    st.builds(DrainNode, WILD_IDS),
    st.builds(MarkNodeFailed, WILD_IDS, TEXT),
    st.builds(SetPolicy, st.one_of(st.sampled_from(POLICIES), TEXT)),
)


@st.composite
def wild_commands(draw: st.DrawFn) -> Command:
    """One command with any values the Avro schema can carry: empty, huge, negative, odd unicode."""
    return Command(
        draw(
            st.one_of(
                st.sampled_from(("cmd-0", "w1", "w2", "w3")),
                st.text(st.characters(categories=("L", "N")), min_size=1, max_size=8).map("w-".__add__),
                WILD_IDS,
            )
        ),
        draw(st.one_of(st.just("c0"), st.just("c0"), st.just("c0"), WILD_IDS)),
        draw(st.one_of(st.just(1), st.just(2), st.just(3), INT64)),
        draw(wild_payloads),
        draw(TEXT),
    )


# ---------------------------------------------------------------- jobs: gangs, time limits, dependencies, time


GANG_IDS = tuple(f"g{i}" for i in range(4))
JOB_IDS = (*POD_IDS, *GANG_IDS, "g0-0", "g1-1", "later")  # what depends_on may name (some never submitted)
RACKS = ("r0", "r1")


@st.composite
def rack_nodes(draw: st.DrawFn) -> AddNode:
    """An 8- or 4-GPU node in one of two racks of one block (topology labels as ordinary labels)."""
    rack = draw(st.sampled_from(RACKS))
    return AddNode(
        draw(st.sampled_from(NODE_IDS)),
        cpu_milli=32000,
        memory_mib=65536,
        gpu_model="A100",
        gpu_count=draw(st.sampled_from((4, 8))),
        labels={"topology/rack": rack, "topology/block": "b0"},
    )


@st.composite
def timed_pods(draw: st.DrawFn) -> SubmitPod:
    pod = draw(submit_pods())
    pod.gpu_models, pod.node_selector, pod.tolerations = (), {}, ()
    pod.time_limit_ms = draw(st.sampled_from((None, None, 5_000, 60_000, 400_000)))
    pod.depends_on = tuple(draw(st.lists(st.sampled_from(JOB_IDS), max_size=2, unique=True)))
    pod.dependency = draw(st.sampled_from(("afterok", "afterany")))
    pod.retry = draw(st.sampled_from((None, None, Retry(1, 5_000, 5_000), Retry(3, 1_000, 30_000))))
    return pod


@st.composite
def submit_gangs(draw: st.DrawFn) -> SubmitGang:
    gang_id = draw(st.sampled_from(GANG_IDS))
    size = draw(st.integers(1, 3))
    members = tuple(
        GangMember(
            f"{gang_id}-{i}",
            *draw(st.sampled_from(((4, 1000), (8, 1000), (2, 1000), (1, 500), (0, 0)))),
            cpu_milli=draw(st.sampled_from((1000, 4000))),
            memory_mib=1024,
        )
        for i in range(size)
    )
    topology = draw(st.sampled_from((None, None, "required", "preferred")))
    key = draw(st.sampled_from(("topology/rack", "topology/block")))
    return SubmitGang(
        gang_id,
        tenant=draw(st.sampled_from(("t1", "t2"))),
        priority=draw(st.sampled_from((0, 0, 5, 10))),
        members=members,
        min_members=draw(st.sampled_from((None, None, 1))),
        topology_required=key if topology == "required" else None,
        topology_preferred=key if topology == "preferred" else None,
        timeout_ms=draw(st.sampled_from((None, 30_000, 600_000))),
        time_limit_ms=draw(st.sampled_from((None, 20_000, 300_000))),
        depends_on=tuple(draw(st.lists(st.sampled_from(JOB_IDS), max_size=2, unique=True))),
        dependency=draw(st.sampled_from(("afterok", "afterany"))),
    )


job_payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    rack_nodes(),
    timed_pods(),
    timed_pods(),
    timed_pods(),
    submit_gangs(),
    submit_gangs(),
    st.builds(Release, st.sampled_from((*POD_IDS, "g0-0", "g1-1", "g2-0"))),
    st.builds(Release, st.sampled_from(POD_IDS), st.sampled_from(("completed", "failed"))),
    st.builds(ReleaseGang, st.sampled_from(GANG_IDS), st.sampled_from(("completed", "cancelled"))),
    st.builds(DrainNode, node_ids),
    st.builds(MarkNodeFailed, node_ids),
    st.builds(UncordonNode, node_ids),
    st.builds(RemoveNode, node_ids, st.just(True)),
    st.builds(RecoverNode, node_ids),
    # New taints only: a running gang keeps the domain it started in (labels changed under it would move it).
    st.builds(UpdateNode, node_ids, st.none(), st.lists(st.sampled_from(TAINTS), max_size=2, unique=True).map(tuple)),
    st.just(Tick()),
    st.builds(
        SetPolicy,
        st.sampled_from(("", "best-fit", "first-fit", "fgd-plus")),
        st.sampled_from((None, None, -1, 0, 60_000, 300_000)),
        st.sampled_from(("", "", "skip-ahead", "strict-fifo")),
    ),
)


@st.composite
def job_streams(draw: st.DrawFn, min_size: int = 8, max_size: int = 50) -> list[Command]:
    """Racks of nodes, then gangs, time-limited and dependent pods, releases, failures and ticks.

    Event time jumps by seconds to minutes (so limits, timeouts and reservations come due), and
    about one command in ten is late (issued before the clock)."""
    settings = SetPolicy(
        draw(st.sampled_from(("best-fit", "first-fit", "fgd-plus"))),
        draw(st.sampled_from((0, 0, 30_000, 300_000, -1))),
        draw(st.sampled_from(("skip-ahead", "skip-ahead", "skip-ahead", "strict-fifo"))),
    )
    bodies: list[CommandPayload] = [settings, *draw(st.lists(rack_nodes(), min_size=2, max_size=5))]
    bodies += draw(st.lists(job_payloads, min_size=min_size, max_size=max_size))
    commands: list[Command] = []
    clock = 0
    for i, payload in enumerate(bodies):
        step = draw(st.sampled_from((0, 1_000, 1_000, 10_000, 60_000, 400_000)))
        clock += step
        issued = clock - draw(st.sampled_from((0,) * 9 + (30_000,)))
        command_id = f"cmd-{i}"
        if commands and draw(st.sampled_from(_ONE_IN_TWELVE)):
            command_id = draw(st.sampled_from(commands)).command_id
        commands.append(Command(command_id, draw(st.sampled_from(_CLUSTERS)), max(issued, 0), payload, "hypothesis"))
    return commands


@st.composite
def contended_streams(draw: st.DrawFn, min_size: int = 10, max_size: int = 60) -> list[Command]:
    """Four 8-GPU nodes in two racks, contended by big and small pods and gangs, so reservations are made,
    backfilled, superseded and released; time moves by seconds to minutes, with ticks."""
    reserve = draw(st.sampled_from((0, 10_000, 60_000)))
    bodies: list[CommandPayload] = [SetPolicy(draw(st.sampled_from(("best-fit", "first-fit", "fgd-plus"))), reserve)]
    bodies += [
        AddNode(f"n{i}", 32000, 65536, "A100", 8, {"topology/rack": f"r{i // 2}", "topology/block": "b0"})
        for i in range(4)
    ]
    limits = st.sampled_from((None, 5_000, 30_000, 120_000))
    submitted = 0
    for _ in range(draw(st.integers(min_size, max_size))):
        kind = draw(st.sampled_from(("pod", "pod", "pod", "gang", "release", "release", "release-gang", "tick")))
        if kind == "pod":
            gpus = draw(st.sampled_from((1, 2, 4, 8, 8)))
            priority = draw(st.sampled_from((0, 0, 5)))
            bodies.append(SubmitPod(f"q{submitted}", "t", priority, gpus, 1000, 1000, time_limit_ms=draw(limits)))
            submitted += 1
        elif kind == "gang":
            size, gpus = draw(st.sampled_from(((2, 8), (3, 4), (1, 8))))
            members = tuple(GangMember(f"q{submitted}-{i}", gpus, 1000, 1000) for i in range(size))
            rack = draw(st.sampled_from((None, "topology/rack")))
            bodies.append(
                SubmitGang(f"q{submitted}", members=members, topology_required=rack, time_limit_ms=draw(limits))
            )
            submitted += 1
        elif kind == "release" and submitted:
            bodies.append(Release(f"q{draw(st.integers(0, submitted - 1))}"))
        elif kind == "release-gang" and submitted:
            bodies.append(ReleaseGang(f"q{draw(st.integers(0, submitted - 1))}"))
        else:
            bodies.append(Tick())
    commands: list[Command] = []
    clock = 0
    for i, payload in enumerate(bodies):
        clock += draw(st.sampled_from((0, 1_000, 5_000, 20_000, 90_000)))
        commands.append(Command(f"cmd-{i}", "c0", clock, payload, "hypothesis"))
    return commands


# ---------------------------------------------------------------- sharing: tenants, quotas, priorities, moves

TENANTS = ("t1", "t2", "t3")


@st.composite
def set_quotas(draw: st.DrawFn) -> SetQuota:
    nominal = draw(
        st.sampled_from(({}, {"A100": 4}, {"A100": 8}, {"A100": 2, "*": 2}, {"*": 6}, {"A100": 0, "V100": 2}))
    )
    cohort = draw(st.sampled_from((None, "lab", "lab")))
    return SetQuota(
        draw(st.sampled_from(TENANTS)),
        cohort=cohort,
        nominal_gpus=dict(nominal),
        nominal_cpu_milli=draw(st.sampled_from((None, None, 8000, 40_000))),
        borrowing_limit_gpus=draw(st.sampled_from((None, 0, 2))) if cohort else None,
        lending_limit_gpus=draw(st.sampled_from((None, 1))) if cohort else None,
        weight=draw(st.sampled_from((1, 1, 2, 3))),
        preemption=draw(st.one_of(st.none(), quota_preemptions())),
    )


@st.composite
def quota_preemptions(draw: st.DrawFn) -> QuotaPreemption:
    """Every value of every policy of ``SetQuota.preemption`` (issue #24)."""
    return QuotaPreemption(
        draw(st.sampled_from(WITHIN_TENANT_MODES)),
        draw(st.sampled_from(RECLAIM_MODES)),
        draw(st.sampled_from(BORROW_MODES)),
        draw(st.sampled_from((None, 0, 1, 3))),
    )


@st.composite
def shared_pods(draw: st.DrawFn, ids: tuple[str, ...] = POD_IDS) -> SubmitPod:
    kind = draw(st.sampled_from(("share", "whole", "whole", "cpu")))
    if kind == "cpu":
        num_gpu, milli = 0, 0
    elif kind == "share":
        num_gpu, milli = 1, draw(st.sampled_from((250, 500, 700)))
    else:
        num_gpu, milli = draw(st.sampled_from((1, 2, 4))), 1000
    return SubmitPod(
        draw(st.sampled_from(ids)),
        tenant=draw(st.sampled_from(TENANTS)),
        priority=draw(st.sampled_from((0, 0, 1, 3, 10))),
        num_gpu=num_gpu,
        gpu_milli=milli,
        cpu_milli=draw(st.sampled_from((500, 2000, 8000))),
        memory_mib=draw(st.sampled_from((1024, 8192))),
        gpu_models=draw(st.sampled_from(((), (), ("A100",), ("V100",)))),
        time_limit_ms=draw(st.sampled_from((None, None, 20_000, 200_000))),
        preemption=draw(st.sampled_from(("lower_priority", "lower_priority", "lower_priority", "never"))),
        movable=draw(st.booleans()),
        preemptible=draw(st.sampled_from((True, True, True, False))),
    )


@st.composite
def shared_gangs(draw: st.DrawFn) -> SubmitGang:
    gang_id = draw(st.sampled_from(GANG_IDS[:2]))
    roles = draw(st.booleans())  # contract v4: members with roles and a minimum per role (all valid)
    members = tuple(
        GangMember(
            f"{gang_id}-{i}",
            *draw(st.sampled_from(((2, 1000), (1, 1000), (1, 500)))),
            cpu_milli=1000,
            role=draw(st.sampled_from(("ps", "worker"))) if roles else None,
        )
        for i in range(draw(st.integers(1, 3 if roles else 2)))
    )
    min_members = draw(st.sampled_from((None, None, 1, 2)))
    if min_members is not None and min_members > len(members):
        min_members = None
    per_role: dict[str, int] = {}
    if roles:
        budget = min_members if min_members is not None else len(members)
        for role in ("ps", "worker"):
            have = sum(1 for m in members if m.role == role)
            if have:
                per_role[role] = min(budget, draw(st.integers(0, have)))
                budget -= per_role[role]
    return SubmitGang(
        gang_id,
        tenant=draw(st.sampled_from(TENANTS)),
        priority=draw(st.sampled_from((0, 1, 3, 10))),
        members=members,
        topology_required=draw(st.sampled_from((None, None, "topology/rack"))),
        preemption=draw(st.sampled_from(("lower_priority", "never"))),
        min_members=min_members,
        timeout_ms=draw(st.sampled_from((None, None, 30_000))),
        preemptible=draw(st.sampled_from((True, True, False))),
        disruption=draw(st.sampled_from(("all", "above_min"))) if roles else "all",
        min_members_per_role=per_role,
    )


sharing_payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    shared_pods(),
    shared_pods(),
    shared_pods(),
    shared_pods(),
    shared_gangs(),
    set_quotas(),
    st.builds(RemoveQuota, st.sampled_from(TENANTS)),
    st.builds(Release, st.sampled_from((*POD_IDS, "g0-0", "g1-1"))),
    st.builds(Release, st.sampled_from(POD_IDS)),
    st.builds(ReleaseGang, st.sampled_from(GANG_IDS[:2])),
    st.builds(MarkNodeFailed, node_ids),
    st.builds(DrainNode, node_ids),
    st.builds(UncordonNode, node_ids),
    st.just(Tick()),
    st.builds(Defragment, st.sampled_from((0, 2, 8)), st.sampled_from((None, None, *POD_IDS[:3], "g0"))),
    st.builds(
        SetPolicy,
        st.just(""),
        st.just(None),
        st.just(""),
        st.sampled_from((Quota(nominal_gpus={"*": 4}), Quota(weight=2), Quota())),
    ),
)


@st.composite
def sharing_streams(draw: st.DrawFn, min_size: int = 10, max_size: int = 50) -> list[Command]:
    """Racked A100 and V100 nodes, then tenants with quotas (cohorts, borrowing and lending limits, weights, a
    default), pods and gangs of several priorities that may preempt or not and may move, releases, failures,
    drains, ticks and Defragment; time moves by seconds to minutes."""
    bodies: list[CommandPayload] = [
        SetPolicy(draw(st.sampled_from(("best-fit", "first-fit", "fgd-plus"))), draw(st.sampled_from((-1, 60_000))))
    ]
    for i in range(draw(st.integers(2, 5))):
        model = draw(st.sampled_from(("A100", "A100", "V100")))
        bodies.append(
            AddNode(
                NODE_IDS[i], 32_000, 65_536, model, draw(st.sampled_from((2, 4, 8))), {"topology/rack": f"r{i % 2}"}
            )
        )
    bodies += draw(st.lists(set_quotas(), min_size=0, max_size=3))
    bodies += draw(st.lists(sharing_payloads, min_size=min_size, max_size=max_size))
    commands: list[Command] = []
    clock = 0
    for i, payload in enumerate(bodies):
        clock += draw(st.sampled_from((0, 1_000, 5_000, 60_000)))
        commands.append(Command(f"cmd-{i}", "c0", clock, payload, "hypothesis"))
    return commands


PREEMPTION_PODS = tuple(f"p{i}" for i in range(10))  # with one 2-member gang: at most 12 pods at a time


@st.composite
def preemption_streams(draw: st.DrawFn) -> list[Command]:
    """At most 6 nodes and 12 pods: plain pods and small gangs of several priorities filling the cluster,
    releases and time passing, so that pods preempt; small enough to search every victim set."""
    bodies: list[CommandPayload] = [SetPolicy(draw(st.sampled_from(("best-fit", "first-fit", "spread"))), -1)]
    for i in range(draw(st.integers(1, 6))):
        bodies.append(
            AddNode(f"n{i}", draw(st.sampled_from((4000, 16_000))), 65_536, "A100", draw(st.sampled_from((1, 2, 4))))
        )
    for _ in range(draw(st.integers(12, 36))):
        roll = draw(st.sampled_from(("pod", "pod", "pod", "pod", "pod", "gang", "release", "tick")))
        if roll == "pod":
            num_gpu, milli = draw(st.sampled_from(((1, 1000), (1, 1000), (2, 1000), (1, 500), (1, 300), (0, 0))))
            cpu = draw(st.sampled_from((500, 2000)))
            pod_id, priority = draw(st.sampled_from(PREEMPTION_PODS)), draw(st.integers(0, 3))
            bodies.append(SubmitPod(pod_id, "t", priority, num_gpu, milli, cpu, 1024))
        elif roll == "gang":
            gang = draw(shared_gangs())
            gang.gang_id, gang.topology_required = "g0", None
            gang.members = tuple(
                GangMember(f"g0-{i}", m.num_gpu, m.gpu_milli, m.cpu_milli) for i, m in enumerate(gang.members)
            )
            gang.min_members_per_role, gang.disruption = {}, "all"  # the exhaustive search knows no roles
            bodies.append(gang)
        elif roll == "release":
            bodies.append(Release(draw(st.sampled_from(PREEMPTION_PODS))))
        else:
            bodies.append(Tick())
    commands: list[Command] = []
    clock = 0
    for i, payload in enumerate(bodies):
        clock += draw(st.sampled_from((1_000, 7_000, 60_000)))
        commands.append(Command(f"cmd-{i}", "c0", clock, payload, "hypothesis"))
    return commands


# ---------------------------------------------------------------- adversarial: random mixed streams (issue #20)


class DrawChooser(Chooser):
    """``tests.adversarial.mixed_stream``'s choices drawn by hypothesis (so a failing stream shrinks)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def integer(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))


@st.composite
def mixed_streams(draw: st.DrawFn, min_size: int = 150, max_size: int = 250) -> list[Command]:
    """Pods, gangs with min_members, quotas in a cohort with borrowing and lending limits, priorities,
    preemption modes, dependencies, time limits, drains, failures, releases and ticks on a small cluster:
    ``tests.adversarial.mixed_stream``, drawn by hypothesis."""
    return mixed_stream(DrawChooser(draw), draw(st.integers(min_size, max_size)), draw(st.integers(3, 8)))


# ---------------------------------------------------------------- disruption budgets and graceful drains (issue #25)

BUDGET_IDS = ("b-t1", "b-g0", "b-zone")


@st.composite
def set_budgets(draw: st.DrawFn) -> SetDisruptionBudget:
    budget_id = draw(st.sampled_from(BUDGET_IDS))
    tenant = "t1" if budget_id == "b-t1" else None
    gang_id = "g0" if budget_id == "b-g0" else None
    selector = {"zone": "a"} if budget_id == "b-zone" else None
    return SetDisruptionBudget(budget_id, tenant, gang_id, selector, draw(st.sampled_from((0, 1, 1, 2, 3))))


@st.composite
def retrying_gangs(draw: st.DrawFn) -> SubmitGang:
    """A gang of ``submit_gangs`` with a retry policy or none (``SubmitGang.retry``)."""
    gang = draw(submit_gangs())
    gang.retry = draw(st.sampled_from((None, Retry(1, 1_000, 1_000), Retry(3, 2_000, 5_000))))
    if len(gang.members) > 1 and draw(st.booleans()):  # contract v4: roles, a minimum per role, above_min
        gang.members = tuple(
            dataclasses.replace(m, role="worker" if i % 2 else "ps") for i, m in enumerate(gang.members)
        )
        gang.min_members = draw(st.sampled_from((None, 1, 2)))
        gang.min_members_per_role = {"worker": 1} if gang.min_members != 1 else draw(st.sampled_from(({}, {"ps": 1})))
        gang.disruption = draw(st.sampled_from(("all", "above_min")))
    return gang


disruption_payloads: st.SearchStrategy[CommandPayload] = st.one_of(
    submit_pods(),
    submit_pods(),
    submit_pods(),
    retrying_gangs(),
    set_budgets(),
    set_budgets(),
    st.builds(RemoveDisruptionBudget, st.sampled_from(BUDGET_IDS)),
    st.builds(DrainNode, node_ids, st.sampled_from((0, 0, 2_000, 30_000))),
    st.builds(DrainNode, node_ids, st.sampled_from((0, 5_000)), st.just(False)),
    st.builds(UncordonNode, node_ids),
    st.builds(MarkNodeFailed, node_ids),
    st.builds(RecoverNode, node_ids),
    st.builds(UpdateNode, node_ids, st.none(), st.lists(st.sampled_from(TAINTS), max_size=1).map(tuple)),
    st.builds(Release, st.sampled_from((*POD_IDS, "g0-0", "g1-1")), st.sampled_from(("completed", "failed"))),
    st.just(Tick()),
)


@st.composite
def disruption_streams(draw: st.DrawFn, min_size: int = 10, max_size: int = 50) -> list[Command]:
    """Nodes, pods of two tenants (some asking zone=a) and gangs, budgets set and removed, drains with and without
    grace periods or budgets, uncordons, failures, recoveries, taint updates, releases and ticks; time moves by
    0 to 10 s per command, so grace periods end between commands."""
    bodies: list[CommandPayload] = list(draw(st.lists(add_nodes(), min_size=3, max_size=5)))
    bodies += draw(st.lists(disruption_payloads, min_size=min_size, max_size=max_size))
    commands: list[Command] = []
    clock = 0
    for i, payload in enumerate(bodies):
        clock += draw(st.sampled_from((0, 1_000, 1_000, 3_000, 10_000)))
        commands.append(Command(f"cmd-{i}", draw(st.sampled_from(_CLUSTERS)), clock, payload, "hypothesis"))
    return commands
