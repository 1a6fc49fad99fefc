"""The write API refuses abuse cheaply and says what happened: status codes by outcome, idempotent retries,
unknown clusters, the body guard (token, size, type, JSON), start-up checks, and waits that starve nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufold.cli import CliError
from gpufold.server.body_guard import BodyGuard, content_type_problem
from gpufold.server.cli import api_token, is_loopback
from gpufold.server.outcomes import final_outcome, write_status
from logs.embedded import EmbeddedLog
from schemas.events import CommandRejected
from tests.unit.gpufold.server.test_app import NODES, Server, line

GPUFOLD = str(Path(sys.executable).with_name("gpufold"))


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "log.sqlite")
    yield running
    running.close()


def commands_in(path: Path) -> int:
    with EmbeddedLog(path, readonly=True) as log:
        return sum(log.end_offset(log.topics.commands, p) for p in range(log.partitions))


def pod(
    pod_id: str, num_gpu: int = 1, milli: int = 1000, command_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    body = {"pod_id": pod_id, "num_gpu": num_gpu, "gpu_milli": milli, **extra}
    envelope = {} if command_id is None else {"command_id": command_id}
    return {"cluster": "lab", **envelope, "payload": {"SubmitPod": body}}


def with_nodes(server: Server) -> None:
    assert server.post("/v1/commands?wait=10&create_cluster=true", NODES).status_code == 200


# ------------------------------------------------------------------ status codes and outcomes


def test_a_refusal_is_409_with_its_command_rejected(server: Server) -> None:
    """A command the fold refuses for the state it met answers 409 with the CommandRejected event and its code."""
    with_nodes(server)
    again = server.post("/v1/commands?wait=10", {**NODES[0], "command_id": "n1-again"})
    assert again.status_code == 409, again.text
    (outcome,) = again.json()["outcomes"]
    assert outcome["kind"] == "CommandRejected" and outcome["accepted"] is False
    assert outcome["code"] == "DUPLICATE_NODE" and "a100-1" in outcome["message"]
    assert next(iter(outcome["events"][0]["payload"])) == "CommandRejected"
    accepted = server.post("/v1/commands?wait=10", pod("p1"))
    assert accepted.status_code == 200 and accepted.json()["outcomes"][0]["accepted"] is True


def test_status_of_outcomes() -> None:
    """200 all accepted; 409 a refusal for the state; 422 only malformed refusals; 202 while one is missing."""
    conflict = CommandRejected("c", "AddNode", "DUPLICATE_NODE", "")
    malformed = CommandRejected("c", "SubmitPod", "INVALID_RESOURCES", "")
    assert write_status([None, None], True) == 200
    assert write_status([None, conflict], True) == 409
    assert write_status([malformed, conflict], True) == 409
    assert write_status([malformed], True) == 422
    assert write_status([None], False) == 202


def test_outcome_is_named_by_what_happened_to_the_command(server: Server) -> None:
    """A SubmitPod that preempts begins with the victim's PodPreempted: its outcome is still PodScheduled, over
    ?wait and in what-if; a DrainNode ends with evictions but is NodeDrained."""
    with_nodes(server)
    low = pod("low", num_gpu=8, priority=0, gpu_models=["A100"])
    assert server.post("/v1/commands?wait=10", low).json()["outcomes"][0]["kind"] == "PodScheduled"
    high = pod("high", num_gpu=8, priority=10, gpu_models=["A100"])
    asked = server.post("/v1/what-if", high).json()["results"][0]
    assert next(iter(asked["events"][0]["payload"])) == "PodPreempted" and asked["outcome"] == "PodScheduled"
    done = server.post("/v1/commands?wait=10", high).json()["outcomes"][0]
    assert done["kind"] == "PodScheduled" and next(iter(done["events"][0]["payload"])) == "PodPreempted"
    drained = server.post("/v1/clusters/lab/nodes/a100-1/drain?wait=10").json()["outcomes"][0]
    assert drained["kind"] == "NodeDrained"
    events = [next(iter(e["payload"])) for e in drained["events"]]
    assert final_outcome("DrainNode", "a100-1", []) == "none" and "PodEvicted" in events


# ------------------------------------------------------------------ idempotent retries


def test_a_retry_returns_the_original_outcome_and_appends_nothing(server: Server) -> None:
    """The same command_id and body again: the first outcome (same offset), marked a retry; no second command."""
    with_nodes(server)
    body = pod("p1", command_id="sub-1")
    first = server.post("/v1/commands?wait=10", body)
    assert first.status_code == 200
    appended = commands_in(server.path)
    for query in ("?wait=10", ""):  # with or without wait, the outcome is known
        again = server.post(f"/v1/commands{query}", body)
        assert again.status_code == 200, again.text
        assert again.json()["commands"][0]["retry"] is True
        assert again.json()["outcomes"][0]["command_offset"] == first.json()["outcomes"][0]["command_offset"]
        assert again.json()["outcomes"][0]["kind"] == "PodScheduled"
    typed = server.post("/v1/clusters/lab/pods?wait=10", {"pod_id": "p1", "num_gpu": 1, "command_id": "sub-1"})
    assert typed.status_code == 200 and typed.json()["commands"][0]["retry"] is True
    assert commands_in(server.path) == appended


def test_a_retried_refusal_is_the_original_refusal(server: Server) -> None:
    """A refused command retried answers its own refusal again (409 DUPLICATE_NODE), not DUPLICATE_COMMAND."""
    with_nodes(server)
    body = {**NODES[0], "command_id": "dup-node"}
    assert server.post("/v1/commands?wait=10", body).status_code == 409
    again = server.post("/v1/commands?wait=10", body)
    assert again.status_code == 409 and again.json()["outcomes"][0]["code"] == "DUPLICATE_NODE"


def test_the_same_id_with_another_body_is_a_conflict(server: Server) -> None:
    """Only a different body under a known id is refused: 409 COMMAND_ID_CONFLICT, nothing appended."""
    with_nodes(server)
    assert server.post("/v1/commands?wait=10", pod("p1", command_id="sub-1")).status_code == 200
    appended = commands_in(server.path)
    other = server.post("/v1/commands?wait=10", pod("p2", command_id="sub-1"))
    assert other.status_code == 409 and other.json()["code"] == "COMMAND_ID_CONFLICT"
    in_batch = server.post("/v1/commands", [pod("p3", command_id="x"), pod("p4", command_id="x")])
    assert in_batch.status_code == 409 and in_batch.json()["index"] == 1
    assert commands_in(server.path) == appended


def test_a_retry_before_the_fold_saw_it_is_not_appended_twice(tmp_path: Path) -> None:
    """With the processor stopped, a retry of an appended command is recognised (the server's own ledger):
    one command in the log, and the retry's outcome comes once the fold runs."""
    running = Server(tmp_path / "log.sqlite", processor=False)
    try:
        assert running.post("/v1/commands?create_cluster=true", NODES[0]).status_code == 202
        assert running.post("/v1/commands", NODES[0]).json()["commands"][0]["retry"] is True
        assert commands_in(running.path) == 1
    finally:
        running.close()


# ------------------------------------------------------------------ unknown clusters


def test_a_typo_in_the_cluster_is_404_not_a_new_cluster(server: Server) -> None:
    """A command for a cluster no AddNode created is 404 UNKNOWN_CLUSTER (nothing appended) unless
    ?create_cluster=true; a known cluster needs no flag."""
    with_nodes(server)
    appended = commands_in(server.path)
    typo = server.post("/v1/commands?wait=10", {**pod("p1"), "cluster": "Lab"})
    assert typo.status_code == 404 and typo.json()["code"] == "UNKNOWN_CLUSTER"
    assert typo.json()["clusters"] == ["Lab"] and "create_cluster=true" in typo.json()["detail"]
    assert server.post("/v1/clusters/Lab/pods", {"pod_id": "p1", "num_gpu": 1}).status_code == 404
    assert commands_in(server.path) == appended
    assert [c["cluster"] for c in server.get("/v1/clusters")["clusters"]] == ["lab"]
    node = {**NODES[0]["payload"]["AddNode"]}
    created = server.post("/v1/clusters/new/nodes?wait=10&create_cluster=true", node)
    assert created.status_code == 200 and created.json()["outcomes"][0]["kind"] == "NodeAdded"
    assert server.post("/v1/clusters/new/pods?wait=10", {"pod_id": "p1", "num_gpu": 1}).status_code == 200


# ------------------------------------------------------------------ the body guard


class Receiver:
    """An ASGI receive() that sends a body in chunks and counts how many were asked for."""

    def __init__(self, chunks: int, size: int) -> None:
        self.left = chunks
        self.size = size
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        self.left -= 1
        return {"type": "http.request", "body": b"x" * self.size, "more_body": self.left > 0}


def guarded(token: str | None = "s3cret", max_body: int = 1 << 20) -> tuple[BodyGuard, list[Any]]:
    reached: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    return BodyGuard(app, token=token, protected=lambda m, p: p != "/v1/what-if", max_body=max_body), reached


def call(guard: BodyGuard, headers: list[tuple[bytes, bytes]], receive: Receiver, path: str = "/v1/commands") -> int:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(guard(scope, receive, send))
    return int(sent[0]["status"]) if sent else 0


def test_the_token_is_checked_before_the_body_is_read() -> None:
    """No token, a wrong one or another scheme: 401 and not one chunk of a 30 MB body read."""
    guard, reached = guarded()
    for headers in ([], [(b"authorization", b"Bearer nope")], [(b"authorization", b"Basic s3cret")]):
        receive = Receiver(chunks=30, size=1 << 20)
        assert call(guard, [(b"content-type", b"application/json"), *headers], receive) == 401
        assert receive.calls == 0
    assert not reached
    receive = Receiver(chunks=1, size=10)
    status = call(guard, [(b"content-type", b"application/json")], receive, path="/v1/what-if")
    assert status == 400 and receive.calls == 1  # open route: read, then refused as not JSON


def test_the_body_limit_holds_while_reading() -> None:
    """A declared length over the limit is 413 unread; a chunked body is cut at the first chunk past it."""
    guard, reached = guarded(token=None, max_body=1 << 20)
    receive = Receiver(chunks=30, size=1 << 20)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(30 << 20).encode())]
    assert call(guard, headers, receive) == 413 and receive.calls == 0
    receive = Receiver(chunks=30, size=300_000)
    assert call(guard, [(b"content-type", b"application/json")], receive) == 413
    assert receive.calls == 4  # 1.2 MB read, not 9 MB
    assert not reached


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (b"application/json", True),
        (b"application/json; charset=utf-8", True),
        (b"Application/JSON;charset=UTF-8", True),
        (b"application/json\xc2\xa0", False),
        (b"application/x-www-form-urlencoded", False),
        (b"text/plain", False),
        (b"application/json; charset=latin-1", False),
        (b"application/problem+json", False),
        (None, False),
    ],
)
def test_content_type_is_parsed_strictly(value: bytes | None, ok: bool) -> None:
    """Only application/json (with charset=utf-8 at most) is a JSON body."""
    assert (content_type_problem(value) is None) is ok


