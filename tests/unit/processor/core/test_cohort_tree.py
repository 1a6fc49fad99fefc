"""The cohort tree's arithmetic (processor.core.cohort_tree): subtree quotas, what each level keeps and passes on,
where a demand is refused, what an eviction frees at a level, and the tree's shape."""

from __future__ import annotations

from processor.core import cohort_tree
from processor.core.cohort_tree import CohortPool
from processor.core.state import TenantUsage
from schemas.commands import CohortQuota, Quota

A100 = "gpu:A100"


def usage(gpus: int) -> TenantUsage:
    held = TenantUsage()
    held.gpu["A100"] = gpus * 1000
    return held


SPECS = {
    "org": CohortQuota("org", None, {"A100": 2}),
    "left": CohortQuota("left", "org", {}, lending_limit_gpus=1),
    "right": CohortQuota("right", "org", {"A100": 1}, borrowing_limit_gpus=2),
}
MEMBERS = {"left": ["a"], "right": ["b", "c"]}
QUOTAS = {
    "a": Quota("left", {"A100": 4}),
    "b": Quota("right", {"A100": 1}),
    "c": Quota("right", {"A100": 2}, lending_limit_gpus=1),
}


def test_subtree_quotas_add_the_cohorts_own_and_what_each_child_lends() -> None:
    pools = cohort_tree.build_pools(SPECS, MEMBERS, QUOTAS, {})
    # left: a lends its 4; left lends 1 of them up and keeps 3
    assert pools[("left", A100)] == CohortPool(4000, 0, 3000)
    # right: its own 1, b's 1, c's 1 (c keeps 1): 3, all lent up
    assert pools[("right", A100)] == CohortPool(3000, 0, 0)
    # org: its own 2, left's 1, right's 3
    assert pools[("org", A100)] == CohortPool(6000, 0, 0)


def test_only_use_beyond_what_a_level_keeps_reaches_its_parent() -> None:
    held = {"a": usage(5), "c": usage(1)}  # a: 5 of left's 4 (1 beyond its kept 3 and ...); c within its kept 1
    pools = cohort_tree.build_pools(SPECS, MEMBERS, QUOTAS, held)
    assert pools[("left", A100)].in_use == 5000
    assert pools[("right", A100)].in_use == 0  # c holds only what it keeps
    assert pools[("org", A100)].in_use == 2000  # left passes on 5 - 3


def test_lift_keeps_the_pools_as_a_rebuild_would() -> None:
    pools = cohort_tree.build_pools(SPECS, MEMBERS, QUOTAS, {"a": usage(3)})
    entry = pools[("left", A100)]
    before = entry.in_use
    entry.in_use += 2000  # a starts 2 more GPUs
    cohort_tree.lift(SPECS, pools, "left", A100, before)
    assert pools == cohort_tree.build_pools(SPECS, MEMBERS, QUOTAS, {"a": usage(5)})


def test_blocked_walks_up_to_the_first_level_without_room() -> None:
    pools = cohort_tree.build_pools(SPECS, MEMBERS, QUOTAS, {"a": usage(3)})
    assert cohort_tree.blocked(SPECS, pools, "left", A100, 3000) is None  # left keeps 3, org has 6 free
    block = cohort_tree.blocked(SPECS, pools, "left", A100, 7000)  # 10 in left: 7 reach org, which has 6
    assert block is not None and (block.cohort, block.depth, block.limit) == ("org", 2, 6000)
    # right may use its 3 plus 2 borrowed: 6 more for b is refused at right itself, by its borrowing limit
    block = cohort_tree.blocked(SPECS, pools, "right", A100, 6000)
    assert block is not None and (block.cohort, block.depth, block.limit, block.borrowing_limit) == (
        "right",
        1,
        5000,
        2000,
    )


def test_relief_is_what_an_eviction_frees_at_a_level() -> None:
    pools = cohort_tree.build_pools(SPECS, MEMBERS, QUOTAS, {"a": usage(5)})
    assert cohort_tree.relief(SPECS, pools, "left", A100, 1000, "left") == 1000
    assert cohort_tree.relief(SPECS, pools, "left", A100, 3000, "org") == 2000  # only 2 of left's 5 reach org
    assert cohort_tree.relief(SPECS, pools, "left", A100, 1000, "right") == 0  # not above left


def test_the_trees_shape_without_recursion() -> None:
    specs = {name: CohortQuota(name, parent) for name, parent in (("b", "a"), ("c", "b"), ("d", "b"), ("e", "d"))}
    children = cohort_tree.children_of(specs)
    assert children == {"a": ["b"], "b": ["c", "d"], "d": ["e"]}
    assert cohort_tree.ancestors(specs, "e") == ["e", "d", "b", "a"]
    assert cohort_tree.root_of(specs, "c") == "a"
    assert cohort_tree.subtree(specs, children, "b") == ["b", "c", "d", "e"]
    assert cohort_tree.height(children, "a", 8) == 4 and cohort_tree.height(children, "c", 8) == 1
    assert cohort_tree.deepest_first(specs, {})[:2] == ["e", "c"]
