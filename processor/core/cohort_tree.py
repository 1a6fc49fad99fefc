"""The cohort tree (contract v4, ``SetCohort``; Kueue's hierarchical cohorts): its shape and its pools. Pure.

A cohort is named by tenants' ``SetQuota.cohort`` (its members) and may be declared with ``SetCohort``, which
gives it a parent, a nominal quota of its own and limits towards its parent. Per quota key (see
:mod:`processor.core.quota_keys`) and per cohort ``C`` the state keeps a :class:`CohortPool`:

- ``lent`` (Kueue's *subtree quota*): ``C``'s own nominal, plus what each member tenant lends (its nominal, or
  its lending limit if smaller), plus what each child cohort lends (its subtree quota, or its lending limit if
  smaller);
- ``kept``: what ``C`` keeps for its own subtree, not lent to its parent (``lent`` minus what it lends; 0 for
  a root, or without a lending limit);
- ``in_use``: what the members hold beyond what they keep, plus what each child cohort uses beyond what it
  keeps. Only use beyond ``kept`` reaches the parent.

A tenant's pod fits its cohort tree when, walking up from its cohort with what the pod adds at each level, no
cohort with a parent goes beyond its subtree quota plus its borrowing limit, and the root stays within its
subtree quota (:func:`processor.core.quotas.check`). So a tenant borrows first from its own cohort's pool, then
from its parent's, and so on up; lending and borrowing limits hold at every level. A cohort nobody declared
is a root with nothing of its own: a flat cohort, as before contract v4.

The tree has no cycles (``SetCohort`` refuses them: ``COHORT_CYCLE``) and no path longer than
:data:`MAX_COHORT_DEPTH` cohorts (``COHORT_TOO_DEEP``), so every walk up is bounded by that depth, and every
walk over a subtree by the number of cohorts; no walk recurses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from processor.core import quota_keys
from schemas.commands import GPU_MILLI, MAX_COHORT_DEPTH, CohortQuota, Quota


@dataclass(slots=True)
class CohortPool:
    """One cohort's pool on one quota key: its subtree quota (``lent``), what it keeps from its parent, and what
    is in use of it (see the module's docstring)."""

    lent: int = 0
    in_use: int = 0
    kept: int = 0


Specs = Mapping[str, CohortQuota]


def parent_of(specs: Specs, cohort: str) -> str | None:
    spec = specs.get(cohort)
    return spec.parent if spec is not None else None


def ancestors(specs: Specs, cohort: str) -> list[str]:
    """The cohort and its ancestors, from it up to its root. O(depth)."""
    out = [cohort]
    parent = parent_of(specs, cohort)
    while parent is not None and len(out) <= MAX_COHORT_DEPTH:  # measure: MAX_COHORT_DEPTH + 1 - len(out)
        out.append(parent)
        parent = parent_of(specs, parent)
    return out


def root_of(specs: Specs, cohort: str) -> str:
    return ancestors(specs, cohort)[-1]


def children_of(specs: Specs) -> dict[str, list[str]]:
    """Each parent's child cohorts, sorted. O(C log C)."""
    out: dict[str, list[str]] = {}
    for name in sorted(specs):
        parent = specs[name].parent
        if parent is not None:
            out.setdefault(parent, []).append(name)
    return out


def subtree(specs: Specs, children: Mapping[str, list[str]], cohort: str) -> list[str]:
    """The cohort and every cohort below it, sorted. O(subtree): an explicit stack, each cohort pushed once
    (the tree has no cycles)."""
    out: list[str] = []
    stack = [cohort]
    while stack and len(out) <= len(specs):  # measure: cohorts not yet visited (each is pushed once)
        name = stack.pop()
        out.append(name)
        stack.extend(children.get(name, ()))
    return sorted(out)


def height(children: Mapping[str, list[str]], cohort: str, limit: int) -> int:
    """How many cohorts the longest path down from ``cohort`` holds (1: no children), counted up to ``limit + 1``.
    An explicit stack of (cohort, its depth below), bounded by the cohorts visited."""
    deepest = 0
    stack = [(cohort, 1)]
    visited = 0
    total = sum(len(names) for names in children.values()) + 1
    while stack and visited < total:  # measure: total - visited (a tree: each cohort is pushed once)
        name, depth = stack.pop()
        visited += 1
        deepest = max(deepest, depth)
        if depth <= limit:
            stack.extend((child, depth + 1) for child in children.get(name, ()))
    return deepest


def own_nominal(spec: CohortQuota) -> dict[str, int]:
    """A cohort's own nominal quota per key (GPU milli, CPU milli, MiB)."""
    out: dict[str, int] = {}
    for model, gpus in spec.nominal_gpus.items():
        out[quota_keys.GPU + model] = gpus * GPU_MILLI
    if spec.nominal_cpu_milli is not None:
        out[quota_keys.CPU] = spec.nominal_cpu_milli
    if spec.nominal_memory_mib is not None:
        out[quota_keys.MEMORY] = spec.nominal_memory_mib
    return out


def lendable(spec: CohortQuota, key: str, subtree_quota: int) -> int:
    """What a cohort lends its parent of its subtree quota on a key (its lending limit, on GPU keys)."""
    if key.startswith(quota_keys.GPU) and spec.lending_limit_gpus is not None:
        return min(subtree_quota, spec.lending_limit_gpus * GPU_MILLI)
    return subtree_quota


def borrowing_limit(spec: CohortQuota | None, key: str) -> int | None:
    """How much a cohort's subtree may use beyond its subtree quota, from its parent (None: no limit)."""
    if spec is not None and key.startswith(quota_keys.GPU) and spec.borrowing_limit_gpus is not None:
        return spec.borrowing_limit_gpus * GPU_MILLI
    return None


def deepest_first(specs: Specs, named: Mapping[str, object]) -> list[str]:
    """Every cohort (named by a tenant, declared, or a declared cohort's parent), children before parents:
    by depth, deepest first, then name. O(C · depth)."""
    names = set(named) | set(specs)
    names.update(spec.parent for spec in specs.values() if spec.parent is not None)
    return sorted(names, key=lambda name: (-len(ancestors(specs, name)), name))


def build_pools(
    specs: Specs,
    members: Mapping[str, list[str]],
    quotas: Mapping[str, Quota],
    held: Mapping[str, quota_keys.HeldUsage],
) -> dict[tuple[str, str], CohortPool]:
    """Every cohort's pool per key from the tree, the quotas and the usage (see the module's docstring).
    O(members · keys + C · depth + C · keys); on quota and cohort changes only."""
    by_cohort: dict[str, dict[str, CohortPool]] = {}
    for cohort in sorted(members):
        own = by_cohort.setdefault(cohort, {})
        for member in members[cohort]:
            quota = quotas[member]
            usage = held.get(member)
            for key in quota_keys.limited_keys(quota):
                entry = own.get(key)
                if entry is None:
                    entry = own[key] = CohortPool()
                entry.lent += quota_keys.lendable(quota, key)
                entry.in_use += max(0, quota_keys.usage_on(usage, quota, key) - quota_keys.guaranteed(quota, key))
    if specs:
        for cohort in deepest_first(specs, members):  # measure: cohorts left; children before their parent
            own = by_cohort.setdefault(cohort, {})
            spec = specs.get(cohort)
            if spec is None:
                continue
            for key, amount in own_nominal(spec).items():
                entry = own.get(key)
                if entry is None:
                    entry = own[key] = CohortPool()
                entry.lent += amount
            if spec.parent is None:
                continue
            above = by_cohort.setdefault(spec.parent, {})
            for key in sorted(own):
                entry = own[key]
                lend = lendable(spec, key, entry.lent)
                entry.kept = entry.lent - lend
                up = above.get(key)
                if up is None:
                    up = above[key] = CohortPool()
                up.lent += lend
                up.in_use += max(0, entry.in_use - entry.kept)
    return {(cohort, key): by_cohort[cohort][key] for cohort in sorted(by_cohort) for key in sorted(by_cohort[cohort])}


def lift(specs: Specs, pools: Mapping[tuple[str, str], CohortPool], cohort: str, key: str, before: int) -> None:
    """Carry a change of a cohort's ``in_use`` on a key (it was ``before``) up to its ancestors: each passes on
    what it uses beyond what it keeps. O(depth)."""
    entry = pools[(cohort, key)]
    parent = parent_of(specs, cohort)
    depth = 1
    while parent is not None and depth <= MAX_COHORT_DEPTH:  # measure: MAX_COHORT_DEPTH - depth
        kept = entry.kept
        delta = max(0, entry.in_use - kept) - max(0, before - kept)
        if delta == 0:
            return
        entry = pools[(parent, key)]
        before = entry.in_use
        entry.in_use += delta
        parent = parent_of(specs, parent)
        depth += 1


@dataclass(slots=True)
class Block:
    """Where a cohort tree refuses a demand on a key: the cohort, its depth (1: the tenant's own cohort), its
    limit (subtree quota, plus the borrowing limit below a root), its use and what the demand adds there."""

    cohort: str
    depth: int
    limit: int
    in_use: int
    adds: int
    borrowing_limit: int | None


def blocked(
    specs: Specs, pools: Mapping[tuple[str, str], CohortPool], cohort: str, key: str, adds: int
) -> Block | None:
    """Walk up from a tenant's cohort with what a demand adds to its use there (``adds``): the first cohort
    that would go beyond what it may use, or None. O(depth)."""
    level = cohort
    depth = 1
    while depth <= MAX_COHORT_DEPTH + 1:  # measure: MAX_COHORT_DEPTH + 1 - depth
        entry = pools.get((level, key))
        lent, in_use, kept = (entry.lent, entry.in_use, entry.kept) if entry is not None else (0, 0, 0)
        spec = specs.get(level)
        parent = spec.parent if spec is not None else None
        if parent is None:
            if in_use + adds > lent:
                return Block(level, depth, lent, in_use, adds, None)
            return None
        limit = borrowing_limit(spec, key)
        if limit is not None and in_use + adds > lent + limit:
            return Block(level, depth, lent + limit, in_use, adds, limit)
        adds = max(0, in_use + adds - kept) - max(0, in_use - kept)
        if adds <= 0:
            return None
        level = parent
        depth += 1
    return None


def relief(
    specs: Specs, pools: Mapping[tuple[str, str], CohortPool], cohort: str, key: str, freed: int, at: str
) -> int:
    """How much the use of cohort ``at`` drops on a key when a member of ``cohort`` stops using ``freed`` of its
    cohort's pool (0 if ``at`` is not ``cohort`` or one of its ancestors). O(depth)."""
    level = cohort
    depth = 1
    while freed > 0 and depth <= MAX_COHORT_DEPTH + 1:  # measure: MAX_COHORT_DEPTH + 1 - depth
        if level == at:
            return freed
        entry = pools.get((level, key))
        parent = parent_of(specs, level)
        if entry is None or parent is None:
            return 0
        freed = max(0, entry.in_use - entry.kept) - max(0, entry.in_use - freed - entry.kept)
        level = parent
        depth += 1
    return 0


def headroom(specs: Specs, pools: Mapping[tuple[str, str], CohortPool], cohort: str, key: str) -> int:
    """The most a tenant of ``cohort`` may add to its use of its cohort's pool on a key now: the largest ``adds``
    that :func:`blocked` lets through. From the root down, each level's room is the least of what its own limit
    leaves and what its parent lets it pass on (plus what it keeps and does not use). O(depth)."""
    chain = ancestors(specs, cohort)
    room = 0
    for position in range(len(chain) - 1, -1, -1):  # measure: position, from the root down to the cohort
        level = chain[position]
        entry = pools.get((level, key))
        lent, in_use, kept = (entry.lent, entry.in_use, entry.kept) if entry is not None else (0, 0, 0)
        if position == len(chain) - 1:
            room = max(0, lent - in_use)
            continue
        limit = borrowing_limit(specs.get(level), key)
        through = room + max(0, kept - in_use)  # what it may pass on to its parent, plus its unused kept part
        room = through if limit is None else max(0, min(through, lent + limit - in_use))
    return room
