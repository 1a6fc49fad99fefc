"""The write API: ``POST /v1/commands`` (one command or a batch) and typed routes for the common commands.

Commands are checked like a JSON line and with the fold's stateless checks (422 with the
rejection code), then published through ``CommandPublisher`` on Kafka or appended to the embedded
log. ``?wait=SECONDS`` waits for and returns each command's outcome (the committed events).

Auth: when ``GPUFOLD_API_TOKEN`` is set, every write needs ``Authorization: Bearer <token>``
(compared in constant time with ``hmac.compare_digest``); reads and what-if stay open.
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, HTTPException, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gpufold.server.commands_json import (
    CommandError,
    command_from_json,
    commands_from_body,
    payload_model,
    payload_types,
)
from gpufold.server.replica_routes import ID_PATTERN, event_json
from gpufold.server.writers import CommandWriter, WriteError, outcome_json

MAX_BATCH = 10_000
Wait = Annotated[float | None, Query(gt=0, le=60, description="wait up to this many seconds for each outcome")]
PathId = Annotated[str, Path(min_length=1, max_length=253, pattern=ID_PATTERN)]

# (path, payload type, fields taken from the path, summary)
TYPED_ROUTES = (
    ("/v1/clusters/{cluster}/nodes", "AddNode", (), "add a node"),
    ("/v1/clusters/{cluster}/pods", "SubmitPod", (), "submit a pod"),
    ("/v1/clusters/{cluster}/gangs", "SubmitGang", (), "submit a gang (all pods or none)"),
    ("/v1/clusters/{cluster}/pods/{pod_id}/release", "Release", ("pod_id",), "release a pod (finished or cancelled)"),
    ("/v1/clusters/{cluster}/gangs/{gang_id}/release", "ReleaseGang", ("gang_id",), "release a gang"),
    ("/v1/clusters/{cluster}/nodes/{node_id}/cordon", "CordonNode", ("node_id",), "cordon a node"),
    ("/v1/clusters/{cluster}/nodes/{node_id}/uncordon", "UncordonNode", ("node_id",), "uncordon a node"),
    ("/v1/clusters/{cluster}/nodes/{node_id}/drain", "DrainNode", ("node_id",), "drain a node (evict, re-place)"),
)


def bearer_guard(token: str | None) -> Callable[..., None]:
    """A dependency that requires ``Authorization: Bearer <token>`` when a token is configured."""
    expected = token.encode() if token else None

    def guard(authorization: Annotated[str | None, Header()] = None) -> None:
        if expected is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        # compare_digest takes the same time wherever the strings differ (and for a wrong length).
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise HTTPException(401, "a valid bearer token is required to write", {"WWW-Authenticate": "Bearer"})

    return guard


def add_write_routes(app: FastAPI, writer: CommandWriter, token: str | None) -> None:
    guard = [Depends(bearer_guard(token))]

    def submit(commands: list[Any], wait: float | None) -> Any:
        try:
            placed, outcomes = writer.write(commands, wait)
        except WriteError as error:
            return JSONResponse(status_code=503, content={"detail": str(error)})
        body: dict[str, Any] = {
            "backend": writer.backend,
            "commands": [
                {"command_id": p.command_id, "cluster": p.cluster, "partition": p.partition, "offset": p.offset}
                for p in placed
            ],
        }
        if wait is None:
            return JSONResponse(status_code=202, content=body)
        body["outcomes"] = [outcome_json(o, event_json) for o in outcomes]
        body["complete"] = all(o is not None for o in outcomes)
        return body

    @app.post(
        "/v1/commands",
        summary="publish one command or a batch (JSON-lines format); returns the command ids",
        description='The body is one command, a list, or {"commands": [...]}, each as a line of the JSON-lines '
        "format (command_id and issued_at may be left out: the server fills them in). All are checked first: "
        "one bad command refuses the whole batch with 422 and the fold's rejection code. 202 without wait; with "
        "?wait=SECONDS, 200 and each command's outcome (null if it did not come in time).",
        dependencies=guard,
    )
    def post_commands(body: Annotated[Any, Body()], wait: Wait = None) -> Any:
        try:
            commands = commands_from_body(body)
        except CommandError as error:
            return JSONResponse(status_code=422, content=error.as_json())
        if len(commands) > MAX_BATCH:
            return JSONResponse(status_code=413, content={"detail": f"at most {MAX_BATCH} commands per request"})
        return submit(commands, wait)

    known = set(payload_types())
    for path, type_name, from_path, summary in TYPED_ROUTES:
        if type_name in known:  # gang routes appear once the contract has the commands
            _typed_route(app, path, type_name, from_path, summary, guard, submit)


def _typed_route(
    app: FastAPI,
    path: str,
    type_name: str,
    from_path: tuple[str, ...],
    summary: str,
    guard: list[Any],
    submit: Callable[[list[Any], float | None], Any],
) -> None:
    model = payload_model(type_name, exclude=from_path)
    required = any(f.is_required() for f in model.model_fields.values())

    def handler(cluster: str, body: BaseModel | None, wait: float | None, path_values: dict[str, str]) -> Any:
        data = body.model_dump() if body is not None else {}
        if type_name == "SubmitPod" and body is not None and "gpu_milli" not in body.model_fields_set:
            data["gpu_milli"] = 1000 if data.get("num_gpu") else 0  # as CommandPublisher.submit_pod
        envelope = {"command_id": data.pop("command_id", None), "issued_at": data.pop("issued_at", None)}
        command = {"cluster": cluster, **envelope, "payload": {type_name: {**data, **path_values}}}
        try:
            parsed = command_from_json(command)
        except CommandError as error:
            return JSONResponse(status_code=422, content=error.as_json())
        return submit([parsed], wait)

    # The signature is built, not written: the body's model is made at run time from the contract.
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter("cluster", keyword, annotation=PathId)]
    for name in from_path:
        parameters.append(inspect.Parameter(name, keyword, annotation=PathId))
    if required:
        parameters.append(inspect.Parameter("body", keyword, annotation=Annotated[model, Body()]))
    else:
        parameters.append(inspect.Parameter("body", keyword, annotation=Annotated[model | None, Body()], default=None))
    parameters.append(inspect.Parameter("wait", keyword, annotation=Wait, default=None))

    def endpoint(**values: Any) -> Any:
        path_values = {name: values[name] for name in from_path}
        return handler(values["cluster"], values.get("body"), values.get("wait"), path_values)

    endpoint.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    app.add_api_route(
        path,
        endpoint,
        methods=["POST"],
        summary=f"{summary} ({type_name})",
        dependencies=guard,
        name=f"post_{type_name}",
    )
