"""Every `gpufold` command and subcommand prints its help without crashing."""

from __future__ import annotations

import argparse

import pytest

from gpufold.cli import build_parser, main


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths.extend(_command_paths(sub, (*prefix, name)))
    return paths


PATHS = _command_paths(build_parser())


def test_every_documented_top_level_command_exists() -> None:
    """The commands the README names are all registered."""
    top = {path[0] for path in PATHS if path}
    expected = {"demo", "simulate", "log", "run", "events", "state", "replay", "topics", "processor", "publish"}
    assert expected | {"projector", "query", "serve", "projections"} <= top


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "gpufold")
def test_help_prints(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """`gpufold ... --help` exits 0 and prints a usage line."""
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    assert "usage: gpufold" in capsys.readouterr().out


def test_building_the_parser_leaves_the_read_side_unimported() -> None:
    """`gpufold processor run` (and every other command) starts without importing SQLAlchemy or the projector.

    The parser is built before any handler runs; a fenced processor's successor pays for every import here.
    """
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from gpufold.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy' or m == 'projections.projector'))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
