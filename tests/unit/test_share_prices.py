"""Share prices: the cutting-stock LP's duals are optimal, gaps are valued by them, and reduced costs rank GPUs."""

from __future__ import annotations

import itertools
import random

import pytest

from processor.core.share_prices import GPU_MILLI, MAX_SIZES, NO_PRICES, share_prices


def patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every maximal-or-not multiset of the sizes that fits one GPU, as counts per size."""
    found = []
    limits = [GPU_MILLI // size for size in sizes]
    for counts in itertools.product(*(range(limit + 1) for limit in limits)):
        if any(counts) and sum(c * s for c, s in zip(counts, sizes, strict=True)) <= GPU_MILLI:
            found.append(counts)
    return found


MIXES = [
    {500: 2.0},
    {810: 1.0, 190: 1.0},
    {470: 2.0, 320: 1.0, 650: 1.0},
    {810: 11.0, 470: 7.5, 320: 3.3, 650: 2.5, 230: 1.4, 460: 1.3, 160: 0.7},
    {300: 5.0, 350: 1.0, 400: 2.0, 600: 1.0},
]


@pytest.mark.parametrize("mix", MIXES)
def test_the_prices_are_an_optimal_dual(mix: dict[int, float]) -> None:
    """No pattern of shares is priced above one GPU (dual feasibility), and the prices of the mix add up to the
    LP's optimum (strong duality): together a certificate that the LP was solved to optimality."""
    prices = share_prices(mix)
    sizes = sorted(mix)
    for counts in patterns(sizes):
        assert sum(c * prices.prices[s] for c, s in zip(counts, sizes, strict=True)) <= 1.0 + 1e-9
    assert sum(mix[s] * prices.prices[s] for s in sizes) == pytest.approx(prices.gpus, abs=1e-7)
    assert prices.gpus >= sum(mix[s] * s for s in sizes) / GPU_MILLI - 1e-9  # never below the milli


def test_known_prices() -> None:
    """Two 500s fill a GPU (half each); an 810 costs a whole GPU and a 190 that fills its gap costs nothing."""
    assert share_prices({500: 3.0}).prices == {500: 0.5}
    assert share_prices({810: 1.0, 190: 1.0}).prices == {190: 0.0, 810: 1.0}


def test_reduced_costs_never_go_below_zero() -> None:
    """Putting a share anywhere it fits loses a non-negative part of a GPU."""
    prices = share_prices(MIXES[3])
    for milli in (160, 230, 320, 470, 650, 810, 555):
        for free in range(milli, GPU_MILLI + 1, 10):
            assert prices.reduced_cost(free, milli) >= 0.0


def test_a_share_goes_where_an_optimal_packing_puts_it() -> None:
    """With 470s, 320s and 650s to pack, a 320 next to a 470 loses half a GPU (the 470's partner slot), next to
    a 650 or on an idle GPU nothing; a second 320 on a GPU holding one loses the 650 that GPU could take."""
    prices = share_prices({470: 2.0, 320: 1.0, 650: 1.0})
    assert prices.reduced_cost(350, 320) == 0.0  # beside a 650
    assert prices.reduced_cost(GPU_MILLI, 320) == 0.0  # an idle GPU, for a 650 to join
    assert prices.reduced_cost(530, 320) == 0.5  # beside a 470
    assert prices.reduced_cost(680, 320) == 1.0  # beside another 320
    assert prices.reduced_cost(530, 470) == 0.0  # a 470 beside a 470


def test_prices_do_not_depend_on_the_order_of_the_mix() -> None:
    """The same mix given in another order gives the same prices and values."""
    mix = MIXES[3]
    shuffled = list(mix.items())
    random.Random(7).shuffle(shuffled)
    one, two = share_prices(mix), share_prices(dict(shuffled))
    assert one.prices == two.prices
    assert [one.value(r) for r in range(0, 1001, 10)] == [two.value(r) for r in range(0, 1001, 10)]


def test_no_shares_no_prices() -> None:
    """Without share sizes in the mix nothing is priced: an idle GPU is worth 1, a share costs what it takes."""
    assert share_prices({}) is NO_PRICES
    assert share_prices({1000: 1.0, 0: 2.0}) is NO_PRICES
    assert NO_PRICES.reduced_cost(GPU_MILLI, 300) == 1.0
    assert NO_PRICES.reduced_cost(600, 300) == 0.0


def test_only_the_most_popular_sizes_are_priced() -> None:
    """Past MAX_SIZES sizes, the least popular are left out (worth 0), so the LP stays small."""
    mix = {10 * (i + 1): float(i + 1) for i in range(MAX_SIZES + 6)}
    prices = share_prices(mix)
    assert len(prices.prices) == MAX_SIZES
    assert min(prices.prices) == 70  # sizes 10..60 (weights 1..6) are the six least popular
