"""Request bodies refused cheaply: the token first, then the size while reading, then the type and the JSON.

An ASGI middleware in front of every route that takes a body (POST, PUT, PATCH), in this order, so that
a request refused costs at most the bytes it is allowed to send:

1. **auth**: a route that writes needs ``Authorization: Bearer <token>`` (constant-time comparison);
   without it the answer is 401 before one byte of the body is read;
2. **size**: a ``Content-Length`` over the limit (default 1 MiB) is 413 at once; a body sent without
   one (chunked) is counted while it is read and refused with 413 the moment it passes the limit;
3. **type**: a body must say ``Content-Type: application/json`` (an optional ``charset=utf-8``), exactly:
   anything else, a form encoding (``curl -d``) or ``application/json\\xa0``, is 415;
4. **JSON**: read like a JSON line (``gpufold.jsonl``): strict UTF-8, no key given twice, bounded
   nesting; a body that fails is a short 400 that says why (``"code": "INVALID_JSON"``).

A body that passes reaches the route unchanged.
"""

from __future__ import annotations

import hmac
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

DEFAULT_MAX_BODY = 1 << 20
# A batch wraps its commands in a list, or in {"commands": [...]}: two levels more than one command.
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 2
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPE = "application/json"


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


def content_type_problem(value: bytes | None) -> str | None:
    """Why a Content-Type is not ``application/json`` (optionally with ``charset=utf-8``), or None."""
    if value is None:
        return "a body needs Content-Type: application/json (curl: --json, or -H 'Content-Type: application/json')"
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return "Content-Type holds a byte that is not ASCII; send Content-Type: application/json"
    kind, *parameters = text.split(";")
    if kind.strip(" \t").lower() != JSON_TYPE:
        shown = kind.strip(" \t")[:60]
        return f"Content-Type {shown!r} is not application/json (curl -d sends a form: use --json)"
    for parameter in parameters:
        name, _, given = parameter.strip(" \t").partition("=")
        if name.lower() != "charset" or given.strip('"').lower() not in ("utf-8", "utf8"):
            return f"Content-Type parameter {parameter.strip()[:60]!r}: only charset=utf-8 is accepted"
    return None


class BodyGuard:
    """See the module docstring. ``protected(method, path)`` says whether a request needs the token."""

    def __init__(
        self,
        app: App,
        *,
        token: str | None = None,
        protected: Callable[[str, str], bool] = lambda method, path: False,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.app = app
        self.expected = token.encode() if token else None
        self.protected = protected
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        if self.expected is not None and self.protected(scope["method"], scope["path"]):
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            # compare_digest takes the same time wherever the strings differ (and for a wrong length).
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                await _answer(send, 401, "a valid bearer token is required to write", "UNAUTHORIZED",
                              [(b"www-authenticate", b"Bearer")])  # fmt: skip
                return
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _answer(send, 400, "Content-Length is not a number", "BAD_REQUEST")
                return
            if length > self.max_body:
                await _answer(send, 413, self._too_large(), "BODY_TOO_LARGE")
                return
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _answer(send, 413, self._too_large(), "BODY_TOO_LARGE")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body.strip():
            problem = content_type_problem(headers.get(b"content-type"))
            if problem is not None:
                await _answer(send, 415, problem, "UNSUPPORTED_MEDIA_TYPE")
                return
            problem = body_problem(body)
            if problem is not None:
                await _answer(send, 400, problem[:300], "INVALID_JSON")
                return
        elif b"content-type" in headers and headers[b"content-type"].strip():
            problem = content_type_problem(headers[b"content-type"])
            if problem is not None:
                await _answer(send, 415, problem, "UNSUPPORTED_MEDIA_TYPE")
                return
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}]), send)

    def _too_large(self) -> str:
        return f"the body is larger than {self.max_body} bytes (serve --max-body-bytes)"


async def _answer(
    send: Send, status: int, detail: str, code: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    content = json.dumps({"detail": detail, "code": code}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    headers.extend(extra or ())
    if status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def _replay(messages: list[Message]) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    return receive
