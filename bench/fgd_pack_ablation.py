"""What each of fgd-pack's three measures buys: the policy with one of them taken out, on openb variants.

Not a test: a measurement. Registers three variants of ``fgd-pack`` for this process only (each is
``processor.core.policies.fgd_pack.FgdPack`` with one part switched off) and runs the published
experiment (``gpufold.simulate``) for each variant, trace and seed, one process:

- ``no-prices``: shares ranked like any pod (reduced cost 0): FGD's growth, then best fit;
- ``no-cpu``: FGD's fragmentation measure (``Fragmenter``) instead of ``BalancedFragmenter``;
- ``no-risk``: no model supply risk (every model free to take).

    .venv/bin/python bench/fgd_pack_ablation.py --variants default,gpuspec10 --seeds 42-44 [--traces DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import schemas.validation as validation
from gpufold import simulate
from gpufold.trace import DEFAULT_NODES, default_path, load_nodes, load_pods
from processor.core import policies
from processor.core.policies.fgd import MEMO_LIMIT, FragMemo
from processor.core.policies.fgd_pack import FgdPack, Measured
from processor.core.resources import PodShape, Signature
from processor.core.share_prices import SharePrices
from processor.core.state import ClusterState

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "openb"


class NoPrices(FgdPack):
    name = "fgd-pack/no-prices"

    def measure(self, memo: FragMemo, signature: Signature, shape: PodShape, prices: SharePrices | None) -> Measured:
        return super().measure(memo, signature, shape, None)


class NoCpu(FgdPack):
    name = "fgd-pack/no-cpu"

    def memo(self, cluster: ClusterState) -> FragMemo:
        memo = self._memos.get(cluster.name)
        if memo is None or memo.typical is not cluster.typical or memo.size > MEMO_LIMIT:
            memo = self._memos[cluster.name] = FragMemo(cluster.typical)
        return memo


class NoRisk(FgdPack):
    name = "fgd-pack/no-risk"

    def risks(self, cluster: ClusterState) -> dict[str, float]:
        return {}


def register() -> list[str]:
    names = []
    for policy in (NoPrices(), NoCpu(), NoRisk()):
        policies.REGISTRY[policy.name] = policy
        names.append(policy.name)
    validation.POLICY_NAMES = tuple(sorted(policies.REGISTRY))  # for this process only
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=TRACES, help="directory of openb_pod_list_<variant>.csv")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--policies", help="comma-separated (default: fgd-pack and the three variants)")
    args = parser.parse_args()
    names = ["fgd-pack", *register()]
    chosen = [p.strip() for p in args.policies.split(",")] if args.policies else names
    nodes = load_nodes(str(default_path(DEFAULT_NODES)))
    seeds = simulate.parse_seeds(args.seeds)
    print("| trace | " + " | ".join(chosen) + " |")
    print("|---|" + "---:|" * len(chosen))
    for variant in args.variants.split(","):
        pods = load_pods(args.traces / f"openb_pod_list_{variant}.csv")
        cells = []
        for name in chosen:
            values = [simulate.run(nodes, pods, name, seed).unallocated_gpu_pct_at_100 or 0.0 for seed in seeds]
            cells.append(f"{statistics.fmean(values):.2f} ({' / '.join(f'{v:.2f}' for v in values)})")
        print(f"| {variant} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
