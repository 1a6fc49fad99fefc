"""The switch that runs built modules from their ``.py`` sources: ``GPUFOLD_PURE_PYTHON=1``.

The install may compile part of the code into C extensions beside their sources (a build detail:
``build_config.py`` says which). Python imports an extension before a source of the same name, so a built
tree runs compiled. ``GPUFOLD_PURE_PYTHON=1`` in the environment of a process makes :func:`install` (called
first by ``schemas/__init__.py``, before any built module is imported) load every module that has both from
its ``.py`` source instead: the same code, interpreted, for comparisons and debugging. The fold never reads
the environment; only this import shim does, once.
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

ROOT = Path(__file__).resolve().parent.parent  # the folder holding the schemas/ package and its siblings
_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def requested() -> bool:
    """Whether this process asked for the interpreted sources (``GPUFOLD_PURE_PYTHON`` set and not ``0``)."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


class _SourceFinder:
    """A meta-path finder that loads a module of a package beside ``schemas`` from its ``.py`` source where an
    extension of the same name would be imported (no list: whatever the install built)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is None:
            return None  # a top-level module or package: only modules inside packages are built
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.origin.endswith(_EXTENSIONS):
            return None
        extension = Path(spec.origin)
        if ROOT not in extension.parents or any(part.startswith(".") for part in extension.relative_to(ROOT).parts):
            return None  # not ours (another package's extension, or a virtualenv inside the tree)
        source = extension.with_name(extension.name.split(".", 1)[0] + ".py")
        return importlib.util.spec_from_file_location(fullname, source) if source.is_file() else None


def install() -> None:
    """Load the ``.py`` sources of built modules if this process asked for them; idempotent."""
    if requested() and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())
    elif str(ROOT) not in sys.path and any(ROOT.glob("*__mypyc.*")):
        # The compiled modules import mypyc's shared library, built beside the packages; an editable install
        # maps only the packages onto sys.path, so a process started outside the tree would not find it.
        sys.path.append(str(ROOT))
