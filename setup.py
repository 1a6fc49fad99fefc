"""Builds the fold's hot path with mypyc when it can, and plain Python when it cannot.

``GPUFOLD_COMPILE=1 pip install .`` (or ``-e .``; without it, ``schemas.compiled.COMPILE_BY_DEFAULT``
decides) compiles the modules of :data:`schemas.compiled.COMPILED` into C extensions beside their sources.
Missing mypyc, a missing C compiler or Python headers, or any error while compiling is not fatal: the
build says so in one clear message and installs the same modules as plain Python, which give the same
events and hashes (only slower).
``GPUFOLD_PURE_PYTHON=1`` at build time skips compiling; at run time it loads the ``.py`` sources
even where extensions were built (see ``schemas/compiled.py``).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# schemas/compiled.py holds the one list of compiled modules; loaded by path (stdlib only), since importing the
# schemas package would need its dependencies, which the build environment does not have.
_COMPILED_PY = runpy.run_path(str(HERE / "schemas" / "compiled.py"))
COMPILED: tuple[str, ...] = _COMPILED_PY["COMPILED"]

BANNER = "gpufold: {}"


def say(message: str) -> None:
    print(BANNER.format(message), file=sys.stderr, flush=True)


class OptionalBuildExt(build_ext):
    """Compiles the extensions; a failure leaves the pure-Python modules in place instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # a missing compiler raises at set-up (CCompilerError, PlatformError, ...)
            self._give_up(error)

    def build_extension(self, ext: object) -> None:
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as error:
            self._give_up(error)

    def _give_up(self, error: BaseException) -> None:
        say(
            f"compiling the hot path failed ({type(error).__name__}: {error}); installing pure Python instead "
            "(same results, ~2-5x slower fold). Install gcc and the Python headers, then reinstall, to compile."
        )
        self.extensions = []


def extensions() -> list[object]:
    if os.environ.get("GPUFOLD_PURE_PYTHON", "") not in ("", "0"):
        say("GPUFOLD_PURE_PYTHON is set: installing the hot path as pure Python (not compiled)")
        return []
    if not _COMPILED_PY["compile_requested"]():
        say("installing the hot path as pure Python; GPUFOLD_COMPILE=1 pip install ... compiles it with mypyc")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as error:
        say(f"mypyc is not available ({error}); installing the hot path as pure Python (not compiled)")
        return []
    paths = [module.replace(".", "/") + ".py" for module in COMPILED]
    try:
        level = os.environ.get("GPUFOLD_MYPYC_OPT_LEVEL", "3")
        # multi_file: one C file per module, compiled in parallel (options below) rather than one big file
        return list(mypycify(paths, opt_level=level, multi_file=True, verbose=False))
    except BaseException as error:  # mypyc exits (SystemExit) on a type error it cannot compile
        traceback.print_exc()
        say(f"mypyc could not translate the hot path ({type(error).__name__}); installing pure Python instead")
        return []


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
