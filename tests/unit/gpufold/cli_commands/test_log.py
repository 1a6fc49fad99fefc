"""The local-log journey through the CLI: append JSON lines, run, events, state, replay, export/import."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gpufold.cli import main
from gpufold.jsonl import ParsedCommand, read_commands
from gpufold.replay import replay_partition
from logs.embedded import EmbeddedLog
from logs.port import InputRecord
from processor.core.snapshot import state_hash
from tests.contract.log_contract import GARBAGE

EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "commands.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    return json.loads(out)


@pytest.fixture
def log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A log with the README example appended and folded."""
    path = str(tmp_path / "lab.sqlite")
    run(capsys, "log", "append", "--create", "--log", path, str(EXAMPLES))
    assert run(capsys, "run", "--log", path, "--no-progress")[0] == 0
    return path


def test_append_reports_the_bad_line_and_appends_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """log append skips the malformed line with its number and reason, appends the others, exits 1."""
    path = str(tmp_path / "lab.sqlite")
    code, out, err = run(capsys, "log", "append", "--create", "--log", path, str(EXAMPLES))
    assert code == 1
    assert "commands.jsonl line 14: not JSON" in err
    assert "appended 11 command(s)" in out and "partition 0 offsets 0-10" in out
    assert "skipped 1 bad line(s)" in out
    with EmbeddedLog(path) as log:
        assert log.end_offset(log.topics.commands, 0) == 11


def test_strict_append_appends_nothing_when_a_line_is_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --strict, one bad line means no command is appended (no log is even created) and the exit status is 2."""
    path = str(tmp_path / "lab.sqlite")
    code, _, err = run(capsys, "log", "append", "--create", "--log", path, "--strict", str(EXAMPLES))
    assert code == 2 and "nothing appended (--strict)" in err
    assert not Path(path).exists()


def test_append_reads_standard_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """log append - reads the JSON lines from stdin."""
    line = '{"command_id": "x", "cluster": "lab", "issued_at": 0, "payload": {"SetPolicy": {"policy": "spread"}}}\n'
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO((line * 2).encode())))
    code, out, _ = run(capsys, "log", "append", "--create", "--log", str(tmp_path / "l.sqlite"), "-")
    assert code == 0 and "appended 2 command(s)" in out


def test_run_folds_once_then_has_nothing_to_do(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A second run finds every command processed and publishes nothing."""
    code, out, _ = run(capsys, "run", "--log", log, "--no-progress")
    assert code == 0 and "nothing to fold" in out
    info = run_json(capsys, "log", "info", "--log", log)
    assert info["partitions"][0] == {
        "partition": 0,
        "commands": 11,
        "committed": 11,
        "lag": 0,
        "events": 18,
        "snapshots": 0,
        "dead_letters": 0,
        "wrong_partition": 0,
    }


