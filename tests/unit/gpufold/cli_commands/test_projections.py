"""The projection CLI on the embedded log and SQLite: project, query, rebuild, and no password leaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold.cli import main
from logs.embedded import EmbeddedLog
from projections.runner import project_embedded_log
from tests import workload


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log") / "gpufold.log"
    events = workload.fold(workload.commands(800, nodes=8, seed=5, step_ms=30_000))
    with EmbeddedLog(path) as log_:
        log_.append("gpufold.events", [(0, b"c1", frame) for frame in workload.encode(events)])
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_project_query_and_rebuild(tmp_path: Path, log_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`projector run` projects the embedded log; queries answer in JSON; `projections rebuild` proves it equal."""
    url = f"sqlite:///{tmp_path / 'read.sqlite'}"
    code, stats, _ = run(capsys, "projector", "run", "--embedded-log", str(log_path), "--database-url", url,
                         "--stop-when-idle", "--create")  # fmt: skip
    assert code == 0 and stats["events"] > 800
    code, again, _ = run(capsys, "projector", "run", "--embedded-log", str(log_path), "--database-url", url,
                         "--stop-when-idle")  # fmt: skip
    assert code == 0 and again["events"] == 0
    code, pending, _ = run(capsys, "query", "pending", "--cluster", "c1", "--limit", "3", "--database-url", url)
    assert code == 0 and [p["position"] for p in pending["pods"]] == list(range(1, len(pending["pods"]) + 1))
    code, utilization, _ = run(capsys, "query", "utilization", "--by", "model", "--database-url", url)
    assert code == 0 and {row["gpu_model"] for row in utilization} == set(workload.MODELS)
    code, outcome, _ = run(capsys, "query", "command", "--command-id", "c1-cmd-1", "--database-url", url)
    assert code == 0 and outcome["outcome"] == "accepted" and outcome["events"][0]["type"] == "NodeAdded"
    code, usage, _ = run(capsys, "query", "usage", "--start", "2026-01-01T00:00:00Z", "--end", "2026-01-02",
                         "--granularity", "day", "--database-url", url)  # fmt: skip
    assert code == 0 and usage and all(row["gpu_hours"] > 0 for row in usage)
    code, report, _ = run(capsys, "projections", "rebuild", "--embedded-log", str(log_path), "--database-url", url)
    assert code == 0 and report["equal"] is True
    assert all(table["equal"] for table in report["tables"].values())


def test_bad_query_parameters_exit_2_with_a_message(
    tmp_path: Path, log_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad parameter is refused with one clear line and exit status 2."""
    url = f"sqlite:///{tmp_path / 'read.sqlite'}"
    project_embedded_log(log_path, url)
    code, _, err = run(capsys, "query", "pending", "--cluster", "c1 OR 1=1", "--database-url", url)
    assert code == 2 and "cluster must be 1-253 printable characters" in err
    code, _, err = run(capsys, "query", "usage", "--start", "10", "--end", "5", "--database-url", url)
    assert code == 2 and "end (5) must be after start (10)" in err
    code, _, err = run(capsys, "query", "pod", "--cluster", "c1", "--pod", "nope", "--database-url", url)
    assert code == 1 and "not known" in err


def test_passwords_never_appear_in_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """An unreachable database is reported without the password of its URL."""
    url = "postgresql+psycopg://gpufold:s3cr3t-Pa55@127.0.0.1:1/gpufold?connect_timeout=2"
    code, _, err = run(capsys, "query", "status", "--database-url", url)
    assert code == 2 and "database error" in err
    assert "s3cr3t-Pa55" not in err


def test_project_embedded_log_is_resumable(tmp_path: Path, log_path: Path) -> None:
    """The demo entry point projects the whole log once; a second call finds nothing new."""
    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    first = project_embedded_log(log_path, url)
    second = project_embedded_log(log_path, url)
    assert first.events > 800 and second.events == 0


def test_projection_updates_the_prometheus_metrics(tmp_path: Path, log_path: Path) -> None:
    """Projecting counts events, batches and commit latency in the projector's Prometheus metrics."""
    from prometheus_client import REGISTRY

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    before = (sample("gpufold_projector_events_total"), sample("gpufold_projector_batches_total"),
              sample("gpufold_projector_commit_seconds_count"))  # fmt: skip
    stats = project_embedded_log(log_path, f"sqlite:///{tmp_path / 'metrics.sqlite'}", batch_size=300)
    assert sample("gpufold_projector_events_total") - before[0] == stats.events
    assert sample("gpufold_projector_batches_total") - before[1] == stats.batches > 1
    assert sample("gpufold_projector_commit_seconds_count") - before[2] == stats.batches


def test_query_disruption_budgets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`query disruption-budgets` answers each budget and the evictions it blocks, as the API does."""
    from tests.unit.projections.test_handlers_budgets import events_by_step

    steps = events_by_step()
    events = [event for _, step in steps[: [n for n, _ in steps].index("drain") + 1] for event in step]
    path = tmp_path / "budgets.log"
    with EmbeddedLog(path) as log_:
        log_.append("gpufold.events", [(0, b"lab", frame) for frame in workload.encode(events)])
    url = f"sqlite:///{tmp_path / 'read.sqlite'}"
    code, _, _ = run(capsys, "projector", "run", "--embedded-log", str(path), "--database-url", url,
                     "--stop-when-idle", "--create")  # fmt: skip
    assert code == 0
    code, answer, _ = run(capsys, "query", "disruption-budgets", "--cluster", "lab", "--database-url", url)
    assert code == 0
    assert {b["budget_id"]: [e["pod_id"] for e in b["blocked_evictions"]] for b in answer["budgets"]} == {
        "b-t": ["p1", "p2"],
        "b-zone": [],
    }
