"""`gpufold replay --until TIME`: the state as it was at an event time, from the command log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold.cli import main

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "commands.jsonl"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "log.sqlite"
    main(["log", "append", "--create", "--log", str(path), str(EXAMPLE)])  # the example has one bad line on purpose
    assert main(["run", "--log", str(path)]) == 0
    return path


def _replay(log: Path, until: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["replay", "--log", str(log), "--until", until, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_until_time_stops_before_the_first_later_command(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A time replays exactly the commands issued up to it; the end of time replays everything."""
    early = _replay(log, "2026-01-05T09:00:00Z", capsys)
    everything = _replay(log, "2100-01-01T00:00:00+00:00", capsys)
    full = _replay(log, "999999", capsys)
    assert 0 < early["commands"] < everything["commands"]  # type: ignore[operator]
    assert everything["state_hash"] == full["state_hash"]
    assert early["until"] == 1767603600000


def test_until_time_equals_until_the_matching_offset(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stopping at a time gives the same state as stopping at the offset of the last command before it."""
    by_time = _replay(log, "2026-01-05T09:01:00Z", capsys)
    by_offset = _replay(log, str(int(by_time["commands"]) - 1), capsys)  # type: ignore[call-overload]
    assert by_time["state_hash"] == by_offset["state_hash"]


@pytest.mark.parametrize("bad", ["yesterday", "2026-01-05T09:00:00", "-3"])
def test_bad_until_is_a_clear_error(bad: str, log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A value that is neither an offset nor a zoned ISO time is refused with exit status 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--log", str(log), "--until", bad])
    assert exit_info.value.code == 2
    assert "--until" in capsys.readouterr().err
