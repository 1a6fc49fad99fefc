"""Quotas, cohorts and fair share: what a tenant may run, what it may borrow, whose turn it is.

A tenant's quota (``SetQuota``; tenants without one have the cluster's default from
``SetPolicy``, and with no default they are not limited, as before quotas existed)
limits the resources its *running* pods hold, per **key**:

- ``gpu:<model>`` for each GPU model the quota names, and ``gpu:*`` for the GPUs of
  every model it does not name (0 unless ``"*"`` is given); an empty ``nominal_gpus``
  leaves GPUs unlimited. A GPU share counts as its milli fraction of a GPU.
- ``cpu`` and ``memory``; ``None`` leaves them unlimited.

Without a cohort a tenant may hold up to its nominal quota. Tenants of one cohort pool
what they lend (their nominal, or ``lending_limit_gpus`` if smaller; the rest is
guaranteed to them) and may borrow from the pool up to ``borrowing_limit_gpus`` beyond
their nominal: on every key, the cohort's use of the pool never exceeds the pool
(Kueue's model). A cohort declared with ``SetCohort`` (contract v4) may have a parent and a
quota of its own: borrowing then walks up the cohort tree (``processor.core.cohort_tree``).
Quotas are pooled by key name: what one tenant lends on ``gpu:A100`` only tenants whose
quota names A100 can borrow.

Admission checks quota before placement. A pod that would go over waits with
``QUOTA_EXCEEDED`` (the usage and the limit in words). A tenant that asks for capacity
inside its nominal quota that others borrowed *reclaims* it: borrowers' pods are
preempted (lowest priority, youngest first) until the request fits, and no more.
Lowering a quota below what a tenant already runs evicts nothing: its new work waits.

Fair share: when capacity frees, pods of equal priority are retried in order of their
tenant's weighted dominant share (DRF over GPU, CPU and memory, divided by the weight).

Everything is O(models + cohort members) per check and only runs when a quota exists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from processor.core import cohort_tree
from processor.core.quota_keys import (
    CPU,
    GPU,
    MEMORY,
    Demand,
    Limits,
    borrowing_limit,
    demand,
    gpu_key,
    guaranteed,
    has_key,
    lendable,
    limited_keys,
    nominal,
    usage_on,
)
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Pod
from schemas.commands import ANY_MODEL, BORROW_LOWER, GPU_MILLI, RECLAIM_NEVER, WITHIN_NEVER, CohortQuota, Quota
from schemas.events import PodSpec

_NONE: dict[str, None] = {}


def quota_of(cluster: ClusterState, tenant: str) -> Quota | None:
    quota = cluster.quotas.get(tenant)
    return quota if quota is not None else cluster.default_quota


def used(cluster: ClusterState, tenant: str, quota: Quota, key: str) -> int:
    """What the tenant's running pods hold on a key. O(models)."""
    return usage_on(cluster.usage.get(tenant), quota, key)


def add(total: Demand, more: Demand) -> None:
    for key, amount in more.items():
        total[key] = total.get(key, 0) + amount


def pool(cluster: ClusterState, cohort: str, key: str) -> tuple[int, int]:
    """(what the cohort's members lend on the key, how much of it is in use). O(1): kept by the state."""
    entry = cluster.pools.get((cohort, key))
    return (entry.lent, entry.in_use) if entry is not None else (0, 0)


@dataclass(slots=True)
class Shortfall:
    """Why a demand does not fit a tenant's quota on one key; ``reclaimable``: it is within the nominal
    quota, and only others' borrowing stands in the way."""

    tenant: str
    key: str
    used: int
    need: int
    room: int
    reclaimable: bool
    message: str
    cohort: str | None = None  # the cohort of the tree that has no room (None: the tenant's own limits)
    depth: int = 0  # its level: 1 for the tenant's own cohort, 2 for its parent, and so on


