"""The FGD comparison table: every openb pod-list variant x every policy, beside the published numbers.

Runs ``gpufold.simulate`` (the published experiment, through the fold) for each
(variant, policy, seed), in worker processes, and prints a Markdown table of the
mean unallocated GPU % at arrived = 100% over the seeds, with the published
mean in parentheses, plus scheduling speed per policy, and draws the plot for
``default``. Results are appended to a JSON-lines cache as they finish, so an
interrupted run resumes where it stopped (``--cache``); ``--max-minutes`` stops
submitting new runs after a budget (the table then says how many seeds each
cell has).

    .venv/bin/python bench/simulate_table.py --workers 2 --plot bench/openb_default.png

Published numbers: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC 2023 (Table/Fig. data
as listed in the openb trace README: mean of 10 seeds, unallocated GPU % at
arrived = 100%).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Published means over seeds 42..51 (Weng et al., ATC '23), unallocated GPU % at arrived = 100%.
PUBLISHED_POLICIES = ("random", "dot-product", "gpu-clustering", "gpu-packing", "best-fit-paper", "fgd")
PUBLISHED: dict[str, tuple[float, ...]] = {
    "default": (13.70, 9.38, 8.35, 8.22, 7.14, 4.77),
    "cpu050": (10.98, 6.97, 6.48, 6.54, 6.44, 5.00),
    "cpu100": (12.56, 8.27, 7.58, 7.50, 6.74, 4.79),
    "gpushare40": (15.14, 10.70, 10.24, 10.23, 8.56, 6.04),
    "gpushare60": (17.19, 13.18, 13.10, 12.85, 10.94, 8.75),
    "gpushare80": (19.38, 15.86, 15.50, 15.35, 13.34, 10.92),
    "gpushare100": (21.10, 18.02, 17.78, 17.87, 15.38, 13.36),
    "gpuspec10": (13.74, 9.83, 8.04, 7.76, 6.90, 5.34),
    "multigpu20": (13.08, 8.15, 6.66, 6.50, 6.27, 4.47),
    "multigpu30": (13.37, 6.89, 5.45, 5.30, 5.43, 3.64),
    "multigpu40": (14.62, 5.96, 4.65, 4.41, 4.90, 3.09),
    "multigpu50": (18.72, 5.27, 4.31, 3.94, 4.38, 2.91),
}
PAPER_NAMES = {
    "random": "Random",
    "dot-product": "DotProd",
    "gpu-clustering": "GpuClustering",
    "gpu-packing": "GpuPacking",
    "best-fit-paper": "BestFit",
    "fgd": "FGD",
}
DEFAULT_POLICIES = (*PUBLISHED_POLICIES, "fgd-plus", "fgd-pack", "fgd@prior", "fgd-plus@prior")
# "name@prior": the policy with the workload's pod shapes given in advance (``simulate.run(prior=True)``), the
# setting of the published FGD; plain names learn the typical pods online from arrivals.
DEFAULT_TRACES = ROOT.parent / "shared" / "traces" / "openb"

_loaded: dict[str, Any] = {}


def _load(path: str, kind: str) -> Any:
    from gpufold.trace import load_nodes, load_pods

    key = f"{kind}:{path}"
    if key not in _loaded:
        _loaded[key] = load_nodes(path) if kind == "nodes" else load_pods(path)
    return _loaded[key]


def _run(task: tuple[str, str, str, str, int, float]) -> dict[str, Any]:
    variant, pods_path, nodes_path, policy, seed, inflate = task
    from gpufold import simulate

    name, _, mode = policy.partition("@")
    result = simulate.run(
        _load(nodes_path, "nodes"), _load(pods_path, "pods"), name, seed, inflate, prior=mode == "prior"
    )
    record = {
        "variant": variant,
        "policy": policy,
        "seed": seed,
        "inflate": inflate,
        "unallocated": result.unallocated_gpu_pct_at_100,
        "fragmentation": result.fragmentation_pct_at_100,
        "pods_per_sec": result.pods_per_sec,
        "seconds": result.seconds,
        "pods_failed": result.pods_failed,
        "state_hash": result.state_hash,
    }
    if variant == "default":
        record["curve"] = result.curve
    return record


def variants(traces: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(traces.glob("openb_pod_list_*.csv")):
        found[path.stem.removeprefix("openb_pod_list_")] = path
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="directory of openb_pod_list_*.csv")
    parser.add_argument("--nodes", help="node list CSV (default: the bundled openb GPU node list)")
    parser.add_argument("--variants", help="comma-separated variants (default: every pod list in --traces)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--inflate", type=float, default=1.3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / "simulate_results.jsonl")
    parser.add_argument("--max-minutes", type=float, help="stop submitting new runs after this budget")
    parser.add_argument("--plot", help="PNG for the default trace (unallocated GPU %% vs arrived 80-130%%)")
    parser.add_argument("--table-only", action="store_true", help="print the table from the cache, run nothing")
    parser.add_argument(
        "--bounds", action="store_true", help="add the share-residue bound column (bench/share_packing_bound.py)"
    )
    args = parser.parse_args()

    from gpufold import simulate
    from gpufold.trace import DEFAULT_NODES, default_path

    nodes_path = args.nodes or str(default_path(DEFAULT_NODES))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    seeds = simulate.parse_seeds(args.seeds)
    available = variants(args.traces)
    if not available:
        available = {"default": default_path("openb_pod_list_default.csv")}
    chosen = [v.strip() for v in args.variants.split(",")] if args.variants else list(available)
    missing = [v for v in chosen if v not in available]
    if missing:
        parser.error(f"no pod list for {missing} in {args.traces}")

    done: dict[tuple[str, str, int], dict[str, Any]] = {}
    if args.cache.exists():
        for line in args.cache.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if record.get("inflate", 1.3) == args.inflate:
                    done[(record["variant"], record["policy"], record["seed"])] = record

    # A budget-cut run should still answer the main questions, so runs go by priority: default (every policy,
    # first three seeds), then every variant's fragmentation policies on the first seed, then default's other
    # seeds, then the baselines on the variants, then the rest seed by seed.
    order = sorted(chosen, key=lambda v: v != "default")
    fragmentation = {p for p in policies if p.partition("@")[0] in ("fgd", "fgd-plus", "fgd-pack")}

    def priority(variant: str, policy: str, seed: int) -> tuple[int, int, int, int]:
        rank = seeds.index(seed)
        if variant == "default":
            tier = 0 if rank < 3 else 2
        elif rank == 0:
            tier = 1 if policy in fragmentation else 3
        else:
            tier = 4
        return (tier, rank, order.index(variant), policies.index(policy))

    tasks = sorted(
        (
            (variant, str(available[variant]), nodes_path, policy, seed, args.inflate)
            for variant in order
            for policy in policies
            for seed in seeds
        ),
        key=lambda task: priority(task[0], task[3], task[4]),
    )
    tasks = [task for task in tasks if (task[0], task[3], task[4]) not in done]
    started = time.perf_counter()
    if tasks and not args.table_only:
        print(f"{len(tasks)} runs to do on {args.workers} worker(s); cache {args.cache}", file=sys.stderr)
        deadline = started + 60 * args.max_minutes if args.max_minutes else None
        with multiprocessing.get_context("fork").Pool(args.workers) as pool, open(args.cache, "a") as cache:
            pending = []
            for task in tasks:
                pending.append(pool.apply_async(_run, (task,)))
            for number, handle in enumerate(pending, start=1):
                if deadline and time.perf_counter() > deadline:
                    pool.terminate()
                    print("budget reached; stopping (rerun to resume)", file=sys.stderr)
                    break
                record = handle.get()
                done[(record["variant"], record["policy"], record["seed"])] = record
                cache.write(json.dumps(record) + "\n")
                cache.flush()
                print(
                    f"[{number}/{len(pending)}] {record['variant']} {record['policy']} seed {record['seed']}: "
                    f"{record['unallocated']} % unallocated, {record['pods_per_sec']:.0f} pods/s "
                    f"({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                )
    elapsed = time.perf_counter() - started
    bounds = share_bounds({v: available[v] for v in order}, seeds, nodes_path) if args.bounds else None
    print(table(done, order, policies, seeds, bounds))
    print()
    if OURS in policies:
        print(margin_table(done, order, seeds))
        print()
    print(speed_table(done, policies))
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{args.workers} worker(s); this invocation took {elapsed / 60:.1f} min"
    )
    if args.plot:
        plot(done, policies, seeds, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


OURS = "fgd-pack"


def table(
    done: dict[tuple[str, str, int], dict[str, Any]],
    order: list[str],
    policies: list[str],
    seeds: list[int],
    bounds: dict[str, tuple[float, float]] | None = None,
) -> str:
    """Mean unallocated GPU % per (variant, policy); when ours and FGD are both columns, ours minus the published
    FGD; with ``bounds``, the share-residue lower bound and offline packing (``share_packing_bound.py``)."""
    delta = OURS in policies and "fgd" in policies
    header = "| trace | " + " | ".join(PAPER_NAMES.get(p, p) for p in policies) + " | seeds |"
    rule = "|" + "---|" * (len(policies) + 2)
    if delta:
        header += f" {OURS} minus published FGD |"
        rule += "---:|"
    if bounds:
        header += " share residue: bound / offline |"
        rule += "---:|"
    lines = [
        "Unallocated GPU % at arrived = 100%, mean over seeds (published mean in parentheses).",
        "",
        header,
        rule,
    ]
    for variant in order:
        cells = []
        counts = set()
        means: dict[str, float | None] = {}
        for policy in policies:
            values = [
                done[(variant, policy, seed)]["unallocated"]
                for seed in seeds
                if (variant, policy, seed) in done and done[(variant, policy, seed)]["unallocated"] is not None
            ]
            counts.add(len(values))
            mean = means[policy] = _mean(values)
            cell = "—" if mean is None else f"{mean:.2f}"
            published = PUBLISHED.get(variant)
            base = policy.partition("@")[0]
            if published and base in PUBLISHED_POLICIES:
                cell += f" ({published[PUBLISHED_POLICIES.index(base)]:.2f})"
            cells.append(cell)
        seeds_cell = "/".join(str(c) for c in sorted(counts))
        line = f"| {variant} | " + " | ".join(cells) + f" | {seeds_cell} |"
        if delta:
            ours, published = means[OURS], PUBLISHED.get(variant)
            line += " — |" if ours is None or not published else f" {ours - published[5]:+.2f} |"
        if bounds:
            low, offline = bounds.get(variant, (float("nan"), float("nan")))
            line += f" {low:.2f} / {offline:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def margin_table(done: dict[tuple[str, str, int], dict[str, Any]], order: list[str], seeds: list[int]) -> str:
    """Ours per variant against the published FGD: mean, worst seed, seed-to-seed standard deviation, the margin
    (published minus our mean) and the margin in standard deviations of the seeds, and the same for fgd-plus."""
    lines = [
        f"{OURS} against the published FGD, unallocated GPU % at arrived = 100% over the seeds run (sd: sample "
        "standard deviation over seeds; margin: published FGD minus the mean, positive = below FGD).",
        "",
        f"| trace | published FGD | {OURS} mean | worst seed | sd | margin | margin / sd | fgd-plus mean | "
        "fgd-plus worst | seeds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in order:
        published = PUBLISHED.get(variant)
        cells = []
        for policy in (OURS, "fgd-plus"):
            values = [
                done[(variant, policy, seed)]["unallocated"]
                for seed in seeds
                if (variant, policy, seed) in done and done[(variant, policy, seed)]["unallocated"] is not None
            ]
            cells.append(values)
        ours, plus = cells
        if not ours:
            continue
        mean = statistics.fmean(ours)
        spread = statistics.stdev(ours) if len(ours) > 1 else float("nan")
        fgd = published[5] if published else None
        margin = f"{fgd - mean:+.2f}" if fgd is not None else "—"
        ratio = f"{(fgd - mean) / spread:.1f}" if fgd is not None and spread == spread and spread > 0 else "—"
        plus_mean = f"{statistics.fmean(plus):.2f}" if plus else "—"
        plus_worst = f"{max(plus):.2f}" if plus else "—"
        lines.append(
            f"| {variant} | {'—' if fgd is None else f'{fgd:.2f}'} | {mean:.2f} | {max(ours):.2f} | {spread:.2f} | "
            f"{margin} | {ratio} | {plus_mean} | {plus_worst} | {len(ours)} |"
        )
    return "\n".join(lines)


def share_bounds(traces: dict[str, Path], seeds: list[int], nodes_path: str) -> dict[str, tuple[float, float]]:
    """Per variant, the mean share-residue lower bound and offline best-fit-decreasing residue (% of capacity)."""
    from bench.share_packing_bound import GPU_MILLI, best_fit_decreasing, lower_bound_bins, shares_by_100

    nodes = _load(nodes_path, "nodes")
    out = {}
    for variant, path in traces.items():
        pods = _load(str(path), "pods")
        low, offline = [], []
        for seed in seeds:
            sizes, capacity = shares_by_100(nodes, pods, seed)
            low.append(100.0 * (lower_bound_bins(sizes) * GPU_MILLI - sum(sizes)) / capacity)
            offline.append(100.0 * best_fit_decreasing(sizes) / capacity)
        out[variant] = (statistics.fmean(low), statistics.fmean(offline))
    return out


def speed_table(done: dict[tuple[str, str, int], dict[str, Any]], policies: list[str]) -> str:
    lines = ["| policy | pods/s (mean over runs) | runs |", "|---|---:|---:|"]
    for policy in policies:
        speeds = [r["pods_per_sec"] for (_, p, _), r in done.items() if p == policy]
        mean = _mean(speeds)
        lines.append(f"| {policy} | {'—' if mean is None else f'{mean:,.0f}'} | {len(speeds)} |")
    return "\n".join(lines)


def plot(done: dict[tuple[str, str, int], dict[str, Any]], policies: list[str], seeds: list[int], path: str) -> None:
    from gpufold.simulate import SimulationResult
    from gpufold.simulate import plot as draw

    by_policy: dict[str, list[SimulationResult]] = {}
    for policy in policies:
        for seed in seeds:
            record = done.get(("default", policy, seed))
            if record and record.get("curve"):
                result = SimulationResult(
                    policy,
                    seed,
                    record["inflate"],
                    "@prior" in policy,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    None,
                    None,
                    None,
                    record["curve"],
                )
                by_policy.setdefault(policy, []).append(result)
    draw(by_policy, path, "openb default: unallocated GPU % vs arrived workload (median over seeds)")


if __name__ == "__main__":
    sys.exit(main())
