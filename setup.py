"""Builds the fold's hot path with mypyc when it can, and plain Python when it cannot.

``pip install .`` (or ``-e .``) compiles the modules of :data:`build_config.COMPILED` into C extensions
beside their sources when asked (``GPUFOLD_COMPILE=1``; ``=0`` declines; unset, ``build_config.COMPILE_BY_DEFAULT``
decides: off).
Missing mypyc, a missing C compiler or Python headers, or any error while compiling is not fatal: the
build says so in one clear message and installs the same modules as plain Python, which give the same
events and hashes (only slower).
``GPUFOLD_PURE_PYTHON=1`` at build time skips compiling; at run time it loads the ``.py`` sources
even where extensions were built (see ``schemas/pure_python.py``).
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# build_config.py holds the list of compiled modules and their options; loaded by path (stdlib only: the build
# environment has none of the packages' dependencies).
_CONFIG = runpy.run_path(str(HERE / "build_config.py"))
COMPILED: tuple[str, ...] = _CONFIG["COMPILED"]
OPT_LEVEL: str = os.environ.get("GPUFOLD_MYPYC_OPT_LEVEL", _CONFIG["OPT_LEVEL"])
OPT_LEVELS: dict[str, str] = _CONFIG["OPT_LEVELS"]
JOBS = max(1, int(os.environ.get("GPUFOLD_BUILD_JOBS", "0")) or os.cpu_count() or 1)

BANNER = "gpufold: {}"


def say(message: str) -> None:
    print(BANNER.format(message), file=sys.stderr, flush=True)


def _c_file_levels() -> dict[str, str]:
    """mypyc's C file of each module with its own -O level (multi_file names them ``__native_a___b.c``)."""
    if "GPUFOLD_MYPYC_OPT_LEVEL" in os.environ:  # one level for everything when asked
        return {}
    return {f"__native_{module.replace('.', '___')}.c": level for module, level in OPT_LEVELS.items()}


def _parallel(compile_: Any, jobs: int, levels: dict[str, str]) -> Any:
    """A ``CCompiler.compile`` that runs gcc on an extension's C files side by side (distutils runs them one by one).

    mypyc puts every module's C into one shared library (one extension of ~60 files, the generated codec's
    6.6 MB among them), so setuptools' ``parallel`` option, which only builds whole extensions side by
    side, leaves one core idle. Largest files first, so the codec does not start last. A file named in
    ``levels`` gets its own -O (gcc takes the last -O it is given).
    """

    def compile_sources(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
        if len(sources) == 1 or jobs == 1:
            return compile_(sources, *args, **kwargs)

        def one(source: str) -> list[str]:
            level = levels.get(os.path.basename(source))
            extra = list(kwargs.get("extra_postargs") or [])
            return compile_([source], *args, **{**kwargs, "extra_postargs": [*extra, f"-O{level}"] if level else extra})

        order = sorted(sources, key=lambda source: -os.path.getsize(source))
        pool = ThreadPoolExecutor(jobs)
        try:
            built = dict(zip(order, pool.map(one, order), strict=True))
        finally:  # after a failure, start no other file (the build falls back to pure Python anyway)
            pool.shutdown(cancel_futures=True)
        return [obj for source in sources for obj in built[source]]

    return compile_sources


class OptionalBuildExt(build_ext):
    """Compiles the extensions; a failure leaves the pure-Python modules in place instead of failing the install.

    The first failure (no compiler, a compiler error, a killed gcc) stops the build: the other extensions
    are skipped (a module's small extension without mypyc's shared library would not import) and none is
    installed; one message says why.
    """

    failed: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            super().run()
        except Exception as error:  # a missing compiler raises at set-up (CCompilerError, PlatformError, ...)
            self._give_up(error)
        if self.extensions:
            say(f"compiled the hot path with mypyc in {time.monotonic() - started:.0f} s ({JOBS} gcc jobs)")

    def build_extensions(self) -> None:
        self.compiler.compile = _parallel(self.compiler.compile, JOBS, _c_file_levels())  # type: ignore[method-assign]
        super().build_extensions()

    def build_extension(self, ext: object) -> None:
        if self.failed is not None:
            return
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as error:
            self._give_up(error)

    def _give_up(self, error: BaseException) -> None:
        self.extensions = []
        if self.failed is not None:
            return
        self.failed = error
        # distutils quotes the whole command line (~40 arguments): name the program only, its output is above
        reason = re.sub(r"Command '\['([^']*)'.*?\]'", r"\1", str(error), flags=re.DOTALL)
        say(
            f"compiling the hot path failed ({type(error).__name__}: {reason}); installing it as pure Python "
            "instead (same events and hashes, slower fold). Install gcc and the Python headers, then reinstall "
            "to compile it."
        )


METADATA_ONLY = frozenset({"egg_info", "dist_info", "sdist"})
"""Commands that build nothing: pip runs setup.py for them first (build requirements, metadata), and translating
the hot path with mypyc costs ~15 s of CPU each time, so it happens only in the run that compiles."""


def extensions() -> list[object]:
    command = next((argument for argument in sys.argv[1:] if not argument.startswith("-")), None)
    if command in METADATA_ONLY:
        return []
    if os.environ.get("GPUFOLD_PURE_PYTHON", "") not in ("", "0"):
        say("GPUFOLD_PURE_PYTHON is set: installing the hot path as pure Python (not compiled)")
        return []
    if not _CONFIG["compile_requested"]():
        say(f"compiling is opt-in ({_CONFIG['COMPILE_ENV']}=1 compiles): installing the hot path as pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as error:
        say(f"mypyc is not available ({error}); installing the hot path as pure Python (not compiled)")
        return []
    paths = [module.replace(".", "/") + ".py" for module in COMPILED]
    try:
        # multi_file: one C file per module, compiled side by side (_parallel) rather than one big file
        return list(mypycify(paths, opt_level=OPT_LEVEL, multi_file=True, verbose=False))
    except BaseException as error:  # mypyc exits (SystemExit) on a type error it cannot compile
        traceback.print_exc()
        say(f"mypyc could not translate the hot path ({type(error).__name__}); installing pure Python instead")
        return []


if __name__ == "__main__":  # pip's backend runs this file as __main__; tests load it under another name
    setup(
        ext_modules=extensions(),
        cmdclass={"build_ext": OptionalBuildExt},
        options={"build_ext": {"parallel": JOBS}},
    )