def _amount(key: str, value: int) -> str:
    if key == CPU:
        return f"{value / 1000:g} cores"
    if key == MEMORY:
        return f"{value / 1024:g} GiB"
    model = key[len(GPU) :]
    what = "GPU(s) of models its quota does not name" if model == ANY_MODEL else f"{model} GPU(s)"
    return f"{value / GPU_MILLI:g} {what}"


def key_limit(quota: Quota, limits: Limits | None, key: str) -> tuple[int | None, int, int | None]:
    """(nominal amount, the part the tenant keeps for itself, borrowing limit) on a key: from the quota compiled
    (``ClusterState.limits``) when given, else from the quota itself. Nominal None: the key is not limited."""
    entry = limits.get(key) if limits is not None else None
    if entry is not None:
        return entry.nominal, entry.kept, entry.borrowing
    amount = nominal(quota, key)
    return amount, 0 if amount is None else amount - lendable(quota, key), borrowing_limit(quota, key)


def check(cluster: ClusterState, tenant: str, quota: Quota, wanted: Demand) -> Shortfall | None:
    """The first key (in key order) on which adding ``wanted`` would break the tenant's quota, or None."""
    limits = cluster.limits.get(tenant) if cluster.quotas.get(tenant) is quota else None
    for key in sorted(wanted) if len(wanted) > 1 else wanted:
        need = wanted[key]
        amount, kept, limit = key_limit(quota, limits, key)
        if amount is None or need <= 0:
            continue
        now = used(cluster, tenant, quota, key)
        cohort = quota.cohort
        if cohort is None:
            if now + need > amount:
                message = (
                    f"tenant {tenant!r} runs {_amount(key, now)} of its quota of {_amount(key, amount)}; "
                    f"this needs {_amount(key, need)} more"
                )
                return Shortfall(tenant, key, now, need, max(0, amount - now), False, message)
            continue
        if limit is not None and now + need > amount + limit:
            message = (
                f"tenant {tenant!r} runs {_amount(key, now)}: its nominal {_amount(key, amount)} plus the "
                f"{_amount(key, limit)} it may borrow in cohort {cohort!r} leave room for "
                f"{_amount(key, max(0, amount + limit - now))}; this needs {_amount(key, need)}"
            )
            return Shortfall(tenant, key, now, need, max(0, amount + limit - now), False, message)
        if cluster.cohort_specs and cohort_tree.parent_of(cluster.cohort_specs, cohort) is not None:
            short = _tree_shortfall(cluster, tenant, cohort, key, now, need, amount, kept, limit)
            if short is not None:
                return short
            continue
        size, in_use = pool(cluster, cohort, key)
        guaranteed = kept  # the pool counts only use beyond what the tenant keeps for itself
        after = in_use - max(0, now - guaranteed) + max(0, now + need - guaranteed)
        if after > size:
            within = now + need <= amount
            room = max(0, size - in_use + max(0, now - guaranteed) + guaranteed - now)
            if limit is not None:
                room = min(room, max(0, amount + limit - now))
            message = (
                f"tenant {tenant!r} runs {_amount(key, now)} (nominal {_amount(key, amount)}); cohort {cohort!r} "
                f"lends {_amount(key, size)} in all and {_amount(key, max(0, size - in_use))} of it is free; "
                f"this needs {_amount(key, need)}"
            )
            if within:
                message += ": it is within the tenant's nominal quota, so borrowers give it back (reclaim)"
            return Shortfall(tenant, key, now, need, room, within, message, cohort, 1)
    return None


