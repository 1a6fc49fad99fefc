"""Fold time of placing a 64-member gang with topology_required on a 10,000-node cluster.

Not a test: a measurement. ``python bench/gang_placement.py [--nodes 10000] [--gangs 30] [--json]``.

The cluster: 8-GPU nodes in racks of 8 and blocks of 8 racks (64 nodes: ``topology/block``), about 70%
of the GPUs taken by 1- and 2-GPU pods spread by the default policy, then some blocks left empty so a
64-node gang fits only in one of them. Each round submits a 64-member gang (8 GPUs per member) with
``topology_required: topology/block`` and times ``decide`` (CPU time of this process: trial placement in
the best block, the GangScheduled and 64 PodScheduled events applied), then releases it. It also times a
gang that cannot fit (65 members: every block is too small), which ranks every block and gives reasons.
Target (issue 10): <= 20 ms per gang placement.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, GangMember, ReleaseGang, SetPolicy, SubmitGang, SubmitPod


def build(nodes: int, seed: int) -> tuple[PartitionState, int]:
    rng = random.Random(seed)
    state = PartitionState()
    offset = 0

    def run(payload: object) -> list:
        nonlocal offset
        offset += 1
        return decide(state, Command(f"c{offset}", "big", offset, payload), offset)  # type: ignore[arg-type]

    run(SetPolicy("fgd-plus", -1))
    blocks = nodes // 64
    empty = set(rng.sample(range(blocks), max(2, blocks // 20)))  # ~5% of blocks stay idle
    busy = []
    for i in range(nodes):
        rack, block = i // 8, i // 64
        run(
            AddNode(
                f"n{i:05d}", 96_000, 786_432, "H100", 8, {"topology/rack": f"r{rack}", "topology/block": f"b{block}"}
            )
        )
        if block not in empty:
            busy.append(i)
    # ~70% of the busy blocks' GPUs in small pods: submit until the share is reached.
    target = int(0.7 * len(busy) * 8)
    taken = 0
    pod = 0
    while taken < target:
        gpus = rng.choice((1, 1, 2))
        pod += 1
        events = run(SubmitPod(f"p{pod}", num_gpu=gpus, gpu_milli=1000, cpu_milli=4000, memory_mib=16384,
                               node_selector={"topology/block": f"b{rng.choice(busy) // 64}"}))  # fmt: skip
        if events[-1].type_name == "PodScheduled":
            taken += gpus
    return state, offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gangs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    state, offset = build(args.nodes, args.seed)
    cluster = state.clusters["big"]
    signatures = sum(1 for _ in cluster.index.groups())
    members = tuple(GangMember(f"m{i}", 8, 1000, 8000, 32768) for i in range(64))
    timings = []
    for round_ in range(args.gangs):
        offset += 1
        command = Command(f"g{round_}", "big", offset, SubmitGang(f"gang{round_}", members=members,
                                                                  topology_required="topology/block"))  # fmt: skip
        started = time.process_time()
        events = decide(state, command, offset)
        timings.append((time.process_time() - started) * 1000)
        assert events[0].type_name == "GangScheduled" and len(events) == 65, events[0]
        offset += 1
        decide(state, Command(f"r{round_}", "big", offset, ReleaseGang(f"gang{round_}")), offset)
    too_big = tuple(GangMember(f"x{i}", 8, 1000, 8000, 32768) for i in range(65))
    offset += 1
    started = time.process_time()
    no_fit = SubmitGang("nofit", members=too_big, topology_required="topology/block")
    events = decide(state, Command("nofit", "big", offset, no_fit), offset)
    no_fit_ms = (time.process_time() - started) * 1000
    assert events[0].type_name == "GangQueued"
    row = {
        "nodes": args.nodes,
        "blocks": args.nodes // 64,
        "signatures": signatures,
        "gangs": args.gangs,
        "place_ms_median": round(statistics.median(timings), 2),
        "place_ms_p90": round(sorted(timings)[int(0.9 * len(timings))], 2),
        "place_ms_max": round(max(timings), 2),
        "queue_65_members_ms": round(no_fit_ms, 2),
    }
    if args.json:
        print(json.dumps(row))
    else:
        print(f"# {platform.machine()} | python {platform.python_version()}")
        for key, value in row.items():
            print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
