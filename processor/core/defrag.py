"""Defragmentation: migrations of movable pods that free whole GPUs, or make room for one waiting job.

Only running pods submitted with ``movable: true`` move, and only to another schedulable node
of the same GPU model (so quota keys and GPU-model constraints stay as they were) that admits
them (selector, taints; reserved nodes are left alone). A move is one ``PodMigrated``.

**Without a target** (:func:`consolidate`): a GPU that holds only movable shares is *emptied* when
every share on it finds a place on another partly used GPU: best fit, or a chain of two moves
(:mod:`processor.core.defrag_gaps`). The cheapest GPUs go first (fewest pods, then least used); a GPU is
emptied only if that lowers the cluster's FGD fragmentation (``processor.core.fragmentation``, against the
learned typical pods) on the nodes it touches, and only within the move budget. A GPU that took shares in
the plan is not emptied in it. Then **relief** within the gaps for waiting whole-GPU pods
(:func:`processor.core.defrag_relieve.relieve`), **set re-packing** for what gaps and chains cannot find
(:mod:`processor.core.defrag_repack`), and last **moving pods across nodes** for the first waiting GPU pods
(:func:`processor.core.defrag_relieve.relieve_across`).

**With a target** (a waiting pod, or each member of a waiting gang in turn): the node where it fits after
the fewest moves of movable pods away from it (:func:`processor.core.defrag_target.make_room`).

The plan is made on trial (:class:`processor.core.defrag_moves.Trial`: nodes and index follow each move,
then everything is rolled back); the fold emits it, so every move is applied by its event.

**Work, bounded by the budget.** Besides a constant number of passes over the cluster's nodes and pods to
index them (O(N + P log P): the movable pods, the G partly used GPUs in O(G log G), and one pass over the
nodes per waiting pod relieved, at most ``RELIEVE_PODS``), a ``Defragment`` of ``max_moves`` B examines at
most ``LOOKS_BASE`` + ``LOOKS`` · B candidates (looks: a gap, a group of the capacity index, a subset of a
node's pods, a packing step, a node listed for a target; O(1) each) and makes at most ``TRIAL_MOVES`` · B
trial moves (O(log N) each in the indexes): :class:`processor.core.defrag_moves.Allowance`. Once either is
spent, the plan is what was kept so far. A command of contract v1 or v2 has no allowance (it plans as its
release did, so the recorded logs replay byte for byte).
"""

from __future__ import annotations

from processor.core.defrag_gaps import DEPTH, Fragments, Gaps, GpuKey, dry_run, record
from processor.core.defrag_moves import Move, Plan, Trial, any_movable, less_fragmented, movable_pods, outcome, tally
from processor.core.defrag_relieve import relieve, relieve_across
from processor.core.defrag_repack import repack
from processor.core.defrag_target import make_room
from processor.core.fragmentation import Fragmenter
from processor.core.state import ClusterState, Pod
from schemas.commands import GPU_MILLI

__all__ = ["Move", "Plan", "Trial", "any_movable", "consolidate", "make_room", "movable_pods", "tally"]


def consolidate(cluster: ClusterState, budget: int, bounded: bool = True) -> Plan:
    """Free whole GPUs by emptying the cheapest GPUs that hold only movable shares (module docstring); within
    the work allowance of the budget if ``bounded`` (:class:`Allowance`)."""
    models = _share_models(cluster)
    if not models:  # no movable share runs
        return _across_only(cluster, budget, bounded)
    trial = Trial(cluster, bounded)
    allowance = trial.allowance(budget)
    gaps = Gaps(cluster, trial, models)
    sources = []
    for (node_id, index), pods in gaps.shares.items():
        node = cluster.nodes[node_id]
        if node.gpu_model in gaps.lists and node.schedulable and all(pod.spec.movable for pod in pods):
            used = GPU_MILLI - node.gpu_free[index]
            sources.append((len(pods), used, node_id, index))
    sources.sort()
    fragmenter = Fragmenter(cluster.typical) if cluster.typical else None
    fragments: Fragments = {}  # the dry runs' memo of the fragmenter
    before: dict[str, tuple[int, bool]] = {}
    receivers: set[GpuKey] = set()  # GPUs that took shares in this plan: never emptied again
    trial.deferred = True  # the steps up to moving pods across nodes read the nodes, never the index
    try:
        # Measure: the sources left; each one tried spends a look per share (its dry run: at most SCAN gaps
        # per share) and, when tried on trial, moves of the allowance.
        for _, _, node_id, index in sources:
            key = (node_id, index)
            shares = gaps.shares.get(key, ())
            pods = sorted(shares, key=_largest_first) if len(shares) > 1 else list(shares)
            if key in receivers or not pods or len(pods) > budget - len(trial.moves):
                continue
            if not allowance.look(len(pods)):
                break
            node = cluster.nodes[node_id]
            if fragmenter is not None and dry_run(gaps, pods, node.gpu_model, key, fragmenter, fragments) is False:
                continue  # its moves would be undone (not less fragmented): known without making them
            if not allowance.move(trial):
                break
            mark, journal_mark = len(trial.moves), len(gaps.journal)
            gaps.seen = {}
            why = f"consolidating GPU {index} of {node_id} to free it whole"
            ok = True
            for pod in pods:
                if not gaps.place(pod, node.gpu_model, {key}, why, DEPTH):
                    ok = False
                    break
            moved = trial.moves[mark:]
            better = ok and len(trial.moves) <= budget and less_fragmented(cluster, fragmenter, gaps.seen)
            if not better:
                gaps.undo_to(journal_mark)
                continue
            record(gaps, before)
            receivers.update((move.to_node, move.to_gpus[0].index) for move in moved)
        relieve(cluster, gaps, budget, before)
        repack(cluster, gaps, budget, before, fragmenter)
        trial.flush()
        relieve_across(cluster, trial, budget, before)  # last: it moves pods the gaps do not follow
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = outcome(cluster, plan.moves, before)
        plan.looks, plan.trial_moves = allowance.looked, trial.made
        if not plan.moves:
            plan.note = "no GPU holding only movable shares could be emptied within the budget with less fragmentation"
        return plan
    finally:
        trial.rollback()


def _share_models(cluster: ClusterState) -> list[str]:
    """The GPU models of the nodes where movable GPU shares run, sorted. O(P)."""
    nodes = cluster.nodes
    models: set[str] = set()
    for pod in cluster.pods.values():
        if pod.node_id is not None and pod.spec.movable and pod.shape.is_share:
            models.add(nodes[pod.node_id].gpu_model)
    return sorted(models)


def _largest_first(pod: Pod) -> tuple[int, str]:
    """The order a GPU's shares are moved off it: the largest first, then by pod id."""
    return (-pod.spec.gpu_milli, pod.spec.pod_id)


def _across_only(cluster: ClusterState, budget: int, bounded: bool) -> Plan:
    """No movable share runs: only moving pods across nodes for the first waiting pods can help."""
    trial = Trial(cluster, bounded)
    allowance = trial.allowance(budget)
    before: dict[str, tuple[int, bool]] = {}
    try:
        relieve_across(cluster, trial, budget, before)
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = outcome(cluster, plan.moves, before)
        plan.looks, plan.trial_moves = allowance.looked, trial.made
        if not plan.moves:
            plan.note = "no movable GPU-share pod runs, and no move lets a waiting pod start: nothing was moved"
        return plan
    finally:
        trial.rollback()
