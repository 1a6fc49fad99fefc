"""The write API: ``POST /v1/commands`` (one command or a batch) and typed routes for the common commands.

Commands are checked like a JSON line and with the fold's stateless checks (422 with the rejection
code), then published through ``CommandPublisher`` on Kafka or appended to the embedded log.

- ``?wait=SECONDS``: wait for each command's outcome (the committed events): 200 when all were
  accepted, 409 with the ``CommandRejected`` when one was refused (422 if for a malformed command,
  ``gpufold.server.outcomes``), 202 if an outcome did not come in time. Waiting holds no thread, and
  appends run on their own few threads, so writes never starve reads or ``/healthz``.
- **Idempotent retry**: a ``command_id`` the log already holds is not appended again: the answer is
  its original outcome; the same id with a different body (cluster or payload) is 409
  ``COMMAND_ID_CONFLICT``.
- A command for a cluster the replica does not know is 404 ``UNKNOWN_CLUSTER`` unless the request says
  ``?create_cluster=true`` (a typo would otherwise start a second, empty cluster).

Auth (``GPUFOLD_API_TOKEN``) and the body limit are checked before the body is read
(``gpufold.server.body_guard``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Annotated, Any

import anyio
from fastapi import Body, FastAPI, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gpufold.server.commands_json import (
    CommandError,
    command_from_json,
    commands_from_body,
    payload_model,
    payload_types,
)
from gpufold.server.openapi import WRITE_RESPONSES, secured
from gpufold.server.outcomes import event_json, final_outcome, rejection, subject_of, write_status
from gpufold.server.replica_routes import ID_PATTERN
from gpufold.server.writers import CommandWriter, Outcome, Placed, WriteError
from processor.runtime.ledger import CommandLedger, Entry
from processor.runtime.replica import Replica
from schemas.codes import RejectionCode
from schemas.commands import Command

MAX_BATCH = 10_000
WRITE_THREADS = 4  # appends at once; the rest wait without holding a thread
Wait = Annotated[float | None, Query(gt=0, le=60, description="wait up to this many seconds for each outcome")]
CreateCluster = Annotated[
    bool, Query(description="allow commands for a cluster that does not exist yet (its first AddNode)")
]
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


def write_paths() -> list[str]:
    """The routes that write (the body guard asks for the token on these)."""
    return ["/v1/commands", *(path for path, *_ in TYPED_ROUTES)]


def _error(status: int, detail: str, code: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail, "code": code, **extra})


class WriteService:
    """Idempotency, cluster checks, appends and outcomes for the write routes (see the module docstring)."""

    def __init__(
        self, writer: CommandWriter, replica: Replica | None, warning: Callable[[], str | None] = lambda: None
    ) -> None:
        self.writer = writer
        self.replica = replica
        self.warning = warning
        self._appended = CommandLedger()  # appended by this server, maybe not folded yet
        self._created: set[str] = set()  # clusters this server was asked to create
        self._lock = threading.Lock()  # one check-then-append at a time: a retry racing its original waits
        self._limiter = anyio.CapacityLimiter(WRITE_THREADS)

    def _digest(self, command: Command) -> bytes:
        from processor.runtime.ledger import command_digest
        from schemas import COMMAND, registry

        if self.replica is not None:
            return self.replica.digest(command)
        encode = registry().codec(COMMAND).encode
        return command_digest(command, lambda c: encode(c.to_avro()))

    def _known(self, command_id: str) -> Entry | None:
        found = self.replica.ledger.get(command_id) if self.replica is not None else None
        return found if found is not None else self._appended.get(command_id)

    async def unknown_clusters(self, commands: list[Command]) -> list[str]:
        """Clusters of the commands the replica does not know (after letting it catch up a moment)."""
        if self.replica is None:
            return []
        replica = self.replica
        names = sorted({c.cluster for c in commands} - self._created)
        for _ in range(20):  # up to ~1 s for a replica that is behind the head
            unknown = [name for name in names if not replica.knows_cluster(name)]
            if not unknown or not replica.status().get("lag"):
                return unknown
            await asyncio.sleep(0.05)
        return unknown

    def _append(self, commands: list[Command], create: bool) -> list[tuple[Placed, bool]] | JSONResponse:
        """Under the lock: refuse a reused id with another body, skip known ids, append the rest."""
        with self._lock:
            digests = [self._digest(c) for c in commands]
            fresh: list[Command] = []
            plan: list[tuple[Command, Entry | None]] = []
            seen: dict[str, bytes] = {}
            for index, (command, digest) in enumerate(zip(commands, digests, strict=True)):
                known = self._known(command.command_id)
                first = seen.get(command.command_id)
                if (known is not None and known.digest != digest) or (first is not None and first != digest):
                    return _error(
                        409,
                        f"command_id {command.command_id!r} was already used for another command (cluster or "
                        "payload differ); a retry must repeat the command unchanged, a new command needs a new id",
                        "COMMAND_ID_CONFLICT",
                        index=index,
                    )
                seen[command.command_id] = digest
                plan.append((command, known))
                if known is None and first is None:
                    fresh.append(command)
            self.writer.prepare()
            placed = {p.command_id: p for p in self.writer.append(fresh)} if fresh else {}
            for command, digest in zip(commands, digests, strict=True):
                if command.command_id in placed:
                    p = placed[command.command_id]
                    self._appended.record(command.command_id, Entry(p.partition, p.offset, digest))
            if create:
                self._created.update(c.cluster for c in fresh)
            out: list[tuple[Placed, bool]] = []
            for command, known in plan:
                if command.command_id in placed and known is None:
                    out.append((placed[command.command_id], False))
                    continue
                entry = known or self._known(command.command_id)
                assert entry is not None
                out.append((Placed(command.command_id, command.cluster, entry.partition, entry.offset), True))
            return out

    async def submit(self, commands: list[Command], wait: float | None, create_cluster: bool) -> JSONResponse:
        if self.replica is not None and not self.replica.restored.is_set():
            return JSONResponse(
                status_code=503,
                content={"detail": "the replica is still restoring the state; retry shortly", "code": "NOT_READY"},
                headers={"Retry-After": "2"},
            )
        if not create_cluster:
            unknown = await self.unknown_clusters(commands)
            if unknown:
                return _error(
                    404,
                    f"no cluster {unknown[0]!r} (GET /v1/clusters lists them); to create a new cluster, add "
                    "?create_cluster=true to the request that adds its first node",
                    "UNKNOWN_CLUSTER",
                    clusters=unknown,
                )
        try:
            appended = await anyio.to_thread.run_sync(self._append, commands, create_cluster, limiter=self._limiter)
        except WriteError as error:
            return _error(503, str(error), "LOG_UNAVAILABLE")
        if isinstance(appended, JSONResponse):
            return appended
        retried = any(again for _, again in appended)
        outcomes: list[Outcome | None] = [None] * len(appended)
        if wait is not None or retried:
            outcomes = await self._outcomes(appended, wait or 0.0)
        body: dict[str, Any] = {
            "backend": self.writer.backend,
            "commands": [
                {
                    "command_id": p.command_id,
                    "cluster": p.cluster,
                    "partition": p.partition,
                    "offset": p.offset,
                    **({"retry": True} if again else {}),
                }
                for p, again in appended
            ],
        }
        warning = self.warning()
        if warning:
            body["warning"] = warning
        if wait is None and not retried:
            return JSONResponse(status_code=202, content=body)
        body["outcomes"] = [outcome_json(o, c) for o, c in zip(outcomes, commands, strict=True)]
        body["complete"] = all(o is not None for o in outcomes)
        status = write_status((rejection(o.events) if o is not None else None for o in outcomes), body["complete"])
        return JSONResponse(status_code=status, content=body)

    async def _outcomes(self, appended: list[tuple[Placed, bool]], wait: float) -> list[Outcome | None]:
        """Each command's outcome: a retried one's original (read now), a new one's awaited up to ``wait``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        results: list[Outcome | None] = [None] * len(appended)
        futures: dict[int, asyncio.Future[Outcome]] = {}
        for i, (placed, again) in enumerate(appended):
            if again:
                placed = await self._folded(placed, deadline)
                appended[i] = (placed, True)
                if placed.offset is not None:
                    results[i] = await anyio.to_thread.run_sync(
                        self.writer.outcome_at, placed.partition, placed.offset, limiter=self._limiter
                    )
            if results[i] is None and wait > 0 and (placed.offset is not None or not again):
                futures[i] = asyncio.wrap_future(self.writer.watch(placed))
        if futures:
            done, pending = await asyncio.wait(futures.values(), timeout=max(0.0, deadline - loop.time()))
            for future in pending:
                future.cancel()
            for i, future in futures.items():
                if future in done and not future.cancelled() and future.exception() is None:
                    results[i] = future.result()
        for i, outcome in enumerate(results):  # raced with another writer of the same id: the first one wins
            bounced = rejection(outcome.events) if outcome is not None else None
            if bounced is not None and bounced.code == RejectionCode.DUPLICATE_COMMAND:
                results[i] = await self._original(appended[i][0], outcome)
        return results

    async def _folded(self, placed: Placed, deadline: float) -> Placed:
        """A retried command's place with its offset: on Kafka the offset is known once the replica folded it."""
        loop = asyncio.get_running_loop()
        while placed.offset is None and self.replica is not None:
            entry = self.replica.ledger.get(placed.command_id)
            if entry is not None and entry.offset is not None:
                return Placed(placed.command_id, placed.cluster, entry.partition, entry.offset)
            if loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        return placed

    async def _original(self, placed: Placed, duplicate: Outcome | None) -> Outcome | None:
        entry = self.replica.ledger.get(placed.command_id) if self.replica is not None else None
        if entry is None or entry.offset is None or entry.offset == placed.offset:
            return duplicate
        found = await anyio.to_thread.run_sync(
            self.writer.outcome_at, entry.partition, entry.offset, limiter=self._limiter
        )
        return found or duplicate


