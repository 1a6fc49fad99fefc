"""The offline bound of ``bench/defrag_bound.py``: the LP never promises less unallocated GPU than a real packing
can reach (it is a lower bound), and the packer never over-commits a node."""

from __future__ import annotations

import itertools
import os
import random

import pytest

if os.environ.get("CI"):  # CI installs the dev extra, which has them: a missing one is a failure there, not a skip
    import highspy  # noqa: F401
    import numpy  # noqa: F401
else:
    pytest.importorskip("numpy")
    pytest.importorskip("highspy")

from bench import defrag_bound


def best_packing(gpus: int, shares: list[tuple[int, bool]], whole_low: int, whole_high: int) -> int | None:
    """Exhaustive: the most milli any packing allocates (running shares and whole GPUs kept), None if none fits."""
    best = None
    for places in itertools.product(range(-1, gpus), repeat=len(shares)):
        if any(at < 0 and must for at, (_, must) in zip(places, shares, strict=True)):
            continue
        used = [0] * gpus
        for at, (size, _) in zip(places, shares, strict=True):
            if at >= 0:
                used[at] += size
        if any(u > defrag_bound.GPU_MILLI for u in used):
            continue
        empty = used.count(0)
        if empty < whole_low:
            continue
        allocated = sum(used) + defrag_bound.GPU_MILLI * min(empty, whole_high)
        best = allocated if best is None else max(best, allocated)
    return best


CASES = [
    # GPUs, (share milli, running) ..., whole GPUs running, running + waiting
    (3, [(810, True), (810, True), (190, False), (470, True), (470, True)], 0, 2),
    (2, [(650, True), (320, True), (470, False), (470, False)], 1, 1),
    (3, [(600, True), (500, True), (500, True), (400, False)], 0, 0),
    (4, [(810, False), (810, False), (810, False), (160, False)], 0, 2),
]


@pytest.mark.parametrize(("gpus", "shares", "whole_low", "whole_high"), CASES)
def test_lp_bound_is_never_above_the_best_packing(
    gpus: int, shares: list[tuple[int, bool]], whole_low: int, whole_high: int
) -> None:
    """The LP's allocated milli is at least what the best exhaustive packing allocates, and at most the capacity."""
    low: dict[int, int] = {}
    high: dict[int, int] = {}
    for size, must in shares:
        high[size] = high.get(size, 0) + 1
        if must:
            low[size] = low.get(size, 0) + 1
    allocated, _ = defrag_bound.lp_bound(gpus, low, high, whole_low, whole_high)
    exact = best_packing(gpus, shares, whole_low, whole_high)
    assert exact is not None
    assert exact - 1e-6 <= allocated <= gpus * defrag_bound.GPU_MILLI + 1e-6


def test_lp_bound_on_random_instances() -> None:
    """Random small instances: the LP allocates at least what the best exhaustive packing does."""
    rng = random.Random(11)
    for _ in range(25):
        gpus = rng.randint(1, 3)
        shares = [(rng.choice((160, 230, 320, 470, 650, 810)), rng.random() < 0.4) for _ in range(rng.randint(1, 5))]
        whole_high = rng.randint(0, 2)
        whole_low = rng.randint(0, whole_high)
        exact = best_packing(gpus, shares, whole_low, whole_high)
        if exact is None:
            continue  # the running pods do not fit: not a state the fold can be in
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        for size, must in shares:
            high[size] = high.get(size, 0) + 1
            low[size] = low.get(size, 0) + must
        allocated, _ = defrag_bound.lp_bound(gpus, low, high, whole_low, whole_high)
        assert allocated >= exact - 1e-6


def test_lp_bound_sees_the_pairing_residue() -> None:
    """Three 470-milli shares need two GPUs: 1060 milli unallocated of 3000 when nothing else may run."""
    allocated, _ = defrag_bound.lp_bound(2, {470: 3}, {470: 3}, 0, 0)
    assert allocated == pytest.approx(1410)


def test_packer_places_what_must_run_and_never_over_commits() -> None:
    """Every pod that must run is placed when it can be, and what cannot fit anywhere is not counted."""
    nodes = [defrag_bound.NodeRow(f"n{i}", "G2", 2, 8000, 32768) for i in range(3)]
    item = defrag_bound.Item
    items = [
        item(2, 2000, 6000, 1024, (), True, 1),  # only an empty node with 6 cores takes it
        item(1, 1000, 4000, 1024, (), True, 1),
        item(1, 1000, 4000, 1024, (), True, 1),
        item(0, 0, 2000, 1024, (), True, 1),
        item(1, 810, 9000, 1024, (), False, 1),  # optional and more CPU than any node has: left out
    ]
    for weight in defrag_bound.WEIGHTS:
        allocated, missing = defrag_bound.pack(nodes, items, weight)
        assert missing == []
        assert allocated == 4000
