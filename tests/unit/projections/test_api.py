"""The query API over a SQLite projection: answers, validation (4xx with a message), and nothing written."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import StaticPool

from projections import models
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import content_hashes
from schemas.commands import AddNode, Command, Release, SubmitPod
from tests import workload

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from projections.api import create_app

T0 = workload.START_MS
HOSTILE = [
    ("/v1/pending", {"cluster": "c1' OR '1'='1"}, 422),
    ("/v1/pending", {"cluster": "c1; DROP TABLE pods; --"}, 422),
    ("/v1/pending", {"cluster": "x" * 300}, 422),
    ("/v1/pending", {"cluster": "c1", "limit": "99999999999999999999999"}, 422),
    ("/v1/pending", {"cluster": "c1", "limit": "-1"}, 422),
    ("/v1/pending", {"cluster": "c1", "limit": "1e3"}, 422),
    ("/v1/pending", {"cluster": "c1", "offset": "abc"}, 422),
    ("/v1/pending", {}, 422),
    ("/v1/utilization", {"by": "model; DELETE FROM nodes"}, 422),
    ("/v1/utilization", {"by": "node"}, 400),
    ("/v1/usage", {"start": "10", "end": "5"}, 400),
    ("/v1/usage", {"start": "0", "end": "9" * 40}, 422),
    ("/v1/usage", {"start": "yesterday", "end": "5"}, 422),
    ("/v1/usage", {"start": "0", "end": "5", "granularity": "week"}, 422),
    ("/v1/usage", {"start": "0", "end": "5", "tenant": "a\tb"}, 422),
    ("/v1/usage/top", {"start": "0", "end": "5", "limit": "0"}, 422),
    ("/v1/utilization/history", {"cluster": "c1", "start": "0", "end": str(T0), "step_ms": "60000"}, 400),
    ("/v1/utilization/history", {"cluster": "c1", "start": "0", "end": "1", "step_ms": "1"}, 422),
    ("/v1/fragmentation", {"cluster": ""}, 422),
    ("/v1/commands/%27OR%271%27%3D%271", {}, 404),
    ("/v1/commands/a%20b", {}, 422),
    ("/v1/clusters/c1/pods/nope/history", {}, 404),
    ("/v1/clusters/c1/pods/a%20b/history", {}, 422),
]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    models.Base.metadata.create_all(eng)
    events = workload.fold(
        [
            Command("a1", "c1", T0, AddNode("n1", 8_000, 65_536, "A10", 2)),
            Command("a2", "c1", T0 + 60_000, SubmitPod("p1", "acme", 0, 2, 1000, 1000, 1024)),
            Command("a3", "c1", T0 + 120_000, SubmitPod("p2", "globex", 5, 1, 500, 1000, 1024, preemption="never")),
            Command("a4", "c1", T0 + 180_000, Release("nope")),
            Command("a5", "c1", T0 + 3_600_000, Release("p1")),
        ]
    )
    Projector(eng, "events").project([Envelope.of(e, i) for i, e in enumerate(events)])
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return TestClient(create_app(engine))


def test_answers(client: TestClient) -> None:
    """Each endpoint answers the projected scenario correctly."""
    utilization = client.get("/v1/utilization", params={"by": "model"}).json()
    assert utilization == [
        {"cluster": "c1", "gpu_model": "A10", "nodes": 1, "allocated_gpus": 0.5, "capacity_gpus": 2.0,
         "utilization": 0.25, "pods_running": 1}
    ]  # fmt: skip
    pending = client.get("/v1/pending", params={"cluster": "c1"}).json()
    assert pending["total"] == 0
    rejected = client.get("/v1/commands/a4").json()
    assert (rejected["outcome"], rejected["code"]) == ("rejected", "UNKNOWN_POD")
    history = client.get("/v1/clusters/c1/pods/p1/history").json()
    assert [e["type"] for e in history["events"]] == ["PodScheduled", "PodReleased"]
    assert [e["command_id"] for e in history["events"]] == ["a2", "a5"]
    top = client.get("/v1/usage/top", params={"start": 0, "end": T0 + 86_400_000}).json()
    assert top[0] == {"rank": 1, "tenant": "acme", "gpu_hours": round(2 * 59 / 60, 6)}
    assert client.get("/v1/fragmentation", params={"cluster": "c1"}).json()["idle_gpus"] == 1.5
    assert "gpufold_gpus_total" in client.get("/metrics").text
    assert client.get("/openapi.json").json()["info"]["title"] == "gpufold projections"


@pytest.mark.parametrize(("path", "params", "status"), HOSTILE)
def test_hostile_parameters_get_a_4xx_and_change_nothing(
    client: TestClient, engine: Engine, path: str, params: dict, status: int
) -> None:
    """SQL metacharacters, huge numbers and wrong types are refused with a message; the tables are untouched."""
    with engine.connect() as conn:
        before = content_hashes(conn)
    response = client.get(path, params=params)
    assert response.status_code == status
    assert response.json()["detail"]
    with engine.connect() as conn:
        assert content_hashes(conn) == before