def outcome_json(outcome: Outcome | None, command: Command) -> dict[str, Any] | None:
    """An outcome as JSON, named by what became of the command (``gpufold.server.outcomes``)."""
    if outcome is None:
        return None
    payload = command.payload
    kind = final_outcome(type(payload).__name__, subject_of(payload), outcome.events)
    refused = rejection(outcome.events)
    body: dict[str, Any] = {
        "command_id": outcome.command_id,
        "kind": kind,
        "accepted": refused is None,
        "partition": outcome.partition,
        "command_offset": outcome.command_offset,
        "events": [event_json(event) for event in outcome.events],
    }
    if refused is not None:
        body["code"] = refused.code
        body["message"] = refused.message
    return body


def add_write_routes(app: FastAPI, service: WriteService) -> None:
    @app.post(
        "/v1/commands",
        summary="publish one command or a batch (JSON-lines format); returns the command ids",
        description='The body is one command, a list, or {"commands": [...]}, each as a line of the JSON-lines '
        "format (command_id and issued_at may be left out: the server fills them in). All are checked first: "
        "one bad command refuses the whole batch with 422 and the fold's rejection code. 202 without wait; with "
        "?wait=SECONDS, 200 when every command was accepted, 409 with the CommandRejected event when one was "
        "refused (422 if malformed), 202 if an outcome did not come in time. A command_id the log already holds "
        "answers its original outcome (a retry); the same id with another body is 409 COMMAND_ID_CONFLICT. "
        "A cluster that does not exist is 404 unless ?create_cluster=true.",
        responses=WRITE_RESPONSES,
        openapi_extra=secured(),
    )
    async def post_commands(
        body: Annotated[Any, Body()], wait: Wait = None, create_cluster: CreateCluster = False
    ) -> Any:
        try:
            commands = commands_from_body(body)
        except CommandError as error:
            return JSONResponse(status_code=422, content=error.as_json())
        if len(commands) > MAX_BATCH:
            return _error(413, f"at most {MAX_BATCH} commands per request", "TOO_MANY_COMMANDS")
        return await service.submit(commands, wait, create_cluster)

    known = set(payload_types())
    for path, type_name, from_path, summary in TYPED_ROUTES:
        if type_name in known:  # gang routes appear once the contract has the commands
            _typed_route(app, path, type_name, from_path, summary, service)