def _tree_shortfall(
    cluster: ClusterState,
    tenant: str,
    cohort: str,
    key: str,
    now: int,
    need: int,
    amount: int,
    kept: int,
    limit: int | None,
) -> Shortfall | None:
    """A tenant of a cohort with a parent: walk up the tree with what the demand adds (:func:`cohort_tree.blocked`).
    O(depth)."""
    adds = max(0, now + need - kept) - max(0, now - kept)
    block = cohort_tree.blocked(cluster.cohort_specs, cluster.pools, cohort, key, adds)
    if block is None:
        return None
    within = now + need <= amount
    # Giving up `excess` of the demand is the least that fits the blocked level (each level passes on at most
    # what it is given), so need - excess bounds the room from above.
    excess = block.in_use + block.adds - block.limit
    room = max(0, need - max(0, excess))
    if limit is not None:
        room = min(room, max(0, amount + limit - now))
    where = "its own cohort" if block.depth == 1 else f"level {block.depth} of the tree above cohort {cohort!r}"
    what = "its subtree's quota" if block.borrowing_limit is None else "its subtree's quota plus its borrowing limit"
    message = (
        f"tenant {tenant!r} runs {_amount(key, now)} (nominal {_amount(key, amount)}); cohort {block.cohort!r} "
        f"({where}) may use {_amount(key, block.limit)} ({what}) and uses {_amount(key, block.in_use)}; this "
        f"needs {_amount(key, need)}, {_amount(key, block.adds)} of it from cohort {block.cohort!r}"
    )
    if within:
        message += ": it is within the tenant's nominal quota, so borrowers give it back (reclaim)"
    return Shortfall(tenant, key, now, need, room, within, message, block.cohort, block.depth)


def demand_floor(cluster: ClusterState, quota: Quota, specs: list[PodSpec], count: int) -> Demand:
    """The least that any ``count`` of these pods add to the tenant's limited keys wherever they run, key by key:
    the sum of the ``count`` smallest amounts on the key. GPUs count only when every model present is counted
    under one key (else a pod might land where its GPUs count elsewhere or not at all). Each key's check is
    monotone in what is asked, so a floor that does not fit on one key rules out every set of ``count`` or more
    of them. O(M log M)."""
    out: Demand = {}
    keys = list(dict.fromkeys(gpu_key(quota, model) for model, nodes in cluster.model_nodes.items() if nodes))
    if len(keys) == 1 and keys[0] is not None:
        out[keys[0]] = sum(sorted(spec.num_gpu * spec.gpu_milli for spec in specs)[:count])
    if quota.nominal_cpu_milli is not None:
        out[CPU] = sum(sorted(spec.cpu_milli for spec in specs)[:count])
    if quota.nominal_memory_mib is not None:
        out[MEMORY] = sum(sorted(spec.memory_mib for spec in specs)[:count])
    return {key: amount for key, amount in out.items() if amount > 0}


FREEABLE_SCAN = 512
"""The tenant's running pods :func:`freeable_below` reads at most; beyond, it counts all the tenant holds."""


def freeable_below(cluster: ClusterState, tenant: str, quota: Quota, priority: int) -> Demand | None:
    """An upper bound of what evicting the tenant's own running pods of priority below ``priority`` gives back to
    its quota, per key; None: perhaps all it holds. Reads the tenant's pods in reclaim's order (a tenant with its
    own quota in a cohort), lowest priority first. O(min(p, FREEABLE_SCAN) · keys)."""
    usage = cluster.usage.get(tenant)
    if usage is None:
        return {}
    if cluster.quotas.get(tenant) is not quota or quota.cohort is None:
        return None  # its pods are not filed by priority
    pods = cluster.reclaimable.get((tenant, ""))
    if pods is None:
        return {}
    out: Demand = {}
    for read, entry in enumerate(pods):  # measure: the pods left below ``priority``, and at most FREEABLE_SCAN
        if entry[0] >= priority:
            break
        if read >= FREEABLE_SCAN:
            return None
        pod = cluster.pods[entry[2]]
        if pod.node_id is not None:
            add(out, demand(quota, pod.spec, cluster.nodes[pod.node_id].gpu_model))
    return out


