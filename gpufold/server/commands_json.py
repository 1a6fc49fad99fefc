"""Commands from JSON bodies: the JSON-lines format (``gpufold.jsonl``), with the envelope filled in.

``command_id`` and ``issued_at`` may be left out of an HTTP body: the server then makes a uuid4 and
takes its clock, as ``CommandPublisher``'s typed methods do (never the fold). Everything else is
checked exactly as a JSON line is, then with the fold's stateless checks (``schemas.validation``,
through ``producers.publisher.validate``), so a command the fold would refuse without looking at
the cluster is answered 422 with the fold's rejection code.

:func:`payload_model` derives a pydantic model from a payload record of ``schemas/command.avsc``,
so the typed routes' OpenAPI schemas come from the same contract.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from gpufold.jsonl import JsonCommandError, command_schema, parse_command
from producers.publisher import InvalidCommand, validate
from schemas.commands import Command

ENVELOPE_DEFAULTED = ("command_id", "issued_at")


class CommandError(ValueError):
    """A body that is not a command the fold would accept: ``code`` is the rejection code (or a shape error)."""

    def __init__(self, message: str, code: str, index: int | None = None, path: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.index = index
        self.path = path

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"detail": str(self), "code": self.code}
        if self.index is not None:
            body["index"] = self.index
        if self.path:
            body["field"] = self.path
        return body


def command_from_json(
    data: Any,
    *,
    index: int | None = None,
    clock: Callable[[], float] = time.time,
    new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    source: str = "gpufold-api",
) -> Command:
    """A JSON object (a JSON line's command) -> a checked :class:`Command`; raises :class:`CommandError`."""
    if not isinstance(data, dict):
        raise CommandError("expected a JSON object (a command)", "INVALID_JSON", index)
    data = dict(data)
    if data.get("command_id") is None:
        data["command_id"] = new_id()
    if data.get("issued_at") is None:
        data["issued_at"] = int(clock() * 1000)
    data.setdefault("source", source)
    try:
        command = Command.from_avro(parse_command(data))
    except JsonCommandError as error:
        raise CommandError(str(error), "INVALID_JSON", index, error.path) from None
    try:
        validate(command)
    except InvalidCommand as error:
        raise CommandError(str(error), error.code, index) from None
    return command


def commands_from_body(body: Any, **options: Any) -> list[Command]:
    """One command, a list, or ``{"commands": [...]}`` -> checked commands (all or none)."""
    items = body.get("commands") if isinstance(body, dict) and "payload" not in body else body
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        raise CommandError('expected a command, a list of commands or {"commands": [...]}', "INVALID_JSON")
    return [command_from_json(item, index=i, **options) for i, item in enumerate(items)]


# ------------------------------------------------------------------ models from the contract


def _records() -> dict[str, dict[str, Any]]:
    payload = next(f for f in command_schema()["fields"] if f["name"] == "payload")
    return {branch["name"]: branch for branch in payload["type"]}


def payload_types() -> list[str]:
    return list(_records())


_NAMED: dict[str, type[BaseModel]] = {}


def _python_type(schema: Any) -> Any:
    if isinstance(schema, list):
        others = [s for s in schema if s != "null"]
        inner = _python_type(others[0]) if len(others) == 1 else Any
        return inner | None if "null" in schema else inner
    if isinstance(schema, str):
        primitive = {"string": str, "int": int, "long": int, "boolean": bool, "double": float, "float": float}
        if schema in primitive:
            return primitive[schema]
        return _named_model(schema)
    kind = schema["type"]
    if kind == "array":
        return list[_python_type(schema["items"])]  # type: ignore[misc]
    if kind == "map":
        return dict[str, _python_type(schema["values"])]  # type: ignore[misc]
    if kind == "record":
        return _record_model(schema)
    return _python_type(kind)


def _named_model(name: str) -> Any:
    from gpufold.jsonl import _named_types

    full = name if "." in name else f"gpufold.{name}"
    schema = _named_types().get(full)
    if schema is None:
        return Any
    return _record_model(schema)


def _record_model(schema: dict[str, Any], exclude: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> Any:
    name = schema["name"].rsplit(".", 1)[-1]
    key = name + "|" + ",".join(exclude) + ("+envelope" if extra else "")
    if key in _NAMED:
        return _NAMED[key]
    fields: dict[str, Any] = {}
    for field in schema["fields"]:
        if field["name"] in exclude:
            continue
        annotation = _python_type(field["type"])
        if "default" in field:
            fields[field["name"]] = (annotation, Field(default=field["default"], description=field.get("doc")))
        else:
            fields[field["name"]] = (annotation, Field(..., description=field.get("doc")))
    fields.update(extra or {})
    model = create_model(  # type: ignore[call-overload]
        name if not (exclude or extra) else f"{name}Body",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    _NAMED[key] = model
    return model


def payload_model(type_name: str, exclude: tuple[str, ...] = ()) -> type[BaseModel]:
    """A request body model for a payload type, minus the fields taken from the path, plus optional envelope fields."""
    envelope = {
        "command_id": (str | None, Field(default=None, description="idempotency key (default: a new uuid4)")),
        "issued_at": (int | None, Field(default=None, description="epoch ms (default: the server's clock)")),
    }
    return _record_model(_records()[type_name], exclude, envelope)  # type: ignore[no-any-return]