def test_run_summary_counts_the_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run --json reports commands folded, events, dead letters and throughput."""
    path = str(tmp_path / "lab.sqlite")
    run(capsys, "log", "append", "--create", "--log", path, str(EXAMPLES))
    with EmbeddedLog(path) as raw:
        raw.append_commands([(b"lab", GARBAGE)])
    summary = run_json(capsys, "run", "--log", path, "--no-progress")
    assert (summary["commands"], summary["events"], summary["dead_letters"], summary["lag"]) == (12, 18, 1, 0)
    code, out, _ = run(capsys, "events", "--log", path, "--dead-letters")
    assert code == 0 and "gpufold.commands[0]@11" in out and "bad magic" not in out


def test_events_text_shows_the_story(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """events lists scheduling, queueing, the rejection, the reservation, the release and the drain in offset order."""
    code, out, _ = run(capsys, "events", "--log", log)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 18
    assert lines[1].startswith("0:1  2026-01-05T09:00:00.000Z  lab  lab-001  NodeAdded  a100-1 8xA100")
    assert "PodQueued  train-2: GPU_MODEL_MISMATCH x2, INSUFFICIENT_GPU x1" in out
    assert "CommandRejected  SubmitPod INVALID_RESOURCES: memory_mib" in out
    assert "PodScheduled  train-2 -> a100-1 gpus 0:1000,1:1000,2:1000,3:1000 (best-fit from queue)" in out
    assert "PodEvicted  infer-1 from t4-1: drain" in out
    # train-2 headed the queue for 5 minutes of event time: its node was reserved, then released when it started.
    assert "2026-01-05T09:06:03.000Z  lab  lab-010  NodesReserved  pod 'train-2' has waited 300 s" in out
    assert "ReservationReleased  released the 1 node(s) held for pod 'train-2': its holder started" in out


def test_events_json_from_and_limit(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """events --json --from 4 --limit 2 prints two event envelopes with the payload as {"Type": {...}}."""
    code, out, _ = run(capsys, "events", "--log", log, "--json", "--from", "4", "--limit", "2")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [e["offset"] for e in events] == [4, 5]
    assert events[0]["payload"]["PodScheduled"]["pod"]["pod_id"] == "train-1"
    assert events[0]["command_id"] == "lab-004" and events[0]["sequence"] == 4


def test_events_filter_by_type(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """events --type CommandRejected shows only the rejection."""
    code, out, _ = run(capsys, "events", "--log", log, "--type", "CommandRejected")
    assert code == 0 and len(out.splitlines()) == 1 and "lab-009" in out


def test_state_views(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """state shows nodes, pods and GPU utilization per model as the example leaves them."""
    summary = run_json(capsys, "state", "--log", log)
    assert summary["clusters"][0] | {} == {
        "cluster": "lab",
        "policy": "best-fit",
        "nodes": 3,
        "nodes_cordoned": 1,
        "nodes_failed": 0,
        "pods_running": 2,
        "pods_queued": 1,
        "gangs_running": 0,
        "gangs_waiting": 0,
        "gpu_milli_capacity": 14_000,
        "gpu_milli_allocated": 4_250,
        "gpu_utilization_pct": 30.36,
    }
    nodes = {n["node_id"]: n for n in run_json(capsys, "state", "--log", log, "nodes")}
    assert nodes["t4-1"]["status"] == "cordoned" and nodes["a100-1"]["gpu_milli_allocated"] == 4_000
    pods = {p["pod_id"]: p for p in run_json(capsys, "state", "--log", log, "pods")}
    assert pods["infer-1"]["status"] == "pending" and pods["notebook-1"]["node_id"] == "v100-1"
    assert "train-1" not in pods and "bad-1" not in pods
    utilization = {u["gpu_model"]: u["utilization_pct"] for u in run_json(capsys, "state", "--log", log, "utilization")}
    assert utilization == {"A100": 50.0, "T4": 0.0, "V100M32": 6.25}
    code, out, _ = run(capsys, "state", "--log", log, "utilization")
    assert code == 0 and out.splitlines()[0].split() == [
        "CLUSTER",
        "GPU",
        "MODEL",
        "NODES",
        "GPUS",
        "GPUS",
        "USED",
        "GPUS",
        "USABLE",
        "UTIL",
    ]


def test_state_before_run_says_what_is_pending(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """state on a log nobody ran shows an empty state and points at gpufold run."""
    path = str(tmp_path / "lab.sqlite")
    run(capsys, "log", "append", "--create", "--log", path, str(EXAMPLES))
    code, out, err = run(capsys, "state", "--log", path)
    assert code == 0 and "no clusters yet" in out and "11 command(s) not folded yet" in err


def test_replay_matches_the_processor_and_leaves_the_log_alone(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """replay re-derives the processor's state_hash and events (--check) without writing to the log."""
    before = Path(log).read_bytes()
    replayed = run_json(capsys, "replay", "--log", log, "--check")
    assert replayed["state_hash"] == run_json(capsys, "state", "--log", log)["state_hash"]
    assert (replayed["commands"], replayed["events"]) == (11, 18)
    assert replayed["check"] == [{"partition": 0, "ok": True, "compared": 18, "problem": None}]
    assert Path(log).read_bytes() == before


