"""Set re-packing: free a GPU by packing the shares of a few partly used GPUs of one model anew.

A GPU to free (the pool: partly used GPUs whose shares are all movable, most free milli first) and as few
other GPUs of its model as have that much free milli between them (on its node or with CPU for one of its
shares; one more if that fails; at most ``REPACK_SET`` in all) have all their shares packed anew into all but
one of them: depth first, largest share first, each trying its own GPU first and then best fit; selector,
taints, and the CPU and memory of every node at the end respected. The moves are ordered so that each fits
where it lands when it is applied; a cycle is broken by parking a share (on the GPU being freed, another of
the set, or a best-fit gap outside it) until its place has room. Of the GPUs of the set it could free, the
sequence with the fewest moves wins; kept within the budget and if it lowers the FGD fragmentation.

Work: per model, at most ``REPACK_TRIES`` sets, each up to three packings of at most ``REPACK_STEPS`` steps;
every GPU of a pool drawn, set drawn and packing step is a look of the allowance (:class:`Allowance`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from processor.core.defrag_gaps import Gaps, GpuKey, record
from processor.core.defrag_moves import Allowance, Trial, admits, less_fragmented
from processor.core.fragmentation import Fragmenter
from processor.core.state import ClusterState, Pod
from schemas.commands import GPU_MILLI

REPACK_SET = 6  # GPUs re-packed together at most (one of them is freed)
REPACK_POOL = 48  # GPUs per model, most free milli first, that the sets are drawn from
REPACK_TRIES = 32  # sets tried per model per Defragment
REPACK_STEPS = 400  # search steps per packing of a set (a bound, so a Defragment stays fast)
REPACK_RIGID = 750  # a GPU holding one share larger than this only takes tiny shares: not in the pool


def repack(
    cluster: ClusterState,
    gaps: Gaps,
    budget: int,
    before: dict[str, tuple[int, bool]],
    fragmenter: Fragmenter | None,
) -> None:
    """Free whole GPUs by re-packing the shares of a few partly used GPUs together: a set of at most
    ``REPACK_SET`` GPUs of one model (consecutive in the pool, most free first) whose free milli adds up to a
    GPU is packed into all but one of them (:func:`_pack`), the moves ordered so none over-commits
    (:func:`_sequence`); kept only within the budget and if it lowers FGD fragmentation, else undone."""
    trial = gaps.trial
    allowance = trial.allowance(budget)
    for model in sorted(gaps.lists):
        failed: dict[tuple[GpuKey, ...], bool] = {}
        pool: list[GpuKey] | None = None
        for _ in range(REPACK_TRIES):  # measure: tries left (and the allowance)
            if len(trial.moves) >= budget or not allowance.move(trial):
                return
            if pool is None:
                pool = _repack_pool(gaps, model, allowance)
            if not allowance.look(len(pool) + 1):  # drawing the sets of the pool (O(REPACK_POOL) each)
                return
            members = next((found for found in _repack_sets(gaps, pool) if found not in failed), None)
            if members is None:
                break
            if _repack_set(cluster, gaps, members, budget, fragmenter):
                record(gaps, before)
                pool = None  # shares moved: draw the pool again
            else:
                failed[members] = True  # everything undone: the same pool


def _repack_set(
    cluster: ClusterState, gaps: Gaps, members: tuple[GpuKey, ...], budget: int, fragmenter: Fragmenter | None
) -> bool:
    """Try to free one GPU of ``members`` (the first, or one of the two holding the fewest shares, then least
    used) by re-packing all their shares into the others: of the packings found, the one that moves the fewest
    shares first. On trial; kept if within the budget and less fragmented, else undone."""
    trial = gaps.trial
    pods = sorted((pod for key in members for pod in gaps.shares.get(key, ())), key=lambda p: p.spec.pod_id)
    at = {pod.spec.pod_id: _gpu_of(trial, pod) for pod in pods}
    nodes = cluster.nodes
    others = sorted(
        members[1:], key=lambda key: (len(gaps.shares.get(key, ())), GPU_MILLI - nodes[key[0]].gpu_free[key[1]], key)
    )
    found: list[tuple[int, int, GpuKey, dict[str, GpuKey]]] = []
    allowance = trial.allowance(budget)
    for rank, freed in enumerate((members[0], *others[:2])):
        limit = min(REPACK_STEPS, allowance.looks)
        target, steps = _pack(gaps, pods, [key for key in members if key != freed], at, limit)
        allowance.look(steps)  # a look per step of the packing (at most what was left)
        if target is not None:
            moving = sum(1 for pod_id, key in target.items() if at[pod_id] != key)
            if moving <= budget - len(trial.moves):
                found.append((moving, rank, freed, target))
    names = ", ".join(f"GPU {index} of {node_id}" for node_id, index in members)
    best: tuple[int, int] | None = None  # (moves with the parked ones, rank) of the best sequence that works
    for moving, rank, freed, target in sorted(found, key=lambda entry: entry[:2]):
        if best is not None and moving >= best[0]:
            break  # a sequence never takes fewer moves than its packing
        mark, moves = len(gaps.journal), len(trial.moves)
        gaps.seen = {}
        why = f"re-packing the shares of {names} so GPU {freed[1]} of {freed[0]} is freed whole"
        if (
            _sequence(gaps, pods, target, members, freed, why)
            and nodes[freed[0]].gpu_free[freed[1]] >= GPU_MILLI
            and len(trial.moves) <= budget
            and less_fragmented(cluster, fragmenter, gaps.seen)  # it must lower FGD fragmentation where it moves
        ):
            taken = len(trial.moves) - moves
            if taken == moving:  # no share parked: nothing can do better
                return True
            if best is None or taken < best[0]:
                best = (taken, rank)
        gaps.undo_to(mark)
    if best is None:
        return False
    _, rank, freed, target = next(entry for entry in found if entry[1] == best[1])
    gaps.seen = {}
    why = f"re-packing the shares of {names} so GPU {freed[1]} of {freed[0]} is freed whole"
    return _sequence(gaps, pods, target, members, freed, why)


def _repack_pool(gaps: Gaps, model: str, allowance: Allowance) -> list[GpuKey]:
    """The partly used GPUs of a model whose shares are all movable, most free milli first (then key), at most
    ``REPACK_POOL``; a GPU holding one share larger than ``REPACK_RIGID`` is left out (it can only take tiny
    shares, and its own share fits nowhere but an empty GPU). A look per GPU looked at."""
    pool: list[GpuKey] = []
    entries = gaps.lists[model]
    for position in range(len(entries) - 1, -1, -1):  # measure: the position, down to 0
        if not allowance.look():
            break
        _, node_id, index = entries[position]
        key = (node_id, index)
        pods = gaps.shares.get(key, ())
        if not pods or not all(pod.spec.movable for pod in pods):
            continue
        if len(pods) == 1 and pods[0].spec.gpu_milli > REPACK_RIGID:
            continue
        pool.append(key)
        if len(pool) >= REPACK_POOL:
            break
    # Equal free milli: by key, so the order never depends on how the list was built.
    free = {key: gaps.cluster.nodes[key[0]].gpu_free[key[1]] for key in pool}
    pool.sort(key=lambda key: (-free[key], key))
    return pool


def _gpu_of(trial: Trial, pod: Pod) -> GpuKey:
    """The GPU a share is on in the trial."""
    node_id, gpus = trial.where(pod)
    return node_id, gpus[0].index


def _repack_sets(gaps: Gaps, pool: list[GpuKey]) -> Iterator[tuple[GpuKey, ...]]:
    """Candidate sets, the GPU to free first: each GPU of the pool (most free first) with the GPUs of the pool
    that could take one of its shares' CPU (on its node, or on a node with that much CPU free), most free first,
    as few as add up to its used milli, then one more, up to ``REPACK_SET``."""
    nodes = gaps.cluster.nodes
    free = {key: nodes[key[0]].gpu_free[key[1]] for key in pool}
    for source in pool:
        pods = gaps.shares.get(source, ())
        cpu = min(pod.spec.cpu_milli for pod in pods)
        memory = min(pod.spec.memory_mib for pod in pods)
        receivers = [
            key
            for key in pool
            if key != source
            and (key[0] == source[0] or (nodes[key[0]].cpu_free >= cpu and nodes[key[0]].memory_free >= memory))
        ]
        need, total, size = GPU_MILLI - free[source], 0, 0
        while size < len(receivers) and total < need:
            total += free[receivers[size]]
            size += 1
        if total < need:
            continue
        for extra in range(size, min(size + 2, REPACK_SET, len(receivers) + 1)):
            yield (source, *receivers[:extra])


def _pack(
    gaps: Gaps, pods: list[Pod], bins: list[GpuKey], at: dict[str, GpuKey], limit: int
) -> tuple[dict[str, GpuKey] | None, int]:
    """A packing of the shares ``pods`` into the GPUs ``bins``: depth-first, largest share first, each trying
    the GPU it is on first and then the fullest GPU that holds it (best fit); GPU model, selector, taints and
    the CPU and memory of every node at the end respected. At most ``limit`` steps (``REPACK_STEPS`` or what
    the allowance has left); (the packing or None if none found, the steps taken)."""
    cluster = gaps.cluster
    order = sorted(pods, key=lambda p: (-p.spec.gpu_milli, p.spec.pod_id))
    # Room on each GPU once the set's shares are lifted off (what else holds it stays).
    room = {key: cluster.nodes[key[0]].gpu_free[key[1]] for key in bins}
    for pod in order:
        if at[pod.spec.pod_id] in room:
            room[at[pod.spec.pod_id]] += pod.spec.gpu_milli
    admitted: dict[tuple[str, str], bool] = {}
    for pod in order:
        for key in bins:
            admitted[(pod.spec.pod_id, key[0])] = admits(cluster, cluster.nodes[key[0]], pod.shape)
    left = [0] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        left[i] = left[i + 1] + order[i].spec.gpu_milli
    chosen: dict[str, GpuKey] = {}
    steps = 0

    def resources_fit() -> bool:
        cpu: dict[str, int] = {}
        memory: dict[str, int] = {}
        for pod in order:
            spec = pod.spec
            source, target = at[spec.pod_id][0], chosen[spec.pod_id][0]
            if source == target:
                continue
            cpu[source] = cpu.get(source, 0) + spec.cpu_milli
            cpu[target] = cpu.get(target, 0) - spec.cpu_milli
            memory[source] = memory.get(source, 0) + spec.memory_mib
            memory[target] = memory.get(target, 0) - spec.memory_mib
        for node_id in sorted(cpu):
            node = cluster.nodes[node_id]
            if node.cpu_free + cpu[node_id] < 0 or node.memory_free + memory[node_id] < 0:
                return False
        return True

    def search() -> bool:
        """Depth first without recursion: one frame per pod placed so far (its options, the next to try, the
        rooms tried, the GPU it holds now)."""
        nonlocal steps
        frames: list[list[Any]] = []
        i = 0
        while True:  # the measure: steps left (``limit``), down by one per level entered
            steps += 1
            if steps > limit:
                return False
            if i == len(order):
                if resources_fit():
                    return True
            elif left[i] <= sum(room.values()):
                pod_id, need = order[i].spec.pod_id, order[i].spec.gpu_milli
                here = at[pod_id]
                options = sorted(
                    (key for key in bins if room[key] >= need and admitted[(pod_id, key[0])]),
                    key=lambda key: (key != here, room[key], key),
                )
                frames.append([options, 0, [], None])
            # The deepest frame takes its next option (a GPU with a room not tried yet), or is done.
            while frames:  # measure: frames left, each popped once its options are spent
                level = len(frames) - 1
                frame = frames[level]
                pod_id, need = order[level].spec.pod_id, order[level].spec.gpu_milli
                here = at[pod_id]
                if frame[3] is not None:  # undo the option tried last
                    room[frame[3]] += need
                    del chosen[pod_id]
                    frame[3] = None
                options, k, tried = frame[0], frame[1], frame[2]
                while k < len(options):  # measure: options left
                    key = options[k]
                    k += 1
                    if key != here and room[key] in tried:
                        continue  # the same room elsewhere: the same packings of what is left
                    if key != here:
                        tried.append(room[key])
                    room[key] -= need
                    chosen[pod_id] = key
                    frame[3] = key
                    break
                frame[1] = k
                if frame[3] is not None:
                    i = level + 1
                    break
                frames.pop()
            else:
                return False

    found = search()
    return (dict(chosen) if found else None), min(steps, limit)


def _sequence(
    gaps: Gaps, pods: list[Pod], target: dict[str, GpuKey], members: tuple[GpuKey, ...], freed: GpuKey, why: str
) -> bool:
    """Apply a packing on trial as moves that each fit where they land when applied: any share whose place has
    room goes (ids in order); when none can (a cycle), the smallest waiting share that can is parked: on the GPU
    being freed, else on another GPU of the set, else in the best-fit gap outside it; it moves on once its place
    has room. True when every share is where the packing puts it."""
    index = {pod.spec.pod_id: pod for pod in pods}
    waiting = sorted(pod_id for pod_id, key in target.items() if _gpu_of(gaps.trial, index[pod_id]) != key)
    model = gaps.cluster.nodes[freed[0]].gpu_model
    outside = set(members)
    for _ in range(2 * len(pods) + 2):  # measure: a move a turn, each share at most parked once and placed once
        if not waiting:
            return True
        ready = [pod_id for pod_id in waiting if gaps.room(index[pod_id], target[pod_id])]
        if ready:
            pod_id = ready[0]
            gaps.move(index[pod_id], target[pod_id], why)
            waiting.remove(pod_id)
            continue
        if not _park(gaps, [index[pod_id] for pod_id in waiting], target, members, freed, model, outside, why):
            return False
    return not waiting


def _park(
    gaps: Gaps,
    waiting: list[Pod],
    target: dict[str, GpuKey],
    members: tuple[GpuKey, ...],
    freed: GpuKey,
    model: str,
    outside: set[GpuKey],
    why: str,
) -> bool:
    """Park the smallest waiting share that can be parked (see :func:`_sequence`); False if none can."""
    for pod in sorted(waiting, key=lambda p: (p.spec.gpu_milli, p.spec.pod_id)):
        here, there = _gpu_of(gaps.trial, pod), target[pod.spec.pod_id]
        spots = [freed] + [key for key in members if key != freed]
        spot = next((key for key in spots if key not in (here, there) and gaps.room(pod, key)), None)
        if spot is None:
            spot = gaps.best_fit(pod, model, outside)
        if spot is not None:
            gaps.move(pod, spot, f"{why} (parked on GPU {spot[1]} of {spot[0]} until its place has room)")
            return True
    return False