def over_own_limit(cluster: ClusterState, tenant: str, quota: Quota, wanted: Demand, freed: Demand | None) -> bool:
    """Whether ``wanted`` breaks the tenant's quota on some key whatever other tenants give back, even after its
    own pods give back ``freed`` (None: all they hold): its nominal quota outside a cohort; its nominal plus its
    borrowing limit in one; or its cohort's whole pool (a cohort without a parent), which holds at least the
    tenant's own use beyond what it keeps (``check``: ``in_use`` sums every member's use beyond its kept part).
    O(keys · models)."""
    limits = cluster.limits.get(tenant) if cluster.quotas.get(tenant) is quota else None
    cohort = quota.cohort
    tree = cohort is not None and bool(cluster.cohort_specs) and cohort_tree.parent_of(cluster.cohort_specs, cohort)
    for key, need in wanted.items():
        amount, kept, limit = key_limit(quota, limits, key)
        if amount is None:
            continue
        held = 0 if freed is None else used(cluster, tenant, quota, key) - freed.get(key, 0)
        if cohort is None:
            if held + need > amount:
                return True
            continue
        if limit is not None and held + need > amount + limit:
            return True
        if not tree and max(0, held + need - kept) > pool(cluster, cohort, key)[0]:
            return True
    return False


def pool_short(
    cluster: ClusterState,
    tenant: str,
    quota: Quota,
    wanted: Demand,
    freed: Demand | None,
    given_back: Mapping[str, Demand | None],
) -> bool:
    """Whether the pool of the tenant's cohort (one without a parent) has no room for ``wanted`` on some key even
    after the tenant's own pods give back ``freed`` and each other member's give back ``given_back[member]``
    (None or missing: all its use beyond what it keeps). A member's share of the pool is its use beyond its kept
    part, which falls by at most what its pods give back (``check``'s pool arithmetic). O(keys · members)."""
    cohort = quota.cohort
    if cohort is None:
        return False
    limits = cluster.limits.get(tenant) if cluster.quotas.get(tenant) is quota else None
    members = cluster.cohorts.get(cohort, [])
    for key, need in wanted.items():
        amount, kept, _limit = key_limit(quota, limits, key)
        if amount is None:
            continue
        size, in_use = pool(cluster, cohort, key)
        now = used(cluster, tenant, quota, key)
        others = in_use - max(0, now - kept)  # the other members' shares
        for member in members:  # measure: the members left
            peer_limits = cluster.limits.get(member)
            peer_entry = peer_limits.get(key) if member != tenant and peer_limits is not None else None
            if peer_entry is None:
                continue  # the tenant itself, or a member whose use on the key is not pooled
            share = max(0, used(cluster, member, cluster.quotas[member], key) - peer_entry.kept)
            back = given_back.get(member)
            others -= share if back is None else min(share, back.get(key, 0))
        held = 0 if freed is None else now - freed.get(key, 0)
        if max(0, others) + max(0, held + need - kept) > size:
            return True
    return False


def over_limit(cluster: ClusterState, tenant: str, quota: Quota) -> list[str]:
    """The keys on which the tenant runs more than the quota lets it start: its nominal (no cohort) or its
    nominal plus its borrowing limit (a cohort with a limit). Lowering a quota can do that; nothing is evicted."""
    over = []
    for key in limited_keys(quota):
        amount = nominal(quota, key) or 0
        limit = borrowing_limit(quota, key)
        if quota.cohort is not None and limit is None:
            continue
        if used(cluster, tenant, quota, key) > amount + (limit or 0):
            over.append(key)
    return over


def models_for(cluster: ClusterState, shape: PodShape) -> list[str]:
    """The GPU models a pod may run on, among those present (sorted)."""
    if shape.gpu_models:
        return [model for model in shape.gpu_models if cluster.model_nodes.get(model)]
    return sorted(model for model, count in cluster.model_nodes.items() if count)


@dataclass(slots=True)
class Admission:
    """What quota lets a pod do: the shape restricted to the models it may use now (None: none), and the
    shortfalls of the models it may not (one per key, for the queue reason and for reclaim)."""

    shape: PodShape | None
    shortfalls: list[tuple[str, Shortfall]]  # (model, shortfall)


