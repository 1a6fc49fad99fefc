"""JSON request bodies read like JSON lines: strict UTF-8, no duplicate key, bounded nesting.

FastAPI's own parser takes the last of two equal keys silently and answers a bad byte with a bare
"error parsing the body". This ASGI middleware checks every JSON body of a POST first, with the
rules of ``gpufold log append`` (``gpufold.jsonl``), and answers a short 400 that says what is wrong
(``{"detail": ..., "code": "INVALID_JSON"}``); a body that passes reaches the route unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpufold.jsonl import BOM, JsonCommandError, check_json_text
from schemas.limits import MAX_JSON_DEPTH

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# A batch wraps its commands in a list, or in {"commands": [...]}: two levels more than one command.
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 2


def body_problem(body: bytes) -> str | None:
    """Why a JSON body is refused, or None."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"not UTF-8: byte 0x{body[error.start]:02x} at byte {error.start}"
    try:
        check_json_text(text.removeprefix(BOM), MAX_BODY_DEPTH)
    except JsonCommandError as error:
        return str(error)
    return None


class StrictJsonBody:
    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = body_problem(body) if body.strip() else None
        if problem is not None:
            content = json.dumps({"detail": problem[:300], "code": "INVALID_JSON"}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": content})
            return
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}]), send)


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            kind = value.split(b";")[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True  # FastAPI parses a body without a content type as JSON too


def _replay(messages: list[Message]) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    return receive
