"""`gpufold demo`: the trace replayed in event time on the embedded log, summarised from the events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold import trace
from gpufold.cli import main
from gpufold.demo import run_demo, trace_commands
from schemas.commands import Release, SubmitPod


def test_commands_follow_event_time_with_submission_before_release() -> None:
    """Nodes come first; then commands are in time order and no pod is released before it is submitted."""
    nodes = trace.load_nodes()[:3]
    pods = trace.load_pods()[:200]
    commands = trace_commands(nodes, pods)
    assert [c.type_name for c in commands[:3]] == ["AddNode"] * 3
    times = [c.issued_at for c in commands[3:]]
    assert times == sorted(times)
    submitted: set[str] = set()
    for command in commands[3:]:
        if isinstance(command.payload, SubmitPod):
            submitted.add(command.payload.pod_id)
        elif isinstance(command.payload, Release):
            assert command.payload.pod_id in submitted


def test_demo_is_deterministic_and_consistent(tmp_path: Path) -> None:
    """Two runs give the same state hash, every pod is accounted for, and nothing is rejected."""
    first = run_demo(tmp_path / "a.sqlite", limit_pods=400, progress=False, pressure_policies=())
    second = run_demo(tmp_path / "b.sqlite", limit_pods=400, progress=False, pressure_policies=())
    assert first.state_hash == second.state_hash
    assert first.pods_submitted == 400
    assert first.pods_scheduled + first.pods_pending_at_end <= 400
    assert not first.rejections
    assert first.events >= first.commands
    assert first.projected_events == first.events
    assert first.utilization  # sampled over event time
    assert {row["gpu_model"] for row in first.utilization_by_model} >= {"G2", "T4"}


def test_demo_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints one JSON summary including the pressure experiment for the asked policy."""
    log = tmp_path / "demo.sqlite"
    argv = ["demo", "--log", str(log), "--limit-pods", "300", "--no-progress", "--json", "--pressure", "first-fit"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pods_submitted"] == 300
    assert summary["gpus"] == 6212
    assert [row["policy"] for row in summary["pressure_experiment"]] == ["first-fit"]
    assert 0 <= summary["pressure_experiment"][0]["unallocated_gpu_pct_at_100"] <= 100
    assert log.exists()