def admit(cluster: ClusterState, spec: PodSpec, shape: PodShape) -> Admission:
    """Quota admission of one pod: O(models · (keys + members)). A tenant without a quota: admitted as is."""
    quota = quota_of(cluster, spec.tenant)
    if quota is None:
        return Admission(shape, [])
    if not spec.num_gpu or not quota.nominal_gpus:
        shortfall = check(cluster, spec.tenant, quota, demand(quota, spec, ""))
        return Admission(shape if shortfall is None else None, [] if shortfall is None else [("", shortfall)])
    allowed: list[str] = []
    shortfalls: list[tuple[str, Shortfall]] = []
    by_key: dict[str | None, Shortfall | None] = {}
    models = models_for(cluster, shape)
    for model in models:
        key = gpu_key(quota, model)
        if key not in by_key:
            by_key[key] = check(cluster, spec.tenant, quota, demand(quota, spec, model))
        shortfall = by_key[key]
        if shortfall is None:
            allowed.append(model)
        else:
            shortfalls.append((model, shortfall))
    if not allowed:
        return Admission(None, shortfalls)
    if len(allowed) == len(models):
        return Admission(shape, [])
    return Admission(shape._replace(gpu_models=tuple(allowed)), shortfalls)


def shortfall_words(shortfalls: list[tuple[str, Shortfall]]) -> str:
    """One sentence per distinct shortfall (models sharing a key are one)."""
    seen: dict[str, list[str]] = {}
    messages: dict[str, str] = {}
    for model, shortfall in shortfalls:
        seen.setdefault(shortfall.message, []).append(model)
        messages[shortfall.message] = shortfall.message
    return "; ".join(messages[message] for message in seen)


def reclaim_candidates(
    cluster: ClusterState, tenant: str, quota: Quota, keys: list[str], protected: Mapping[str, None] = _NONE
) -> list[Pod]:
    """Running pods of the lender's cohort peers that borrow on one of ``keys``: lowest priority, then
    youngest (latest start) first, then id; none of ``protected`` (evicted earlier in the same command).
    O(P) over the peers' running pods."""
    cohort = quota.cohort
    if cohort is None:
        return []
    borrowers = []
    for member in tree_members(cluster, cohort):
        if member == tenant:
            continue
        peer = cluster.quotas[member]
        for key in keys:
            amount = nominal(peer, key)
            if has_key(peer, key) and amount is not None and used(cluster, member, peer, key) > amount:
                borrowers.append(member)
                break
    if not borrowers:
        return []
    wanted = set(borrowers)
    candidates = []
    for pod in cluster.pods.values():
        if pod.node_id is None or pod.spec.tenant not in wanted:
            continue
        node = cluster.nodes[pod.node_id]
        if pod.spec.pod_id not in node.pods or pod.spec.pod_id in protected:  # evicted on trial, or before
            continue
        peer = cluster.quotas[pod.spec.tenant]
        model = node.gpu_model
        if any(key in demand(peer, pod.spec, model) for key in keys):
            candidates.append(pod)
    candidates.sort(key=lambda pod: (pod.spec.priority, -(pod.started_at or 0), pod.spec.pod_id))
    return candidates


def borrowing(cluster: ClusterState, pod: Pod) -> bool:
    """Whether a running pod's tenant runs over its nominal quota on a key the pod holds: the pod is
    borrowing (Kueue's sense). Tenants without a quota never borrow. O(keys)."""
    quota = quota_of(cluster, pod.spec.tenant)
    if quota is None or pod.node_id is None:
        return False
    for key, held in demand(quota, pod.spec, cluster.nodes[pod.node_id].gpu_model).items():
        amount = nominal(quota, key)
        if amount is not None and held > 0 and used(cluster, pod.spec.tenant, quota, key) > amount:
            return True
    return False


