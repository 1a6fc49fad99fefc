"""The live replica's HTTP routes: pods, nodes, clusters, the queue, gangs, disruptions, disruption budgets,
explain, history, quotas, tenants and what-if.

Every answer carries ``replica``: the offset each partition was answered at, the log's head and the
lag (also the ``gpufold_replica_lag_commands`` metric). Every GET answers with an ``ETag`` that
changes when the cluster it is about changes (any cluster, for cross-cluster routes): a client that
sends it back in ``If-None-Match`` gets ``304 Not Modified`` and no body, which is how the dashboard
refreshes without pulling the state again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Annotated, Any

import anyio
from fastapi import Body, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from gpufold.server.commands_json import CommandError, commands_from_body
from gpufold.server.openapi import READ_RESPONSES, WHAT_IF_RESPONSES
from gpufold.server.outcomes import event_json
from gpufold.server.whatif_process import render
from processor.runtime.replica import Replica

ID_PATTERN = r"^[^\s]{1,253}$"
OptionalId = Annotated[str | None, Query(min_length=1, max_length=253, pattern=ID_PATTERN)]
PathId = Annotated[str, Path(min_length=1, max_length=253, pattern=ID_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
MAX_WHAT_IF = 1_000


def tagged(request: Request, version: str, make: Callable[[], Any]) -> Response:
    """``make()`` as JSON with an ETag of (version, path, query); 304 if the client already has it."""
    digest = hashlib.blake2b(f"{version}|{request.url.path}|{request.url.query}".encode(), digest_size=12).hexdigest()
    tag = f'W/"{digest}"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if tag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    content = make()
    return Response(json.dumps(content, separators=(",", ":")), media_type="application/json", headers=headers)


def add_replica_routes(app: FastAPI, replica: Replica, what_if: Callable[..., Any] | None = None) -> None:
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

    @app.get(
        "/v1/pods",
        summary="running or pending pods (live replica), paged, with per-GPU shares and live reasons",
        responses=READ_RESPONSES,
    )
    def pods(
        request: Request,
        state: Annotated[str | None, Query(pattern="^(running|pending)$")] = None,
        cluster: OptionalId = None,
        tenant: OptionalId = None,
        node: OptionalId = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> Response:
        known(cluster)
        return tagged(
            request,
            replica.version(cluster),
            lambda: replica.pods(state=state, cluster=cluster, tenant=tenant, node_id=node, offset=offset, limit=limit),
        )

    @app.get(
        "/v1/nodes",
        summary="nodes (live replica), paged, each GPU with its allocation and the pods sharing it",
        responses=READ_RESPONSES,
    )
    def nodes(
        request: Request,
        cluster: OptionalId = None,
        gpu_model: OptionalId = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> Response:
        known(cluster)
        return tagged(
            request,
            replica.version(cluster),
            lambda: replica.nodes(cluster=cluster, gpu_model=gpu_model, offset=offset, limit=limit),
        )

    @app.get(
        "/v1/clusters/{cluster}/nodes/{node_id}",
        summary="one node: labels, taints, GPUs, every pod on it, reservation",
        responses=READ_RESPONSES,
    )
    def node(request: Request, cluster: PathId, node_id: PathId) -> Response:
        known(cluster)
        found = replica.node(cluster, node_id)
        if found is None:
            raise HTTPException(404, f"no node {node_id!r} in cluster {cluster!r}")
        return tagged(request, replica.version(cluster), lambda: found)

    @app.get(
        "/v1/clusters",
        summary="every cluster now (live replica): nodes, GPUs, allocation, queue, fragmentation, halted",
        responses=READ_RESPONSES,
    )
    def clusters(request: Request) -> Response:
        return tagged(request, replica.version(), replica.clusters)

    @app.get(
        "/v1/clusters/{cluster}/grid",
        summary="every node compactly, grouped by GPU model: the dashboard's GPU grid",
        responses=READ_RESPONSES,
    )
    def grid(request: Request, cluster: PathId) -> Response:
        known(cluster)
        return tagged(request, replica.version(cluster), lambda: replica.grid(cluster))

    @app.get(
        "/v1/clusters/{cluster}/queue",
        summary="the queue in scheduling order: position, age, priority, tenant, reasons now, expected start",
        description="Pods and gangs in the order the fold retries them (priority; with quotas, the tenant's "
        "weighted dominant share; then arrival), then the jobs waiting for dependencies (position null). "
        "`tenant` and `search` (an id substring) filter; positions stay those in the whole queue.",
        responses=READ_RESPONSES,
    )
    def queue(
        request: Request,
        cluster: PathId,
        tenant: OptionalId = None,
        search: Annotated[str | None, Query(min_length=1, max_length=253)] = None,
        limit: Limit = 50,
        offset: Offset = 0,
    ) -> Response:
        known(cluster)
        return tagged(
            request,
            replica.version(cluster),
            lambda: replica.queue(cluster, tenant=tenant, search=search, offset=offset, limit=limit),
        )

    @app.get(
        "/v1/clusters/{cluster}/gangs",
        summary="gangs (live replica): members, state, placement",
        responses=READ_RESPONSES,
    )
    def gangs(
        request: Request,
        cluster: PathId,
        state: Annotated[str | None, Query(pattern="^(waiting|pending|running)$")] = None,
    ) -> Response:
        known(cluster)
        return tagged(request, replica.version(cluster), lambda: replica.gangs(cluster, state))

    @app.get(
        "/v1/clusters/{cluster}/disruptions",
        summary="recent preemptions, evictions, migrations and time limits (live replica), newest first, with cause",
        responses=READ_RESPONSES,
    )
    def disruptions(request: Request, cluster: PathId, limit: Annotated[int, Query(ge=1, le=200)] = 50) -> Response:
        known(cluster)

        def make() -> dict[str, Any]:
            events = [event_json(e) for e in replica.disruptions(cluster, limit)]
            return {"cluster": cluster, "events": events, "replica": replica.position()}

        return tagged(request, replica.version(cluster), make)

    @app.get(
        "/v1/clusters/{cluster}/disruption-budgets",
        summary="disruption budgets (live replica): filters, max_unavailable, pods unavailable now, disruptions "
        "allowed now and the drain evictions each blocks",
        responses=READ_RESPONSES,
    )
    def disruption_budgets(request: Request, cluster: PathId) -> Response:
        known(cluster)
        return tagged(request, replica.version(cluster), lambda: replica.disruption_budgets(cluster))

    def explain(cluster: str, job_id: str) -> dict[str, Any]:
        found = replica.explain(cluster, job_id)
        if found is None:
            known(cluster)
            raise HTTPException(
                404, f"no pod, gang or gang member {job_id!r} waiting or running in cluster {cluster!r}"
            )
        return {**found.as_json(), "replica": replica.position()}

    @app.get(
        "/v1/clusters/{cluster}/pods/{pod_id}/explain",
        summary="why a pod (or a gang, or a gang's member) waits now: every reason the fold knows, what would help",
        responses=READ_RESPONSES,
    )
    def explain_pod(cluster: PathId, pod_id: PathId) -> dict[str, Any]:
        return explain(cluster, pod_id)

    @app.get(
        "/v1/clusters/{cluster}/gangs/{gang_id}/explain",
        summary="why a gang waits now: quota, strict FIFO, the members that fit no node, topology",
        responses=READ_RESPONSES,
    )
    def explain_gang(cluster: PathId, gang_id: PathId) -> dict[str, Any]:
        return explain(cluster, gang_id)

    @app.get(
        "/v1/clusters/{cluster}/history",
        summary="utilization and fragmentation over event time (replica): a point per change, bounded",
        responses=READ_RESPONSES,
    )
    def history(request: Request, cluster: PathId) -> Response:
        known(cluster)
        return tagged(
            request, replica.version(cluster), lambda: {**replica.history(cluster), "replica": replica.position()}
        )

    @app.get(
        "/v1/quotas",
        summary="per tenant and quota key: nominal, used, may hold now, borrowed, lent; per cohort of the cohort "
        "tree and key: subtree quota, kept, in use, may use (replica)",
        responses=READ_RESPONSES,
    )
    def quotas(request: Request, cluster: OptionalId = None) -> Response:
        known(cluster)
        return tagged(request, replica.version(cluster), lambda: replica.quotas(cluster))

    @app.get(
        "/v1/tenants", summary="GPU milli running now and pods per tenant (live replica)", responses=READ_RESPONSES
    )
    def tenants(request: Request, cluster: OptionalId = None) -> Response:
        known(cluster)
        return tagged(request, replica.version(cluster), lambda: replica.tenants(cluster))

    @app.post(
        "/v1/what-if",
        summary="fold commands on a copy of the head state and return their events; nothing is published",
        description='The body is one command, a list, or {"commands": [...]}, each as in the JSON-lines format '
        "(command_id and issued_at may be left out: the server fills them in and returns them, so the same "
        "command can then be published). Each command is folded at the offset it would get if published now, "
        "in a forked process with a time and an output budget (413 WHAT_IF_BUDGET past either); `outcome` "
        "names what became of each command (its final event about its pod, gang or node, or CommandRejected). "
        "With frames=true each event's Avro frame (base64) is included, byte for byte what the processor "
        "would publish; hashes=true adds each forked partition's state_hash afterwards (slow on big states).",
        responses=WHAT_IF_RESPONSES,
    )
    async def what_if_route(body: Annotated[Any, Body()], frames: bool = False, hashes: bool = False) -> Any:
        try:
            commands = commands_from_body(body)
        except CommandError as error:
            return JSONResponse(status_code=422, content=error.as_json())
        if len(commands) > MAX_WHAT_IF:
            return JSONResponse(
                status_code=413,
                content={"detail": f"at most {MAX_WHAT_IF} commands per what-if", "code": "WHAT_IF_BUDGET"},
            )
        if not replica.restored.is_set():
            return JSONResponse(status_code=503, content={"detail": "the replica is restoring", "code": "NOT_READY"})
        if what_if is not None:
            return await what_if(commands, frames=frames, hashes=hashes)
        answer = await anyio.to_thread.run_sync(lambda: replica.what_if(commands, hashes=hashes))
        return render(answer, frames=frames)
