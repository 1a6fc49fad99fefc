"""Issue 12, classes 6 and 7: typos create nothing; filters, text, help and the API say clearly what is wrong.

Every mistake is one line and a non-zero exit, and leaves no file behind; text output never passes
a control character to the terminal; every command and option explains itself; the HTTP API answers
HEAD, keeps 422s short and says 404 for a cluster it has never seen.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select

from gpufold.cli import build_parser, main
from logs.embedded import EmbeddedLog
from projections import models
from projections.api import create_app
from projections.runner import project_embedded_log
from schemas.commands import AddNode, Command, MarkNodeFailed, Release, SubmitPod, Tick
from schemas.events import CommandRejected, Event
from schemas.fastcodec import encode_command, encode_event
from tests import workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "commands.jsonl"
ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> bool:
    return err.startswith("gpufold: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.fixture
def folded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    path = str(tmp_path / "lab.sqlite")
    run(capsys, "log", "append", "--create", "--log", path, str(EXAMPLES))
    assert run(capsys, "run", "--log", path, "--no-progress")[0] == 0
    return path


# ---------------------------------------------------------------- 6. typos create nothing


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--log", "{typo}", "--no-progress"],
        ["state", "--log", "{typo}"],
        ["replay", "--log", "{typo}"],
        ["events", "--log", "{typo}"],
        ["log", "info", "--log", "{typo}"],
        ["log", "export", "--log", "{typo}", "{dir}"],
        ["log", "append", "--log", "{typo}", "{examples}"],
        ["log", "append", "--create", "--log", "{typo}", "{missing_input}"],
        ["query", "status", "--database-url", "sqlite:///{typo}"],
        ["query", "pending", "--cluster", "lab", "--database-url", "sqlite:///{typo}"],
        ["serve", "--database-url", "sqlite:///{typo}"],
        ["projections", "rebuild", "--embedded-log", "{log}", "--database-url", "sqlite:///{typo}"],
        ["projector", "run", "--embedded-log", "{log}", "--database-url", "sqlite:///{typo}", "--stop-when-idle"],
        ["projector", "run", "--embedded-log", "{typo}", "--database-url", "sqlite:///{db}", "--create"],
    ],
    ids=lambda argv: " ".join(a for a in argv if not a.startswith("{") and not a.startswith("sqlite")),
)
def test_a_mistyped_path_is_one_line_and_creates_nothing(
    argv: list[str], folded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that does not exist is an error; no log, database or export appears because of it."""
    values = {
        "typo": str(tmp_path / "typo.sqlite"),
        "dir": str(tmp_path / "out"),
        "examples": str(EXAMPLES),
        "missing_input": str(tmp_path / "missing.jsonl"),
        "log": folded,
        "db": str(tmp_path / "new.sqlite"),
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run(capsys, *[arg.format(**values) for arg in argv])
    assert code == 2 and one_line(err), err
    assert any(word in err for word in ("no log at", "no database at", "cannot read", "--create")), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_append_creates_a_log_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--create makes the log and says so; the next append to it needs no flag."""
    path = str(tmp_path / "new.sqlite")
    code, out, _ = run(capsys, "log", "append", "--create", "--log", path, str(EXAMPLES))
    assert code == 1 and f"created a new log at {path}" in out
    code, out, _ = run(capsys, "log", "append", "--log", path, str(EXAMPLES))
    assert "created" not in out and "appended 11 command(s)" in out


def test_a_file_that_is_no_projection_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """query on an empty or foreign SQLite file says so (it used to answer 'no such table')."""
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE other (x)").connection.close()
    code, _, err = run(capsys, "query", "status", "--database-url", f"sqlite:///{empty}")
    assert code == 2 and one_line(err) and "holds no projection tables" in err


# ---------------------------------------------------------------- 7. filters, text, help


def test_events_names_an_unknown_type_and_an_unknown_cluster(folded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--type Bogus lists the types; a cluster never seen says so with exit 1; a known one with no match exit 0."""
    code, _, err = run(capsys, "events", "--log", folded, "--type", "Bogus")
    assert code == 2 and one_line(err) and "unknown event type Bogus" in err and "PodScheduled" in err
    code, out, err = run(capsys, "events", "--log", folded, "--cluster", "nowhere")
    assert code == 1 and out == "" and "no events of cluster 'nowhere'" in err and "clusters: lab" in err
    code, out, err = run(capsys, "events", "--log", folded, "--cluster", "lab", "--type", "NodeFailed")
    assert code == 0 and out == "" and "no events match" in err


@pytest.mark.parametrize("view", ["summary", "nodes", "pods", "utilization"])
def test_state_names_an_unknown_cluster(folded: str, view: str, capsys: pytest.CaptureFixture[str]) -> None:
    """state --cluster with a typo says so (it printed "no clusters yet" or an empty table, exit 0)."""
    code, out, err = run(capsys, "state", view, "--log", folded, "--cluster", "nowhere")
    assert code == 2 and out == "" and one_line(err) and "no cluster 'nowhere'" in err and "clusters: lab" in err
    code, out, _ = run(capsys, "state", view, "--log", folded, "--cluster", "lab")
    assert code == 0 and out


def test_text_output_escapes_control_characters_and_prints_any_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ESC, BEL, CR and a bidi override from a reason reach the terminal escaped; a time past 9999 prints."""
    path = tmp_path / "evil.sqlite"
    evil = "done\x1b]0;pwned\x07\x1b[2J\r\u202efake"
    commands = [
        Command("a", "lab", 1, AddNode("n1", 1000, 1024, "A100", 1)),
        Command("b", "lab", 2, SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=1)),
        Command("c", "lab", 3, Release("p1", evil)),
        Command("d", "lab", 4, MarkNodeFailed("n1", evil)),
    ]
    with EmbeddedLog(path) as log:
        log.append_commands([(b"lab", encode_command(c)) for c in commands])
    assert run(capsys, "run", "--log", str(path), "--no-progress")[0] == 0
    with EmbeddedLog(path) as log:  # an event of an old log, from before issued_at had a bound
        late = Event(0, 99, "lab", "x", 9, (1 << 62), CommandRejected("x", "Release", "UNKNOWN_POD", "m\x1b[31m"))
        log.append(log.topics.events, [(0, b"lab", encode_event(late))])
    code, out, err = run(capsys, "events", "--log", str(path))
    assert code == 0 and "Traceback" not in err
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out
    assert "done\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\u202efake" in out
    assert f"{1 << 62} ms" in out


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for name, sub in action.choices.items():
            found.extend(_leaves(sub, (*path, name)))
    return found or [(path, parser)]


LEAVES = _leaves(build_parser())


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_and_option_explains_itself(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    """Each command has a description and each of its options a help text (projector run and serve had none)."""
    assert parser.description, f"gpufold {' '.join(path)} has no description"
    missing = [
        action.option_strings[0] if action.option_strings else action.dest
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert not missing, f"gpufold {' '.join(path)}: no help for {missing}"


# ---------------------------------------------------------------- 7. the HTTP API


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    folder = tmp_path_factory.mktemp("api")
    log = folder / "log.sqlite"
    with EmbeddedLog(log) as opened:
        events = workload.fold(workload.commands(200, nodes=5, seed=3))
        opened.append(opened.topics.events, [(0, b"c1", frame) for frame in workload.encode(events)])
    url = f"sqlite:///{folder / 'read.sqlite'}"
    project_embedded_log(log, url)
    return TestClient(create_app(url))


GET_ROUTES = [
    "/healthz",
    "/v1/utilization",
    "/v1/status",
    "/v1/pending?cluster=c1",
    "/v1/fragmentation?cluster=c1",
    "/v1/utilization/history?cluster=c1&start=0&end=3600000",
    "/v1/usage?start=0&end=3600000",
    "/metrics",
]


@pytest.mark.parametrize("route", GET_ROUTES)
def test_head_answers_like_get_without_a_body(client: TestClient, route: str) -> None:
    """HEAD on a GET route is 200 with the GET's headers and no body (it was 405)."""
    got, head = client.get(route), client.head(route)
    assert got.status_code == head.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]