def would_borrow(cluster: ClusterState, tenant: str, wanted: Demand, freed: list[Pod]) -> bool:
    """Whether the tenant would run over its nominal quota on some key by adding ``wanted``, once ``freed``
    (victims about to be evicted; only the tenant's own count) stop. O(keys · V)."""
    quota = quota_of(cluster, tenant)
    if quota is None:
        return False
    for key, need in wanted.items():
        amount = nominal(quota, key)
        if amount is None or need <= 0:
            continue
        now = used(cluster, tenant, quota, key)
        for pod in freed:
            if pod.spec.tenant == tenant and pod.node_id is not None:
                now -= demand(quota, pod.spec, cluster.nodes[pod.node_id].gpu_model).get(key, 0)
        if now + need > amount:
            return True
    return False


def over_nominal(cluster: ClusterState, tenant: str, quota: Quota) -> bool:
    """Whether the tenant runs over its nominal quota on some key (its pods there borrow). O(keys · models)."""
    for key in limited_keys(quota):
        amount = nominal(quota, key)
        if amount is not None and used(cluster, tenant, quota, key) > amount:
            return True
    return False


def would_borrow_on_every_key(cluster: ClusterState, tenant: str, wanted: Demand) -> bool:
    """Whether adding ``wanted`` would take the tenant over its nominal quota on every key it asks of (so no
    shortfall of it is within the nominal quota: none is reclaimable). O(keys · models)."""
    quota = quota_of(cluster, tenant)
    if quota is None:
        return False
    for key, need in wanted.items():
        amount = nominal(quota, key)
        if amount is None or used(cluster, tenant, quota, key) + need <= amount:
            return False
    return bool(wanted)


def may_reclaim(cluster: ClusterState, tenant: str) -> bool:
    """Whether the tenant's ``reclaim_within_cohort`` lets it reclaim at all (contract v4: ``never`` does not)."""
    quota = quota_of(cluster, tenant)
    return quota is not None and quota.policy.reclaim_within_cohort != RECLAIM_NEVER


def shielded(cluster: ClusterState, pod: Pod, priority: int) -> bool:
    """Whether a borrower's pod is kept from a reclaim by work of ``priority``: its tenant's
    ``borrow_within_cohort`` lets it take lower-priority work inside others' nominal quota, so lower-priority
    work may not take it back (else the two would evict each other in turn). O(1)."""
    if pod.spec.priority <= priority:
        return False
    quota = quota_of(cluster, pod.spec.tenant)
    return quota is not None and quota.policy.borrow_within_cohort == BORROW_LOWER


def has_policy(quota: Quota | None) -> bool:
    """Whether a quota sets a policy by which a pod its quota has no room for may preempt (``within_tenant`` or
    ``borrow_within_cohort``): the queue retries its tenant's work on any change, not only where it fits."""
    if quota is None or quota.preemption is None:
        return False
    policy = quota.preemption
    return policy.within_tenant != WITHIN_NEVER or policy.borrow_within_cohort == BORROW_LOWER


def with_peers(cluster: ClusterState, tenants: set[str], *previous: Quota | None) -> set[str]:
    """The tenants and everyone who shares a cohort (now, or before a change) with one of them. O(members)."""
    out = set(tenants)
    cohorts = {quota.cohort for quota in previous if quota is not None and quota.cohort is not None}
    for tenant in tenants:
        quota = cluster.quotas.get(tenant)
        if quota is not None and quota.cohort is not None:
            cohorts.add(quota.cohort)
    for cohort in sorted(cohorts):
        out.update(tree_members(cluster, cohort))
    return out


def tree_members(cluster: ClusterState, cohort: str) -> list[str]:
    """The tenants of every cohort in the tree of ``cohort`` (from its root down), sorted: whom its tenants borrow
    from and lend to. Without a declared tree, the cohort's own members. O(cohorts of the tree + members)."""
    specs = cluster.cohort_specs
    if not specs:
        return cluster.cohorts.get(cohort, [])
    names = cohort_tree.subtree(specs, cluster.cohort_children, cohort_tree.root_of(specs, cohort))
    if len(names) == 1:
        return cluster.cohorts.get(cohort, [])
    out: list[str] = []
    for name in names:
        out.extend(cluster.cohorts.get(name, ()))
    return sorted(out)