def test_http_refusals_are_short_and_typed(server: Server) -> None:
    """A form body (curl -d) is 415 with a hint, not a 422 echoing it; a non-breaking space after the type is
    415; a bad value in a typed route is a short 422."""
    with_nodes(server)
    form = server.client.post("/v1/clusters/lab/pods", content=b"pod_id=" + b"x" * 900_000,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert form.status_code == 415 and "--json" in form.json()["detail"] and len(form.content) < 500
    nbsp = server.client.post("/v1/commands", content=json.dumps(pod("p1")).encode(),
                              headers={"Content-Type": "application/json\xa0".encode("latin-1")})  # fmt: skip
    assert nbsp.status_code == 415
    wrong = server.post("/v1/clusters/lab/pods", {"pod_id": "p1", "num_gpu": "x" * 900_000})
    assert wrong.status_code == 422 and len(wrong.content) < 2_000
    big = server.client.post("/v1/commands", content=b"[" + b" " * (2 << 20) + b"]",
                             headers={"Content-Type": "application/json"})  # fmt: skip
    assert big.status_code == 413 and big.json()["code"] == "BODY_TOO_LARGE"


def test_openapi_has_the_bearer_scheme_and_every_status_code(tmp_path: Path) -> None:
    """Writes declare the bearer scheme and 200/202/400/401/404/409/413/415/422/503; /docs is local."""
    running = Server(tmp_path / "log.sqlite", token="s3cret", processor=False)
    try:
        schema = running.client.get("/openapi.json").json()
        scheme = schema["components"]["securitySchemes"]["bearer"]
        assert (scheme["type"], scheme["scheme"]) == ("http", "bearer") and "GPUFOLD_API_TOKEN" in scheme["description"]
        for path in ("/v1/commands", "/v1/clusters/{cluster}/pods", "/v1/clusters/{cluster}/nodes/{node_id}/drain"):
            operation = schema["paths"][path]["post"]
            assert operation["security"] == [{"bearer": []}], path
            assert {"200", "202", "400", "401", "404", "409", "413", "415", "422", "503"} <= set(operation["responses"])
        assert "security" not in schema["paths"]["/v1/what-if"]["post"]
        assert {"413", "415", "422"} <= set(schema["paths"]["/v1/what-if"]["post"]["responses"])
        page = running.client.get("/docs").text
        script = running.client.get("/dashboard/docs.js").text
        assert "/dashboard/docs.js" in page and "openapi.json" in script
        assert "http://" not in page + script and "https://" not in page + script
        assert running.client.get("/redoc", follow_redirects=False).headers["location"] == "/docs"
    finally:
        running.close()


# ------------------------------------------------------------------ start-up


def test_an_empty_token_is_an_error_never_no_auth() -> None:
    """GPUFOLD_API_TOKEN="" (or blank, or padded) refuses to start; unset means no token."""
    assert api_token({}) is None
    assert api_token({"GPUFOLD_API_TOKEN": "s3cret"}) == "s3cret"
    for bad in ("", "  ", " s3cret"):
        with pytest.raises(CliError):
            api_token({"GPUFOLD_API_TOKEN": bad})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.org")


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--host", "0.0.0.0"], {}, "refusing to open writes on 0.0.0.0 without a token"),
        ([], {"GPUFOLD_API_TOKEN": ""}, "GPUFOLD_API_TOKEN is set but empty"),
        (["--max-body-bytes", "0"], {}, "--max-body-bytes must be >= 1"),
    ],
)
def test_serve_refuses_unsafe_start_ups(tmp_path: Path, args: list[str], env: dict[str, str], says: str) -> None:
    """Writes on a public address without a token, an empty token and nonsense limits stop serve at start."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUFOLD_")}
    result = subprocess.run(
        [GPUFOLD, "serve", "--create", "--log", str(tmp_path / "l.sqlite"), "--port", "1", *args],
        capture_output=True, text=True, timeout=60, env={**environ, **env},
    )  # fmt: skip
    assert result.returncode != 0 and says in result.stderr, result.stderr
    help_text = subprocess.run([GPUFOLD, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "GPUFOLD_API_TOKEN" in help_text and "Bearer" in help_text


# ------------------------------------------------------------------ waits starve nothing


def test_waiting_writes_never_starve_reads_or_healthz(tmp_path: Path) -> None:
    """60 writes waiting 5 s for outcomes that never come (no processor) hold no thread: /healthz and a read
    answer at once meanwhile, and each write answers 202 with its outcome null when its wait ends."""
    from tests.browser.test_dashboard import LiveServer

    path = tmp_path / "log.sqlite"
    with EmbeddedLog(path) as log:
        log.append_commands([])
    live = LiveServer(path)
    try:
        base = live.url.rstrip("/")
        with httpx.Client(base_url=base, timeout=30) as client:
            node = NODES[0]["payload"]["AddNode"]
            assert client.post("/v1/clusters/lab/nodes?create_cluster=true", json=node).status_code == 202
        answers: list[int] = []

        def write(i: int) -> None:
            with httpx.Client(base_url=base, timeout=30) as client:
                answers.append(client.post("/v1/commands?wait=5", json=line(f"w{i}", {"Tick": {}})).status_code)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(60)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        with httpx.Client(base_url=base, timeout=30) as client:
            for route in ("/healthz", "/v1/pods", "/v1/clusters"):
                started = time.monotonic()
                client.get(route)
                assert time.monotonic() - started < 1.0, route
        for thread in threads:
            thread.join(30)
        assert answers == [202] * 60
    finally:
        live.close()
