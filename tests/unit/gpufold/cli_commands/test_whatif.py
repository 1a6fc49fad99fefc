"""``gpufold what-if`` and ``gpufold explain`` on the embedded log (a replica built in the CLI process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold.cli import main

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture()
def log(tmp_path: Path) -> str:
    path = str(tmp_path / "log.sqlite")
    main(["log", "append", "--create", "--log", path, str(REPO / "examples" / "commands.jsonl")])
    return path


def test_what_if_prints_the_events_and_changes_nothing(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Uncordoning the drained T4 node would place the queued T4 pod there; the log is untouched."""
    asked = tmp_path / "ask.jsonl"
    asked.write_text(
        '{"command_id": "wi-1", "cluster": "lab", "issued_at": 1767607300000, '
        '"payload": {"UncordonNode": {"node_id": "t4-1"}}}\n'
    )
    capsys.readouterr()
    assert main(["what-if", "--log", log, str(asked), "--json"]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [next(iter(e["payload"])) for e in record["events"]]
    assert kinds == ["NodeUncordoned", "PodScheduled"] and record["offset"] == 11
    assert record["events"][1]["payload"]["PodScheduled"]["pod"]["pod_id"] == "infer-1"
    assert main(["log", "info", "--log", log, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partitions"][0]["commands"] == 11


def test_explain_says_why_and_what_would_help(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The queued T4 pod: wrong model everywhere else, its node cordoned; uncordoning it would help."""
    capsys.readouterr()
    assert main(["explain", "--log", log, "--cluster", "lab", "infer-1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"] == "pending"
    assert [r["code"] for r in data["reasons"]] == ["GPU_MODEL_MISMATCH", "NODE_UNSCHEDULABLE"]
    assert any(r["change"] == "uncordon" and r["node_ids"] == ["t4-1"] for r in data["would_fit_if"])
    assert main(["explain", "--log", log, "--cluster", "lab", "ghost"]) == 1
