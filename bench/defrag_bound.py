"""How low can unallocated GPU % at arrived = 100% go on openb ``default``, whatever the moves (issue 11)?

Not a test: a measurement. ``python bench/defrag_bound.py [--seeds 42-44] [--source defrag|nomove]
[--policy fgd-pack]`` runs the defragmentation experiment of ``bench/defrag_experiment.py`` (the policy,
every pod movable, a ``Defragment`` after each 1% of arrived capacity, budget 1% of running pods;
``--source nomove``: no ``Defragment``) up to the end of the arrived = 100% bucket and takes the cluster
twice: after the first pod of that bucket and after its last. For each it re-places, offline, every pod
that is running there plus every pod that is waiting (no move budget, all pods movable), two ways:

- **moves only**: every running pod must stay placed (a move cannot stop a pod); a waiting pod is
  placed only where it fits. This is what any ``Defragment``, with any budget, could reach.
- **free choice**: any subset of the arrived GPU pods may run (CPU-only pods always do), as if the
  scheduler had held some pods back when they arrived. Not reachable by moves; shows what admission
  control could add.

and reports, per seed, as % of GPU capacity:

- **LP bound**: the optimum of a linear relaxation, so a true lower bound on unallocated GPU for *every*
  packing (online or offline) of that scenario: GPUs are bins of 1000 milli; a GPU-share pod (one GPU,
  under 1000 milli) shares its GPU with other shares only, so every GPU holds either one pattern of
  shares (sizes summing to <= 1000) or a whole-GPU pod's GPU; the LP picks how many GPUs get each
  pattern (column generation: the pricing problem is a bounded knapsack over the share sizes) and how
  many hold whole-GPU pods, within the GPU count, with the running pods' counts as lower limits and
  running + waiting as upper limits, maximising allocated milli. It ignores CPU, memory, nodes and
  GPU models (relaxing only makes the bound lower). Since pods never leave and a ``Defragment`` only
  moves, the running shares only grow through the bucket, so the bound at the bucket's first pod holds
  for every pod of the bucket, hence for the bucket's mean (the published metric).
- **packer**: a concrete re-placement that respects everything the fold checks: GPU count and share
  rules, CPU and memory per node, GPU models. Shares are first grouped into GPUs (best-fit decreasing,
  or the LP's patterns rounded down then best-fit decreasing), then the pods (and GPUs' worth of
  shares) are packed onto nodes in decreasing order, each on the node whose share of CPU left stays
  closest to its share of GPUs left (see ``pack``), a few weights tried, the best that places every
  running pod kept.

Also: the whole-bucket bound (``bucket_bound``) and the floor if every arrived share were running.
"""

from __future__ import annotations

import argparse
import collections
import json
import pickle
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufold import simulate  # noqa: E402
from gpufold.trace import load_nodes, load_pods  # noqa: E402

GPU_MILLI = 1000
UNIT = 10  # every openb share is a multiple of 10 milli; the knapsack works in these units


@dataclass(frozen=True, slots=True)
class PodRow:
    pod_id: str
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: tuple[str, ...]

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    gpu_model: str
    gpu_count: int
    cpu_milli: int
    memory_mib: int


@dataclass(slots=True)
class Moment:
    """The pods of one moment of the online run: running (must stay placed) and waiting."""

    running: list[PodRow]
    waiting: list[PodRow]
    allocated: int  # GPU milli allocated online at that moment


def capture(cluster: Any) -> Moment:
    running, waiting = [], []
    for pod_id, pod in cluster.pods.items():
        spec = pod.spec
        row = PodRow(pod_id, spec.num_gpu, spec.gpu_milli, spec.cpu_milli, spec.memory_mib, tuple(spec.gpu_models))
        (running if pod.node_id is not None else waiting).append(row)
    return Moment(running, waiting, cluster.gpu_milli_allocated)


