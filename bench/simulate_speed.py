"""Scheduling speed per policy on the openb cluster (1,213 nodes), with the policy's own share of the time.

One run of the published experiment (default trace, inflated to 1.3x) per policy;
pods/s counts every SubmitPod folded (decide + apply), and ``policy ms/pod`` the
time spent inside ``Policy.place`` (the rest is the core: validation, the
capacity index's feasibility scan, apply, events).

    .venv/bin/python bench/simulate_speed.py [--policies fgd,fgd-plus] [--seed 42]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT = "random,dot-product,gpu-clustering,gpu-packing,best-fit-paper,best-fit,fgd,fgd-plus"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default=DEFAULT)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--pods", help="pod list CSV (default: bundled default)")
    args = parser.parse_args()

    from gpufold import simulate
    from gpufold.trace import load_nodes, load_pods
    from processor.core.policies import get_policy

    nodes, pods = load_nodes(), load_pods(args.pods)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| policy | pods/s | policy ms/pod | unallocated @100 % |")
    print("|---|---:|---:|---:|")
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        policy = get_policy(name)
        if policy is None:
            parser.error(f"unknown policy {name}")
        spent = [0.0, 0]
        place = policy.place

        def timed(cluster, shape, groups, _place=place, _spent=spent):  # type: ignore[no-untyped-def]
            tick = time.perf_counter()
            try:
                return _place(cluster, shape, groups)
            finally:
                _spent[0] += time.perf_counter() - tick
                _spent[1] += 1

        policy.place = timed  # type: ignore[method-assign]
        try:
            result = simulate.run(nodes, pods, name, args.seed)
        finally:
            del policy.place
        per_pod = 1000 * spent[0] / max(1, spent[1])
        print(f"| {name} | {result.pods_per_sec:,.0f} | {per_pod:.3f} | {result.unallocated_gpu_pct_at_100} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
