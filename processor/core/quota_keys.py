"""Quota keys: what a quota limits, and how much of it a tenant's running pods hold. Pure, no state.

Keys are ``gpu:<model>`` for the models a quota names, ``gpu:*`` for the rest, ``cpu`` and
``memory`` (see ``processor.core.quotas``). Amounts are GPU milli, CPU milli and MiB.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from schemas.commands import ANY_MODEL, GPU_MILLI, Quota
from schemas.events import PodSpec


class HeldUsage(Protocol):
    """What a tenant's running pods hold (``processor.core.state.TenantUsage``), as far as keys read it.

    A protocol rather than an import of the state module, which imports this one."""

    gpu: dict[str, int]
    cpu: int
    memory: int


GPU = "gpu:"
CPU = "cpu"
MEMORY = "memory"

Demand = dict[str, int]  # key -> amount (GPU milli, CPU milli, MiB)


def gpu_key(quota: Quota, model: str) -> str | None:
    """The key a GPU of this model is counted under for the quota (None: GPUs are not limited)."""
    if not quota.nominal_gpus:
        return None
    return GPU + (model if model in quota.nominal_gpus else ANY_MODEL)


def nominal(quota: Quota, key: str) -> int | None:
    """The nominal amount of a key (GPU milli, CPU milli, MiB); None: not limited."""
    if key == CPU:
        return quota.nominal_cpu_milli
    if key == MEMORY:
        return quota.nominal_memory_mib
    if not quota.nominal_gpus:
        return None
    return quota.nominal_gpus.get(key[len(GPU) :], 0) * GPU_MILLI


def has_key(quota: Quota, key: str) -> bool:
    """Whether the key is one of the quota's own: ``gpu:M`` only if it names M (its other models are ``gpu:*``)."""
    if key == CPU:
        return quota.nominal_cpu_milli is not None
    if key == MEMORY:
        return quota.nominal_memory_mib is not None
    model = key[len(GPU) :]
    return bool(quota.nominal_gpus) and (model == ANY_MODEL or model in quota.nominal_gpus)


def limited_keys(quota: Quota) -> list[str]:
    """Every key the quota limits, sorted."""
    keys = []
    if quota.nominal_gpus:
        keys = [GPU + model for model in quota.nominal_gpus]
        if ANY_MODEL not in quota.nominal_gpus:
            keys.append(GPU + ANY_MODEL)
    if quota.nominal_cpu_milli is not None:
        keys.append(CPU)
    if quota.nominal_memory_mib is not None:
        keys.append(MEMORY)
    return sorted(keys)


def lendable(quota: Quota, key: str) -> int:
    amount = nominal(quota, key) or 0
    if key.startswith(GPU) and quota.lending_limit_gpus is not None:
        return min(amount, quota.lending_limit_gpus * GPU_MILLI)
    return amount


def guaranteed(quota: Quota, key: str) -> int:
    """What the tenant keeps for itself of its nominal quota (the rest it lends to its cohort)."""
    return (nominal(quota, key) or 0) - lendable(quota, key)


def borrowing_limit(quota: Quota, key: str) -> int | None:
    if key.startswith(GPU) and quota.borrowing_limit_gpus is not None:
        return quota.borrowing_limit_gpus * GPU_MILLI
    return None


def usage_on(usage: HeldUsage | None, quota: Quota, key: str) -> int:
    """What a tenant's running pods hold on a key. O(models)."""
    if usage is None:
        return 0
    if key == CPU:
        return usage.cpu
    if key == MEMORY:
        return usage.memory
    model = key[len(GPU) :]
    if model != ANY_MODEL:
        return usage.gpu.get(model, 0)
    return sum(milli for name, milli in usage.gpu.items() if name not in quota.nominal_gpus)


def demand(quota: Quota, spec: PodSpec, model: str) -> Demand:
    """What a pod placed on a node of ``model`` adds to its tenant's limited keys."""
    out: Demand = {}
    milli = spec.num_gpu * spec.gpu_milli
    if milli:
        key = gpu_key(quota, model)
        if key is not None:
            out[key] = milli
    if spec.cpu_milli and quota.nominal_cpu_milli is not None:
        out[CPU] = spec.cpu_milli
    if spec.memory_mib and quota.nominal_memory_mib is not None:
        out[MEMORY] = spec.memory_mib
    return out


class KeyLimit(NamedTuple):
    """A quota on one key, compiled for its checks."""

    nominal: int
    kept: int  # what the tenant keeps for itself (the rest of its nominal quota it lends to its cohort)
    borrowing: int | None  # how much it may borrow beyond its nominal quota (None: no limit)


Limits = dict[str, KeyLimit]
"""A quota compiled for its checks: key -> its limit."""


def compile_limits(quota: Quota) -> Limits:
    return {
        key: KeyLimit(nominal(quota, key) or 0, guaranteed(quota, key), borrowing_limit(quota, key))
        for key in limited_keys(quota)
    }


def key_of(limits: Limits, model: str) -> str | None:
    """The GPU key of a model under compiled limits (None: GPUs not limited). O(1)."""
    key = GPU + model
    if key in limits:
        return key
    key = GPU + ANY_MODEL
    return key if key in limits else None
