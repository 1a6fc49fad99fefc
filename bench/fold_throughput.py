"""Fold throughput in commands/s: SubmitPod/Release mixes at 1k, 10k and 100k nodes.

Not a test: a measurement. Run ``python bench/fold_throughput.py`` (or ``make bench``);
it prints a table and, with ``--json``, one JSON object per row. Each row folds
the same kind of steady-state stream (a submit, then the release of the oldest
running pod) over a cluster kept about 70% full, in two modes:

- ``fold``: ``decide`` on ``Command`` objects (the pure core alone);
- ``codec``: ``PartitionFolder.fold`` on Avro frames: decode, decide, encode events.

Cost per command should not grow with cluster size; the last column is the
ratio to the first (1k-node) row of the same policy and mode, measured in the
same run. Times are CPU time of this process (time.process_time), which other
load on a shared machine disturbs far less than wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from collections import deque

from logs.port import InputRecord, OutputRecord
from processor.core.fold import decide
from processor.core.state import PartitionState
from processor.runtime.loop import PartitionFolder
from schemas import COMMAND, registry
from schemas.commands import AddNode, Command, QuotaPreemption, Release, SetCohort, SetPolicy, SetQuota, SubmitPod
from schemas.topics import Topics

NODE_TYPES = [  # (model, gpus, cpu_milli, memory_mib, weight)
    ("H100", 8, 96_000, 786_432, 4),
    ("A100", 8, 64_000, 524_288, 3),
    ("A10", 4, 32_000, 262_144, 2),
    ("T4", 2, 16_000, 131_072, 1),
]
POD_SHAPES = [  # (num_gpu, gpu_milli, cpu_milli, memory_mib, weight) - openb-like: many shares, some multi-GPU
    (1, 1000, 8_000, 32_768, 30),
    (1, 500, 4_000, 16_384, 20),
    (1, 250, 2_000, 8_192, 15),
    (2, 1000, 16_000, 65_536, 10),
    (4, 1000, 32_000, 131_072, 8),
    (8, 1000, 64_000, 262_144, 4),
    (0, 0, 4_000, 8_192, 13),
]


def build_nodes(count: int, rng: random.Random) -> list[Command]:
    types = [t for t in NODE_TYPES for _ in range(t[4])]
    commands = []
    for i in range(count):
        model, gpus, cpu, memory, _ = rng.choice(types)
        commands.append(Command(f"add-{i}", "bench", i, AddNode(f"node-{i:06d}", cpu, memory, model, gpus)))
    return commands


class Stream:
    """A steady stream: submit pods until the target fill, then alternate submit and release-oldest."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.shapes = [s for s in POD_SHAPES for _ in range(s[4])]
        self.running: deque[str] = deque()
        self.next_pod = 0
        self.clock = 10_000_000
        gpus = sum(t[1] * t[4] for t in NODE_TYPES) / sum(t[4] for t in NODE_TYPES) * nodes
        mean_milli = sum(s[0] * s[1] * s[4] for s in POD_SHAPES) / sum(s[4] for s in POD_SHAPES)
        self.fill = int(gpus * 1000 * 0.7 / mean_milli)

    def submit(self) -> Command:
        num_gpu, milli, cpu, memory, _ = self.rng.choice(self.shapes)
        pod_id = f"pod-{self.next_pod}"
        self.next_pod += 1
        self.running.append(pod_id)
        self.clock += 1
        return Command(f"s-{pod_id}", "bench", self.clock, SubmitPod(pod_id, "t1", 0, num_gpu, milli, cpu, memory))

    def release(self) -> Command:
        pod_id = self.running.popleft()
        self.clock += 1
        return Command(f"r-{pod_id}", "bench", self.clock, Release(pod_id))

    def warmup(self) -> list[Command]:
        return [self.submit() for _ in range(self.fill)]

    def mix(self, count: int) -> list[Command]:
        return [self.submit() if i % 2 == 0 else self.release() for i in range(count)]


QUOTA = {"A100": 1_000_000, "*": 1_000_000}
"""``--quotas``: a quota the stream never reaches (admission and fair share run, nothing waits for quota)."""