def tree_tenants(cluster: ClusterState, cohort: str) -> set[str]:
    """:func:`tree_members` as a set."""
    return set(tree_members(cluster, cohort))


def describe_cohort(cluster: ClusterState, spec: CohortQuota) -> str:
    """A cohort of the tree in words, for CohortChanged."""
    parts = [f"cohort {spec.cohort!r}"]
    parts.append("a root" if spec.parent is None else f"under {spec.parent!r}")
    own = cohort_tree.own_nominal(spec)
    if own:
        parts.append("its own quota: " + ", ".join(_amount(key, amount) for key, amount in sorted(own.items())))
    else:
        parts.append("no quota of its own")
    if spec.parent is not None:
        borrow = "no limit" if spec.borrowing_limit_gpus is None else f"up to {spec.borrowing_limit_gpus} GPU(s)"
        lend = "all of it" if spec.lending_limit_gpus is None else f"up to {spec.lending_limit_gpus} GPU(s)"
        parts.append(f"borrows {borrow} from {spec.parent!r}, lends {lend}")
    members = cluster.cohorts.get(spec.cohort, [])
    parts.append(f"{len(members)} tenant(s)")
    return "; ".join(parts)


def dominant_share(cluster: ClusterState, tenant: str) -> float:
    """The tenant's weighted dominant share: max over GPU, CPU, memory of its use over the cluster's, / weight."""
    quota = quota_of(cluster, tenant)
    if quota is not None and quota.weight == 0:
        return math.inf  # weight 0 (contract v4): after every tenant with a weight, whatever it runs
    usage = cluster.usage.get(tenant)
    if usage is None:
        return 0.0
    share = 0.0
    if cluster.gpu_milli_capacity > 0:
        share = usage.gpu_total / cluster.gpu_milli_capacity
    if cluster.cpu_capacity > 0:
        share = max(share, usage.cpu / cluster.cpu_capacity)
    if cluster.memory_capacity > 0:
        share = max(share, usage.memory / cluster.memory_capacity)
    return share / (quota.weight if quota is not None else 1)


def describe(quota: Quota | None) -> str:
    """A quota in words, for QuotaChanged."""
    if quota is None:
        return "no quota: not limited"
    parts = []
    if quota.nominal_gpus:
        gpus = ", ".join(
            f"{count} {'other' if model == ANY_MODEL else model}" for model, count in quota.nominal_gpus.items()
        )
        parts.append(f"GPUs: {gpus}")
    else:
        parts.append("GPUs not limited")
    if quota.nominal_cpu_milli is not None:
        parts.append(f"{quota.nominal_cpu_milli / 1000:g} cores")
    if quota.nominal_memory_mib is not None:
        parts.append(f"{quota.nominal_memory_mib / 1024:g} GiB")
    if quota.cohort is not None:
        borrow = "no limit" if quota.borrowing_limit_gpus is None else f"up to {quota.borrowing_limit_gpus} GPU(s)"
        lend = "all of it" if quota.lending_limit_gpus is None else f"up to {quota.lending_limit_gpus} GPU(s)"
        parts.append(f"cohort {quota.cohort!r} (borrows {borrow}, lends {lend})")
    parts.append(f"weight {quota.weight}")
    return "; ".join(parts)


@dataclass(slots=True)
class QuotaLine:
    """One tenant's standing on one quota key (GPU milli, CPU milli or MiB)."""

    tenant: str
    default: bool  # the cluster's default quota, not one of its own
    cohort: str | None
    key: str
    nominal: int
    used: int
    may_hold: int  # its nominal (reclaimed if need be), or more while its cohort's pool has room
    borrowed: int  # held beyond its nominal quota
    lent: int  # its share of what its cohort borrows (see quota_report)
    weight: int


