"""The compiled hot path (``build_config.py``): built and used where the install compiled it, equal to the pure path."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import build_config
from schemas import pure_python
from schemas.fastcodec_gen import GENERATED, module_source
from tests import fold_digest

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_codec_is_what_the_generator_writes() -> None:
    """schemas/fastcodec_generated.py equals the generator's output for today's schemas (else regenerate it)."""
    assert GENERATED.read_text() == module_source(), "stale: run python -m schemas.fastcodec_gen"


def test_every_compiled_module_has_a_source_and_is_in_the_mypy_packages() -> None:
    """Each listed module exists as a .py file (the pure path), so GPUFOLD_PURE_PYTHON=1 can always load it."""
    for name in build_config.COMPILED:
        assert ROOT.joinpath(*name.split(".")).with_suffix(".py").is_file(), name
        assert build_config.source_of(name) == ROOT.joinpath(*name.split(".")).with_suffix(".py"), name


@pytest.mark.skipif(pure_python.requested(), reason="this process asked for the pure-Python path")
def test_the_built_modules_are_the_ones_in_use() -> None:
    """Where the install compiled the hot path (always in CI, which has gcc), every module of it runs compiled."""
    built = build_config.built()
    if os.environ.get("CI") == "true" and build_config.compile_requested():  # .ci/run asks for it
        assert built == list(build_config.COMPILED), (
            f"CI builds every module; not built: {set(build_config.COMPILED) - set(built)}"
        )
    if not built:
        pytest.skip("the install did not compile the hot path (no compiler): nothing to check")
    assert build_config.stale() == [], (
        "sources edited after the build: reinstall (or python setup.py build_ext --inplace)"
    )
    status = build_config.status()
    assert [name for name in built if not status[name]] == []
    assert build_config.summary().startswith("hot path compiled")


def test_the_switch_loads_the_pure_sources() -> None:
    """GPUFOLD_PURE_PYTHON=1 loads every module of the hot path from its .py source."""
    script = "import build_config; import json; print(json.dumps(build_config.status()))"
    env = {**os.environ, pure_python.PURE_PYTHON_ENV: "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert not any(json.loads(result.stdout).values())


def test_compiled_and_pure_paths_give_the_same_bytes_and_hashes() -> None:
    """Recorded logs and generated streams (several policies) fold to identical frames and state hashes both ways."""
    here = fold_digest.digest()
    env = {**os.environ, pure_python.PURE_PYTHON_ENV: "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.fold_digest"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    pure = json.loads(result.stdout)
    assert pure.pop("hot_path").startswith("hot path pure Python")
    here.pop("hot_path")
    assert pure == here


def _setup_script() -> dict[str, Any]:
    """setup.py's definitions, without running setup() (it does only when run as __main__, as pip's backend does)."""
    return runpy.run_path(str(ROOT / "setup.py"), run_name="gpufold_setup")


def test_a_failing_compiler_installs_pure_python_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No usable C compiler (CC=/bin/false): the build does not fail, builds nothing, and says why in one line."""
    import setuptools  # the venv has it (Python 3.11 venvs do, and setup.py needs it): never a skip

    source = tmp_path / "probe.c"
    source.write_text("int probe(void) { return 1; }\n")
    extension = setuptools.Extension("probe", [str(source)])
    command = _setup_script()["OptionalBuildExt"](
        setuptools.Distribution({"name": "probe", "ext_modules": [extension]})
    )
    command.build_lib, command.build_temp = str(tmp_path / "lib"), str(tmp_path / "temp")
    monkeypatch.setenv("CC", "/bin/false")
    command.ensure_finalized()
    command.run()
    assert command.extensions == []
    err = capsys.readouterr().err
    assert "gpufold: compiling the hot path failed" in err
    assert "installing it as pure Python instead" in err
    assert list(tmp_path.rglob("*.so")) == []


