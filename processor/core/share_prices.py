"""What a GPU share is worth, from the learned share mix: the dual prices of the cutting-stock LP.

Shares (one GPU, under 1000 milli) only share a GPU with other shares, so packing them
is bin packing: which sizes end up together decides how much of each GPU is left
over. With the mix of share sizes known (the cluster's typical pods), the LP
"cover the mix with as few GPUs as possible, each GPU holding a pattern of sizes
summing to <= 1000" has dual prices ``price[s]`` (the part of a GPU a share of ``s``
milli is worth, <= 1 per pattern, = 1 for the patterns an optimal packing uses). A
gap of ``r`` free milli is worth ``value(r)``, the most a pattern that fits in it
is priced at (a knapsack over the prices). Putting a share of ``s`` in a gap of
``r`` then loses ``value(r) - price[s] - value(r - s)`` of a GPU (its *reduced
cost*, never negative); on an idle GPU, which a whole-GPU pod would fill, it loses
``1 - price[s] - value(1000 - s)``. A share whose reduced cost is 0 goes where an
optimal packing of the mix would put it; placing each share at the least reduced
cost packs the stream close to the LP's optimum (a 470 waits for a 470 or a 530
rather than taking a 320's gap, a 320 opens a GPU that a 650 will fill).

Pure and deterministic: the LP is solved by a revised simplex in floating point
(the same operations in the same order on every machine), entering columns from
the knapsack (column generation), ties broken on the lowest index. Cost: at most
``MAX_SIZES`` sizes, on a grid of ``UNIT`` milli; each iteration is O(n^2 + n * 1000/UNIT)
for n sizes; at most ``MAX_ITERATIONS`` iterations (~10 ms for openb's mixes, at most
~0.1 s). Computed once per typical-pod list (the policy caches it by identity).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

GPU_MILLI = 1000
MAX_SIZES = 32  # the most popular sizes are priced; the rest are worth 0 (they fit where value is lost least)
UNIT = 10  # milli: the LP's grid (openb's shares are all multiples of 10)
MAX_ITERATIONS = 400
EPSILON = 1e-9
REFACTOR_EVERY = 32  # pivots between two fresh inversions of the basis
DIGITS = 6  # reduced costs are rounded to 1e-6 of a GPU so that equal ones compare equal


class SharePrices:
    """Dual prices of a share mix, and the value of every gap (see the module docstring)."""

    __slots__ = ("_values", "gpus", "prices", "unit")

    def __init__(self, prices: dict[int, float], unit: int, values: list[float], gpus: float = 0.0) -> None:
        self.prices = prices  # share milli -> part of a GPU
        self.unit = unit
        self._values = values  # value of a gap of r milli = _values[r // unit]
        self.gpus = gpus  # the LP optimum: GPUs that pack the mix (weights as given), fractionally

    def value(self, free: int) -> float:
        """The most a gap of ``free`` milli can be worth, in GPUs (1 for an idle GPU)."""
        if free >= GPU_MILLI:
            return 1.0
        if free <= 0:
            return 0.0
        return self._values[free // self.unit]

    def reduced_cost(self, free: int, milli: int) -> float:
        """The part of a GPU lost by putting a share of ``milli`` on a GPU with ``free`` milli free (>= milli).

        Never negative (the knapsack's values dominate every price); a size off the LP's grid, priced
        as rounded up, could make it a rounding below zero, which counts as zero."""
        price = self.prices.get(milli, 0.0)
        return max(0.0, round(self.value(free) - price - self.value(free - milli), DIGITS))


NO_PRICES = SharePrices({}, GPU_MILLI, [0.0, 0.0])


def share_prices(mix: Mapping[int, float]) -> SharePrices:
    """Prices for a share mix (share milli -> weight, any scale). Sizes outside (0, 1000) are ignored.

    The LP works in units of ``UNIT`` milli (or the largest unit every size is a multiple of, if coarser):
    a size is rounded up to a whole number of units, so every pattern it prices fits a GPU."""
    weighted = sorted(((weight, size) for size, weight in mix.items() if 0 < size < GPU_MILLI and weight > 0))
    chosen = sorted(size for _, size in weighted[::-1][:MAX_SIZES])
    if not chosen:
        return NO_PRICES
    unit = max(UNIT, math.gcd(GPU_MILLI, *chosen))
    rows: dict[int, float] = {}  # units -> weight
    for size in chosen:
        rows[-(-size // unit)] = rows.get(-(-size // unit), 0.0) + float(mix[size])
    units = sorted(rows)
    duals, gpus = _solve(units, GPU_MILLI // unit, [rows[u] for u in units])
    values, _ = _knapsack(units, duals, GPU_MILLI // unit)
    dual_of = dict(zip(units, duals, strict=True))
    prices = {size: dual_of[-(-size // unit)] for size in chosen}
    return SharePrices(prices, unit, values, gpus)


def _knapsack(units: list[int], worth: list[float], capacity: int) -> tuple[list[float], list[int]]:
    """Unbounded knapsack: best[r] = most worth of sizes summing to <= r; last[r] = item added at r (-1: none)."""
    best = [0.0] * (capacity + 1)
    last = [-1] * (capacity + 1)
    for room in range(1, capacity + 1):
        top, pick = best[room - 1], -1
        for i, size in enumerate(units):
            if size <= room and worth[i] > 0:
                candidate = best[room - size] + worth[i]
                if candidate > top + EPSILON:
                    top, pick = candidate, i
        best[room], last[room] = top, pick
    return best, last


def _pattern(units: list[int], last: list[int], capacity: int) -> list[float]:
    counts = [0.0] * len(units)
    room = capacity
    while room > 0:
        pick = last[room]
        if pick < 0:
            room -= 1
            continue
        counts[pick] += 1.0
        room -= units[pick]
    return counts


def _invert(matrix: list[list[float]]) -> list[list[float]]:
    """Gauss-Jordan with partial pivoting (lowest row on ties). The basis is never singular here."""
    n = len(matrix)
    work = [row[:] + [1.0 if i == j else 0.0 for j in range(n)] for i, row in enumerate(matrix)]
    for column in range(n):
        pivot = max(range(column, n), key=lambda row: (abs(work[row][column]), -row))
        work[column], work[pivot] = work[pivot], work[column]
        head = work[column][column]
        work[column] = [value / head for value in work[column]]
        for row in range(n):
            factor = work[row][column]
            if row != column and factor != 0.0:
                work[row] = [a - factor * b for a, b in zip(work[row], work[column], strict=True)]
    return [row[n:] for row in work]


def _solve(units: list[int], capacity: int, demand: list[float]) -> tuple[list[float], float]:
    """(duals, optimum) of min sum(x) s.t. patterns x >= demand, x >= 0: revised simplex, column generation.

    Columns are patterns (counts per size, costing 1 GPU) or surplus columns (-e_i, cost 0).
    The start is one single-size pattern per size (as many copies as fit), which is feasible.
    """
    n = len(units)
    columns: list[tuple[list[float], float]] = []  # basis columns with their cost
    for i, size in enumerate(units):
        column = [0.0] * n
        column[i] = float(capacity // size)
        columns.append((column, 1.0))
    inverse = [[(1.0 / columns[i][0][i] if i == j else 0.0) for j in range(n)] for i in range(n)]
    solution = [demand[i] / columns[i][0][i] for i in range(n)]
    pivots = 0
    for _ in range(MAX_ITERATIONS):
        costs = [cost for _, cost in columns]
        duals = [sum(costs[k] * inverse[k][i] for k in range(n)) for i in range(n)]
        # Entering column: a surplus with a negative dual, else the knapsack's best pattern if it prices above 1.
        entering: list[float] | None = None
        entering_cost = 0.0
        for i in range(n):
            if duals[i] < -EPSILON:
                entering = [0.0] * n
                entering[i] = -1.0
                break
        if entering is None:
            best, last = _knapsack(units, duals, capacity)
            if best[capacity] <= 1.0 + EPSILON:
                break
            entering, entering_cost = _pattern(units, last, capacity), 1.0
        direction = [sum(inverse[k][i] * entering[i] for i in range(n)) for k in range(n)]
        leaving, ratio = -1, 0.0
        for k in range(n):
            if direction[k] > EPSILON:
                candidate = solution[k] / direction[k]
                if leaving < 0 or candidate < ratio - EPSILON:
                    leaving, ratio = k, candidate
        if leaving < 0:
            break  # unbounded: cannot happen with a positive cost per pattern
        columns[leaving] = (entering, entering_cost)
        pivots += 1
        if pivots % REFACTOR_EVERY == 0:
            basis = [[columns[k][0][i] for k in range(n)] for i in range(n)]
            inverse = _invert(basis)
            solution = [sum(inverse[k][i] * demand[i] for i in range(n)) for k in range(n)]
            continue
        head = direction[leaving]
        pivot_row = [value / head for value in inverse[leaving]]
        for k in range(n):
            if k == leaving:
                continue
            factor = direction[k]
            if factor != 0.0:
                inverse[k] = [a - factor * b for a, b in zip(inverse[k], pivot_row, strict=True)]
                solution[k] -= factor * ratio
        inverse[leaving] = pivot_row
        solution[leaving] = ratio
    costs = [cost for _, cost in columns]
    duals = [sum(costs[k] * inverse[k][i] for k in range(n)) for i in range(n)]
    return [max(0.0, dual) for dual in duals], sum(costs[k] * solution[k] for k in range(n))
