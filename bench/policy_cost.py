"""A placement policy's own cost per pod, at 1k and 10k nodes, policies interleaved in one run.

Not a test: a measurement. The stream is ``bench/fold_throughput.py``'s (a cluster kept ~70% full,
SubmitPod and Release alternating, openb-like shapes); each row times ``Policy.place`` alone
(``time.process_time`` around every call: the rest of the fold is not counted) over the measured
commands, after the warm-up. Policies alternate, ``--rounds`` times, so load on a shared machine falls
on each alike; the ratio column is against the first policy's mean at the same size.

    .venv/bin/python bench/policy_cost.py --nodes 1000,10000 --policies fgd-plus,fgd-pack --rounds 2

``--pinned F`` makes the stream more like the openb ``gpuspec`` traces, where fgd-pack does its extra
work (the model risk is O(K) over the distinct shapes present, plus the pinned sets): a share F of the GPU
pods names one or two allowed GPU models, and every pod's CPU is jittered to one of 32 values so the present
pods have a few hundred distinct shapes (openb: 91 on default, 250-320 on gpuspec).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fold_throughput import Stream, build_nodes
from processor.core.fold import decide
from processor.core.policies import get_policy
from processor.core.state import PartitionState
from schemas.commands import Command, SetPolicy, SubmitPod

MODEL_SETS = (("T4",), ("A10",), ("A100",), ("H100",), ("A100", "H100"), ("A10", "T4"))


class PinnedStream(Stream):
    """``Stream`` with a share of GPU pods pinned to GPU models and CPU jittered (many distinct shapes)."""

    def __init__(self, nodes: int, seed: int, pinned: float) -> None:
        super().__init__(nodes, seed)
        self.pinned = pinned

    def submit(self) -> Command:
        command = super().submit()
        pod = command.payload
        assert isinstance(pod, SubmitPod)
        cpu = max(500, pod.cpu_milli * self.rng.randrange(16, 48) // 32)
        models = self.rng.choice(MODEL_SETS) if pod.num_gpu and self.rng.random() < self.pinned else ()
        return Command(
            command.command_id, command.cluster, command.issued_at, replace(pod, cpu_milli=cpu, gpu_models=models)
        )


def measure(nodes: int, commands: int, policy_name: str, seed: int, pinned: float = 0.0) -> tuple[float, int]:
    """(CPU seconds inside ``place``, calls) over the measured commands."""
    policy = get_policy(policy_name)
    if policy is None:
        raise SystemExit(f"unknown policy {policy_name}")
    rng = random.Random(seed)
    state = PartitionState()
    setup = [Command("policy", "bench", 0, SetPolicy(policy_name)), *build_nodes(nodes, rng)]
    stream = PinnedStream(nodes, seed, pinned) if pinned else Stream(nodes, seed)
    setup += stream.warmup()
    for offset, command in enumerate(setup):
        decide(state, command, offset)
    spent = [0.0, 0]
    place = policy.place

    def timed(cluster, shape, groups):  # type: ignore[no-untyped-def]
        tick = time.process_time()
        try:
            return place(cluster, shape, groups)
        finally:
            spent[0] += time.process_time() - tick
            spent[1] += 1

    policy.place = timed  # type: ignore[method-assign]
    try:
        for i, command in enumerate(stream.mix(commands)):
            decide(state, command, len(setup) + i)
    finally:
        del policy.place
    return spent[0], int(spent[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000")
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--policies", default="fgd-plus,fgd-pack")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pinned", type=float, default=0.0, help="share of GPU pods pinned to GPU models (0: none)")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}; pinned share of GPU pods: {args.pinned}")
    print("| nodes | policy | us per place (each round) | mean | ratio |")
    print("|---:|---|---|---:|---:|")
    for nodes in (int(n) for n in args.nodes.split(",")):
        per: dict[str, list[float]] = {p: [] for p in policies}
        for _ in range(args.rounds):
            for name in policies:
                seconds, calls = measure(nodes, args.commands, name, args.seed, args.pinned)
                per[name].append(1e6 * seconds / max(calls, 1))
        base = statistics.fmean(per[policies[0]])
        for name in policies:
            mean = statistics.fmean(per[name])
            rounds = " / ".join(f"{value:.1f}" for value in per[name])
            print(f"| {nodes:,} | {name} | {rounds} | {mean:.1f} | {mean / base:.2f}x |", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
