"""Relief: make idle GPUs usable for the first waiting pods where their node's CPU or memory is gone.

**Within the gaps** (:func:`relieve`): for the first waiting whole-GPU shapes (queue order, at most
``RELIEVE_SHAPES``), movable shares on a node with idle whole GPUs (CPU-heaviest first) move into gaps
elsewhere (:class:`~processor.core.defrag_gaps.Gaps`) until the first shape that wants no more GPUs than
are idle there fits; or nothing moves there.

**Across nodes** (:func:`relieve_across`, last in a ``Defragment``) for the first waiting GPU pods (queue
order, at most ``RELIEVE_PODS``): either up to ``RELIEVE_MOVES`` movable pods of any kind (whole-GPU, shares,
CPU-only; CPU-heaviest first) leave a node whose GPUs the waiting pod could take but whose CPU or memory is
short, or one light GPU pod leaves a node with CPU to spare for GPUs that lacked CPU or memory for the
waiting pods, so the waiting pod fits the node it left. A moved pod goes where it fits (best fit by GPU,
then CPU, then node id; of its own GPU model, or, without quotas, of any model its request allows), never
leaving idle GPUs there short of the CPU or memory the smallest waiting GPU pod asks. Each move fits where
it lands when it is applied; a node made ready for one waiting pod takes no pods and is not used again in
the plan; no pod moves twice. The queue then takes the room (the fold places after the moves).

Work: a pass over the nodes per waiting pod (at most ``RELIEVE_PODS``); every subset of a node's pods
looked at, and every trial move, is spent from the allowance (:class:`~processor.core.defrag_moves.Allowance`).
"""

from __future__ import annotations

from itertools import combinations
from math import comb

from processor.core.defrag_gaps import DEPTH, Gaps, record
from processor.core.defrag_moves import (
    Allowance,
    Trial,
    admits,
    fewest_covering,
    fits_without,
    movable_pods,
    whole_free,
)
from processor.core.node_victims import fits_now, gpus_fit
from processor.core.policies.base import default_gpus
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Pod, lookup
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

RELIEVE_SHAPES = 16  # waiting whole-GPU shapes (queue order) that idle GPUs short of CPU are relieved for
RELIEVE_PODS = 8  # waiting GPU pods (queue order) that pods are moved across nodes for, per Defragment
RELIEVE_MOVES = 2  # pods moved off one node at most to make room for one waiting pod
RELIEVE_SUBSETS = 200  # subsets of a node's movable pods tried per node when moving pods across nodes
ACROSS_MODELS = True  # without quotas, a pod moved across nodes may change GPU model (within its own constraint)
SWAP = True  # also move a light GPU pod onto GPUs left idle for want of CPU, freeing a GPU with CPU to spare


def _waiting_whole_gpu_shapes(cluster: ClusterState) -> list[PodShape]:
    """The shapes of the first waiting whole-GPU pods, in queue order (at most ``RELIEVE_SHAPES``)."""
    heads = sorted(cluster.queue.heads(), key=lambda head: head[0])
    shapes = [group[2] for _, group in heads if group[2].num_gpu and group[2].gpu_milli >= GPU_MILLI]
    return shapes[:RELIEVE_SHAPES]


def relieve(cluster: ClusterState, gaps: Gaps, budget: int, before: dict[str, tuple[int, bool]]) -> None:
    """Make idle whole GPUs usable where a waiting pod lacks only CPU or memory on their node: move
    movable shares (CPU-heaviest first) off that node into gaps elsewhere until the first waiting
    whole-GPU shape (queue order) that wants no more GPUs than are idle there fits; or move nothing."""
    shapes = _waiting_whole_gpu_shapes(cluster)
    if not shapes:
        return
    trial = gaps.trial
    for node_id in sorted(cluster.nodes):  # measure: the nodes left; each attempt on one spends the allowance
        node = cluster.nodes[node_id]
        idle = whole_free(node)
        if not idle or not node.schedulable or node.gpu_model not in gaps.lists:
            continue
        for shape in shapes:
            if shape.num_gpu > idle or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
                continue
            if fits_now(node, shape) or not admits(cluster, node, shape):
                break  # it fits as it is (the queue takes it), or never will by moving shares
            keys = {(node_id, index) for index in range(node.gpu_count)}
            pods = [pod for key in sorted(keys) for pod in gaps.shares.get(key, ()) if pod.spec.movable]
            pods.sort(key=lambda p: (-p.spec.cpu_milli, -p.spec.memory_mib, p.spec.pod_id))
            cpu = node.cpu_free + sum(pod.spec.cpu_milli for pod in pods)
            memory = node.memory_free + sum(pod.spec.memory_mib for pod in pods)
            if cpu < shape.cpu_milli or memory < shape.memory_mib:
                continue
            allowance = trial.allowance(budget)
            if not allowance.move(trial) or not allowance.look(len(pods)):  # a gap sought per share at most
                return
            mark = len(gaps.journal)
            gaps.seen = {}
            why = f"moving CPU and memory off {node_id} so its {idle} idle GPU(s) can take a waiting pod"
            for pod in pods:
                if fits_now(node, shape) or len(trial.moves) >= budget:
                    break
                gaps.place(pod, node.gpu_model, keys, why, DEPTH)
            if not fits_now(node, shape):
                gaps.undo_to(mark)
                continue
            record(gaps, before)
            break
        if len(trial.moves) >= budget:
            return


