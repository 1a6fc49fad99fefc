"""The short 422 on every route: whatever parameter or body field a route types, a hostile value of 30 KB is
refused with a short answer that never echoes it (FastAPI's default sends every bad value back whole)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from gpufold.server.app import create_app
from gpufold.server.writers import EmbeddedWriter
from logs.embedded_replica import EmbeddedReplicaSource
from processor.runtime.replica import Replica
from projections.schema import ensure_schema

HOSTILE = "9" * 15_000 + "x" * 15_000  # neither a number nor an id (30 KB: under the client's URL limit)
SHORT = 2_000


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    engine = create_engine(f"sqlite:///{tmp_path / 'projection.sqlite'}")
    ensure_schema(engine)
    writer = EmbeddedWriter(tmp_path / "log.sqlite")
    replica = Replica(EmbeddedReplicaSource(tmp_path / "log.sqlite")).start()
    assert replica.restored.wait(30)
    try:
        yield TestClient(create_app(database=engine, replica=replica, writer=writer))
    finally:
        replica.stop()
        writer.close()
        engine.dispose()


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in sorted(schema["paths"].items()):
        for method, operation in sorted(methods.items()):
            yield path, method, operation


def body_fields(schema: dict[str, Any], operation: dict[str, Any]) -> list[str]:
    """The typed JSON body's fields (a model of the OpenAPI components), else none."""
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = content.get("schema", {}).get("$ref")
    if ref is None:
        return []
    model = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return sorted(model.get("properties", {}))


def test_every_route_answers_a_hostile_value_with_a_short_422(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    checked: list[str] = []
    for path, method, operation in operations(schema):
        params = operation.get("parameters", [])
        typed = [p for p in params if p["in"] in ("query", "path")]
        fields = body_fields(schema, operation)
        for param in typed:
            url = path
            query: dict[str, str] = {}
            for other in typed:
                if other["in"] == "path":
                    url = url.replace("{" + other["name"] + "}", HOSTILE if other is param else "lab")
            if param["in"] == "query":
                query[param["name"]] = HOSTILE
            kwargs: dict[str, Any] = {"params": query}
            if method == "post":
                kwargs["json"] = {}
            answer = client.request(method.upper(), url, **kwargs)
            name = f"{method.upper()} {path} {param['name']}"
            assert answer.status_code == 422, (name, answer.status_code)
            assert len(answer.content) < SHORT and HOSTILE[:1000] not in answer.text, name
            assert param["name"] in answer.text, name  # it says which parameter
            checked.append(name)
        for field in fields:
            answer = client.request(method.upper(), path.replace("{cluster}", "lab").replace("{node_id}", "n1")
                                    .replace("{pod_id}", "p1"), json={field: [HOSTILE]})  # fmt: skip
            name = f"{method.upper()} {path} body.{field}"
            assert answer.status_code == 422, (name, answer.status_code, answer.text[:200])
            assert len(answer.content) < SHORT and HOSTILE[:1000] not in answer.text, name
            checked.append(name)
    assert len(checked) > 100, checked  # every parameter of every route (137 today), and the typed bodies' fields
