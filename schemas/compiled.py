"""Which modules the install compiles with mypyc, and the switch that keeps their pure-Python sources runnable.

``setup.py`` compiles :data:`COMPILED` into C extensions beside their ``.py`` sources (or, when it
cannot, says why and leaves them pure). Python imports an extension before a source of the same
name, so a built tree runs compiled. ``GPUFOLD_PURE_PYTHON=1`` in the environment of a process makes
:func:`install` (called first by ``schemas/__init__.py``) load these modules from their ``.py``
sources instead: the same code, interpreted, for comparisons and debugging. The fold never reads the
environment; only this import shim does, once, before any compiled module is imported.

Standard library only: ``setup.py`` loads this file by path before anything is installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_PYTHON_ENV = "GPUFOLD_PURE_PYTHON"
COMPILE_ENV = "GPUFOLD_COMPILE"
COMPILE_BY_DEFAULT = True
"""Whether ``pip install`` compiles without being asked (``GPUFOLD_COMPILE=0`` declines, ``=1`` asks).

The build takes ~210-245 s of CPU, ~2.5-4 minutes on 2 cores (BENCHMARKS.md, "Compiling by default"); without
a compiler it says so and installs pure Python."""

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
    "processor.core.state",
    "processor.core.reservations",
    "processor.core.reasons",
    "processor.core.dependencies",
    "processor.core.fragmentation",
    "processor.core.quotas",
    "processor.core.gangs",
    "processor.core.preemption",
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

ROOT = Path(__file__).resolve().parent.parent  # the folder holding the schemas/ and processor/ packages


def compile_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the install should compile the hot path (``GPUFOLD_COMPILE``, else :data:`COMPILE_BY_DEFAULT`)."""
    value = (os.environ if environ is None else environ).get(COMPILE_ENV, "")
    return COMPILE_BY_DEFAULT if value == "" else value != "0"


def pure_python_requested() -> bool:
    """Whether this process asked for the interpreted sources (``GPUFOLD_PURE_PYTHON`` set and not ``0``)."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


class _SourceFinder:
    """A meta-path finder that loads the compiled modules from their ``.py`` sources."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED:
            return None
        source = ROOT.joinpath(*fullname.split(".")).with_suffix(".py")
        return importlib.util.spec_from_file_location(fullname, source)


def install() -> None:
    """Load the pure-Python sources of :data:`COMPILED` if this process asked for them; idempotent."""
    if pure_python_requested() and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())
    elif str(ROOT) not in sys.path and any(ROOT.glob("*__mypyc.*")):
        # The compiled modules import mypyc's shared library, built beside the packages; an editable install
        # maps only the packages onto sys.path, so a process started outside the tree would not find it.
        sys.path.append(str(ROOT))


def is_compiled(module: ModuleType) -> bool:
    """Whether a module was loaded from a C extension rather than from its ``.py`` source."""
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def built() -> list[str]:
    """The modules of :data:`COMPILED` that have a C extension beside their source (what the install built)."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    out = []
    for name in COMPILED:
        folder = ROOT.joinpath(*name.split(".")[:-1])
        stem = name.rsplit(".", 1)[-1]
        if any(folder.joinpath(stem + suffix).exists() for suffix in suffixes):
            out.append(name)
    return out


def stale() -> list[str]:
    """The modules whose ``.py`` source changed after their extension was built (reinstall to rebuild them)."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    out = []
    for name in COMPILED:
        source = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        for suffix in suffixes:
            extension = source.with_name(source.stem + suffix)
            if extension.exists() and extension.stat().st_mtime < source.stat().st_mtime:
                out.append(name)
    return out


def status() -> dict[str, bool]:
    """Each module of :data:`COMPILED` -> whether the running process uses its compiled form (imports them)."""
    return {name: is_compiled(importlib.import_module(name)) for name in COMPILED}


def summary() -> str:
    """One line for logs and ``--version``-like output: how much of the hot path runs compiled."""
    compiled = sum(status().values())
    if compiled == len(COMPILED):
        return f"hot path compiled with mypyc ({compiled} modules)"
    if compiled == 0:
        if pure_python_requested():
            why = f"{PURE_PYTHON_ENV} is set"
        elif os.environ.get(COMPILE_ENV, "").strip() == "0":
            why = f"not built ({COMPILE_ENV}=0)"
        else:
            why = "not built (no compiler at install? pip install -v shows why)"
        return f"hot path pure Python: {why}"
    return f"hot path partly compiled: {compiled} of {len(COMPILED)} modules"
