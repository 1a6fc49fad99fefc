"""The placement policy registry, keyed by name (like kube-scheduler's plugin registry)."""

from __future__ import annotations

from processor.core.policies.base import Choice, Policy, ScoringPolicy, default_gpus
from processor.core.policies.best_fit import BestFit
from processor.core.policies.dot_product import DotProduct
from processor.core.policies.fgd import Fgd
from processor.core.policies.fgd_pack import FgdPack
from processor.core.policies.fgd_plus import FgdPlus
from processor.core.policies.first_fit import FirstFit
from processor.core.policies.gpu_clustering import GpuClustering
from processor.core.policies.gpu_packing import GpuPacking
from processor.core.policies.paper_best_fit import PaperBestFit
from processor.core.policies.random_pick import RandomPick
from processor.core.policies.spread import Spread

REGISTRY: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Add a policy to the registry under its name (names are unique)."""
    if policy.name in REGISTRY:
        raise ValueError(f"policy {policy.name!r} is already registered")
    REGISTRY[policy.name] = policy
    return policy


def get_policy(name: str) -> Policy | None:
    return REGISTRY.get(name)


def policy_names() -> list[str]:
    return sorted(REGISTRY)


for _policy in (
    FirstFit(),
    BestFit(),
    Spread(),
    RandomPick(),
    DotProduct(),
    GpuClustering(),
    GpuPacking(),
    PaperBestFit(),
    Fgd(),
    FgdPlus(),
    FgdPack(),
):
    register(_policy)

__all__ = ["REGISTRY", "Choice", "Policy", "ScoringPolicy", "default_gpus", "get_policy", "policy_names", "register"]
