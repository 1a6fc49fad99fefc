"""The published FGD experiment (Weng et al., ATC '23), run through the fold.

Method (as in ``kubernetes-scheduler-simulator``, see the openb trace README):

1. Pods sorted by name. ``rng = random.Random(seed)``.
2. Inflation ("tune 1.3"): random copies of the original pods, drawn with
   replacement with ``rng.choice``, are appended until the next copy would push
   the total GPU request past ``inflate`` x cluster GPU capacity. Copy ``k`` of
   pod ``p`` is named ``p-t<k>``.
3. The pod list is shuffled with ``rng``, then the node list with the same ``rng``.
4. Nodes are added to one cluster in shuffled order, as ``AddNode`` commands whose
   ids start with the shuffled position (``00042-openb-node-0123``), so that the
   fold's tie-break on node id reproduces the shuffled node order.
5. Each pod is a ``SubmitPod``; a pod that does not fit becomes ``PodQueued`` and,
   since nothing is ever released, is never retried: it counts as failed (a
   ``CommandRejected``, e.g. a GPU model no node has, counts as failed as well).
6. After every pod: arrived = total GPU request of the pods tried so far (failed
   ones included) as % of capacity, rounded to a whole percent (``round``, as the
   published analysis does); allocated GPU % is averaged within each bucket.

The fold itself sees only commands: all randomness is here, outside it.

``prior=True`` gives the fold the workload's pod shapes in advance, as the
published FGD had them (its typical pods come from the whole trace): after the
nodes, every original pod is submitted once more with a node selector no node
matches, so it waits in the queue forever (never placed, never counted as
arrived) and only teaches the fold's typical-pod histogram the workload's mix.
Without it the fold learns the mix online from the pods as they arrive.

``defrag_every`` (percent of capacity) adds defragmentation: every pod is submitted with
``movable=true``, and each time the arrived workload crosses another ``defrag_every``% of
GPU capacity a ``Defragment`` with a budget of ``defrag_budget``% of the running pods
(at least one move) is folded. A pod that did not fit stays queued, as the fold keeps it,
so capacity a defragmentation frees may start it later (``late_starts``); with
``withdraw_failed`` each pod that does not fit is released at once instead, so only pods
arriving later can use that capacity (the paper's "failed pods are not retried").
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufold.trace import TraceNode, TracePod, add_node, submit_pod
from processor.core.fold import decide
from processor.core.fragmentation import cluster_fragmentation
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from schemas.commands import Command, Defragment, Release, SetPolicy
from schemas.events import CommandRejected, PodMigrated, PodScheduled

CLUSTER = "openb"
PRIOR_SELECTOR = {"gpufold.simulate/prior": "never-matches"}
DEFAULT_INFLATE = 1.3
DEFAULT_SEEDS = tuple(range(42, 52))


@dataclass(slots=True)
class Workload:
    """One seed's arrival order: node order and pods (with their unique ids)."""

    nodes: list[tuple[str, TraceNode]]
    pods: list[tuple[str, TracePod]]
    gpu_milli_capacity: int


@dataclass(slots=True)
class SimulationResult:
    policy: str
    seed: int
    inflate: float
    prior: bool
    nodes: int
    pods_total: int
    pods_scheduled: int
    pods_failed: int
    pods_rejected: int
    gpu_milli_total: int
    gpu_milli_requested: int
    gpu_milli_allocated: int
    unallocated_gpu_pct_at_100: float | None
    fragmentation_pct_at_100: float | None  # FGD fragment GPU milli as % of capacity, when arrived reached 100%
    fragmentation_pct_of_idle_at_100: float | None
    curve: list[list[float]] = field(default_factory=list)  # [arrived %, mean allocated %] per bucket
    seconds: float = 0.0
    commands_per_sec: float = 0.0
    pods_per_sec: float = 0.0
    state_hash: str = ""
    defrag_every: float | None = None
    defrag_budget: float = 0.0
    withdraw_failed: bool = False
    defragments: int = 0
    moves: int = 0
    pods_moved: int = 0  # distinct pods moved at least once
    late_starts: int = 0  # queued pods that started after a defragmentation
    defrag_cpu_seconds: float = 0.0  # CPU time (time.process_time) of the Defragment commands' decide

    def unallocated_at(self, arrived_pct: int) -> float | None:
        for arrived, allocated in self.curve:
            if arrived == arrived_pct:
                return round(100.0 - allocated, 4)
        return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_workload(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], seed: int, inflate: float = DEFAULT_INFLATE
) -> Workload:
    """The seed's node order and pod arrival order, inflation included (steps 1-3 above)."""
    rng = random.Random(seed)
    capacity = sum(node.gpu_count for node in nodes) * 1000
    ordered = sorted(pods, key=lambda pod: pod.name)
    workload = [(pod.name, pod) for pod in ordered]
    if inflate > 0 and ordered:
        limit = inflate * capacity
        total = sum(pod.gpu_milli_total for pod in ordered)
        copies = 0
        while True:
            pod = rng.choice(ordered)
            if total + pod.gpu_milli_total > limit:
                break
            total += pod.gpu_milli_total
            workload.append((f"{pod.name}-t{copies}", pod))
            copies += 1
    rng.shuffle(workload)
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    width = max(5, len(str(len(shuffled))))
    node_ids = [(f"{position:0{width}d}-{node.name}", node) for position, node in enumerate(shuffled)]
    return Workload(node_ids, workload, capacity)


