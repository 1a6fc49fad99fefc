"""Draining a 64-node rack: today's evict-all against a graceful drain under a disruption budget of 2 per gang.

Not a test: a measurement (issue #25). Run ``python bench/drain_budget.py [--racks 8] [--seed 7]``. A cluster of
racks of 64 nodes (8 A100 each) runs elastic training gangs (8 members of 8 GPUs, one per node, in one rack;
``min_members`` 6: two members may be lost) with time limits of 2 to 12 hours, started at staggered times, and
single-GPU pods filling the rest. At hour 6 rack r0 is drained, node by node, in one of two ways:

- ``evict-all``: ``DrainNode`` as today (no budget, no grace): every pod of the rack is evicted at once; a gang that
  loses more than two members goes back to the queue and loses all its work;
- ``budget-2``: ``SetDisruptionBudget`` of 2 per gang, then ``DrainNode`` with a 5-minute grace period: at most two
  members of a gang are evicted; the others wait (EvictionBlocked) until their gang ends.

Reported: how long the drain takes in event time (the first ``DrainNode`` to the last ``NodeDrained``), the GPU
hours of work lost (per evicted pod, the time it had run; for a gang sent back to the queue, every member's), the
pods evicted and gangs requeued, and the CPU time the fold spent. Event time moves by 5-minute ticks.
"""

from __future__ import annotations

import argparse
import random
import time

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import (
    AddNode,
    Command,
    CommandPayload,
    DrainNode,
    GangMember,
    SetDisruptionBudget,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Tick,
)
from schemas.events import Event, GangQueued, NodeDrained, PodEvicted, PodScheduled

HOUR = 3_600_000
RACK = 64


class Run:
    def __init__(self) -> None:
        self.state = PartitionState()
        self.count = 0
        self.events: list[Event] = []
        self.cpu = 0.0

    def send(self, payload: CommandPayload, at: int) -> list[Event]:
        self.count += 1
        started = time.process_time()
        events = decide(self.state, Command(f"c{self.count}", "lab", at, payload))
        self.cpu += time.process_time() - started
        self.events.extend(events)
        return events


def build(racks: int, seed: int) -> Run:
    rng = random.Random(seed)
    run = Run()
    run.send(SetPolicy("first-fit"), 0)
    for rack in range(racks):
        for n in range(RACK):
            labels = {"topology/rack": f"r{rack}"}
            run.send(AddNode(f"r{rack}-n{n:02d}", 64_000, 524_288, "A100", 8, labels), 0)
    at = 0
    for g in range(racks * 6):  # 6 gangs of 8 nodes per rack: 48 of 64 nodes
        at += rng.randint(1, 5) * 60_000
        members = tuple(GangMember(f"g{g}-{m}", 8, 1000, 8_000) for m in range(8))
        limit = rng.randint(2, 12) * HOUR
        gang = SubmitGang(f"g{g}", members=members, min_members=6, topology_required="topology/rack")
        gang.time_limit_ms = limit
        run.send(gang, at)
    for p in range(racks * 16 * 8):  # single-GPU pods on the other 16 nodes of each rack
        at += 1_000
        run.send(
            SubmitPod(f"p{p}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, time_limit_ms=rng.randint(1, 8) * HOUR), at
        )
    return run


def drain(racks: int, seed: int, budget: bool) -> dict[str, float]:
    run = build(racks, seed)
    start = 6 * HOUR
    run.send(Tick(force=True), start - 1)
    mark = len(run.events)
    nodes = [f"r0-n{n:02d}" for n in range(RACK)]
    if budget:
        for g in range(racks * 6):
            run.send(SetDisruptionBudget(f"b-g{g}", gang_id=f"g{g}", max_unavailable=2), start)
    for node_id in nodes:
        run.send(DrainNode(node_id, 300_000 if budget else 0), start)
    drained: dict[str, int] = {}
    now = start
    while len(drained) < RACK and now < start + 48 * HOUR:
        for event in run.events[mark:]:
            if isinstance(event.payload, NodeDrained) and event.payload.node_id in nodes:
                drained.setdefault(event.payload.node_id, event.occurred_at)
        if len(drained) == RACK:
            break
        now += 300_000
        run.send(Tick(), now)
    started: dict[str, int] = {}
    lost_ms = 0
    evicted = 0
    requeued = 0
    for event in run.events:
        payload = event.payload
        if isinstance(payload, PodScheduled):
            started[payload.pod.pod_id] = event.occurred_at
        elif event.sequence >= run.events[mark].sequence and isinstance(payload, PodEvicted):
            evicted += 1
            gpus = 8 if payload.pod_id.startswith("g") else 1
            lost_ms += (event.occurred_at - started[payload.pod_id]) * gpus
        elif event.sequence >= run.events[mark].sequence and isinstance(payload, GangQueued) and payload.requeued:
            requeued += 1
    end = max(drained.values()) if drained else now
    return {
        "drain_hours": (end - start) / HOUR,
        "drained_nodes": len(drained),
        "gpu_hours_lost": lost_ms / HOUR,
        "pods_evicted": evicted,
        "gangs_requeued": requeued,
        "fold_cpu_s": run.cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(f"# {args.racks} racks of {RACK} nodes x 8 A100, seed {args.seed}; drain of rack r0 at hour 6")
    for name, budget in (("evict-all", False), ("budget-2", True)):
        row = drain(args.racks, args.seed, budget)
        print(
            f"{name:10} drain {row['drain_hours']:6.2f} h ({row['drained_nodes']} nodes)  "
            f"GPU-hours lost {row['gpu_hours_lost']:8.1f}  evicted {row['pods_evicted']:4}  "
            f"gangs requeued {row['gangs_requeued']:3}  fold CPU {row['fold_cpu_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