def test_a_422_never_echoes_a_large_input(client: TestClient) -> None:
    """A 60 KB bad parameter gets a short 422 naming it, not the 60 KB back."""
    response = client.get("/v1/pending", params={"cluster": "x" * 60_000})
    assert response.status_code == 422 and len(response.content) < 1_000
    assert response.json()["detail"][0]["loc"] == ["query", "cluster"]


@pytest.mark.parametrize(
    "route",
    [
        "/v1/fragmentation?cluster=nowhere",
        "/v1/utilization/history?cluster=nowhere&start=0&end=3600000",
        "/v1/pending?cluster=nowhere",
    ],
)
def test_an_unknown_cluster_is_404_not_zeros(client: TestClient, route: str) -> None:
    """A cluster the projection never saw is 404 with a message (it was 200 with zeros)."""
    response = client.get(route)
    assert response.status_code == 404 and "nowhere" in response.json()["detail"]


# ---------------------------------------------------------------- SIGTERM


def test_the_projector_honours_sigterm_within_seconds(tmp_path: Path) -> None:
    """A projector busy with a big log and a far-future watermark exits cleanly within 5 s of SIGTERM."""
    log = tmp_path / "big.sqlite"
    commands = list(workload.commands(20_000, nodes=40, seed=9, step_ms=1_000))
    commands.insert(3_000, Command("far", "c1", 4_102_444_000_000, Tick(force=True)))  # Dec 2099, on purpose
    with EmbeddedLog(log) as opened:
        opened.append(opened.topics.events, [(0, b"c1", f) for f in workload.encode(workload.fold(commands))])
    database = tmp_path / "read.sqlite"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpufold", "projector", "run", "--embedded-log", str(log),
         "--database-url", f"sqlite:///{database}", "--create", "--batch-size", "2000"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until it is projecting
            if database.exists() and _projected(database) > 0:
                break
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = process.communicate(timeout=15)
        assert time.monotonic() - sent < 5.0
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err.decode()
    stats = json.loads(out)
    assert 0 < stats["events"] == _projected(database)  # what it says it projected is what it committed


def _projected(database: Path) -> int:
    try:
        engine = create_engine(f"sqlite:///{database}")
        with engine.connect() as conn:
            offsets = conn.execute(select(models.projection_offsets.c.next_sequence)).scalars().all()
        engine.dispose()
        return sum(offsets)
    except Exception:  # not created yet
        return 0