def test_replay_until_an_offset(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """replay --until 6 folds offsets 0..6 only and prints that state's hash."""
    with EXAMPLES.open(encoding="utf-8") as lines:
        first = [c for c in read_commands(lines) if isinstance(c, ParsedCommand)][:7]
    expected = replay_partition(0, [InputRecord(0, i, c.key, c.frame()) for i, c in enumerate(first)])
    replayed = run_json(capsys, "replay", "--log", log, "--until", "6")
    assert replayed["commands"] == 7 and replayed["state_hash"] == state_hash(expected.state)
    code, out, _ = run(capsys, "replay", "--log", log, "--until", "6")
    assert code == 0 and "up to offset 6" in out and f"state_hash {state_hash(expected.state)}" in out


def test_replay_check_detects_a_tampered_event(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """replay --check exits 1 when a published event differs from the derived one (checksum and all)."""
    import sqlite3

    from logs.embedded import record_crc

    crc = record_crc("gpufold.events", 0, 5, 4, b"lab", b"\x00")
    with sqlite3.connect(log) as db:
        db.execute(f"UPDATE records SET value = X'00', crc = {crc} WHERE topic = 'gpufold.events' AND \"offset\" = 5")
    code, out, _ = run(capsys, "replay", "--log", log, "--check")
    assert code == 1 and "MISMATCH: event 5 (offset 5) differs" in out


def test_a_damaged_event_is_reported_not_compared(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An event changed behind the log's back fails its checksum: one line naming it, exit 2."""
    import sqlite3

    with sqlite3.connect(log) as db:
        db.execute("UPDATE records SET value = X'00' WHERE topic = 'gpufold.events' AND \"offset\" = 5")
    code, _out, err = run(capsys, "replay", "--log", log, "--check")
    assert code == 2 and "gpufold.events[0]@5 fails its checksum" in err and "Traceback" not in err


def test_export_import_then_replay_gives_the_same_hash(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log exported and imported elsewhere replays to the same state_hash."""
    code, out, _ = run(capsys, "log", "export", "--log", log, str(tmp_path / "export"))
    assert code == 0 and "commands: 11 record(s)" in out
    copy = str(tmp_path / "copy.sqlite")
    code, out, _ = run(capsys, "log", "import", "--log", copy, str(tmp_path / "export"), "--topics", "commands")
    assert code == 0 and "gpufold run --log" in out
    assert (
        run_json(capsys, "replay", "--log", copy)["state_hash"]
        == run_json(capsys, "replay", "--log", log)["state_hash"]
    )


def test_default_log_path_and_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --log the log is $GPUFOLD_LOG, else ./gpufold.log.sqlite; --help says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUFOLD_LOG", raising=False)
    run(capsys, "log", "append", "--create", str(EXAMPLES))
    assert (tmp_path / "gpufold.log.sqlite").exists()
    monkeypatch.setenv("GPUFOLD_LOG", str(tmp_path / "env.sqlite"))
    run(capsys, "log", "append", "--create", str(EXAMPLES))
    assert (tmp_path / "env.sqlite").exists()
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "gpufold.log.sqlite" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["state", "--log", "{missing}"], "no log at"),
        (["replay", "--log", "{missing}"], "no log at"),
        (["events", "--log", "{log}", "--partition", "3"], "--partition 3 is outside 0..0"),
        (["log", "append", "--log", "{log}", "{missing}"], "cannot read"),
        (["log", "append", "--log", "{log}", "--partitions", "4", "{examples}"], "has 1 command partition(s), not 4"),
        (["log", "import", "--log", "{log}", "{missing}"], "does not exist"),
    ],
)
def test_user_errors_are_one_line_with_status_2(
    argv: list[str], message: str, log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mistakes (missing log, bad partition, unreadable file) print one clear line and exit 2."""
    values = {"missing": str(tmp_path / "nope"), "log": log, "examples": str(EXAMPLES)}
    code, _out, err = run(capsys, *[arg.format(**values) for arg in argv])
    assert code == 2 and message in err and err.startswith("gpufold: error:") and err.count("\n") == 1


def test_state_counts_gangs_that_hold_no_pod_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A running gang and two waiting ones (too big; waiting for a dependency): the summary counts them,
    where it used to say 0 queued."""
    path = str(tmp_path / "gangs.sqlite")
    member = {"num_gpu": 8, "gpu_milli": 1000, "cpu_milli": 1, "memory_mib": 1}
    node = {"node_id": "n1", "gpu_model": "A100", "gpu_count": 8, "cpu_milli": 64_000, "memory_mib": 65_536}
    payloads = [
        {"AddNode": node},
        {"SubmitGang": {"gang_id": "a", "members": [{"pod_id": "a0", **member}]}},
        {"SubmitGang": {"gang_id": "b", "members": [{"pod_id": "b0", **member}]}},
        {"SubmitGang": {"gang_id": "c", "members": [{"pod_id": "c0", **member}], "depends_on": ["b"]}},
    ]
    source = tmp_path / "gangs.jsonl"
    source.write_text(
        "".join(
            json.dumps({"command_id": f"c{i}", "cluster": "lab", "issued_at": 1_767_225_600_000 + i, "payload": p})
            + "\n"
            for i, p in enumerate(payloads)
        )
    )
    assert run(capsys, "log", "append", "--create", "--log", path, str(source))[0] == 0
    assert run(capsys, "run", "--log", path)[0] == 0
    (cluster,) = run_json(capsys, "state", "--log", path)["clusters"]
    assert (cluster["pods_running"], cluster["gangs_running"], cluster["gangs_waiting"]) == (1, 1, 2)
    code, out, _ = run(capsys, "state", "--log", path)
    assert code == 0 and "GANGS RUN/WAIT" in out and " 1/2 " in out