def quota_report(cluster: ClusterState) -> list[QuotaLine]:
    """Per tenant with a quota (or the default, for tenants running under it), per limited key: nominal,
    used, the most it may hold now (nominal plus what it may borrow), borrowed and lent.

    ``lent`` is the tenant's share of what its cohort borrows on the key: the cohort's borrowing split among
    lenders in proportion to their unused lendable quota (the pool records how much is lent, not to whom).
    Sorted by tenant and key. O(tenants · keys).
    """
    with_default = cluster.default_quota is not None
    tenants = sorted(set(cluster.quotas) | ({t for t in cluster.usage} if with_default else set()))
    lines: list[QuotaLine] = []
    unused_of: dict[int, int] = {}  # line index -> unused lendable quota
    borrowed: dict[tuple[str, str], int] = {}  # (cohort, key) -> what the cohort borrows in all
    unused: dict[tuple[str, str], int] = {}  # (cohort, key) -> unused lendable quota in all
    for tenant in tenants:
        quota = quota_of(cluster, tenant)
        if quota is None:
            continue
        for key in limited_keys(quota):
            amount = nominal(quota, key) or 0
            use = used(cluster, tenant, quota, key)
            over = max(0, use - amount)
            may_hold = amount
            if quota.cohort is not None:
                lend, in_use = pool(cluster, quota.cohort, key)
                reach = use + max(0, lend - in_use)  # what it holds plus the pool's free room
                if cluster.cohort_specs and cohort_tree.parent_of(cluster.cohort_specs, quota.cohort) is not None:
                    kept = guaranteed(quota, key)  # a cohort with a parent: the room the tree leaves, up to the root
                    room = cohort_tree.headroom(cluster.cohort_specs, cluster.pools, quota.cohort, key)
                    reach = use + room + max(0, kept - use)
                limit = borrowing_limit(quota, key)
                may_hold = max(amount, reach if limit is None else min(reach, amount + limit))
                pair = (quota.cohort, key)
                spare = max(0, min(lendable(quota, key), amount - use))
                borrowed[pair] = borrowed.get(pair, 0) + over
                unused[pair] = unused.get(pair, 0) + spare
                unused_of[len(lines)] = spare
            lines.append(
                QuotaLine(tenant, tenant not in cluster.quotas, quota.cohort, key, amount, use, may_hold, over, 0,
                          quota.weight)
            )  # fmt: skip
    for index, spare in unused_of.items():
        line = lines[index]
        pair = (line.cohort or "", line.key)
        if spare and unused.get(pair):
            line.lent = borrowed.get(pair, 0) * spare // unused[pair]
    return lines


@dataclass(slots=True)
class CohortLine:
    """One cohort of the tree on one quota key (GPU milli, CPU milli or MiB): its subtree quota, what it keeps
    from its parent, what is in use of it, and the most it may use (its subtree quota, plus its borrowing limit
    below a root; None: no limit of its own)."""

    cohort: str
    parent: str | None
    depth: int  # 1: a root
    key: str
    subtree_quota: int
    kept: int
    in_use: int
    may_use: int | None
    tenants: list[str]


def cohort_report(cluster: ClusterState) -> list[CohortLine]:
    """Every cohort (named by a tenant or declared) per key of its pool, by cohort and key. O(cohorts · keys ·
    depth)."""
    lines: list[CohortLine] = []
    specs = cluster.cohort_specs
    for cohort, key in sorted(cluster.pools):
        entry = cluster.pools[(cohort, key)]
        spec = specs.get(cohort)
        parent = spec.parent if spec is not None else None
        limit = cohort_tree.borrowing_limit(spec, key)
        may_use = entry.lent if parent is None else (None if limit is None else entry.lent + limit)
        depth = len(cohort_tree.ancestors(specs, cohort))
        members = list(cluster.cohorts.get(cohort, []))
        lines.append(CohortLine(cohort, parent, depth, key, entry.lent, entry.kept, entry.in_use, may_use, members))
    return lines
