"""``gpufold simulate``: the published FGD experiment on the openb trace, through the fold."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from gpufold.cli import CliError
from gpufold.cli_commands.options import add_json_option, add_trace_options
from gpufold.trace import TraceError, load_nodes, load_pods


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay the openb trace the way the FGD paper measured it (unallocated GPU %% at arrived = 100%%)",
        description=(
            "Reproduce the FGD experiment (Weng et al., ATC '23): pods sorted by name, inflated with random copies "
            "to --inflate x GPU capacity and shuffled with the seed (nodes too); pods never leave and failed pods "
            "are not retried. Prints unallocated GPU %% and FGD fragmentation %% at arrived = 100%%."
        ),
    )
    add_trace_options(parser)
    parser.add_argument(
        "--policy",
        default="fgd-pack",
        help="placement policy, or several separated by commas (default: fgd-pack); see --list-policies",
    )
    parser.add_argument("--seed", type=int, default=42, help="the seed of one run (default: 42)")
    parser.add_argument("--seeds", help="several seeds, e.g. 42-51 or 42,45 (overrides --seed)")
    parser.add_argument(
        "--inflate", type=float, default=1.3, help="inflate the workload to this x GPU capacity (default: 1.3)"
    )
    parser.add_argument(
        "--prior",
        action="store_true",
        help="tell the fold the workload's pod shapes in advance, as the published FGD knew its typical pods "
        "(default: learned online from arrivals)",
    )
    parser.add_argument(
        "--defrag-every",
        type=float,
        metavar="PCT",
        help="pods are movable; fold a Defragment each time arrived GPU crosses another PCT%% of capacity",
    )
    parser.add_argument(
        "--defrag-budget",
        type=float,
        default=1.0,
        metavar="PCT",
        help="moves per Defragment, as %% of the running pods (default: 1)",
    )
    parser.add_argument(
        "--withdraw-failed",
        action="store_true",
        help="release a pod that does not fit at once (it is never retried, as in the paper)",
    )
    parser.add_argument("--limit", type=int, help="use only the first N pods of the file (smoke tests)")
    add_json_option(parser, help="print JSON (one object)")
    parser.add_argument("--curve", action="store_true", help="with text output, also print the allocation curve")
    parser.add_argument("--plot", metavar="FILE.png", help="plot unallocated GPU %% vs arrived 80-130%% per policy")
    parser.add_argument("--list-policies", action="store_true", help="list the registered policies and exit")
    gangs = parser.add_argument_group(
        "--workload gangs",
        "multi-node training gangs (2-32 nodes, topology required, time limits) among the trace's single pods with "
        "their real lifetimes, in event time, once per queueing mode (see gpufold/gang_simulation.py)",
    )
    gangs.add_argument(
        "--workload",
        choices=("fgd", "gangs"),
        default="fgd",
        help="fgd: the published FGD experiment (default); gangs: queueing modes with gangs",
    )
    gangs.add_argument("--hours", type=float, default=24.0, help="event time to simulate (default: %(default)s)")
    gangs.add_argument(
        "--modes",
        default="skip-ahead,strict-fifo,reserve+backfill",
        help="queueing modes to compare (default: %(default)s)",
    )
    gangs.add_argument("--single-load", type=float, default=0.30, help="single pods' share of GPU capacity")
    gangs.add_argument("--gang-load", type=float, default=0.75, help="gangs' share of the 8-GPU nodes")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpufold import simulate
    from processor.core.policies import REGISTRY, policy_names

    if args.workload == "gangs" and not args.list_policies:
        return _run_gangs(args)
    if args.list_policies:
        for name in policy_names():
            print(f"{name:16} {REGISTRY[name].description}")
        return 0
    policies = [name.strip() for name in args.policy.split(",") if name.strip()]
    unknown = [name for name in policies if name not in REGISTRY]
    if unknown or not policies:
        raise CliError(f"unknown policy {', '.join(unknown) or args.policy!r}; known: {', '.join(policy_names())}")
    try:
        seeds = simulate.parse_seeds(args.seeds) if args.seeds else [args.seed]
    except ValueError as error:
        raise CliError(f"--seeds: {error}") from error
    if args.inflate < 0:
        raise CliError("--inflate must be >= 0 (0 or 1 = no inflation beyond the trace)")
    try:
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods)
    except TraceError as error:
        raise CliError(str(error)) from error
    if args.limit is not None:
        pods = pods[: max(0, args.limit)]
    if not nodes or not pods:
        raise CliError("the trace has no nodes or no pods")

    results: dict[str, list[simulate.SimulationResult]] = {}
    for policy in policies:
        for seed in seeds:
            results.setdefault(policy, []).append(_one(simulate, nodes, pods, policy, seed, args))
            if not args.json and (len(seeds) > 1 or len(policies) > 1):
                _print_run(results[policy][-1])
    if args.plot:
        try:
            simulate.plot(results, args.plot)
        except RuntimeError as error:
            raise CliError(str(error)) from error
    if args.json:
        json.dump(_json(results), sys.stdout, indent=None if len(seeds) == 1 and len(policies) == 1 else 1)
        print()
    else:
        _print_text(results, curve=args.curve)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def _one(simulate: Any, nodes: list[Any], pods: list[Any], policy: str, seed: int, args: Any) -> Any:
    from tqdm import tqdm

    total = len(simulate.build_workload(nodes, pods, seed, args.inflate).pods)
    with tqdm(total=total, desc=f"{policy} seed {seed}", unit="pod", file=sys.stderr, disable=None, leave=False) as bar:
        return simulate.run(
            nodes,
            pods,
            policy,
            seed,
            args.inflate,
            progress=bar.update,
            prior=args.prior,
            defrag_every=args.defrag_every,
            defrag_budget=args.defrag_budget,
            withdraw_failed=args.withdraw_failed,
        )


def _json(results: dict[str, list[Any]]) -> dict[str, Any]:
    from gpufold import simulate

    runs = [run for per_policy in results.values() for run in per_policy]
    if len(runs) == 1:
        return runs[0].to_json()  # type: ignore[no-any-return]
    return {
        "runs": [run.to_json() for run in runs],
        "summary": {policy: simulate.summarize(per_policy) for policy, per_policy in results.items()},
    }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _print_run(result: Any) -> None:
    print(
        f"{result.policy:16} seed {result.seed:4}  unallocated@100 {_fmt(result.unallocated_gpu_pct_at_100):>6}%  "
        f"frag@100 {_fmt(result.fragmentation_pct_at_100):>6}%  scheduled {result.pods_scheduled}/{result.pods_total}"
        f"  {result.pods_per_sec:,.0f} pods/s  state {result.state_hash[:16]}"
        + (
            f"  defrag: {result.moves} moves, {result.pods_moved} pods moved, {result.late_starts} late starts"
            if result.defrag_every
            else ""
        )
    )


def _print_text(results: dict[str, list[Any]], *, curve: bool) -> None:
    runs = [run for per_policy in results.values() for run in per_policy]
    if len(runs) == 1:
        result = runs[0]
        learned = "given in advance (--prior)" if result.prior else "learned online"
        print(f"policy {result.policy}, seed {result.seed}, inflate {result.inflate}, typical pods {learned}")
        print(f"  nodes {result.nodes}, GPU capacity {result.gpu_milli_total / 1000:,.1f} GPUs")
        print(
            f"  pods {result.pods_total}: scheduled {result.pods_scheduled}, failed {result.pods_failed}"
            f" (rejected {result.pods_rejected})"
        )
        print(
            f"  GPUs requested {result.gpu_milli_requested / 1000:,.1f}, "
            f"allocated {result.gpu_milli_allocated / 1000:,.1f}"
        )
        print(f"  unallocated GPU at arrived = 100%: {_fmt(result.unallocated_gpu_pct_at_100)}%")
        print(
            f"  fragmentation at arrived = 100%: {_fmt(result.fragmentation_pct_at_100)}% of capacity "
            f"({_fmt(result.fragmentation_pct_of_idle_at_100)}% of idle GPU)"
        )
        print(f"  {result.pods_per_sec:,.0f} pods/s, {result.commands_per_sec:,.0f} commands/s, {result.seconds} s")
        print(f"  state_hash {result.state_hash}")
        if curve:
            for arrived, allocated in result.curve:
                print(f"    arrived {arrived:5.0f}%  allocated {allocated:7.3f}%  unallocated {100 - allocated:7.3f}%")
        return
    print()
    print(f"{'policy':16} {'seeds':>5} {'unalloc@100 mean':>17} {'median':>7} {'frag@100 mean':>14} {'pods/s':>8}")
    for policy, per_policy in results.items():
        unallocated = [r.unallocated_gpu_pct_at_100 for r in per_policy if r.unallocated_gpu_pct_at_100 is not None]
        fragmentation = [r.fragmentation_pct_at_100 for r in per_policy if r.fragmentation_pct_at_100 is not None]
        mean = statistics.fmean(unallocated) if unallocated else None
        median = statistics.median(unallocated) if unallocated else None
        frag = statistics.fmean(fragmentation) if fragmentation else None
        speed = statistics.fmean(r.pods_per_sec for r in per_policy)
        print(f"{policy:16} {len(per_policy):>5} {_fmt(mean):>17} {_fmt(median):>7} {_fmt(frag):>14} {speed:>8,.0f}")


def _run_gangs(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from gpufold import gang_simulation, simulate

    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in gang_simulation.MODES]
    if unknown or not modes:
        raise CliError(f"unknown mode {', '.join(unknown) or args.modes!r}; known: {', '.join(gang_simulation.MODES)}")
    if args.hours <= 0 or args.single_load < 0 or args.gang_load < 0:
        raise CliError("--hours must be > 0 and the loads >= 0")
    try:
        seeds = simulate.parse_seeds(args.seeds) if args.seeds else [args.seed]
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods)
    except (ValueError, TraceError) as error:
        raise CliError(str(error)) from error
    config = gang_simulation.Config(args.hours, args.single_load, args.gang_load, args.policy.split(",")[0])
    results = []
    for mode in modes:
        for seed in seeds:
            try:
                total = len(gang_simulation.build_arrivals(nodes, pods, seed, config))
            except ValueError as error:
                raise CliError(str(error)) from error
            with tqdm(total=total, desc=f"{mode} seed {seed}", unit="job", file=sys.stderr, disable=None,
                      leave=False) as bar:  # fmt: skip
                result = gang_simulation.run(nodes, pods, mode, seed, config, progress=bar.update)
            results.append(result)
            if not args.json:
                _print_gang_run(result)
    if args.json:
        json.dump({"runs": [result.to_json() for result in results]}, sys.stdout)
        print()
    return 0


def _print_gang_run(result: Any) -> None:
    waits = "  ".join(
        f"{size}n {stats['p50']:.0f}/{stats['p99']:.0f}/{stats['max']:.0f}s"
        for size, stats in result.gang_wait_s.items()
    )
    waiting = sum(result.gangs_waiting_at_end.values())
    print(
        f"{result.mode:17} seed {result.seed:3}  GPU util {result.utilization_pct:6.2f}%  largest gang "
        f"({result.largest_gang_size} nodes) max wait {result.largest_gang_max_wait_s or 0:7.0f} s  "
        f"partial gangs {result.partial_gangs}  still waiting {waiting}  ({result.seconds:.0f} s)"
    )
    print(f"{'':17}   gang wait p50/p99/max by size: {waits}")
    print(f"{'':17}   single pods wait p50 {result.pod_wait_p50_s:.0f} s, p99 {result.pod_wait_p99_s:.0f} s")