def test_the_build_runs_gcc_on_each_c_file_side_by_side_with_its_own_level() -> None:
    """One call per C file (largest first), the objects in the sources' order, the codec's file at its own -O."""
    calls: list[tuple[list[str], list[str]]] = []

    def compile_(sources: list[str], output_dir: str | None = None, **kwargs: Any) -> list[str]:
        calls.append((sources, kwargs["extra_postargs"]))
        return [source.replace(".c", ".o") for source in sources]

    sources = [str(ROOT / "setup.py"), str(ROOT / "schemas" / "fastcodec_generated.py"), str(ROOT / "Makefile")]
    levels = {"fastcodec_generated.py": "1"}
    parallel = _setup_script()["_parallel"](compile_, 2, levels)
    objects = parallel(sources, output_dir="build", extra_postargs=["-O2", "-g1"])
    assert objects == [source.replace(".c", ".o") for source in sources]
    assert sorted(len(called) for called, _ in calls) == [1, 1, 1]
    assert calls[0][0] == [sources[1]], "the largest file first"
    assert {called[0]: args for called, args in calls} == {
        sources[0]: ["-O2", "-g1"],
        sources[1]: ["-O2", "-g1", "-O1"],
        sources[2]: ["-O2", "-g1"],
    }


def test_metadata_steps_do_not_translate_the_hot_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip asks setup.py for requirements and metadata first; only the build step runs mypyc (~15 s each)."""
    script = _setup_script()
    for command in (["egg_info"], ["dist_info", "--output-dir", "/tmp/x"], ["--quiet", "sdist"]):
        monkeypatch.setattr(sys, "argv", ["setup.py", *command])
        assert script["extensions"]() == []
    monkeypatch.setattr(sys, "argv", ["setup.py", "build_ext"])
    monkeypatch.setenv(build_config.COMPILE_ENV, "0")
    assert script["extensions"]() == []


def test_the_compiled_fold_reads_clusters_nodes_and_pods_through_in_and_brackets() -> None:
    """No ``.get`` on the dicts a what-if fork copies on read: compiled, ``dict.get`` skips the fork's override."""
    pattern = re.compile(r"\b(clusters|nodes|pods)\.get\(")
    found = [
        f"{name}:{number}: {line.strip()}"
        for name in build_config.COMPILED
        for number, line in enumerate(
            ROOT.joinpath(*name.split(".")).with_suffix(".py").read_text().splitlines(), start=1
        )
        if pattern.search(line)
    ]
    assert found == [], "use processor.core.state.lookup(table, key) instead"


def test_the_summary_says_why_the_hot_path_is_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not asked (unset: off by default, or GPUFOLD_COMPILE=0), asked for pure sources, or asked and not built:
    three different lines."""
    monkeypatch.setattr(build_config, "status", lambda: dict.fromkeys(build_config.COMPILED, False))
    monkeypatch.delenv(build_config.PURE_PYTHON_ENV, raising=False)
    opt_in = f"hot path pure Python: not built (compiling is opt-in: {build_config.COMPILE_ENV}=1 at install builds it)"
    monkeypatch.setenv(build_config.COMPILE_ENV, "0")
    assert build_config.summary() == opt_in
    monkeypatch.delenv(build_config.COMPILE_ENV)
    assert not build_config.COMPILE_BY_DEFAULT and build_config.summary() == opt_in
    monkeypatch.setenv(build_config.COMPILE_ENV, "1")
    assert "no compiler at install?" in build_config.summary()
    monkeypatch.setenv(build_config.PURE_PYTHON_ENV, "1")
    assert build_config.summary() == f"hot path pure Python: {build_config.PURE_PYTHON_ENV} is set"


def test_the_build_and_the_switch_name_the_same_variable() -> None:
    """build_config.py (stdlib only, read before install) and the import shim agree on the switch's name."""
    assert build_config.PURE_PYTHON_ENV == pure_python.PURE_PYTHON_ENV


def test_the_switch_loads_only_sources_of_extensions_inside_the_tree(tmp_path: Path) -> None:
    """No list: a module of ours with an extension beside it loads from its source; anything else is left alone."""
    finder = pure_python._SourceFinder()
    assert finder.find_spec("schemas", None) is None  # top-level: never built
    assert finder.find_spec("json.decoder", [str(Path(json.__file__).parent)]) is None  # not ours
    for name in build_config.built():
        spec = finder.find_spec(name, [str(build_config.source_of(name).parent)])
        assert spec is not None and spec.origin == str(build_config.source_of(name)), name
