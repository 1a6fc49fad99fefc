"""The composed web app of ``gpufold serve``: projections + replica + write API + dashboard."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, Response

from gpufold.server.json_body import StrictJsonBody
from gpufold.server.replica_routes import add_replica_routes
from gpufold.server.write_routes import add_write_routes
from gpufold.server.writers import CommandWriter
from processor.runtime.replica import Replica

DASHBOARD_FILES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
_REPLICAS: weakref.WeakSet[Replica] = weakref.WeakSet()
_COLLECTOR_REGISTERED = False


def create_app(
    *,
    database: Any = None,
    replica: Replica | None = None,
    writer: CommandWriter | None = None,
    token: str | None = None,
) -> FastAPI:
    """The app: the projections' API when ``database`` (a URL or engine) is given, the replica's routes, the
    write API, and the dashboard at ``/``."""
    if database is not None:
        from projections.api import create_app as projections_app

        app = projections_app(database)
        app.title = "gpufold"
    else:
        app = FastAPI(title="gpufold", version="1")

        @app.get("/healthz", summary="liveness")
        def healthz() -> dict[str, Any]:
            return {"ok": True}

        @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
        def prometheus() -> Response:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.description = (
        "The operator's API: live replica (pods, nodes, explain, what-if), writes (POST /v1/commands), "
        "projections (utilization, usage, audit) when a database is configured, and the dashboard at /."
    )
    if replica is not None:
        add_replica_routes(app, replica)
        _register_metrics(replica)
    if writer is not None:
        add_write_routes(app, writer, token)
    _add_dashboard(app)
    app.add_middleware(StrictJsonBody)  # type: ignore[arg-type]
    return app


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


def _register_metrics(replica: Replica) -> None:
    """``gpufold_replica_lag_commands`` and ``gpufold_replica_offset`` per partition, read at scrape time."""
    global _COLLECTOR_REGISTERED
    _REPLICAS.add(replica)
    if _COLLECTOR_REGISTERED:
        return
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        return

    class ReplicaCollector:
        def collect(self) -> Iterator[Any]:
            lag = GaugeMetricFamily(
                "gpufold_replica_lag_commands",
                "Commands in the log the replica has not folded yet",
                labels=["partition"],
            )
            offset = GaugeMetricFamily(
                "gpufold_replica_offset", "The next command offset the replica folds", labels=["partition"]
            )
            for live in list(_REPLICAS):
                position = live.position()
                for partition, next_offset in position["offsets"].items():
                    head = position["head"].get(partition, next_offset)
                    lag.add_metric([partition], max(0, head - next_offset))
                    offset.add_metric([partition], next_offset)
            yield lag
            yield offset

    REGISTRY.register(ReplicaCollector())  # type: ignore[arg-type]
    _COLLECTOR_REGISTERED = True
