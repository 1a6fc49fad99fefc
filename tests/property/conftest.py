"""Reports the property suite's time (wall and CPU) in the terminal summary, so CI logs show its cost.

``GPUFOLD_PROPERTY_MAX_EXAMPLES=N`` caps every property test at N examples: the second pass of the suite
on the pure-Python hot path (``scripts/test.sh``) runs it so, to keep CI's cost small.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from hypothesis import settings


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    cap = int(os.environ.get("GPUFOLD_PROPERTY_MAX_EXAMPLES", "0") or 0)
    if cap <= 0:
        return
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if isinstance(current, settings) and current.max_examples > cap:
            test._hypothesis_internal_use_settings = settings(current, max_examples=cap)  # type: ignore[union-attr]


_wall: dict[str, float] = {}
_cpu: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    if item.nodeid.startswith("tests/property/"):
        _wall[module] = _wall.get(module, 0.0) + time.perf_counter() - wall
        _cpu[module] = _cpu.get(module, 0.0) + time.process_time() - cpu


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _wall:
        parts = ", ".join(f"{module} {_wall[module]:.1f} s wall / {_cpu[module]:.1f} s CPU" for module in sorted(_wall))
        terminalreporter.write_line(
            f"property suite: {sum(_wall.values()):.1f} s wall, {sum(_cpu.values()):.1f} s CPU ({parts})"
        )
