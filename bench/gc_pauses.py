"""The cyclic garbage collector's pauses inside commands, with and without the processor's freezes (#20).

Folds ``tests.adversarial.baseline`` (nodes added, every node filled, then rounds of a ``Release`` and a plain
``SubmitPod`` that takes its place) and times every command, the filling too (CPU time of this process, which
includes any collection the command set off: while a state grows, CPython starts a full collection each time
the objects promoted pass a quarter of those alive). Two modes, each in a fresh child process:

- ``default``: CPython's collector as it comes (what the processor did before ``processor.runtime.collector``);
- ``frozen``: the processor's policy: collect and freeze at start and every ``collector.FREEZE_EVERY`` commands,
  between commands (those pauses are timed apart: a processor pays them between batches).

    python bench/gc_pauses.py                          # 10,000 nodes, 100,000 pods, 30,000 rounds
    python bench/gc_pauses.py --nodes 2000 --pods 20000 --rounds 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def child(mode: str, nodes: int, pods: int, rounds: int) -> dict[str, object]:
    sys.path.insert(0, os.getcwd())
    from processor.core.fold import decide
    from processor.core.state import PartitionState
    from processor.runtime.collector import Collector
    from tests import adversarial

    commands = adversarial.baseline(nodes, pods, rounds=rounds)
    state = PartitionState()
    collector = Collector() if mode == "frozen" else None
    freezes: list[float] = []
    if collector is not None:
        freezes.append(collector.now())  # at start, as ``gpufold run`` and the Kafka runner do
    times: list[float] = []
    clock = time.process_time
    for offset, command in enumerate(commands):
        started = clock()
        decide(state, command, offset)
        times.append(clock() - started)
        if collector is not None:
            spent = collector.folded(1)
            if spent:
                freezes.append(spent)
    slowest = sorted(range(len(times)), key=lambda i: -times[i])[:3]
    top = [f"{commands[i].type_name}@{i}: {times[i] * 1e3:.1f} ms" for i in sorted(slowest)]
    times.sort()
    count = len(times)
    return {
        "mode": mode,
        "commands": count,
        "median_us": round(times[count // 2] * 1e6, 1),
        "p999_ms": round(times[min(count - 1, int(count * 0.999))] * 1e3, 2),
        "max_ms": round(times[-1] * 1e3, 1),
        "over_100ms": sum(1 for value in times if value > 0.1),
        "total_s": round(sum(times), 2),
        "slowest": top,
        "freezes_ms": [round(value * 1e3, 1) for value in freezes],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30_000)
    parser.add_argument("--modes", default="default,frozen")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.nodes, args.pods, args.rounds)))
        return 0
    for mode in args.modes.split(","):
        command = [sys.executable, str(Path(__file__).resolve()), "--child", mode]
        command += ["--nodes", str(args.nodes), "--pods", str(args.pods), "--rounds", str(args.rounds)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
