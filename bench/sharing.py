"""Sharing a cluster (issue 11): preemption search cost, quota overhead, fair share and reclaim latency.

Not a test: a measurement. ``python bench/sharing.py [--nodes 10000] [--json]`` runs four parts:

- ``preemption``: a cluster of ``--nodes`` 8-GPU nodes filled with priority-0 pods (whole GPUs,
  2- and 4-GPU pods, shares, started at different times), then high-priority pods of several
  shapes that fit only by preempting; fold CPU time per preempting pod (one ``decide``: the
  search, the evictions, the placement and the victims' requeue), mean / p50 / p99 / max;
- ``quota overhead``: the steady submit/release stream of ``bench/fold_throughput.py`` on 1,000
  nodes, without quotas and with every tenant under a cohort quota that never binds, in one
  run: the ratio of commands/s;
- ``fairness``: three tenants with weights 1:1:2 flood a 64-node cluster with equal pods that
  end after a fixed time; each tenant's dominant share (its GPUs over the cluster's) sampled over
  event time, the steady-state mean against the weighted DRF allocation (25% / 25% / 50%), and
  Jain's index of the weight-normalised shares;
- ``reclaim``: a borrower fills a lender's quota; each lender request is answered by the command
  that makes it (commands until the lender runs what it asked, and how many borrowers went).

Times are CPU time of this process (``time.process_time``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import statistics
import sys
import time
from collections import deque

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, Release, SetPolicy, SetQuota, SubmitPod, Tick
from schemas.events import PodPreempted, PodScheduled

MINUTE = 60_000


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000
        self.n = 0

    def command(self, payload: object, step: int = 1) -> Command:
        self.t += step
        self.n += 1
        return Command(f"c-{self.n}", "bench", self.t, payload, "bench")  # type: ignore[arg-type]


def preemption(nodes: int, pods: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    state, clock = PartitionState(), Clock()
    decide(state, clock.command(SetPolicy("fgd-plus", reserve_after_ms=-1)))
    for i in range(nodes):
        decide(state, clock.command(AddNode(f"node-{i:06d}", 96_000, 786_432, "A100", 8)))
    shapes = [(1, 1000), (1, 1000), (2, 1000), (4, 1000), (1, 500), (1, 250)]
    serial = 0
    # Random shapes until five in a row do not fit, then whole GPUs, then quarter shares: the cluster full.
    for phase, pool in enumerate((shapes, [(1, 1000)], [(1, 250)])):
        misses = 0
        while misses < (5 if phase == 0 else 1):
            num_gpu, milli = rng.choice(pool)
            serial += 1
            pod = SubmitPod(f"low-{serial}", "t", 0, num_gpu, milli, 2_000 * num_gpu, 16_384)
            events = decide(state, clock.command(pod, rng.choice((1, 1000, 60_000))))
            if not isinstance(events[-1].payload, PodScheduled):
                misses += 1
                decide(state, clock.command(Release(pod.pod_id)))
            else:
                misses = 0
    running = sum(1 for pod in state.clusters["bench"].pods.values() if pod.running)
    times: list[float] = []
    victims: list[int] = []
    by_shape: dict[str, list[float]] = {}
    digest = hashlib.sha256()
    top_shapes = [(8, 1000), (4, 1000), (2, 1000), (1, 1000), (1, 500)]
    for i in range(pods):
        num_gpu, milli = top_shapes[i % len(top_shapes)]
        pod = SubmitPod(f"high-{i}", "t", 10, num_gpu, milli, 2_000 * num_gpu, 16_384)
        command = clock.command(pod, 1000)
        started = time.process_time()
        events = decide(state, command)
        elapsed = time.process_time() - started
        times.append(elapsed)
        by_shape.setdefault(f"{num_gpu}x{milli}", []).append(1000 * elapsed)
        victims.append(sum(isinstance(event.payload, PodPreempted) for event in events))
        for event in events:  # who was preempted, from which node, for whom, and where the preemptor went
            if isinstance(event.payload, (PodPreempted, PodScheduled)):
                digest.update(repr(event.payload).encode())
        # Victims requeued (they fit nowhere): release them and the preemptor, refill, so the next pod
        # finds the cluster as full of low-priority pods as this one did.
        queued = [pod_id for pod_id, p in state.clusters["bench"].pods.items() if p.queued]
        for pod_id in [pod.pod_id, *sorted(queued)]:
            decide(state, clock.command(Release(pod_id)))
        for _ in range(num_gpu * 1000 // milli):
            serial += 1
            refill = SubmitPod(f"low-{serial}", "t", 0, 1, milli if milli < 1000 else 1000, 2_000, 16_384)
            if not isinstance(decide(state, clock.command(refill))[-1].payload, PodScheduled):
                decide(state, clock.command(Release(refill.pod_id)))
    first = times[0]  # the first search also meets every node the fill changed (the preemption index)
    times_after_first = sorted(times[1:])
    times.sort()
    return {
        "part": "preemption",
        "nodes": nodes,
        "running_low_priority_pods": running,
        "preempting_pods": pods,
        "preempted_every_time": all(count > 0 for count in victims),
        "victims_mean": round(statistics.fmean(victims), 2),
        "ms_mean": round(1000 * statistics.fmean(times), 2),
        "ms_p50": round(1000 * times[len(times) // 2], 2),
        "ms_p99": round(1000 * times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "ms_max": round(1000 * times[-1], 2),
        "ms_first": round(1000 * first, 2),
        "ms_after_first": _summary(times_after_first),
        "preemption_events_sha256": digest.hexdigest()[:16],
        "ms_mean_by_shape": {shape: round(statistics.fmean(values), 2) for shape, values in by_shape.items()},
        "victims_by_shape": {
            f"{top_shapes[i % len(top_shapes)][0]}x{top_shapes[i % len(top_shapes)][1]}": victims[i]
            for i in range(len(top_shapes))
        },
    }


def _summary(times: list[float]) -> dict[str, float]:
    """Mean, p50 and max of sorted CPU times, in ms."""
    if not times:
        return {}
    mean, p50, top = statistics.fmean(times), times[len(times) // 2], times[-1]
    return {"mean": round(1000 * mean, 2), "p50": round(1000 * p50, 2), "max": round(1000 * top, 2)}


def _throughput(quotas: bool, nodes: int, commands: int, seed: int) -> float:
    rng = random.Random(seed)
    state, clock = PartitionState(), Clock()
    decide(state, clock.command(SetPolicy("best-fit", reserve_after_ms=-1)))
    tenants = ("a", "b", "c", "d")
    if quotas:
        for tenant in tenants:
            quota = SetQuota(tenant, "all", {"A100": nodes * 8}, nominal_cpu_milli=nodes * 64_000 * 4)
            decide(state, clock.command(quota))
    for i in range(nodes):
        decide(state, clock.command(AddNode(f"node-{i:06d}", 64_000, 524_288, "A100", 8)))
    shapes = [(1, 1000, 8_000), (1, 500, 4_000), (1, 250, 2_000), (2, 1000, 16_000), (0, 0, 4_000)]
    running: deque[str] = deque()
    stream = []
    for i in range(int(nodes * 8 * 0.7 / 0.8)):
        num_gpu, milli, cpu = rng.choice(shapes)
        stream.append(clock.command(SubmitPod(f"f-{i}", rng.choice(tenants), 0, num_gpu, milli, cpu, 8_192)))
        running.append(f"f-{i}")
    for command in stream:
        decide(state, command)
    stream = []
    for i in range(commands // 2):
        num_gpu, milli, cpu = rng.choice(shapes)
        stream.append(clock.command(SubmitPod(f"s-{i}", rng.choice(tenants), 0, num_gpu, milli, cpu, 8_192)))
        running.append(f"s-{i}")
        stream.append(clock.command(Release(running.popleft())))
    started = time.process_time()
    for command in stream:
        decide(state, command)
    return len(stream) / (time.process_time() - started)


def quota_overhead(nodes: int, commands: int, seed: int) -> dict[str, object]:
    rates = {}
    for rounds in range(2):  # interleaved, twice: the machine's drift hits both alike
        for quotas in (False, True):
            rates.setdefault(quotas, []).append(_throughput(quotas, nodes, commands, seed + rounds))
    without, with_ = max(rates[False]), max(rates[True])
    return {
        "part": "quota overhead",
        "nodes": nodes,
        "commands": commands,
        "commands_per_s_without_quotas": round(without),
        "commands_per_s_with_quotas": round(with_),
        "ratio": round(with_ / without, 3),
    }


def fairness(seed: int, hours: int = 6) -> dict[str, object]:
    rng = random.Random(seed)
    state, clock = PartitionState(), Clock()
    decide(state, clock.command(SetPolicy("best-fit", reserve_after_ms=-1)))
    weights = {"a": 1, "b": 1, "c": 2}
    for tenant, weight in weights.items():
        decide(state, clock.command(SetQuota(tenant, weight=weight)))
    nodes = 64
    for i in range(nodes):
        decide(state, clock.command(AddNode(f"node-{i:03d}", 64_000, 524_288, "A100", 8)))
    cluster = state.clusters["bench"]
    capacity = nodes * 8 * 1000
    serial = 0
    backlog = {tenant: 0 for tenant in weights}
    samples: dict[str, list[float]] = {tenant: [] for tenant in weights}
    timeline = []
    for minute in range(hours * 60):
        for tenant in weights:  # each tenant keeps 200 pods waiting: a flood
            while backlog[tenant] < 200:
                serial += 1
                pod = SubmitPod(
                    f"{tenant}-{serial}",
                    tenant,
                    0,
                    1,
                    1000,
                    1000,
                    4_096,
                    time_limit_ms=rng.choice((20, 30, 40)) * MINUTE,
                )
                events = decide(state, clock.command(pod, 0))
                backlog[tenant] += not isinstance(events[-1].payload, PodScheduled)
        before = {pod_id for pod_id, pod in cluster.pods.items() if pod.queued}
        decide(state, Command(f"tick-{minute}", "bench", clock.t + MINUTE, Tick(), "bench"))
        clock.t += MINUTE
        after = {pod_id for pod_id, pod in cluster.pods.items() if pod.queued}
        for pod_id in before - after:
            backlog[pod_id.split("-")[0]] -= 1
        shares = {
            tenant: cluster.usage[tenant].gpu_total / capacity if tenant in cluster.usage else 0.0 for tenant in weights
        }
        if minute % 30 == 29:
            timeline.append({"minute": minute + 1, **{t: round(100 * s, 1) for t, s in shares.items()}})
        if minute >= 120:  # steady state: after two hours of flooding
            for tenant, share in shares.items():
                samples[tenant].append(share)
    total = sum(weights.values())
    target = {tenant: weight / total for tenant, weight in weights.items()}
    means = {tenant: statistics.fmean(values) for tenant, values in samples.items()}
    normalised = [means[t] / target[t] for t in weights]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised))
    return {
        "part": "fairness",
        "nodes": nodes,
        "weights": weights,
        "steady_state_share_pct": {t: round(100 * m, 2) for t, m in means.items()},
        "weighted_drf_pct": {t: round(100 * v, 2) for t, v in target.items()},
        "worst_relative_error_pct": round(100 * max(abs(means[t] / target[t] - 1) for t in weights), 2),
        "jain_index_of_weighted_shares": round(jain, 4),
        "timeline_pct": timeline,
    }


def reclaim(seed: int) -> dict[str, object]:
    state, clock = PartitionState(), Clock()
    decide(state, clock.command(SetPolicy("best-fit", reserve_after_ms=-1)))
    for i in range(16):
        decide(state, clock.command(AddNode(f"node-{i:03d}", 64_000, 524_288, "A100", 8)))
    decide(state, clock.command(SetQuota("lender", "lab", {"A100": 64})))
    decide(state, clock.command(SetQuota("borrower", "lab", {"A100": 64})))
    for i in range(128):  # the borrower takes the whole cluster: its 64 and the lender's 64
        decide(state, clock.command(SubmitPod(f"b-{i}", "borrower", 0, 1, 1000, 1000, 4_096), 1000))
    answered = []
    for i, gpus in enumerate((1, 4, 8, 8, 8, 8, 8, 8, 8)):
        events = decide(state, clock.command(SubmitPod(f"l-{i}", "lender", 0, gpus, 1000, 1000, 4_096), 1000))
        started = any(isinstance(e.payload, PodScheduled) and e.payload.pod.pod_id == f"l-{i}" for e in events)
        answered.append((gpus, started, sum(isinstance(e.payload, PodPreempted) for e in events)))
    return {
        "part": "reclaim",
        "lender_requests": len(answered),
        "answered_in_the_same_command": sum(started for _, started, _ in answered),
        "borrowers_preempted_per_request": [count for _, _, count in answered],
        "gpus_asked_per_request": [gpus for gpus, _, _ in answered],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--preemptions", type=int, default=50)
    parser.add_argument("--commands", type=int, default=40_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--parts", default="preemption,quota,fairness,reclaim")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}", file=sys.stderr)
    results = []
    if "preemption" in parts:
        results.append(preemption(args.nodes, args.preemptions, args.seed))
    if "quota" in parts:
        results.append(quota_overhead(1000, args.commands, args.seed))
    if "fairness" in parts:
        results.append(fairness(args.seed))
    if "reclaim" in parts:
        results.append(reclaim(args.seed))
    for result in results:
        print(json.dumps(result) if args.json else "  ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
