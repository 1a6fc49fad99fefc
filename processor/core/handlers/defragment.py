"""``Defragment``: migrations planned on trial (:mod:`processor.core.defrag`), then emitted.

``DefragmentationPlanned``, one ``PodMigrated`` per move, the target's placement (nominated: it goes
first), then the queue retries the nodes the moves left.
"""

from __future__ import annotations

from processor.core import defrag, gangs, preemption_plans, quotas, reservations
from processor.core.decision import RETRY_QUEUE, Decision, cluster_policy
from processor.core.handlers.gangs import gang_shortfall, place_gang
from processor.core.handlers.pods import place
from processor.core.policies.base import Choice
from processor.core.resources import PodShape
from processor.core.state import GANG_QUEUED, GANG_RUNNING, ClusterState, Gang, Pod, lookup, shape_of
from schemas.codes import Rejected, RejectionCode
from schemas.commands import Defragment
from schemas.events import DefragmentationPlanned, PodMigrated
from schemas.validation import check_defragment


def defragment(decision: Decision, command: Defragment) -> None:
    check_defragment(command)
    cluster = decision.cluster
    target = command.target
    name = decision.command.cluster
    pod = gang = None
    if target is not None:
        pod = lookup(cluster.pods, target)
        gang = cluster.gangs.get(target)
        if pod is None and gang is None:
            raise Rejected(
                RejectionCode.UNKNOWN_POD, f"target {target!r} is neither a pod nor a gang in cluster {name!r}"
            )
        if (pod is not None and not pod.queued) or (gang is not None and gang.state != GANG_QUEUED):
            running = (pod is not None and pod.running) or (gang is not None and gang.state == GANG_RUNNING)
            what = "running" if running else "waiting for its dependencies, outside the queue"
            raise Rejected(
                RejectionCode.NOT_WAITING,
                f"target {target!r} is {what}: only a job waiting in the queue has something to make room for",
            )
    if command.max_moves == 0:
        decision.emit(DefragmentationPlanned(0, 0, 0, target, "a budget of 0 moves: nothing was moved"))
        return
    if not defrag.any_movable(cluster):
        message = "no running pod is movable (submitted with movable=true): nothing was moved"
        decision.emit(DefragmentationPlanned(0, 0, 0, target, message))
        return
    if target is None:
        plan = defrag.consolidate(cluster, command.max_moves, decision.bounded_search)
    else:
        plan = _plan_room(decision, cluster, target, pod, gang, command.max_moves)
    moves = plan.moves
    if moves:
        freed = f"freeing {plan.gpus_freed} whole GPU(s)" + (
            f" and {plan.nodes_freed} node(s)" if plan.nodes_freed else ""
        )
        message = f"{len(moves)} move(s) of movable pods (budget {command.max_moves}), {freed}"
        if target is not None:
            message += f", to make room for {target!r}"
    else:
        message = plan.note or "nothing to move"
    decision.emit(DefragmentationPlanned(len(moves), plan.gpus_freed, plan.nodes_freed, target, message))
    for move in moves:
        decision.emit(
            PodMigrated(move.pod_id, move.from_node, move.from_gpus, move.to_node, move.to_gpus, "defragment", move.why)
        )
    sources = tuple(sorted({move.from_node for move in moves}))
    if moves and pod is not None:
        place(decision, cluster, pod.spec, pod.shape, from_queue=True, requeued=False)
    elif moves and gang is not None:
        place_gang(decision, cluster, gang.spec, from_queue=True, requeued=False)
    decision.then(RETRY_QUEUE, cluster, sources, None)


def _plan_room(
    decision: Decision, cluster: ClusterState, target: str, pod: Pod | None, gang: Gang | None, budget: int
) -> defrag.Plan:
    """Moves that let a waiting pod (or every member of a waiting gang) start, checked on trial; or none."""
    now = decision.now
    trial = defrag.Trial(cluster, decision.bounded_search)
    placed = preemption_plans.Trial(cluster)
    why = f"making room for {'pod' if pod is not None else 'gang'} {target!r}"
    try:
        if pod is not None:
            shape: PodShape | None = reservations.usable_shape(cluster, target, pod.shape, now)
            if cluster.quotas_on:
                shape = quotas.admit(cluster, pod.spec, shape).shape  # type: ignore[arg-type]
            if shape is None:
                return defrag.Plan(note=f"pod {target!r} is over its tenant's quota: moving pods would not help")
            if defrag.make_room(cluster, trial, shape, budget, why) is None or not cluster.index.feasible(shape):
                return defrag.Plan(note=f"no node can hold pod {target!r} after at most {budget} move(s)")
        else:
            assert gang is not None
            policy = cluster_policy(cluster)
            for member in gangs.ordered_members(gang.spec):
                shape = reservations.usable_shape(cluster, target, shape_of(member), now)
                groups = cluster.index.feasible(shape)
                if groups:
                    placed.allocate(member, policy.place(cluster, shape, groups))
                    continue
                node_id = defrag.make_room(cluster, trial, shape, budget - len(trial.moves), why)
                if node_id is None:
                    return defrag.Plan(note=f"no room for gang {target!r} after at most {budget} move(s)")
                node = cluster.nodes[node_id]
                placed.allocate(member, Choice(node_id, policy.choose_gpus(node, shape), {}))
            placed.rollback()
            found = gangs.try_place(cluster, gang.spec, policy, now)
            if not isinstance(found, gangs.GangPlacement) or (
                cluster.quotas_on and gang_shortfall(cluster, gang.spec, found) is not None
            ):
                return defrag.Plan(note=f"gang {target!r} would still not start after the moves")
        moves = list(trial.moves)
        after = defrag.tally(cluster, moves)
    finally:
        placed.rollback()
        trial.rollback()
    before = defrag.tally(cluster, moves)
    plan = defrag.Plan(moves, max(0, after[0] - before[0]), max(0, after[1] - before[1]))
    plan.looks, plan.trial_moves = trial.allowance(budget).looked, trial.made
    return plan
