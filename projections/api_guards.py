"""What the HTTP API does with hostile requests: short validation errors, HEAD on every GET route.

Kept apart from ``projections.api`` (the routes) so that the routes stay about queries:

- a 422 names the failing parameter and why, and never echoes the input back (FastAPI's
  default returns every bad value whole: a 100 KB parameter came back as a 100 KB body);
- ``HEAD`` is answered on every ``GET`` route, as HTTP requires (headers of the GET, no body),
  instead of 405.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_ERRORS = 5
MAX_TEXT = 200


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def install(app: FastAPI) -> None:
    """Add the short 422 handler and HEAD support to an app."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        details = [
            {
                "loc": [_short(part) for part in item.get("loc", ())][:4],
                "msg": _short(item.get("msg", "")),
                "type": _short(item.get("type", "")),
            }
            for item in error.errors()[:MAX_ERRORS]
        ]
        return JSONResponse(status_code=422, content={"detail": details})

    app.add_middleware(HeadAsGet)


class HeadAsGet:
    """ASGI middleware: run a HEAD request as GET and send its status and headers without the body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)
