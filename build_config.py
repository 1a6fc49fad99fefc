"""The build configuration of the compiled hot path: which modules mypyc compiles, with which options, and whether
``pip install`` compiles without being asked; and, for the Makefile's banner, the tests and the benchmarks,
which of them a tree has built and which a process runs compiled.

A build detail: the code reads the same either way (the modules are plain Python; compiled, they give the same
events and hashes, faster). ``setup.py`` loads this file by path at build time, before anything is installed,
so it uses the standard library only; it is not installed with the packages. A process asks for the
interpreted sources of built modules with ``GPUFOLD_PURE_PYTHON=1`` (``schemas/pure_python.py``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
from pathlib import Path
from types import ModuleType

PURE_PYTHON_ENV = "GPUFOLD_PURE_PYTHON"
COMPILE_ENV = "GPUFOLD_COMPILE"
COMPILE_BY_DEFAULT = False
"""Whether ``pip install`` compiles without being asked (``GPUFOLD_COMPILE=1`` asks, ``=0`` declines).

Off: compiling costs a fresh install ~210 s of CPU (2-18 minutes of wall clock on 2 cores) and gives ~1.6x on
the fold, ~9 s of CPU on ``make demo``'s replay of the openb trace (BENCHMARKS.md, "Compiling by default,
measured again"). It is asked for where it pays: CI (``.ci/run``, so the compiled path runs the test suites and
every listed module must build) and the Docker image. Without a compiler the install says so and installs
pure Python."""

OPT_LEVEL = "2"
"""gcc's -O for the compiled modules (``GPUFOLD_MYPYC_OPT_LEVEL`` at build time sets one level for all)."""
OPT_LEVELS: dict[str, str] = {"schemas.fastcodec_generated": "1"}
"""Modules compiled at another level: the generated codec is 6.6 MB of C, ~70 s of gcc at -O1, ~120 s at -O2."""

COMPILED: tuple[str, ...] = (
    "schemas.codes",
    "schemas.limits",
    "schemas.records",
    "schemas.commands",
    "schemas.events",
    "schemas.snapshots",
    "schemas.dead_letters",
    "schemas.fragmentation",
    "schemas.validation",
    "schemas.avro_binary",
    "schemas.fastcodec_generated",
    "processor.core.errors",
    "processor.core.resources",
    "processor.core.capacity",
    "processor.core.pending",
    "processor.core.timers",
    "processor.core.typical",
    "processor.core.quota_keys",
    "processor.core.preemption_index",
    "processor.core.node",
    "processor.core.cohort_tree",
    "processor.core.state",
    "processor.core.reservations",
    "processor.core.reasons",
    "processor.core.dependencies",
    "processor.core.fragmentation",
    "processor.core.share_prices",
    "processor.core.model_supply",
    "processor.core.quotas",
    "processor.core.gangs",
    "processor.core.preemption_plans",
    "processor.core.node_victims",
    "processor.core.preemption",
    "processor.core.gang_preemption",
    "processor.core.reservation_planner",
    "processor.core.defrag_moves",
    "processor.core.defrag_gaps",
    "processor.core.defrag_repack",
    "processor.core.defrag_relieve",
    "processor.core.defrag_target",
    "processor.core.defrag",
    "processor.core.explain",
    "processor.core.reclaim",
    "processor.core.appliers",
    "processor.core.decision",
    "processor.core.handlers.evictions",
    "processor.core.handlers.reservations",
    "processor.core.handlers.dependants",
    "processor.core.handlers.checks",
    "processor.core.handlers.gangs",
    "processor.core.handlers.pods",
    "processor.core.handlers.rescheduling",
    "processor.core.handlers.queue",
    "processor.core.handlers.nodes",
    "processor.core.handlers.tenancy",
    "processor.core.handlers.clock",
    "processor.core.handlers.defragment",
    "processor.core.policies.base",
    "processor.core.policies.best_fit",
    "processor.core.policies.dot_product",
    "processor.core.policies.fgd",
    "processor.core.policies.fgd_plus",
    "processor.core.policies.fgd_pack",
    "processor.core.policies.first_fit",
    "processor.core.policies.gpu_clustering",
    "processor.core.policies.gpu_packing",
    "processor.core.policies.paper_best_fit",
    "processor.core.policies.random_pick",
    "processor.core.policies.spread",
    "processor.core.fold",
    "processor.core.snapshot",
)
"""The hot path: the contract's records and checks, the generated codec, and the fold (in dependency order)."""


def compile_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the install should compile the hot path (``GPUFOLD_COMPILE``, else :data:`COMPILE_BY_DEFAULT`)."""
    value = (os.environ if environ is None else environ).get(COMPILE_ENV, "")
    return COMPILE_BY_DEFAULT if value == "" else value != "0"


def pure_python_requested() -> bool:
    """Whether this process asked for the interpreted sources (``GPUFOLD_PURE_PYTHON`` set and not ``0``)."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def source_of(name: str) -> Path:
    """The ``.py`` source of a module of :data:`COMPILED`, where the running interpreter imports it from."""
    package, _, stem = name.rpartition(".")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations)), stem + ".py")


def _extensions(source: Path) -> list[Path]:
    return [
        source.with_name(source.stem + suffix)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if source.with_name(source.stem + suffix).exists()
    ]


def is_compiled(module: ModuleType) -> bool:
    """Whether a module was loaded from a C extension rather than from its ``.py`` source."""
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def built() -> list[str]:
    """The modules of :data:`COMPILED` that have a C extension beside their source (what the install built)."""
    return [name for name in COMPILED if _extensions(source_of(name))]


def stale() -> list[str]:
    """The modules whose ``.py`` source changed after their extension was built (reinstall to rebuild them)."""
    out = []
    for name in COMPILED:
        source = source_of(name)
        if any(extension.stat().st_mtime < source.stat().st_mtime for extension in _extensions(source)):
            out.append(name)
    return out


def status() -> dict[str, bool]:
    """Each module of :data:`COMPILED` -> whether the running process uses its compiled form (imports them)."""
    return {name: is_compiled(importlib.import_module(name)) for name in COMPILED}


def summary() -> str:
    """One line for logs and the install's banner: how much of the hot path runs compiled."""
    compiled = sum(status().values())
    if compiled == len(COMPILED):
        return f"hot path compiled with mypyc ({compiled} modules)"
    if compiled == 0:
        if pure_python_requested():
            why = f"{PURE_PYTHON_ENV} is set"
        elif not compile_requested():
            why = f"not built (compiling is opt-in: {COMPILE_ENV}=1 at install builds it)"
        else:
            why = "not built (no compiler at install? pip install -v shows why)"
        return f"hot path pure Python: {why}"
    return f"hot path partly compiled: {compiled} of {len(COMPILED)} modules"