def relieve_across(cluster: ClusterState, trial: Trial, budget: int, before: dict[str, tuple[int, bool]]) -> None:
    """Make room for the first waiting GPU pods (queue order, at most ``RELIEVE_PODS``) on nodes whose GPUs
    they could use but whose CPU or memory is taken: move at most ``RELIEVE_MOVES`` movable pods of any kind
    (whole-GPU, shares, CPU-only) off such a node to other nodes of its GPU model where they fit, without
    leaving idle GPUs there short of CPU for the waiting pods (:func:`_landing`). The node needing the fewest
    moves wins (then id); a node made ready for one waiting pod is not used again in the plan, and pods
    are not moved twice. On trial: the queue takes the room (the fold places after the moves)."""
    heads = sorted(cluster.queue.heads(), key=lambda head: head[0])
    shapes = [group[2] for _, group in heads if group[2].num_gpu]
    if not shapes:
        return
    # A node with idle GPUs and less CPU or memory than every waiting GPU pod asks for strands its GPUs.
    least = (min(shape.cpu_milli for shape in shapes), min(shape.memory_mib for shape in shapes))
    claimed: set[str] = set()
    tried = 0
    movers = [
        pod
        for pod in movable_pods(cluster)
        if pod.spec.gang_id is None
        and (pod.spec.num_gpu == 1 or (pod.spec.num_gpu > 1 and pod.spec.gpu_milli >= GPU_MILLI))
    ]
    for _, group in heads:  # measure: waiting groups left; at most RELIEVE_PODS pods tried in all
        shape = group[2]
        if not shape.num_gpu or (shape.num_gpu > 1 and shape.gpu_milli < GPU_MILLI):
            continue
        for _ in range(cluster.queue.count(group)):
            if tried >= RELIEVE_PODS or len(trial.moves) >= budget:
                return
            tried += 1
            ready = _unclaimed_fit(cluster, shape, claimed)  # room an earlier step made: the queue takes it
            node_id = ready
            if node_id is None:
                node_id = _room_across(cluster, trial, shape, budget - len(trial.moves), claimed, least, before)
            if node_id is None and SWAP:
                node_id = _room_by_swap(cluster, trial, shape, claimed, least, movers, before)
            if node_id is None:
                break  # the next pod of this shape would find no more
            claimed.add(node_id)


def _unclaimed_fit(cluster: ClusterState, shape: PodShape, claimed: set[str]) -> str | None:
    """A node (least id) the shape fits now and that is not kept for another waiting pod, or None."""
    found = [
        next((n for n in group.node_ids if n not in claimed and admits(cluster, cluster.nodes[n], shape)), None)
        for group in cluster.index.feasible(shape)
    ]  # each group's first node not kept (ids ascending): at most len(claimed) + 1 looked at per group
    return min((node_id for node_id in found if node_id is not None), default=None)


