"""Where the unallocated GPU goes at arrived = 100% on an openb variant: which pods failed, which GPUs stay idle, why.

Runs the published experiment (``gpufold.simulate``'s method, no moves) for one policy and
seed, stops after the last pod of the arrived = 100% bucket, and prints:

- the failed pods (queued, never placed) by class: CPU-only, share, whole 1-GPU, multi-GPU;
  model-restricted or not; their GPU milli as % of capacity; and when failures started;
- the idle GPU milli as % of capacity, split by why it is idle: on a GPU holding shares
  (*share residue*), whole idle GPUs on a node whose CPU (or memory) cannot take the
  smallest failed GPU pod's (*CPU-stranded*), whole idle GPUs of a model no failed pod
  may use (*model-stranded*), and the rest; per GPU model.

    .venv/bin/python bench/placement_diagnose.py --variant gpuspec10 --policy fgd-plus --seeds 42,50 [--summary]

Several ``--seeds`` run one after the other (one process: CPU is shared); ``--summary`` prints one
Markdown row per seed (failed GPU % pinned / unpinned, idle GPU % by why). ``--pods`` takes any pod list
(e.g. the stand-ins of ``bench/openb_holdout.py``).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufold.simulate import CLUSTER, build_workload  # noqa: E402
from gpufold.trace import load_nodes, load_pods, submit_pod  # noqa: E402
from processor.core.fold import decide  # noqa: E402
from processor.core.state import PartitionState  # noqa: E402
from schemas.commands import Command, SetPolicy  # noqa: E402
from schemas.events import PodScheduled  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces" / "openb"


def pod_class(pod: Any) -> str:
    if pod.num_gpu == 0:
        return "cpu-only"
    if pod.gpu_milli < 1000:
        return "share"
    return "whole-1" if pod.num_gpu == 1 else f"whole-{pod.num_gpu}"


def diagnose(nodes: list[Any], pods: list[Any], policy: str, seed: int) -> dict[str, Any]:
    from gpufold.trace import add_node

    workload = build_workload(nodes, pods, seed)
    capacity = workload.gpu_milli_capacity
    state = PartitionState()
    decide(state, Command("set-policy", CLUSTER, 0, SetPolicy(policy), "diagnose"))
    for node_id, node in workload.nodes:
        decide(state, add_node(node, node_id, CLUSTER))
    cluster = state.clusters[CLUSTER]
    arrived = 0
    failed: list[tuple[float, Any]] = []
    allocated_sum = 0.0
    in_bucket = 0
    for pod_id, pod in workload.pods:
        previous = round(100.0 * arrived / capacity)
        arrived += pod.gpu_milli_total
        bucket = round(100.0 * arrived / capacity)
        if previous <= 100 < bucket:
            break
        payload = decide(state, submit_pod(pod, pod_id, CLUSTER))[-1].payload
        if not isinstance(payload, PodScheduled):
            failed.append((100.0 * arrived / capacity, pod))
        if bucket == 100:
            allocated_sum += 100.0 * cluster.gpu_milli_allocated / capacity
            in_bucket += 1
    unallocated = 100.0 - allocated_sum / in_bucket if in_bucket else float("nan")

    failed_gpu = [pod for _, pod in failed if pod.num_gpu]
    min_cpu = min((pod.cpu_milli for pod in failed_gpu), default=0)
    min_mem = min((pod.memory_mib for pod in failed_gpu), default=0)
    failed_models: set[str] = set()
    any_model = False
    for pod in failed_gpu:
        if pod.gpu_models:
            failed_models.update(pod.gpu_models)
        else:
            any_model = True
    idle: collections.Counter[str] = collections.Counter()
    by_model: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for node in cluster.nodes.values():
        for free in node.gpu_free:
            if not free:
                continue
            if free < 1000:
                why = "share residue"
            elif node.cpu_free < min_cpu or node.memory_free < min_mem:
                why = "whole GPU, node CPU/memory short"
            elif not any_model and node.gpu_model not in failed_models:
                why = "whole GPU, model no failed pod may use"
            else:
                why = "whole GPU, other"
            idle[why] += free
            by_model[node.gpu_model][why] += free
    classes: collections.Counter[str] = collections.Counter()
    classes_milli: collections.Counter[str] = collections.Counter()
    for _, pod in failed:
        key = pod_class(pod) + (" restricted" if pod.gpu_models else "")
        classes[key] += 1
        classes_milli[key] += pod.gpu_milli_total
    first_failure = failed[0][0] if failed else None
    by_spec: collections.Counter[str] = collections.Counter()
    when: collections.Counter[int] = collections.Counter()
    for at, pod in failed:
        if pod.gpu_models:
            by_spec["|".join(pod.gpu_models)] += pod.gpu_milli_total
        when[int(at // 5) * 5] += pod.gpu_milli_total
    return {
        "seed": seed,
        "unallocated": unallocated,
        "first_failure_arrived_pct": first_failure,
        "failed": {k: (classes[k], round(100.0 * classes_milli[k] / capacity, 3)) for k in sorted(classes)},
        "failed_by_spec_pct": {k: round(100.0 * v / capacity, 3) for k, v in by_spec.most_common()},
        "failed_by_arrived_pct": {k: round(100.0 * v / capacity, 3) for k, v in sorted(when.items())},
        "failed_models": sorted(failed_models) + (["any"] if any_model else []),
        "min_failed_cpu": min_cpu,
        "idle_pct": {k: round(100.0 * v / capacity, 3) for k, v in sorted(idle.items())},
        "idle_by_model_pct": {
            model: {k: round(100.0 * v / capacity, 3) for k, v in sorted(why.items())}
            for model, why in sorted(by_model.items())
        },
        "cpu_free_pct": round(
            100.0 * sum(n.cpu_free for n in cluster.nodes.values()) / sum(n.cpu_milli for n in cluster.nodes.values()),
            2,
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="default")
    parser.add_argument("--pods", help="pod list CSV (default: the variant's in the shared traces)")
    parser.add_argument("--policy", default="fgd-plus")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--summary", action="store_true", help="one Markdown table row per seed")
    args = parser.parse_args()
    from gpufold.simulate import parse_seeds

    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.pods or TRACES / f"openb_pod_list_{args.variant}.csv")
    if args.summary:
        print(
            "| trace | policy | seed | unallocated | failed pinned | failed unpinned | share residue "
            "| whole GPUs, node CPU short | whole GPUs, other | first failure (arrived %) |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in parse_seeds(args.seeds):
        report = diagnose(nodes, pods, args.policy, seed)
        if args.summary:
            pinned = sum(pct for key, (_, pct) in report["failed"].items() if key.endswith("restricted"))
            unpinned = sum(pct for key, (_, pct) in report["failed"].items() if not key.endswith("restricted"))
            idle = report["idle_pct"]
            first = report["first_failure_arrived_pct"]
            print(
                f"| {args.variant} | {args.policy} | {seed} | {report['unallocated']:.2f} | {pinned:.2f} | "
                f"{unpinned:.2f} | {idle.get('share residue', 0.0):.2f} | "
                f"{idle.get('whole GPU, node CPU/memory short', 0.0):.2f} | "
                f"{idle.get('whole GPU, other', 0.0) + idle.get('whole GPU, model no failed pod may use', 0.0):.2f} | "
                f"{'—' if first is None else f'{first:.0f}'} |",
                flush=True,
            )
            continue
        print(f"{args.variant} {args.policy} seed {seed}: unallocated {report['unallocated']:.2f}%")
        first = report["first_failure_arrived_pct"]
        print(f"  first failure at arrived {first:.1f}%" if first else "  no failure")
        print(f"  failed (count, GPU % of capacity): {report['failed']}")
        print(f"  failed restricted pods by allowed models (GPU %): {report['failed_by_spec_pct']}")
        print(f"  failed GPU % by arrived (5% steps): {report['failed_by_arrived_pct']}")
        print(f"  models failed pods asked for: {report['failed_models']}; smallest CPU {report['min_failed_cpu']}")
        print(f"  idle GPU (% of capacity): {report['idle_pct']}; CPU free {report['cpu_free_pct']}%")
        for model, why in report["idle_by_model_pct"].items():
            print(f"    {model}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
