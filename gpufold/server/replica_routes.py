"""The live replica's HTTP routes: pods, nodes, clusters, explain, history, tenants and what-if.

Every answer carries ``replica``: the offset each partition was answered at, the log's head and
the lag (also the ``gpufold_replica_lag_commands`` metric).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import Body, FastAPI, HTTPException, Path, Query
from fastapi.responses import JSONResponse

from gpufold.jsonl import to_json_value
from gpufold.server.commands_json import CommandError, commands_from_body
from processor.runtime.replica import Replica
from schemas.events import Event
from schemas.fastcodec import encode_event

ID_PATTERN = r"^[^\s]{1,253}$"
OptionalId = Annotated[str | None, Query(min_length=1, max_length=253, pattern=ID_PATTERN)]
PathId = Annotated[str, Path(min_length=1, max_length=253, pattern=ID_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
MAX_WHAT_IF = 1_000


def event_json(event: Event) -> dict[str, Any]:
    """An event as JSON: the envelope's fields, the payload as ``{"Type": {...}}`` (as ``gpufold events --json``)."""
    return to_json_value(event.to_avro())  # type: ignore[no-any-return]


def add_replica_routes(app: FastAPI, replica: Replica) -> None:
    def known(cluster: str | None) -> None:
        """404 for a cluster the replica has never seen: an empty answer would look like an idle cluster."""
        if cluster is not None and not replica.knows_cluster(cluster):
            raise HTTPException(404, f"no cluster {cluster!r} in the replica (GET /v1/clusters lists them)")

    @app.get("/v1/replica", summary="the replica's position: offset answered at per partition, head and lag")
    def position(hashes: bool = False) -> dict[str, Any]:
        answer = replica.position()
        if hashes:
            answer["state_hashes"] = {str(p): h for p, h in replica.state_hashes().items()}
        return answer

    @app.get("/v1/pods", summary="running or pending pods (live replica), paged, with per-GPU shares and live reasons")
    def pods(
        state: Annotated[str | None, Query(pattern="^(running|pending)$")] = None,
        cluster: OptionalId = None,
        tenant: OptionalId = None,
        node: OptionalId = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> JSONResponse:
        known(cluster)
        # A JSONResponse is serialised with json.dumps as is: FastAPI's jsonable_encoder would walk
        # every value of a 1000-pod page again first (a third of the request's time).
        return JSONResponse(
            replica.pods(state=state, cluster=cluster, tenant=tenant, node_id=node, offset=offset, limit=limit)
        )

    @app.get("/v1/nodes", summary="nodes (live replica), paged, each GPU with its allocation and the pods sharing it")
    def nodes(
        cluster: OptionalId = None, gpu_model: OptionalId = None, limit: Limit = 100, offset: Offset = 0
    ) -> JSONResponse:
        known(cluster)
        return JSONResponse(replica.nodes(cluster=cluster, gpu_model=gpu_model, offset=offset, limit=limit))

    @app.get("/v1/clusters", summary="every cluster now (live replica): nodes, GPUs, allocation, queue, fragmentation")
    def clusters() -> dict[str, Any]:
        return replica.clusters()

    @app.get(
        "/v1/clusters/{cluster}/pods/{pod_id}/explain",
        summary="why a pending pod does not fit now: live reasons per node class, nearest miss, what would help",
    )
    def explain(cluster: PathId, pod_id: PathId) -> dict[str, Any]:
        found = replica.explain(cluster, pod_id)
        if found is None:
            raise HTTPException(404, f"pod {pod_id!r} is neither pending nor running in cluster {cluster!r}")
        return {**found.as_json(), "replica": replica.position()}

    @app.get("/v1/clusters/{cluster}/history", summary="utilization and fragmentation over event time (replica)")
    def history(cluster: PathId) -> dict[str, Any]:
        known(cluster)
        return {**replica.history(cluster), "replica": replica.position()}

    @app.get("/v1/quotas", summary="per tenant and quota key: nominal, used, may hold now, borrowed, lent (replica)")
    def quotas(cluster: OptionalId = None) -> dict[str, Any]:
        known(cluster)
        return replica.quotas(cluster)

    @app.get("/v1/tenants", summary="GPU milli running now and pods per tenant (live replica)")
    def tenants(cluster: OptionalId = None) -> dict[str, Any]:
        known(cluster)
        return replica.tenants(cluster)

    @app.post(
        "/v1/what-if",
        summary="fold commands on a copy of the head state and return their events; nothing is published",
        description='The body is one command, a list, or {"commands": [...]}, each as in the JSON-lines format '
        "(command_id and issued_at may be left out: the server fills them in and returns them, so the same "
        "command can then be published). Each command is folded at the offset it would get if published now; "
        "with frames=true each event's Avro frame (base64) is included, byte for byte what the processor "
        "would publish; hashes=true adds each forked partition's state_hash afterwards (slow on big states).",
    )
    def what_if(body: Annotated[Any, Body()], frames: bool = False, hashes: bool = False) -> Any:
        try:
            commands = commands_from_body(body)
        except CommandError as error:
            return JSONResponse(status_code=422, content=error.as_json())
        if len(commands) > MAX_WHAT_IF:
            return JSONResponse(status_code=413, content={"detail": f"at most {MAX_WHAT_IF} commands per what-if"})
        answer = replica.what_if(commands, hashes=hashes)
        results = []
        for result in answer.results:
            item: dict[str, Any] = {
                "command": to_json_value(result.command.to_avro()),
                "partition": result.partition,
                "offset": result.offset,
                "outcome": type(result.events[0].payload).__name__,
                "events": [event_json(e) for e in result.events],
            }
            if frames:
                item["frames"] = [base64.b64encode(encode_event(e)).decode() for e in result.events]
            results.append(item)
        return {
            "results": results,
            "state_hashes_after": {str(p): h for p, h in answer.state_hashes.items()},
            "replica": answer.position,
        }