def online_moments(
    seed: int, source: str, policy: str = "fgd-pack"
) -> tuple[Moment, Moment, list[NodeRow], int, dict[str, float]]:
    """The cluster after the first and after the last pod of the arrived = 100% bucket, and the online run's
    figures: the bucket's mean unallocated GPU % (the published metric), pods ever moved, CPU per Defragment."""
    nodes, pods = load_nodes(), load_pods()
    moments: dict[str, Moment] = {}

    def observe(bucket: int, cluster: Any) -> bool:
        if bucket == 100:
            moment = capture(cluster)
            moments.setdefault("first", moment)
            moments["last"] = moment
        return bucket > 100

    result = simulate.run(nodes, pods, policy, seed, defrag_every=1.0 if source == "defrag" else None, observe=observe)
    workload = simulate.build_workload(nodes, pods, seed)
    node_rows = [NodeRow(nid, n.gpu_model, n.gpu_count, n.cpu_milli, n.memory_mib) for nid, n in workload.nodes]
    figures = {
        "bucket_mean_pct": result.unallocated_gpu_pct_at_100 or 0.0,
        "pods_moved_pct": 100.0 * result.pods_moved / len(workload.pods),
        "defrag_ms": 1000.0 * result.defrag_cpu_seconds / result.defragments if result.defragments else 0.0,
    }
    return moments["first"], moments["last"], node_rows, result.gpu_milli_total, figures


# --- the LP bound ---------------------------------------------------------------------------------


