"""The compiled hot path: built and used where the install compiled it, and equal to the pure-Python path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import compiled
from schemas.fastcodec_gen import GENERATED, module_source
from tests import fold_digest

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_codec_is_what_the_generator_writes() -> None:
    """schemas/fastcodec_generated.py equals the generator's output for today's schemas (else regenerate it)."""
    assert GENERATED.read_text() == module_source(), "stale: run python -m schemas.fastcodec_gen"


def test_every_compiled_module_has_a_source_and_is_in_the_mypy_packages() -> None:
    """Each listed module exists as a .py file (the pure path), so GPUFOLD_PURE_PYTHON=1 can always load it."""
    for name in compiled.COMPILED:
        assert compiled.ROOT.joinpath(*name.split(".")).with_suffix(".py").is_file(), name


@pytest.mark.skipif(compiled.pure_python_requested(), reason="this process asked for the pure-Python path")
def test_the_built_modules_are_the_ones_in_use() -> None:
    """Where the install compiled the hot path (always in CI, which has gcc), every module of it runs compiled."""
    built = compiled.built()
    if os.environ.get("CI") == "true" and compiled.COMPILE_BY_DEFAULT:
        assert built == list(compiled.COMPILED), (
            f"CI builds every module; not built: {set(compiled.COMPILED) - set(built)}"
        )
    if not built:
        pytest.skip("the install did not compile the hot path (no compiler): nothing to check")
    assert compiled.stale() == [], "sources edited after the build: reinstall (or python setup.py build_ext --inplace)"
    status = compiled.status()
    assert [name for name in built if not status[name]] == []
    assert compiled.summary().startswith("hot path compiled")


def test_the_switch_loads_the_pure_sources() -> None:
    """GPUFOLD_PURE_PYTHON=1 loads every module of the hot path from its .py source."""
    script = "from schemas import compiled; import json; print(json.dumps(compiled.status()))"
    env = {**os.environ, compiled.PURE_PYTHON_ENV: "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert not any(json.loads(result.stdout).values())


def test_compiled_and_pure_paths_give_the_same_bytes_and_hashes() -> None:
    """Recorded logs and generated streams (several policies) fold to identical frames and state hashes both ways."""
    here = fold_digest.digest()
    env = {**os.environ, compiled.PURE_PYTHON_ENV: "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.fold_digest"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    pure = json.loads(result.stdout)
    assert pure.pop("hot_path").startswith("hot path pure Python")
    here.pop("hot_path")
    assert pure == here
