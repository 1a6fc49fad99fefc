"""The OpenAPI document's shared parts (the bearer scheme, every status code a route may answer) and the
``/docs`` page, served from the package: a small reader of ``/openapi.json`` with no CDN and no
third-party code (FastAPI's default pages load Swagger UI and ReDoc from a CDN, blank offline).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response

BEARER = "bearer"


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {"detail": {}, "code": {"type": "string"}},
                    "required": ["detail"],
                }
            }
        },
    }


BODY_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("the body is not strict JSON (a key given twice, a byte that is not UTF-8, nesting): INVALID_JSON"),
    413: _error("the body is larger than the limit (serve --max-body-bytes, default 1 MiB): BODY_TOO_LARGE"),
    415: _error("the body is not Content-Type: application/json: UNSUPPORTED_MEDIA_TYPE"),
    422: _error("a malformed command (the fold's rejection code, e.g. INVALID_RESOURCES), or a bad parameter"),
}
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "every command's outcome is in (?wait) and every one was accepted"},
    202: {"description": "appended; no ?wait, or an outcome did not come in time (outcome null)"},
    **BODY_RESPONSES,
    401: _error("no valid bearer token (GPUFOLD_API_TOKEN): UNAUTHORIZED"),
    404: _error("a cluster that does not exist, without ?create_cluster=true: UNKNOWN_CLUSTER"),
    409: _error("the fold refused a command (its CommandRejected in outcomes), or COMMAND_ID_CONFLICT"),
    503: _error("the log cannot take the commands (LOG_UNAVAILABLE) or the replica is restoring (NOT_READY)"),
}
WHAT_IF_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "each command's events and final outcome; nothing is published"},
    **BODY_RESPONSES,
    413: _error("the body, or the answer, or the time over the what-if budget: BODY_TOO_LARGE, WHAT_IF_BUDGET"),
    503: _error("the replica is restoring, or too many what-ifs run at once: NOT_READY, BUSY"),
}
READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    304: {"description": "not modified since the ETag given in If-None-Match"},
    404: _error("no such cluster, pod, gang or node"),
    422: _error("a parameter out of range (short: never echoes the input)"),
}


def secured() -> dict[str, Any]:
    """``openapi_extra`` of a route that needs the bearer token."""
    return {"security": [{BEARER: []}]}


def install(app: FastAPI) -> None:
    """The bearer scheme in the OpenAPI document, and ``/docs`` from local files."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {})[BEARER] = {
                "type": "http",
                "scheme": "bearer",
                "description": "the value of GPUFOLD_API_TOKEN (serve refuses to start with an empty one); "
                "writes need it, reads and what-if do not",
            }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    files = resources.files("gpufold.server").joinpath("dashboard")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(files.joinpath("docs.html").read_text(encoding="utf-8"))

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> Response:
        return Response(status_code=307, headers={"Location": "/docs"})