def _knapsack(sizes: Sequence[int], limits: Sequence[int], values: Sequence[float]) -> tuple[float, list[int]]:
    """Bounded knapsack into one GPU: the pattern (count per size) of the largest value. O(sizes·units·count)."""
    units = GPU_MILLI // UNIT
    best = [0.0] * (units + 1)
    choice: list[list[int]] = [[0] * len(sizes) for _ in range(units + 1)]
    for i, (size, limit, value) in enumerate(zip(sizes, limits, values, strict=True)):
        if value <= 1e-12 or limit <= 0:
            continue
        width = size // UNIT
        for _ in range(min(limit, units // width)):
            for room in range(units, width - 1, -1):
                if best[room - width] + value > best[room] + 1e-12:
                    best[room] = best[room - width] + value
                    choice[room] = choice[room - width][:]
                    choice[room][i] += 1
    top = max(range(units + 1), key=lambda room: best[room])
    return best[top], choice[top]


def lp_bound(
    gpus: int,
    shares_low: dict[int, int],
    shares_high: dict[int, int],
    whole_low: int,
    whole_high: int,
    seed_patterns: Sequence[dict[int, int]] = (),
) -> tuple[float, list[tuple[dict[int, int], float]]]:
    """Max allocated milli of the GPU-only relaxation, and the LP's share patterns with their GPU counts."""
    import highspy
    import numpy as np

    sizes = sorted(shares_high, reverse=True)
    if any(size % UNIT for size in sizes):
        raise ValueError("share sizes must be multiples of 10 milli")
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    empty_i, empty_f = np.array([], dtype=np.int32), np.array([], dtype=float)
    rows = len(sizes)
    lower = np.array([float(shares_low.get(size, 0)) for size in sizes])
    upper = np.array([float(shares_high[size]) for size in sizes])
    h.addRows(rows, lower, upper, 0, empty_i, empty_i, empty_f)
    h.addRow(-inf, float(gpus), 0, empty_i, empty_f)  # row `rows`: GPUs used
    # column 0: GPUs holding a whole-GPU pod; minimise minus the allocated milli
    h.addCol(-float(GPU_MILLI), float(whole_low), float(whole_high), 1, np.array([rows], dtype=np.int32), np.ones(1))
    # column 1: GPUs beyond the cluster's, at a prohibitive price: keeps the first restricted LP feasible
    # (the lower limits may need patterns not generated yet); column generation prices it out
    h.addCol(float(GPU_MILLI) * 1e3, 0.0, inf, 1, np.array([rows], dtype=np.int32), -np.ones(1))
    patterns: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()

    def add(pattern: list[int]) -> None:
        key = tuple(pattern)
        if key in seen or not any(pattern):
            return
        seen.add(key)
        fill = sum(count * size for count, size in zip(pattern, sizes, strict=True))
        index = [i for i, count in enumerate(pattern) if count] + [rows]
        value = [float(pattern[i]) for i in index[:-1]] + [1.0]
        h.addCol(-float(fill), 0.0, inf, len(index), np.array(index, dtype=np.int32), np.array(value))
        patterns.append(pattern)

    for i, size in enumerate(sizes):
        add([min(int(upper[i]), GPU_MILLI // size) if j == i else 0 for j in range(rows)])
    for seed in seed_patterns:
        add([seed.get(size, 0) for size in sizes])
    limits = [int(value) for value in upper]
    while True:
        h.run()
        duals = list(h.getSolution().row_dual)
        # reduced cost of a pattern: -fill - sum(a_i * y_i) - y_gpu; negative -> improves
        value, pattern = _knapsack(sizes, limits, [size + duals[i] for i, size in enumerate(sizes)])
        if value + duals[rows] <= 1e-7 or tuple(pattern) in seen:
            break
        add(pattern)
    values = list(h.getSolution().col_value)
    if values[1] > 1e-6:
        raise ValueError(f"the running pods need {values[1]:.1f} GPUs more than the cluster has")
    used = [
        ({size: count for size, count in zip(sizes, pattern, strict=True) if count}, values[2 + k])
        for k, pattern in enumerate(patterns)
        if values[2 + k] > 1e-9
    ]
    return -h.getInfo().objective_function_value, used


# --- the packer -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Item:
    """What goes onto a node: a whole-GPU pod, one GPU's worth of shares, or a CPU-only pod."""

    gpus: int
    gpu_milli: int  # allocated milli it brings
    cpu: int
    memory: int
    models: tuple[str, ...]
    must: bool
    pods: int


def group_shares(
    shares: list[tuple[PodRow, bool]], patterns: Sequence[tuple[dict[int, int], float]] = ()
) -> list[Item]:
    """Shares into GPUs: first whole copies of the given patterns, then best-fit decreasing.

    A share restricted to GPU models joins only GPUs whose other shares allow the same models."""
    pool: dict[tuple[int, tuple[str, ...]], list[tuple[PodRow, bool]]] = collections.defaultdict(list)
    for row, must in sorted(shares, key=lambda t: (not t[1], -t[0].cpu_milli, t[0].pod_id)):
        pool[(row.gpu_milli, row.gpu_models)].append((row, must))
    gpus: list[list[tuple[PodRow, bool]]] = []
    for pattern, count in patterns:
        for _ in range(int(count + 1e-9)):
            members = []
            for size, times in sorted(pattern.items(), reverse=True):
                bucket = pool.get((size, ()), [])
                if len(bucket) < times:
                    break
                members += bucket[:times]
            else:
                for size, times in pattern.items():
                    del pool[(size, ())][:times]
                gpus.append(members)
    rest = [entry for key in sorted(pool, key=lambda k: (-k[0], k[1])) for entry in pool[key]]
    free: list[tuple[int, int]] = []  # (free milli, gpu index), best fit by a scan of the sorted list
    import bisect

    for row, must in rest:
        at = bisect.bisect_left(free, (row.gpu_milli, -1))
        while at < len(free) and not _models_agree(gpus[free[at][1]], row):
            at += 1
        if at < len(free):
            room, index = free.pop(at)
            gpus[index].append((row, must))
        else:
            room, index = GPU_MILLI, len(gpus)
            gpus.append([(row, must)])
        if room - row.gpu_milli > 0:
            bisect.insort(free, (room - row.gpu_milli, index))
    items = []
    for members in gpus:
        models = members[0][0].gpu_models
        items.append(
            Item(
                1,
                sum(row.gpu_milli for row, _ in members),
                sum(row.cpu_milli for row, _ in members),
                sum(row.memory_mib for row, _ in members),
                models,
                any(must for _, must in members),
                len(members),
            )
        )
    return items


def _models_agree(members: list[tuple[PodRow, bool]], row: PodRow) -> bool:
    return all(other.gpu_models == row.gpu_models for other, _ in members)


# Node choice for a GPU item: the node whose share of CPU left stays closest to its share of GPUs left
# (|CPU left / CPU - GPUs left / GPUs|), plus a little best fit on GPUs (weight per GPU left). Measured on
# seed 42 before choosing (moves only, bucket's first pod): GPU best fit first, balance second 8.0% with
# 296 running pods left out; the item's CPU per GPU against the node's 4.3%; the balance with weights
# 0 / 0.001 / 0.01 4.11 / 3.87 / 4.03%: the best weight differs by seed and moment, so the packer tries
# a few and keeps the best.
WEIGHTS = (0.001, 0.003, 0.01, 0.03)


def pack(nodes: Sequence[NodeRow], items: Sequence[Item], weight: float) -> tuple[int, list[Item]]:
    """Pack items onto nodes; returns (allocated milli, the items that must run but were left out).

    Order: items that must run first; among them those that fit at most 1 in 20 empty nodes first, then
    CPU-only pods (they go where CPU is most left over
    beyond what the node's free GPUs will need at the items' mean CPU per GPU), then GPU items by
    allocated milli per GPU, GPUs, CPU, memory, descending; then the optional items the same way. A
    must item that fits nowhere gets one repair: an item on a node with the GPUs for it moves to another
    node where it fits (or, if optional, is dropped) when that leaves room for it."""
    import numpy as np

    free_gpu = np.array([n.gpu_count for n in nodes], dtype=np.int64)
    free_cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
    free_mem = np.array([n.memory_mib for n in nodes], dtype=np.int64)
    cap_gpu = np.maximum(free_gpu, 1).astype(float)
    cap_cpu = np.maximum(free_cpu, 1).astype(float)
    models = [n.gpu_model for n in nodes]
    gpu_items = [item for item in items if item.gpus]
    cpu_per_gpu = sum(item.cpu for item in gpu_items) / max(1, sum(item.gpus for item in gpu_items))
    model_masks: dict[tuple[str, ...], Any] = {}
    on_node: list[list[int]] = [[] for _ in nodes]

    def fits_mask(item: Item) -> Any:
        fits = (free_gpu >= item.gpus) & (free_cpu >= item.cpu) & (free_mem >= item.memory)
        if item.models:
            mask = model_masks.get(item.models)
            if mask is None:
                mask = model_masks[item.models] = np.array([m in item.models for m in models])
            fits &= mask
        return fits

    def choose(item: Item, candidates: Any) -> int:
        if not item.gpus:
            return int(candidates[int(np.argmax(free_cpu[candidates] - cpu_per_gpu * free_gpu[candidates]))])
        gpu_left = free_gpu[candidates] - item.gpus
        cpu_left = free_cpu[candidates] - item.cpu
        score = np.abs(cpu_left / cap_cpu[candidates] - gpu_left / cap_gpu[candidates]) + weight * gpu_left
        return int(candidates[int(np.argmin(score))])

    def put(index: int, at: int, sign: int) -> None:
        item = items[index]
        free_gpu[at] -= sign * item.gpus
        free_cpu[at] -= sign * item.cpu
        free_mem[at] -= sign * item.memory
        if sign > 0:
            on_node[at].append(index)
        else:
            on_node[at].remove(index)

    def key(index: int) -> tuple:
        item = items[index]
        per_gpu = item.gpu_milli / item.gpus if item.gpus else 0.0
        stage = 0 if scarce[index] else 2 if item.gpus else 1
        return (not item.must, stage, -per_gpu, -item.gpus, -item.cpu, -item.memory, index)

    # an item that fits few empty nodes (e.g. 8 GPUs with 120 cores: only the 128-core nodes) goes first
    total_gpu, total_cpu, total_mem = free_gpu.copy(), free_cpu.copy(), free_mem.copy()
    scarce = [
        int(np.count_nonzero((total_gpu >= i.gpus) & (total_cpu >= i.cpu) & (total_mem >= i.memory)))
        <= len(nodes) // 20
        for i in items
    ]
    placed: dict[int, int] = {}

    def repair(index: int) -> bool:
        """Place item ``index`` by moving one item off a node, or dropping it if it is optional (and, when
        ``index`` is optional, allocates less)."""
        item = items[index]
        # a must item may take GPUs freed by the move; an optional one only nodes with the GPUs free already
        # (the stranded case: GPUs idle, CPU or memory short), which keeps this pass cheap
        near = range(len(nodes)) if item.must else np.flatnonzero(free_gpu >= item.gpus).tolist()
        for at in near:
            if item.models and models[at] not in item.models:
                continue
            for other in sorted(on_node[at], key=lambda o: (items[o].must, items[o].gpu_milli, o)):
                moved = items[other]
                if (
                    free_gpu[at] + moved.gpus < item.gpus
                    or free_cpu[at] + moved.cpu < item.cpu
                    or free_mem[at] + moved.memory < item.memory
                ):
                    continue
                put(other, at, -1)
                put(index, at, +1)
                candidates = np.flatnonzero(fits_mask(moved))
                droppable = not moved.must and (item.must or moved.gpu_milli < item.gpu_milli)
                if len(candidates) or droppable:
                    del placed[other]
                    placed[index] = at
                    if len(candidates):
                        target = choose(moved, candidates)
                        put(other, target, +1)
                        placed[other] = target
                    return True
                put(index, at, -1)
                put(other, at, +1)
        return False

    left: list[int] = []
    for index in sorted(range(len(items)), key=key):
        candidates = np.flatnonzero(fits_mask(items[index]))
        if len(candidates):
            at = choose(items[index], candidates)
            put(index, at, +1)
            placed[index] = at
        else:
            left.append(index)
    for index in left:  # in the order above: what must run first
        repair(index)
    allocated = sum(items[index].gpu_milli for index in placed)
    return allocated, [item for index, item in enumerate(items) if item.must and index not in placed]


def bound_moment(
    moment: Moment, nodes: Sequence[NodeRow], capacity: int, free_choice: bool, packer: bool = True
) -> dict[str, Any]:
    """LP bound and best packer result (unallocated GPU % of capacity) for one moment and scenario."""
    gpus = sum(n.gpu_count for n in nodes)
    low: collections.Counter[int] = collections.Counter()
    high: collections.Counter[int] = collections.Counter()
    whole_low = whole_high = 0
    for row in moment.running:
        if row.is_share:
            high[row.gpu_milli] += 1
            if not free_choice:
                low[row.gpu_milli] += 1
        elif row.num_gpu:
            whole_high += row.num_gpu
            if not free_choice:
                whole_low += row.num_gpu
    for row in moment.waiting:
        if row.is_share:
            high[row.gpu_milli] += 1
        elif row.num_gpu:
            whole_high += row.num_gpu
    best_lp, patterns = lp_bound(gpus, dict(low), dict(high), whole_low, whole_high)
    out: dict[str, Any] = {"lp_bound_pct": round(100.0 * (capacity - best_lp) / capacity, 3)}
    if not packer:
        return out
    tries = []
    shares = [(row, not free_choice) for row in moment.running if row.is_share]
    shares += [(row, False) for row in moment.waiting if row.is_share]
    others = [
        Item(row.num_gpu, row.num_gpu * row.gpu_milli, row.cpu_milli, row.memory_mib, row.gpu_models, must, 1)
        for rows, running in ((moment.running, True), (moment.waiting, False))
        for row in rows
        if not row.is_share
        for must in [running and (not free_choice or not row.num_gpu)]
    ]
    for grouping, used in (("bfd", ()), ("lp", patterns)):
        items = others + group_shares(shares, used)
        for weight in WEIGHTS:
            allocated, missing = pack(nodes, items, weight)
            unallocated = round(100.0 * (capacity - allocated) / capacity, 3)
            tries.append((len(missing), unallocated, f"{grouping}/{weight}"))
    left_out, unallocated, how = min(tries)
    out.update(packer_pct=unallocated, packer_left_out=left_out, packer=how, packer_tries=tries)
    return out


def bucket_bound(first: Moment, last: Moment, nodes: Sequence[NodeRow], capacity: int) -> float:
    """The moves-only LP bound for every pod of the bucket at once, hence for its mean.

    Pods never leave and moves keep pods running, so at any pod of the bucket the running pods include
    those running at its first pod and are among those arrived by its last: those are the lower and
    upper limits."""
    low: collections.Counter[int] = collections.Counter()
    high: collections.Counter[int] = collections.Counter()
    for row in first.running:
        if row.is_share:
            low[row.gpu_milli] += 1
    for row in (*last.running, *last.waiting):
        if row.is_share:
            high[row.gpu_milli] += 1
    whole_low = sum(row.num_gpu for row in first.running if row.num_gpu and not row.is_share)
    whole_high = sum(row.num_gpu for row in (*last.running, *last.waiting) if row.num_gpu and not row.is_share)
    best, _ = lp_bound(sum(n.gpu_count for n in nodes), dict(low), dict(high), whole_low, whole_high)
    return round(100.0 * (capacity - best) / capacity, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--source", choices=("defrag", "nomove"), default="defrag")
    parser.add_argument("--policy", default="fgd-pack", help="the cluster's placement policy in the online run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cache", type=Path, help="keep each seed's online moments here (pickle) and reuse them")
    parser.add_argument("--no-packer", action="store_true", help="the LP bounds only (seconds per seed)")
    args = parser.parse_args(argv)
    rows = []
    for seed in simulate.parse_seeds(args.seeds):
        cached = args.cache / f"moments-{args.policy}-{args.source}-{seed}.pickle" if args.cache else None
        if cached is not None and cached.exists():
            first, last, nodes, capacity, figures = pickle.loads(cached.read_bytes())
        else:
            first, last, nodes, capacity, figures = online_moments(seed, args.source, args.policy)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(pickle.dumps((first, last, nodes, capacity, figures)))
        result: dict[str, Any] = {"seed": seed, "source": args.source, "policy": args.policy, **figures}
        pack_it = not args.no_packer
        for name, moment in (("first", first), ("last", last)):
            result[name] = {
                "online_pct": round(100.0 * (capacity - moment.allocated) / capacity, 3),
                "running": len(moment.running),
                "waiting": len(moment.waiting),
                "shares_waiting": sum(1 for row in moment.waiting if row.is_share),
                # the packer only at the bucket's first pod, where the bound holds for the whole bucket
                "moves_only": bound_moment(moment, nodes, capacity, False, packer=pack_it and name == "first"),
                "free_choice": bound_moment(moment, nodes, capacity, True, packer=pack_it and name == "first"),
            }
        result["bucket_lp_bound_pct"] = bucket_bound(first, last, nodes, capacity)
        # the floor if every share arrived by the bucket's end were running (none left waiting)
        every_share = Moment([row for row in (*last.running, *last.waiting) if row.is_share], [], 0)
        every_share.waiting = [row for row in (*last.running, *last.waiting) if not row.is_share]
        result["every_share_lp_bound_pct"] = bound_moment(every_share, nodes, capacity, False, packer=False)[
            "lp_bound_pct"
        ]
        rows.append(result)
        first_row, last_row = result["first"], result["last"]
        moves, free = first_row["moves_only"], first_row["free_choice"]
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            packed = (
                f", packer {moves['packer_pct']:.2f}% [{moves['packer']}, {moves['packer_left_out']} running "
                f"pods left out]"
                if pack_it
                else ""
            )
            free_packed = f", packer {free['packer_pct']:.2f}% [{free['packer']}]" if pack_it else ""
            print(
                f"seed {seed}  {args.policy}: bucket mean {figures['bucket_mean_pct']:.2f}%, "
                f"{figures['pods_moved_pct']:.2f}% of pods moved, {figures['defrag_ms']:.0f} ms CPU per Defragment; "
                f"at the bucket's first pod {first_row['online_pct']:.2f}% ({first_row['waiting']} waiting, "
                f"{first_row['shares_waiting']} of them shares)  moves only: LP bound {moves['lp_bound_pct']:.2f}% "
                f"(bucket's last pod {last_row['moves_only']['lp_bound_pct']:.2f}%, whole bucket "
                f"{result['bucket_lp_bound_pct']:.2f}%){packed}  free choice: LP bound "
                f"{free['lp_bound_pct']:.2f}%{free_packed}",
                flush=True,
            )
    if not args.json and rows:
        columns = [
            ("online, the bucket's mean (the published metric)", lambda r: r["bucket_mean_pct"]),
            ("online minus the whole-bucket LP bound", lambda r: r["bucket_mean_pct"] - r["bucket_lp_bound_pct"]),
            ("pods ever moved, %", lambda r: r["pods_moved_pct"]),
            ("CPU per Defragment, ms", lambda r: r["defrag_ms"]),
            ("online, at the bucket's first pod", lambda r: r["first"]["online_pct"]),
            ("moves only: LP bound, whole bucket", lambda r: r["bucket_lp_bound_pct"]),
            ("moves only: LP bound", lambda r: r["first"]["moves_only"]["lp_bound_pct"]),
            ("LP bound, every arrived share running", lambda r: r["every_share_lp_bound_pct"]),
            ("moves only: packer", lambda r: r["first"]["moves_only"]["packer_pct"]),
            ("free choice: LP bound", lambda r: r["first"]["free_choice"]["lp_bound_pct"]),
            ("free choice: packer", lambda r: r["first"]["free_choice"]["packer_pct"]),
        ]
        if not pack_it:
            columns = [column for column in columns if "packer" not in column[0]]
        print()
        print(f"| {args.policy}, {args.source} | " + " | ".join(str(r["seed"]) for r in rows) + " | mean |")
        print("|---|" + "---:|" * (len(rows) + 1))
        for name, get in columns:
            values = [get(r) for r in rows]
            cells = " | ".join(f"{v:.2f}" for v in values)
            print(f"| {name} | {cells} | **{statistics.fmean(values):.2f}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
