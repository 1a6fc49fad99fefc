"""Gangs on the openb cluster: multi-node training jobs among the trace's single pods, in event time.

``gpufold simulate --workload gangs`` runs this closed loop through the fold, once per queueing mode:

- **skip-ahead** (today's rule without reservations): work that fits starts, whatever waits ahead of it;
- **strict-fifo**: nothing starts before every job ahead of it (priority, then age) has started;
- **reserve+backfill** (the default settings): the head of the queue that has waited 5 minutes reserves
  the nodes where it starts soonest; only work whose time limit ends before then may use them (Slurm).

The cluster, and how topology is labelled (the documented rule): the bundled openb GPU nodes, grouped by
GPU model and sorted by node name, in racks of :data:`RACK_NODES` consecutive nodes
(``topology/rack=G2-r7``) and blocks of :data:`BLOCK_RACKS` consecutive racks (``topology/block=G2-b1``).

The workload (all randomness here, seeded, outside the fold), over ``hours`` of event time:

- **single pods**: drawn with replacement from the trace's pods (their shapes, GPU-model constraints and
  real lifetimes, capped at 24 h), arriving as a Poisson process sized so that they ask for
  ``single_load`` of the cluster's GPU capacity on average; each gets a time limit of twice its lifetime
  (a user's over-estimate), so it may backfill;
- **gangs**: multi-node training jobs of whole 8-GPU nodes (64 cores, 256 GiB per member), of
  :data:`GANG_SIZES` nodes with :data:`GANG_WEIGHTS` (most multi-node jobs are small and a few are very
  large, the shape reported for production training clusters: Jeon et al., ATC '19, for Philly; Hu et al.,
  SC '21, for SenseTime's Helios; the exact weights are ours, not fitted to a trace), durations log-uniform
  between 10 minutes and 4 hours, a time limit of 1-2x the duration, topology required (a rack for up to
  8 nodes, a block above), arriving as a Poisson process sized to ask for ``gang_load`` of the capacity of
  the 8-GPU nodes.

The loop feeds the fold commands in event time: each arrival, and when a job starts (its
``PodScheduled``/``GangScheduled``), its release after its lifetime; a ``Tick`` every minute moves time in
quiet periods. It reports GPU utilization over time, each gang size's queueing delay (p50, p99, max), the
largest gang's wait, and checks that no gang was ever partly placed.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufold.trace import TraceNode, TracePod
from processor.core.fold import decide
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from schemas.commands import (
    AddNode,
    Command,
    CommandPayload,
    GangMember,
    Release,
    ReleaseGang,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Tick,
)
from schemas.events import GangScheduled, PodScheduled

CLUSTER = "openb"
RACK_NODES = 8
BLOCK_RACKS = 4
GANG_SIZES = (2, 4, 8, 16, 32)
GANG_WEIGHTS = (0.40, 0.30, 0.17, 0.09, 0.04)
MEMBER = (8, 1000, 64_000, 262_144)  # GPUs, milli per GPU, CPU milli, memory MiB
TICK_MS = 60_000
SAMPLE_MS = 600_000  # utilization sample period
WARM_UP = 0.1  # the first 10% of the horizon is left out of the mean utilization (the cluster fills up)
MINUTE_MS = 60_000
MODES: dict[str, tuple[int, str]] = {  # reserve_after_ms, queue_order
    "skip-ahead": (-1, "skip-ahead"),
    "strict-fifo": (-1, "strict-fifo"),
    "reserve+backfill": (300_000, "skip-ahead"),
}


def topology_labels(nodes: Sequence[TraceNode]) -> dict[str, dict[str, str]]:
    """node name -> {topology/rack, topology/block}: racks of RACK_NODES nodes of one model, blocks of racks."""
    labels: dict[str, dict[str, str]] = {}
    by_model: dict[str, list[str]] = {}
    for node in nodes:
        by_model.setdefault(node.gpu_model or "cpu", []).append(node.name)
    for model in sorted(by_model):
        for position, name in enumerate(sorted(by_model[model])):
            rack = position // RACK_NODES
            labels[name] = {"topology/rack": f"{model}-r{rack}", "topology/block": f"{model}-b{rack // BLOCK_RACKS}"}
    return labels


@dataclass(frozen=True, slots=True)
class Config:
    hours: float = 24.0
    single_load: float = 0.30
    gang_load: float = 0.75
    policy: str = "fgd-plus"


@dataclass(slots=True)
class Arrival:
    at: int
    job_id: str
    payload: SubmitPod | SubmitGang
    lifetime_ms: int
    size: int  # nodes of a gang; 0 for a single pod


def build_arrivals(nodes: Sequence[TraceNode], pods: Sequence[TracePod], seed: int, config: Config) -> list[Arrival]:
    """The seeded workload: single pods from the trace and synthetic gangs, in arrival order."""
    rng = random.Random(seed)
    horizon = int(config.hours * 3_600_000)
    capacity = sum(node.gpu_count for node in nodes)
    eight = sum(node.gpu_count for node in nodes if node.gpu_count >= 8)
    lived = [pod for pod in pods if pod.creation_time is not None and pod.deletion_time is not None]
    if not lived:
        raise ValueError("the pod list has no creation/deletion times to take lifetimes from")
    arrivals: list[Arrival] = []

    def lifetime(pod: TracePod) -> int:
        return max(60_000, min((pod.deletion_time - pod.creation_time) * 1000, 86_400_000))  # type: ignore[operator]

    # Single pods: Poisson arrivals whose mean GPU-time fills single_load of the capacity.
    mean_gpu_ms = statistics.fmean(pod.gpu_milli_total / 1000 * lifetime(pod) for pod in lived)
    rate = config.single_load * capacity / mean_gpu_ms if mean_gpu_ms else 0.0  # pods per ms
    t = 0.0
    serial = 0
    while rate:
        t += rng.expovariate(rate)
        if t >= horizon:
            break
        pod = rng.choice(lived)
        serial += 1
        life = lifetime(pod)
        payload = SubmitPod(
            f"s{serial}", "trace", 0, pod.num_gpu, pod.gpu_milli, pod.cpu_milli, pod.memory_mib, pod.gpu_models,
            time_limit_ms=2 * life + MINUTE_MS,
        )  # fmt: skip
        arrivals.append(Arrival(int(t), f"s{serial}", payload, life, 0))
    # Gangs: Poisson arrivals whose mean node-time fills gang_load of the 8-GPU nodes.
    low, high = 10 * MINUTE_MS, 240 * MINUTE_MS
    mean_duration = (high - low) / math.log(high / low)
    mean_size = sum(s * w for s, w in zip(GANG_SIZES, GANG_WEIGHTS, strict=True))
    rate = config.gang_load * (eight / 8) / (mean_size * mean_duration)
    t = 0.0
    serial = 0
    while rate:
        t += rng.expovariate(rate)
        if t >= horizon:
            break
        size = rng.choices(GANG_SIZES, GANG_WEIGHTS)[0]
        duration = int(math.exp(rng.uniform(math.log(low), math.log(high))))
        serial += 1
        gang_id = f"g{serial}"
        members = tuple(GangMember(f"{gang_id}-{i}", *MEMBER) for i in range(size))
        key = "topology/rack" if size <= RACK_NODES else "topology/block"
        limit = int(duration * rng.uniform(1.0, 2.0)) + MINUTE_MS
        gang = SubmitGang(gang_id, "training", 0, members, topology_required=key, time_limit_ms=limit)
        arrivals.append(Arrival(int(t), gang_id, gang, duration, size))
    arrivals.sort(key=lambda arrival: (arrival.at, arrival.job_id))
    return arrivals


@dataclass
class GangSimulationResult:
    mode: str
    seed: int
    hours: float
    nodes: int
    gpu_capacity: float
    commands: int = 0
    single_pods: int = 0
    gangs: int = 0
    gangs_started: int = 0
    partial_gangs: int = 0
    utilization_pct: float = 0.0  # mean GPU allocation over the samples after the warm-up
    utilization: list[tuple[float, float]] = field(default_factory=list)  # (hour, allocated GPU %)
    gang_wait_s: dict[int, dict[str, float]] = field(default_factory=dict)  # size -> p50, p99, max, started
    largest_gang_max_wait_s: float | None = None
    largest_gang_size: int = 0
    gangs_waiting_at_end: dict[int, int] = field(default_factory=dict)
    pod_wait_p50_s: float = 0.0
    pod_wait_p99_s: float = 0.0
    seconds: float = 0.0
    state_hash: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["gang_wait_s"] = {str(size): stats for size, stats in self.gang_wait_s.items()}
        out["gangs_waiting_at_end"] = {str(size): n for size, n in self.gangs_waiting_at_end.items()}
        return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    mode: str,
    seed: int,
    config: Config = Config(),
    progress: Callable[[int], None] | None = None,
) -> GangSimulationResult:
    """Fold the workload in event time under one queueing mode; see the module docstring."""
    reserve_after_ms, queue_order = MODES[mode]
    arrivals = build_arrivals(nodes, pods, seed, config)
    horizon = int(config.hours * 3_600_000)
    labels = topology_labels(nodes)
    state = PartitionState()
    result = GangSimulationResult(mode, seed, config.hours, len(nodes), sum(n.gpu_count for n in nodes))
    capacity_milli = result.gpu_capacity * 1000
    # The event queue: (time, order, payload); order keeps arrivals, releases and ticks deterministic.
    queue: list[tuple[int, int, str, CommandPayload]] = []
    serial = 0

    def push(at: int, job_id: str, payload: CommandPayload) -> None:
        nonlocal serial
        serial += 1
        heapq.heappush(queue, (at, serial, job_id, payload))

    setup: list[CommandPayload] = [SetPolicy(config.policy, reserve_after_ms, queue_order)]
    for position, node in enumerate(nodes):
        setup.append(
            AddNode(f"{position:05d}-{node.name}", node.cpu_milli, node.memory_mib, node.gpu_model, node.gpu_count,
                    labels[node.name])
        )  # fmt: skip
    for payload in setup:
        push(0, "setup", payload)
    lifetimes: dict[str, int] = {}
    submitted: dict[str, tuple[int, int]] = {}  # job id -> (submit time, gang size or 0)
    for arrival in arrivals:
        push(arrival.at, arrival.job_id, arrival.payload)
        lifetimes[arrival.job_id] = arrival.lifetime_ms
        submitted[arrival.job_id] = (arrival.at, arrival.size)
    for at in range(TICK_MS, horizon + 1, TICK_MS):
        push(at, "tick", Tick())
    result.single_pods = sum(1 for a in arrivals if not a.size)
    result.gangs = sum(1 for a in arrivals if a.size)
    waits: dict[int, list[float]] = {}
    pod_waits: list[float] = []
    started_gangs: set[str] = set()
    started_pods: set[str] = set()
    next_sample = SAMPLE_MS
    started = time.perf_counter()
    offset = 0
    while queue:
        at, _, job_id, payload = heapq.heappop(queue)
        if at > horizon:
            break
        while at >= next_sample:  # sample utilization at each period boundary crossed
            cluster = state.clusters.get(CLUSTER)
            allocated = cluster.gpu_milli_allocated if cluster is not None else 0
            result.utilization.append((next_sample / 3_600_000, round(100 * allocated / capacity_milli, 3)))
            next_sample += SAMPLE_MS
        events = decide(state, Command(f"c{offset}", CLUSTER, at, payload, "gangsim"), offset)
        offset += 1
        for index, event in enumerate(events):
            body = event.payload
            if isinstance(body, GangScheduled):
                size = len(body.members)
                placed = events[index + 1 : index + 1 + size]
                if [e.payload.pod.pod_id for e in placed if isinstance(e.payload, PodScheduled)] != [
                    m.pod_id for m in body.members
                ] or size < body.gang.min_members:
                    result.partial_gangs += 1
                if body.gang_id not in started_gangs:  # requeued gangs restart; the first start counts
                    started_gangs.add(body.gang_id)
                    submit, nodes_asked = submitted[body.gang_id]
                    waits.setdefault(nodes_asked, []).append((event.occurred_at - submit) / 1000)
                push(event.occurred_at + lifetimes[body.gang_id], body.gang_id, ReleaseGang(body.gang_id))
            elif isinstance(body, PodScheduled) and body.pod.gang_id is None and body.pod.pod_id in lifetimes:
                pod_id = body.pod.pod_id
                if pod_id not in started_pods:
                    started_pods.add(pod_id)
                    pod_waits.append((event.occurred_at - submitted[pod_id][0]) / 1000)
                push(event.occurred_at + lifetimes[pod_id], pod_id, Release(pod_id))
        if progress is not None and job_id != "tick":
            progress(1)
    result.commands = offset
    result.seconds = round(time.perf_counter() - started, 3)
    steady = [pct for hour, pct in result.utilization if hour > WARM_UP * config.hours]
    result.utilization_pct = round(statistics.fmean(steady), 3) if steady else 0.0
    result.gangs_started = sum(len(v) for v in waits.values())
    for size in GANG_SIZES:
        values = waits.get(size, [])
        if values:
            result.gang_wait_s[size] = {
                "p50": round(_percentile(values, 0.5), 1),
                "p99": round(_percentile(values, 0.99), 1),
                "max": round(max(values), 1),
                "started": len(values),
            }
    cluster = state.clusters.get(CLUSTER)
    if cluster is not None:
        for gang in cluster.gangs.values():
            if gang.state != "running":
                size = len(gang.spec.members)
                result.gangs_waiting_at_end[size] = result.gangs_waiting_at_end.get(size, 0) + 1
    largest = max((size for size in GANG_SIZES if size in waits or size in result.gangs_waiting_at_end), default=0)
    result.largest_gang_size = largest
    if largest:
        # A gang still waiting at the end has waited at least until then: count that, not nothing.
        still = [
            (horizon - submit) / 1000
            for job, (submit, size) in submitted.items()
            if size == largest and job not in started_gangs
        ]
        result.largest_gang_max_wait_s = round(max(waits.get(largest, []) + still), 1)
    result.pod_wait_p50_s = round(_percentile(pod_waits, 0.5), 1)
    result.pod_wait_p99_s = round(_percentile(pod_waits, 0.99), 1)
    result.state_hash = state_hash(state)
    return result
