"""The HTTP query API (FastAPI, OpenAPI at /docs and /openapi.json) and Prometheus /metrics.

Every endpoint is read-only (GET, one connection per request, nothing written)
and validates its parameters twice: by type and range in the signature (FastAPI
answers 422 with the failing field), and by the query functions' own checks
(400 with the message). A pod or command that does not exist is a 404.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import Connection, Engine, create_engine, select
from sqlalchemy.exc import SQLAlchemyError

from projections import api_guards, metrics, models, queries
from projections.queries import MAX_LIMIT, MAX_TIME_MS, NotFound, QueryError
from projections.secrets import mask_url

ID_PATTERN = r"^[^\s]{1,253}$"
Id = Annotated[str, Query(min_length=1, max_length=253, pattern=ID_PATTERN)]
OptionalId = Annotated[str | None, Query(min_length=1, max_length=253, pattern=ID_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
Time = Annotated[int, Query(ge=0, le=MAX_TIME_MS, description="epoch milliseconds")]
RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "a parameter the query refuses (the message says which and why)"},
    404: {"description": "a cluster, pod or command the projection does not know"},
    422: {"description": "a parameter of the wrong type or out of range (short: never echoes the input)"},
    503: {"description": "the database is unavailable"},
}


def _connection(request: Request) -> Iterator[Connection]:
    """One connection per request; on PostgreSQL a read-only session (a write would fail)."""
    engine: Engine = request.app.state.engine
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(postgresql_readonly=True)
        yield conn


Conn = Annotated[Connection, Depends(_connection)]


def create_app(database: str | Engine, *, operational_routes: bool = True) -> FastAPI:
    """The API over a projection database (a URL or an engine).

    ``operational_routes``: also ``/healthz``, ``/v1/status`` and ``/metrics`` from the database alone; an app
    that composes this one with a live replica (``gpufold serve``) serves its own, which cover the projection.
    """
    engine = create_engine(database, pool_pre_ping=True) if isinstance(database, str) else database
    app = FastAPI(
        title="gpufold projections",
        version="1",
        description="Read-only queries over the projected scheduler events: utilization, queue, audit, usage.",
    )
    app.state.engine = engine
    api_guards.install(app)  # short 422s, HEAD on GET routes

    @app.exception_handler(QueryError)
    async def bad_query(request: Request, error: QueryError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(error)})

    @app.exception_handler(NotFound)
    async def not_found(request: Request, error: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": error.args[0]})

    @app.exception_handler(SQLAlchemyError)
    async def database_error(request: Request, error: SQLAlchemyError) -> JSONResponse:
        detail = mask_url(str(getattr(error, "orig", None) or error).splitlines()[0])
        return JSONResponse(status_code=503, content={"detail": f"database unavailable: {detail}"})

    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Any]) -> Response:
        started = time.perf_counter()
        response: Response = await call_next(request)
        route = request.scope.get("route")
        endpoint = getattr(route, "path", "unmatched")
        metrics.API_LATENCY.labels(endpoint).observe(time.perf_counter() - started)
        metrics.API_REQUESTS.labels(endpoint, str(response.status_code)).inc()
        return response

    if operational_routes:

        @app.get("/healthz", summary="liveness and database reachability", responses=RESPONSES)
        def healthz(conn: Conn) -> dict[str, Any]:
            conn.execute(select(1))
            return {"ok": True}

    @app.get(
        "/v1/utilization", summary="GPUs allocated vs capacity now, by cluster, GPU model or node", responses=RESPONSES
    )
    def utilization(
        conn: Conn,
        by: Annotated[str, Query(pattern="^(cluster|model|node)$")] = "cluster",
        cluster: OptionalId = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> list[dict[str, Any]]:
        return queries.utilization_now(conn, by=by, cluster=cluster, limit=limit, offset=offset)

    @app.get(
        "/v1/utilization/history",
        summary="allocated vs capacity GPUs over time (end of each step)",
        responses=RESPONSES,
    )
    def utilization_history(
        conn: Conn,
        cluster: Id,
        start: Time,
        end: Time,
        step_ms: Annotated[int, Query(ge=60_000, le=366 * 86_400_000)] = 3_600_000,
        gpu_model: OptionalId = None,
    ) -> dict[str, Any]:
        return queries.utilization_history(
            conn, cluster=cluster, start=start, end=end, step_ms=step_ms, gpu_model=gpu_model
        )

    @app.get("/v1/fragmentation", summary="FGD fragmentation of a cluster now", responses=RESPONSES)
    def fragmentation(conn: Conn, cluster: Id) -> dict[str, Any]:
        return queries.fragmentation_now(conn, cluster=cluster)

    @app.get("/v1/pending", summary="pending pods in queue order, with queue position and reasons", responses=RESPONSES)
    def pending(conn: Conn, cluster: Id, limit: Limit = 100, offset: Offset = 0) -> dict[str, Any]:
        return queries.pending(conn, cluster=cluster, limit=limit, offset=offset)

    @app.get("/v1/gangs", summary="gangs with their members and state, in queue order", responses=RESPONSES)
    def gangs(
        conn: Conn,
        cluster: Id,
        state: Annotated[str | None, Query(pattern="^(waiting|pending|running|released)$")] = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        return queries.gangs(conn, cluster=cluster, state=state, limit=limit, offset=offset)

    @app.get(
        "/v1/disruptions",
        summary="preemptions and migrations of a cluster, newest first, with their cause",
        responses=RESPONSES,
    )
    def disruptions(
        conn: Conn, cluster: Id, pod_id: OptionalId = None, limit: Limit = 100, offset: Offset = 0
    ) -> dict[str, Any]:
        return queries.disruptions(conn, cluster=cluster, pod_id=pod_id, limit=limit, offset=offset)

    @app.get(
        "/v1/reservations", summary="current reservations: nodes held for the head of each queue", responses=RESPONSES
    )
    def reservations(conn: Conn, cluster: OptionalId = None) -> dict[str, Any]:
        return queries.reservations(conn, cluster=cluster)

    @app.get(
        "/v1/disruption-budgets",
        summary="disruption budgets set now: filters, max_unavailable and the drain evictions each blocks",
        responses=RESPONSES,
    )
    def disruption_budgets(conn: Conn, cluster: OptionalId = None) -> dict[str, Any]:
        return queries.disruption_budgets(conn, cluster=cluster)

    @app.get(
        "/v1/clusters/{cluster}/pods/{pod_id}/history",
        summary="a pod's events, each with its command",
        responses=RESPONSES,
    )
    def pod_history(
        conn: Conn,
        cluster: Annotated[str, Path(min_length=1, max_length=253, pattern=ID_PATTERN)],
        pod_id: Annotated[str, Path(min_length=1, max_length=253, pattern=ID_PATTERN)],
    ) -> dict[str, Any]:
        return queries.pod_history(conn, cluster=cluster, pod_id=pod_id)

    @app.get(
        "/v1/commands/{command_id}",
        summary="a command's outcome: accepted (its events) or rejected",
        responses=RESPONSES,
    )
    def command(
        conn: Conn, command_id: Annotated[str, Path(min_length=1, max_length=253, pattern=ID_PATTERN)]
    ) -> dict[str, Any]:
        return queries.command_outcome(conn, command_id=command_id)

    @app.get("/v1/usage", summary="GPU-hours per tenant per hour or day of event time", responses=RESPONSES)
    def usage(
        conn: Conn,
        start: Time,
        end: Time,
        granularity: Annotated[str, Query(pattern="^(hour|day)$")] = "hour",
        tenant: OptionalId = None,
        cluster: OptionalId = None,
    ) -> list[dict[str, Any]]:
        return queries.tenant_usage(conn, start=start, end=end, granularity=granularity, tenant=tenant, cluster=cluster)

    @app.get("/v1/usage/top", summary="top consumers: tenants by GPU-hours in a time range", responses=RESPONSES)
    def top(conn: Conn, start: Time, end: Time, limit: Limit = 10, cluster: OptionalId = None) -> list[dict[str, Any]]:
        return queries.top_consumers(conn, start=start, end=end, limit=limit, cluster=cluster)

    if operational_routes:

        @app.get("/v1/status", summary="projection offsets and event-time watermarks", responses=RESPONSES)
        def status(conn: Conn) -> dict[str, Any]:
            return queries.status(conn)

        @app.get("/metrics", summary="Prometheus metrics", response_class=Response, responses=RESPONSES)
        def prometheus(conn: Conn) -> Response:
            _refresh_gauges(conn)
            return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def _refresh_gauges(conn: Connection) -> None:
    """Cluster gauges read from the projection at scrape time (cheap: nodes and one pending count)."""
    try:
        for row in queries.utilization_now(conn, by="model"):
            metrics.GPUS_ALLOCATED.labels(row["cluster"], row["gpu_model"]).set(row["allocated_gpus"])
            metrics.GPUS_TOTAL.labels(row["cluster"], row["gpu_model"]).set(row["capacity_gpus"])
        stats = models.cluster_stats.c
        for cluster, count in conn.execute(select(stats.cluster, stats.pending)):
            metrics.PENDING_PODS.labels(cluster).set(count)
        for (cluster,) in conn.execute(select(models.nodes.c.cluster).distinct()):
            metrics.FRAGMENTATION.labels(cluster).set(
                queries.fragmentation_now(conn, cluster=cluster)["fragmentation_ratio"]
            )
    except SQLAlchemyError:
        pass  # the scrape still returns the process metrics


__all__ = ["create_app"]