def _room_across(
    cluster: ClusterState,
    trial: Trial,
    shape: PodShape,
    budget: int,
    claimed: set[str],
    least: tuple[int, int],
    before: dict[str, tuple[int, bool]],
) -> str | None:
    """Move movable pods off the node where the shape fits after the fewest moves (then node id), each to a
    landing of its own (:func:`_landing`); on trial. The node, or None (nothing moved)."""
    best: tuple[int, str, tuple[Pod, ...]] | None = None
    limit = min(RELIEVE_MOVES, budget)
    allowance = trial.allowance(budget)
    for node_id in sorted(cluster.nodes):  # measure: nodes left; subsets and landings paid by the allowance
        node = cluster.nodes[node_id]
        if node_id in claimed or not admits(cluster, node, shape):
            continue
        if shape.gpu_models and node.gpu_model not in shape.gpu_models:
            continue
        if not gpus_fit(node.gpu_free, shape) or fits_now(node, shape):
            continue  # only a node whose GPUs the pod could take but whose CPU or memory is short
        present = (lookup(cluster.pods, pod_id) for pod_id in sorted(node.pods))
        movable = [
            pod
            for pod in present
            if pod is not None
            and pod.spec.movable
            and pod.spec.gang_id is None
            and pod.spec.pod_id not in trial.at
            and (pod.spec.num_gpu <= 1 or pod.spec.gpu_milli >= GPU_MILLI)  # no fractional multi-GPU pod
        ]
        if not movable or not fits_without(node, shape, movable):
            continue
        movable.sort(key=lambda p: (-p.spec.cpu_milli, -p.spec.memory_mib, p.spec.pod_id))
        # Fewer pods than it takes to cover the CPU (or memory) short, CPU-heaviest first, cannot do it.
        cpu_short, memory_short = shape.cpu_milli - node.cpu_free, shape.memory_mib - node.memory_free
        fewest = max(
            (fewest_covering([pod.spec.cpu_milli for pod in movable], cpu_short) or 0) if cpu_short > 0 else 0,
            (fewest_covering([pod.spec.memory_mib for pod in movable], memory_short) or 0) if memory_short > 0 else 0,
        )
        subsets = 0
        for size in range(1, (best[0] - 1 if best is not None else limit) + 1):
            if size < fewest:
                subsets += comb(len(movable), size)  # all fail: counted, as trying each would
                if subsets > RELIEVE_SUBSETS:
                    break
                continue
            for chosen in combinations(movable, size):  # at most RELIEVE_SUBSETS per node, a look each
                subsets += 1
                if subsets > RELIEVE_SUBSETS or not allowance.look():
                    break
                if not fits_without(node, shape, list(chosen)):
                    continue
                if not allowance.move(trial):
                    break
                mark = len(trial.moves)
                ok = all(_land(cluster, trial, pod, node_id, claimed, least, "") for pod in chosen)
                ok = ok and fits_now(node, shape)
                trial.undo_to(mark)
                if ok:
                    best = (size, node_id, chosen)
                    break
            if (best is not None and best[1] == node_id) or subsets > RELIEVE_SUBSETS or allowance.spent:
                break
        if (best is not None and best[0] == 1) or allowance.spent:
            break  # one move: nothing does better (ties on node id); or out of work
    if best is None:
        return None
    _, node_id, chosen = best
    node = cluster.nodes[node_id]
    mark = len(trial.moves)
    seen: dict[str, tuple[int, bool]] = {}
    idle = whole_free(node)
    why = (
        f"moving it off {node_id} so a waiting pod ({shape.num_gpu} GPU(s), {shape.cpu_milli} mCPU) fits there: "
        f"its GPUs{f' ({idle} idle)' if idle else ''} lacked the CPU or memory"
    )
    for pod in chosen:
        if not _land(cluster, trial, pod, node_id, claimed, least, why, seen=seen):
            trial.undo_to(mark)  # it landed while planning; the order is the same
            return None
    if not fits_now(node, shape):
        trial.undo_to(mark)
        return None
    for touched, state in seen.items():
        before.setdefault(touched, state)
    return node_id


