"""The composed web app of ``gpufold serve``: projections + replica + write API + health + dashboard.

Guards every route shares: the body guard (token, size, type, strict JSON: ``body_guard``), short 422s
and HEAD on every GET (``projections.api_guards``), the OpenAPI document with the bearer scheme and a
local ``/docs`` (``openapi``). Health (``/healthz``, ``/v1/status``) and ``/metrics`` read the health
monitor and the replica without locks or I/O in the request, so no write, what-if or slow query can
starve them.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

import anyio
from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response

from gpufold.server import openapi
from gpufold.server.body_guard import DEFAULT_MAX_BODY, BodyGuard
from gpufold.server.health import HealthMonitor, Probes
from gpufold.server.replica_routes import add_replica_routes
from gpufold.server.whatif_process import Budget, BudgetExceeded
from gpufold.server.write_routes import WriteService, add_write_routes
from gpufold.server.writers import CommandWriter
from processor.runtime.replica import Replica
from projections import api_guards

DASHBOARD_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
    "docs.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
WHAT_IFS_AT_ONCE = 2
OPEN_POSTS = frozenset({"/v1/what-if"})  # every other POST writes (write_routes.write_paths): it needs the token


def create_app(
    *,
    database: Any = None,
    replica: Replica | None = None,
    writer: CommandWriter | None = None,
    token: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    health: HealthMonitor | None = None,
    what_if_budget: Budget | None = None,
) -> FastAPI:
    """The app: the projections' API when ``database`` (a URL or engine) is given, the replica's routes, the
    write API (``token``: the bearer token writes need), health, and the dashboard at ``/``.

    ``health``: a started :class:`HealthMonitor` (``gpufold serve`` makes one with every probe); without one,
    a monitor of the replica alone is checked on each health request.
    """
    live = replica is not None
    if database is not None:
        from projections.api import create_app as projections_app

        app = projections_app(database, operational_routes=not live)
        app.title = "gpufold"
        app.docs_url = app.redoc_url = None
    else:
        app = FastAPI(title="gpufold", version="1", docs_url=None, redoc_url=None)
        api_guards.install(app)
    app.description = (
        "The operator's API: live replica (pods, nodes, the queue, explain, what-if), writes (POST /v1/commands "
        "and typed routes: they need Authorization: Bearer <GPUFOLD_API_TOKEN> when serve has a token), health "
        "(/healthz, /v1/status), projections (utilization, usage, audit) when a database is configured, and the "
        "dashboard at /."
    )
    if health is None and (live or database is None):
        health = HealthMonitor(Probes(replica=replica))
    if live:
        assert replica is not None
        runner = _what_if_runner(replica, what_if_budget or Budget())
        add_replica_routes(app, replica, runner)
        _add_health_routes(app, health, replica, database)
    elif database is None:
        _add_health_routes(app, health, None, None)
    if writer is not None:
        warning = health.warning if health is not None else (lambda: None)
        add_write_routes(app, WriteService(writer, replica, warning))
    _add_dashboard(app)
    openapi.install(app)
    writes = writer is not None
    app.add_middleware(
        BodyGuard,  # type: ignore[arg-type]
        token=token,
        protected=lambda method, path: writes and path not in OPEN_POSTS,
        max_body=max_body,
    )
    app.state.health = health
    return app


def _what_if_runner(replica: Replica, budget: Budget) -> Any:
    from gpufold.server import whatif_process

    loops: dict[int, asyncio.Semaphore] = {}  # one per event loop (a test client runs its own)

    async def run(commands: list[Any], *, frames: bool, hashes: bool) -> Response:
        loop_id = id(asyncio.get_running_loop())
        semaphore = loops.setdefault(loop_id, asyncio.Semaphore(WHAT_IFS_AT_ONCE))
        try:
            await asyncio.wait_for(semaphore.acquire(), timeout=budget.seconds)
        except TimeoutError:
            return JSONResponse(
                status_code=503,
                content={"detail": f"{WHAT_IFS_AT_ONCE} what-ifs are running; retry shortly", "code": "BUSY"},
                headers={"Retry-After": "1"},
            )
        try:
            data = await anyio.to_thread.run_sync(
                lambda: whatif_process.run(replica, commands, budget, frames=frames, hashes=hashes)
            )
        except BudgetExceeded as error:
            return JSONResponse(status_code=413, content={"detail": str(error), "code": "WHAT_IF_BUDGET"})
        finally:
            semaphore.release()
        return Response(data, media_type="application/json")

    return run


def _add_health_routes(app: FastAPI, health: HealthMonitor | None, replica: Replica | None, database: Any) -> None:
    from gpufold.server.metrics import scrape

    def report() -> dict[str, Any]:
        if health is None:
            return {"ok": True, "problems": []}
        return health.report() if health.running else health.check()

    @app.get(
        "/healthz",
        summary="503 with the reasons when the fold is dead, a cluster is halted, or anything is behind",
        responses={503: {"description": "unhealthy: `problems` says why"}},
    )
    def healthz() -> JSONResponse:  # not async: a 503 is re-sampled (see HealthMonitor.report), off the event loop
        answer = report()
        body = {"ok": answer["ok"], "problems": answer["problems"]}
        return JSONResponse(status_code=200 if answer["ok"] else 503, content=body)

    @app.get(
        "/v1/status",
        summary="health in full: the fold's, the replica's and the projection's position and lag per partition",
    )
    def status() -> dict[str, Any]:
        return report()

    @app.get("/metrics", summary="Prometheus metrics (cluster gauges from the live replica)", response_class=Response)
    def prometheus() -> Response:
        data, media = scrape(replica, health)
        return Response(data, media_type=media)


def _add_dashboard(app: FastAPI) -> None:
    files = resources.files("gpufold.server").joinpath("dashboard")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(files.joinpath("index.html").read_text(encoding="utf-8"))

    @app.get("/dashboard/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        media = DASHBOARD_FILES.get(name)
        if media is None:
            raise HTTPException(404, f"no dashboard file {name!r}")
        return Response(files.joinpath(name).read_text(encoding="utf-8"), media_type=media)