def run(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    inflate: float = DEFAULT_INFLATE,
    progress: Callable[[int], None] | None = None,
    prior: bool = False,
    defrag_every: float | None = None,
    defrag_budget: float = 1.0,
    withdraw_failed: bool = False,
    observe: Callable[[int, Any], bool] | None = None,
) -> SimulationResult:
    """Run one seed of the experiment through the fold; ``progress(n)`` is called per pod.

    ``observe(bucket, cluster)``, if given, sees the cluster state after each pod (and the ``Defragment``
    it triggers) with the pod's arrived bucket; the run stops early when it returns True."""
    workload = build_workload(nodes, pods, seed, inflate)
    state = PartitionState()
    capacity = workload.gpu_milli_capacity
    commands: list[Command] = [Command("set-policy", CLUSTER, 0, SetPolicy(policy), "simulate")]
    commands += [add_node(node, node_id, CLUSTER) for node_id, node in workload.nodes]
    if prior:
        for pod in sorted(pods, key=lambda pod: pod.name):
            submit = submit_pod(pod, f"prior-{pod.name}", CLUSTER)
            submit.payload.node_selector = dict(PRIOR_SELECTOR)  # type: ignore[union-attr]
            commands.append(submit)
    setup_seconds = 0.0
    started = time.perf_counter()
    for command in commands:
        outcome = decide(state, command)[-1].payload
        if isinstance(outcome, CommandRejected):
            raise ValueError(f"{command.command_id}: {outcome.message}")
    setup_seconds = time.perf_counter() - started
    cluster = state.clusters[CLUSTER]

    buckets: dict[int, list[float]] = {}
    arrived = 0
    scheduled = failed = rejected = 0
    fragmentation_at_100 = None
    submits = [submit_pod(pod, pod_id, CLUSTER) for pod_id, pod in workload.pods]
    if defrag_every:
        for submit in submits:
            submit.payload.movable = True  # type: ignore[union-attr]
    pod_seconds = 0.0
    next_defrag = defrag_every or 0.0
    defragments = moves = late_starts = 0
    defrag_cpu = 0.0
    moved: set[str] = set()
    running = 0
    for submit, (_, pod) in zip(submits, workload.pods, strict=True):
        previous = round(100.0 * arrived / capacity) if capacity else 0
        arrived += pod.gpu_milli_total
        bucket = round(100.0 * arrived / capacity) if capacity else 0
        if previous <= 100 < bucket and fragmentation_at_100 is None:
            fragmentation_at_100 = _fragmentation(cluster)  # after the last pod of the 100% bucket
        tick = time.perf_counter()
        payload = decide(state, submit)[-1].payload
        if isinstance(payload, PodScheduled):
            scheduled += 1
            running += 1
        elif isinstance(payload, CommandRejected):
            rejected += 1
            failed += 1
        else:
            failed += 1
            if withdraw_failed:
                decide(
                    state, Command(f"withdraw-{submit.command_id}", CLUSTER, 0, Release(pod_id_of(submit)), "simulate")
                )
        if defrag_every and capacity and 100.0 * arrived / capacity >= next_defrag:
            while 100.0 * arrived / capacity >= next_defrag:
                next_defrag += defrag_every
            budget = max(1, round(running * defrag_budget / 100.0))
            defragments += 1
            command = Command(f"defrag-{defragments}", CLUSTER, 0, Defragment(budget), "simulate")
            cpu = time.process_time()
            events = decide(state, command)
            defrag_cpu += time.process_time() - cpu
            for event in events:
                if isinstance(event.payload, PodMigrated):
                    moves += 1
                    moved.add(event.payload.pod_id)
                elif isinstance(event.payload, PodScheduled):
                    late_starts += 1
                    running += 1
                    scheduled += 1
        pod_seconds += time.perf_counter() - tick
        allocated_pct = 100.0 * cluster.gpu_milli_allocated / capacity if capacity else 0.0
        entry = buckets.setdefault(bucket, [0.0, 0.0])
        entry[0] += allocated_pct
        entry[1] += 1
        if progress is not None:
            progress(1)
        if observe is not None and observe(bucket, cluster):
            break
    if fragmentation_at_100 is None and buckets and max(buckets) == 100:
        fragmentation_at_100 = _fragmentation(cluster)
    curve = [[float(bucket), round(total / count, 4)] for bucket, (total, count) in sorted(buckets.items())]
    at_100 = next((100.0 - allocated for bucket, allocated in curve if bucket == 100), None)
    elapsed = setup_seconds + pod_seconds
    return SimulationResult(
        policy=policy,
        seed=seed,
        inflate=inflate,
        prior=prior,
        nodes=len(workload.nodes),
        pods_total=len(workload.pods),
        pods_scheduled=scheduled,
        pods_failed=failed,
        pods_rejected=rejected,
        gpu_milli_total=capacity,
        gpu_milli_requested=arrived,
        gpu_milli_allocated=cluster.gpu_milli_allocated,
        unallocated_gpu_pct_at_100=round(at_100, 4) if at_100 is not None else None,
        fragmentation_pct_at_100=fragmentation_at_100[0] if fragmentation_at_100 else None,
        fragmentation_pct_of_idle_at_100=fragmentation_at_100[1] if fragmentation_at_100 else None,
        curve=curve,
        seconds=round(elapsed, 3),
        commands_per_sec=round((len(commands) + len(submits)) / elapsed, 1) if elapsed else 0.0,
        pods_per_sec=round(len(submits) / pod_seconds, 1) if pod_seconds else 0.0,
        state_hash=state_hash(state),
        defrag_every=defrag_every,
        defrag_budget=defrag_budget if defrag_every else 0.0,
        withdraw_failed=withdraw_failed,
        defragments=defragments,
        moves=moves,
        pods_moved=len(moved),
        late_starts=late_starts,
        defrag_cpu_seconds=round(defrag_cpu, 3),
    )