def _typed_route(
    app: FastAPI, path: str, type_name: str, from_path: tuple[str, ...], summary: str, service: WriteService
) -> None:
    model = payload_model(type_name, exclude=from_path)
    required = any(f.is_required() for f in model.model_fields.values())

    async def handler(
        cluster: str, body: BaseModel | None, wait: float | None, create: bool, path_values: dict[str, str]
    ) -> Any:
        data = body.model_dump() if body is not None else {}
        if type_name == "SubmitPod" and body is not None and "gpu_milli" not in body.model_fields_set:
            data["gpu_milli"] = 1000 if data.get("num_gpu") else 0  # as CommandPublisher.submit_pod
        envelope = {"command_id": data.pop("command_id", None), "issued_at": data.pop("issued_at", None)}
        command = {"cluster": cluster, **envelope, "payload": {type_name: {**data, **path_values}}}
        try:
            parsed = command_from_json(command)
        except CommandError as error:
            return JSONResponse(status_code=422, content=error.as_json())
        return await service.submit([parsed], wait, create)

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
    parameters.append(inspect.Parameter("create_cluster", keyword, annotation=CreateCluster, default=False))

    async def endpoint(**values: Any) -> Any:
        path_values = {name: values[name] for name in from_path}
        return await handler(
            values["cluster"], values.get("body"), values.get("wait"), values.get("create_cluster", False), path_values
        )

    endpoint.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    app.add_api_route(
        path,
        endpoint,
        methods=["POST"],
        summary=f"{summary} ({type_name})",
        name=f"post_{type_name}",
        responses=WRITE_RESPONSES,
        openapi_extra=secured(),
    )