def quota_commands(kind: str) -> list[Command]:
    """``--quotas none|plain|policies|tree``: no quota; the stream's tenant and a peer in one cohort; the same with
    every preemption policy of ``SetQuota.preemption`` set (issue #24: what they cost when nothing preempts); the
    same cohort three levels down a cohort tree (``SetCohort``)."""
    if kind == "none":
        return []
    policy = QuotaPreemption("lower_or_newer_equal_priority", "lower_priority", "lower_priority", 5)
    tree = []
    if kind == "tree":  # "lab" under "dept" under "org" (contract v4's SetCohort): every start walks 3 levels up
        tree = [
            Command("cohort-org", "bench", 0, SetCohort("org", None, {"A100": 8})),
            Command("cohort-dept", "bench", 0, SetCohort("dept", "org", {"*": 8}, borrowing_limit_gpus=1_000_000)),
            Command("cohort-lab", "bench", 0, SetCohort("lab", "dept", lending_limit_gpus=2_000_000)),
        ]
    return tree + [
        Command(f"quota-{tenant}", "bench", 0, SetQuota(tenant, "lab", dict(QUOTA), **extra))  # type: ignore[arg-type]
        for tenant, extra in (("t1", {"preemption": policy} if kind == "policies" else {}), ("t2", {}))
    ]


def run(nodes: int, commands: int, mode: str, seed: int, policy: str = "", quotas: str = "none") -> dict[str, object]:
    rng = random.Random(seed)
    state = PartitionState()
    setup = [Command("policy", "bench", 0, SetPolicy(policy))] if policy else []
    setup += quota_commands(quotas)
    setup += build_nodes(nodes, rng)
    stream = Stream(nodes, seed)
    setup += stream.warmup()
    for offset, command in enumerate(setup):
        decide(state, command, offset)
    measured = stream.mix(commands)
    base = len(setup)
    events = 0
    if mode == "fold":
        started = time.process_time()
        for i, command in enumerate(measured):
            events += len(decide(state, command, base + i))
        elapsed = time.process_time() - started
    else:
        codec = registry().codec(COMMAND)
        records = [InputRecord(0, base + i, b"bench", codec.encode(c.to_avro())) for i, c in enumerate(measured)]
        folder = PartitionFolder(0, Topics(), state, snapshot_every=0)
        out: list[OutputRecord] = []
        started = time.process_time()
        for record in records:
            folder.fold(record, out)
        elapsed = time.process_time() - started
        events = len(out)
    queued = sum(len(c.queue) for c in state.clusters.values())
    signatures = sum(len(list(c.index.groups())) for c in state.clusters.values())
    return {
        "nodes": nodes,
        "mode": mode,
        "policy": state.clusters["bench"].policy,
        "commands": commands,
        "events": events,
        "seconds": round(elapsed, 3),
        "commands_per_sec": round(commands / elapsed),
        "us_per_command": round(elapsed / commands * 1e6, 2),
        "queued_pods": queued,
        "signatures": signatures,
        "quotas": quotas,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000,100000", help="comma-separated cluster sizes")
    parser.add_argument("--commands", type=int, default=100_000, help="measured commands per row")
    parser.add_argument("--modes", default="fold,codec")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policies", default="first-fit,best-fit,", help="comma-separated; empty = the default policy")
    parser.add_argument("--quotas", default="none", choices=("none", "plain", "policies", "tree"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()} | python {platform.python_version()}", file=sys.stderr)
    rows = []
    for policy, mode in ((p, m) for p in args.policies.split(",") for m in args.modes.split(",")):
        baseline = None
        for nodes in (int(n) for n in args.nodes.split(",")):
            row = run(nodes, args.commands, mode, args.seed, policy, args.quotas)
            baseline = baseline or row["us_per_command"]
            row["cost_vs_first_size"] = round(row["us_per_command"] / baseline, 2)  # type: ignore[operator]
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{row['policy']:10} {mode:6} nodes={nodes:>7} {row['commands_per_sec']:>9,} cmd/s"
                    f"  {row['us_per_command']:>7} us/cmd"
                    f"  x{row['cost_vs_first_size']}  signatures={row['signatures']} queued={row['queued_pods']}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