def _room_by_swap(
    cluster: ClusterState,
    trial: Trial,
    shape: PodShape,
    claimed: set[str],
    least: tuple[int, int],
    movers: list[Pod],
    before: dict[str, tuple[int, bool]],
) -> str | None:
    """One move: a movable GPU pod whose leaving makes the shape fit its node goes where GPUs are idle (or a
    gap is left) for want of CPU or memory there and it fits (:func:`_landing`); the first by node id, then
    pod id. On trial; the node made ready, or None."""
    # A pod with more CPU or memory than any node short of ``least`` has free lands nowhere (a bound).
    short = [
        node
        for node in cluster.nodes.values()
        if node.schedulable and node.gpu_count and (node.cpu_free < least[0] or node.memory_free < least[1])
    ]
    cpu = max((node.cpu_free for node in short), default=-1)
    memory = max((node.memory_free for node in short), default=-1)
    allowance = trial.allowance(0)  # made when the plan began
    for pod in movers:  # measure: movers left; each attempt a look and trial moves of the allowance
        if pod.spec.cpu_milli > cpu or pod.spec.memory_mib > memory or pod.spec.pod_id in trial.at:
            continue
        node = cluster.nodes[pod.node_id]  # type: ignore[index]
        if node.node_id in claimed or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
            continue
        if not fits_without(node, shape, [pod]) or not admits(cluster, node, shape):
            continue
        if not allowance.look() or not allowance.move(trial):
            return None
        mark = len(trial.moves)
        seen: dict[str, tuple[int, bool]] = {}
        why = (
            f"moving it off {node.node_id} so a waiting pod ({shape.num_gpu} GPU(s), {shape.cpu_milli} mCPU) "
            "fits there, to a GPU that lacked the CPU or memory for that pod"
        )
        if _land(cluster, trial, pod, node.node_id, claimed, least, why, seen=seen, stranded_only=True):
            if fits_now(node, shape):
                for touched, state in seen.items():
                    before.setdefault(touched, state)
                return node.node_id
            trial.undo_to(mark)
    return None


def _land(
    cluster: ClusterState,
    trial: Trial,
    pod: Pod,
    away: str,
    claimed: set[str],
    least: tuple[int, int],
    why: str,
    seen: dict[str, tuple[int, bool]] | None = None,
    stranded_only: bool = False,
) -> bool:
    """Move a pod off node ``away`` on trial to its landing (:func:`_landing`); False if it has none."""
    # Without quotas a pod may change GPU model within its own constraint (quota keys follow the model).
    model = None if ACROSS_MODELS and not cluster.quotas_on else cluster.nodes[away].gpu_model
    landing = _landing(cluster, pod, claimed | {away}, model, least, trial.allowance(0), stranded_only)
    if landing is None:
        return False
    if seen is not None:
        for node_id in (away, landing[0]):
            if node_id not in seen:
                node = cluster.nodes[node_id]
                seen[node_id] = (whole_free(node), not node.pods)
    trial.move(pod, landing[0], landing[1], why)
    return True


def _landing(
    cluster: ClusterState,
    pod: Pod,
    exclude: set[str],
    model: str | None,
    least: tuple[int, int],
    allowance: Allowance,
    stranded_only: bool = False,
) -> tuple[str, tuple[GpuShare, ...]] | None:
    """Where a pod moved across nodes goes: a node of ``model`` (for a GPU pod) where it fits, that is not
    left with idle GPUs short of the CPU or memory ``least`` the smallest waiting GPU pod asks (unless it
    already was); best fit by GPU, then CPU, then node id. A look per group of the capacity index."""
    shape = pod.shape._replace(gpu_models=(model,)) if pod.spec.num_gpu and model is not None else pod.shape
    best: tuple[tuple[int, int, str], str] | None = None
    groups = cluster.index.feasible(shape)
    allowance.spend(len(groups))
    for group in groups:  # measure: the groups left
        signature = group.signature
        if model is not None and signature.gpu_model != model:
            continue
        node_id = next((n for n in group.node_ids if n not in exclude), None)
        if node_id is None:
            continue
        free = list(signature.gpu_free)
        if shape.num_gpu and shape.gpu_milli < GPU_MILLI:
            gap = min(milli for milli in free if milli >= shape.gpu_milli)
            fit = gap - shape.gpu_milli
            free[free.index(gap)] = fit
        else:
            fit = sum(1 for milli in free if milli >= GPU_MILLI) - shape.num_gpu
            for _ in range(shape.num_gpu if shape.num_gpu else 0):
                free[free.index(max(free))] = 0
        idle_before = sum(1 for milli in signature.gpu_free if milli >= GPU_MILLI)
        idle_after = sum(1 for milli in free if milli >= GPU_MILLI)
        cpu_after = signature.cpu_free - shape.cpu_milli
        memory_after = signature.memory_free - shape.memory_mib
        short_before = signature.cpu_free < least[0] or signature.memory_free < least[1]
        if idle_after and (cpu_after < least[0] or memory_after < least[1]) and not (idle_before and short_before):
            continue  # it would strand that node's idle GPUs
        if stranded_only and not short_before:
            continue  # GPUs a waiting pod could use as they are: not to be taken
        rank = (fit, cpu_after, node_id)
        if best is None or rank < best[0]:
            best = (rank, node_id)
    if best is None:
        return None
    node_id = best[1]
    return node_id, default_gpus(cluster.nodes[node_id].gpu_free, shape)
