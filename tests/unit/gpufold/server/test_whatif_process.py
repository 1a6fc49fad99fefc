"""What-if in a forked process: the same answer as the in-process fork, a time and an output budget, and the
replica keeps folding and answering while it runs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufold.server import whatif_process
from gpufold.server.app import create_app
from gpufold.server.commands_json import commands_from_body
from gpufold.server.whatif_process import Budget, BudgetExceeded
from gpufold.server.writers import EmbeddedWriter
from logs.embedded_replica import EmbeddedReplicaSource
from processor.runtime.replica import Replica
from tests.unit.gpufold.server.test_app import NODES, line


@pytest.fixture()
def replica(tmp_path: Path) -> Iterator[tuple[Replica, EmbeddedWriter]]:
    writer = EmbeddedWriter(tmp_path / "log.sqlite")
    commands = commands_from_body(NODES)
    writer.append(commands)
    live = Replica(EmbeddedReplicaSource(tmp_path / "log.sqlite")).start()
    assert live.restored.wait(30)
    live.catch_up()
    yield live, writer
    live.stop()
    writer.close()


def asked() -> list[Any]:
    return commands_from_body(
        [line(f"w{i}", {"SubmitPod": {"pod_id": f"w{i}", "num_gpu": 1, "gpu_milli": 500}}, t=10 + i) for i in range(5)]
    )


def test_the_forked_answer_equals_the_in_process_one(replica: tuple[Replica, EmbeddedWriter]) -> None:
    """Frames, offsets, outcomes and the hashes after: byte for byte the in-process fork's; the live state is
    untouched."""
    live, _ = replica
    before = live.state_hashes()
    forked = json.loads(whatif_process.run(live, asked(), Budget(), frames=True, hashes=True))
    local = whatif_process.render(live.what_if(asked(), hashes=True), frames=True)
    assert forked == json.loads(json.dumps(local))
    assert [r["outcome"] for r in forked["results"]] == ["PodScheduled"] * 5
    assert live.state_hashes() == before


def test_budgets_stop_the_child_and_answer_413(replica: tuple[Replica, EmbeddedWriter]) -> None:
    """An answer over the output budget, or a what-if past the time budget, is BudgetExceeded; the child is gone."""
    live, _ = replica
    with pytest.raises(BudgetExceeded, match="larger than its budget of 200 bytes"):
        whatif_process.run(live, asked(), Budget(max_bytes=200), frames=True, hashes=False)
    client = TestClient(create_app(replica=live, what_if_budget=Budget(max_bytes=200)))
    answer = client.post("/v1/what-if", json=NODES)
    assert answer.status_code == 413 and answer.json()["code"] == "WHAT_IF_BUDGET"


def test_a_slow_what_if_blocks_neither_reads_nor_folding(
    replica: tuple[Replica, EmbeddedWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A what-if whose fold takes 30 s (in the child) is killed at its 1 s budget; meanwhile the replica answers
    reads at once and folds a new command."""
    live, writer = replica
    slow = Replica.fold_here

    def sleepy(self: Replica, commands: Any, *, hashes: bool = False) -> Any:
        time.sleep(30)  # only ever in the child: the parent's replica is not asked to fold here
        return slow(self, commands, hashes=hashes)

    monkeypatch.setattr(Replica, "fold_here", sleepy)
    client = TestClient(create_app(replica=live, what_if_budget=Budget(seconds=1.0)))
    result: dict[str, Any] = {}

    def ask() -> None:
        started = time.monotonic()
        response = client.post("/v1/what-if", json=line("w", {"Tick": {}}))
        result.update(status=response.status_code, body=response.json(), seconds=time.monotonic() - started)

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert client.get("/v1/pods").status_code == 200
    assert time.monotonic() - started < 0.5
    offset = live.position()["offsets"]["0"]
    writer.append(commands_from_body(line("t1", {"Tick": {}}, t=99)))
    deadline = time.monotonic() + 5
    while live.position()["offsets"]["0"] == offset:
        assert time.monotonic() < deadline, "the replica did not fold during the what-if"
        time.sleep(0.02)
    thread.join(10)
    assert result["status"] == 413 and result["body"]["code"] == "WHAT_IF_BUDGET"
    assert "longer than its budget of 1 s" in result["body"]["detail"] and result["seconds"] < 3