def pod_id_of(command: Command) -> str:
    return command.payload.pod_id  # type: ignore[union-attr]


def _fragmentation(cluster: Any) -> tuple[float, float]:
    frag = cluster_fragmentation(cluster)
    return round(frag.fragment_pct_of_capacity, 4), round(frag.fragment_pct_of_idle, 4)


def summarize(results: Sequence[SimulationResult]) -> dict[str, Any]:
    """Mean and median over seeds of unallocated GPU % and fragmentation % at arrived = 100%."""
    unallocated = [r.unallocated_gpu_pct_at_100 for r in results if r.unallocated_gpu_pct_at_100 is not None]
    fragmentation = [r.fragmentation_pct_at_100 for r in results if r.fragmentation_pct_at_100 is not None]
    speed = [r.pods_per_sec for r in results]

    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"mean": None, "median": None}
        return {"mean": round(statistics.fmean(values), 4), "median": round(statistics.median(values), 4)}

    return {
        "policy": results[0].policy if results else None,
        "seeds": [r.seed for r in results],
        "unallocated_gpu_pct_at_100": stats(unallocated),
        "fragmentation_pct_at_100": stats(fragmentation),
        "pods_per_sec": stats(speed),
    }


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,43,50`` (or a mix) -> a list of seeds, in order."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            start, end = int(low), int(high)
            if end < start:
                raise ValueError(f"empty seed range {part!r}")
            seeds.extend(range(start, end + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return seeds


def plot(results_by_policy: dict[str, list[SimulationResult]], path: str, title: str = "") -> None:
    """Unallocated GPU % (median over seeds) against arrived workload 80-130%, one line per policy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the optional extra
        raise RuntimeError("--plot needs matplotlib: pip install 'gpufold[plot]'") from error
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for policy, results in results_by_policy.items():
        xs, ys = [], []
        for arrived in range(80, 131):
            values = [v for v in (r.unallocated_at(arrived) for r in results) if v is not None]
            if values:
                xs.append(arrived)
                ys.append(statistics.median(values))
        axes.plot(xs, ys, label=policy, linewidth=1.6)
    axes.set_xlabel("arrived workload (% of GPU capacity)")
    axes.set_ylabel("unallocated GPU (%)")
    axes.set_xlim(80, 130)
    axes.grid(True, alpha=0.3)
    axes.legend()
    seeds = sorted({r.seed for results in results_by_policy.values() for r in results})
    axes.set_title(title or f"openb, median over seeds {seeds[0]}..{seeds[-1]}" if seeds else title)
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)
