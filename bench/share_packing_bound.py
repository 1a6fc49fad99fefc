"""How much GPU the share pods alone must leave unusable by arrived = 100%, per openb trace variant.

A GPU-share pod (one GPU, under 1000 milli) can only share its GPU with other
shares, so the shares that have arrived by the time the arrived workload reaches
100% of GPU capacity (same arrival order and rounding as ``gpufold simulate``)
occupy at least as many GPUs as the best bin packing of their sizes into 1000-milli
bins, and what those GPUs have left over is capacity no pod can use. Two numbers per
seed, as % of cluster GPU capacity:

- **lower bound** (Martello and Toth's L2 bound on the number of bins): no
  packing of those shares, online or offline, leaves less residue;
- **offline best-fit decreasing**: what a packer that sees every share in
  advance (and ignores CPU, memory and GPU models) leaves, a practical target.

A scheduler's unallocated GPU % at arrived = 100% can only fall below the lower
bound by leaving some of those shares unplaced (then whole-GPU pods fill their
GPUs); every policy here places a share whenever some GPU has room for it.

    .venv/bin/python bench/share_packing_bound.py [--variants default,gpushare40] [--seeds 42-51]
"""

from __future__ import annotations

import argparse
import bisect
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPU_MILLI = 1000
DEFAULT_TRACES = ROOT.parent / "shared" / "traces" / "openb"


def best_fit_decreasing(sizes: list[int]) -> int:
    """Leftover milli (summed over opened GPUs) of best-fit decreasing. O(n log n)."""
    gaps: list[int] = []  # free milli of partly used GPUs, sorted ascending
    for size in sorted(sizes, reverse=True):
        at = bisect.bisect_left(gaps, size)
        left = GPU_MILLI - size if at == len(gaps) else gaps.pop(at) - size
        if left > 0:
            bisect.insort(gaps, left)
    return sum(gaps)


def lower_bound_bins(sizes: list[int]) -> int:
    """Martello-Toth L2: max over K of |big| + |mid| + ceil((small mass - room left by mid) / C). O(n·k)."""
    best = math.ceil(sum(sizes) / GPU_MILLI)
    for k in sorted({size for size in sizes if size <= GPU_MILLI // 2} | {0}):
        big = [s for s in sizes if s > GPU_MILLI - k]
        mid = [s for s in sizes if GPU_MILLI // 2 < s <= GPU_MILLI - k]
        small = sum(s for s in sizes if k <= s <= GPU_MILLI // 2)
        room = len(mid) * GPU_MILLI - sum(mid)
        best = max(best, len(big) + len(mid) + max(0, math.ceil((small - room) / GPU_MILLI)))
    return best


def shares_by_100(nodes: list, pods: list, seed: int) -> tuple[list[int], int]:
    """Share sizes of the pods that arrived while the arrived bucket was <= 100%, and the capacity."""
    from gpufold import simulate

    workload = simulate.build_workload(nodes, pods, seed)
    capacity = workload.gpu_milli_capacity
    arrived = 0
    sizes = []
    for _, pod in workload.pods:
        arrived += pod.gpu_milli_total
        if round(100.0 * arrived / capacity) > 100:
            break
        if pod.num_gpu == 1 and pod.gpu_milli < GPU_MILLI:
            sizes.append(pod.gpu_milli)
    return sizes, capacity


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--variants", help="comma-separated (default: every pod list in --traces)")
    parser.add_argument("--seeds", default="42-51")
    args = parser.parse_args()

    from gpufold import simulate
    from gpufold.trace import load_nodes, load_pods

    seeds = simulate.parse_seeds(args.seeds)
    found = {p.stem.removeprefix("openb_pod_list_"): p for p in sorted(args.traces.glob("openb_pod_list_*.csv"))}
    if not found:
        parser.error(f"no openb_pod_list_*.csv in {args.traces}")
    chosen = [v.strip() for v in args.variants.split(",")] if args.variants else sorted(found)
    nodes = load_nodes()
    print(f"share residue at arrived = 100%, mean over seeds {seeds[0]}..{seeds[-1]}, % of GPU capacity")
    print("| variant | lower bound (L2) | offline best-fit decreasing |")
    print("|---|---:|---:|")
    for variant in chosen:
        pods = load_pods(str(found[variant]))
        bounds, offline = [], []
        for seed in seeds:
            sizes, capacity = shares_by_100(nodes, pods, seed)
            bounds.append(100.0 * (lower_bound_bins(sizes) * GPU_MILLI - sum(sizes)) / capacity)
            offline.append(100.0 * best_fit_decreasing(sizes) / capacity)
        print(f"| {variant} | {statistics.fmean(bounds):.2f} | {statistics.fmean(offline):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
