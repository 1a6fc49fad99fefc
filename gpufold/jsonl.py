"""Commands as JSON lines, for scripting: one command envelope per line, field names as in the schemas.

A line looks like::

    {"command_id": "c1", "cluster": "lab", "issued_at": 1767225600000,
     "payload": {"SubmitPod": {"pod_id": "p1", "num_gpu": 1, "gpu_milli": 500, "cpu_milli": 4000}}}

- The payload is an object with exactly one key, the command type (``SubmitPod``
  or ``gpufold.SubmitPod``).
- Fields with a default in ``schemas/command.avsc`` may be left out; unknown
  fields are errors (a typo must not silently become a default).
- ``issued_at`` is epoch milliseconds, or an ISO-8601 string with a time zone.
- Blank lines and lines starting with ``#`` are skipped.

Only the shape is checked here (types, required fields), as Avro would, and what
a frame must be to exist at all: valid UTF-8 without lone surrogates, no duplicate
keys (a JSON object repeating a key is ambiguous: refused, not "last wins"), no
deeper nesting than :data:`~schemas.limits.MAX_JSON_DEPTH`, a line of at most
:data:`~schemas.limits.MAX_LINE_BYTES` and a frame of at most
:data:`~schemas.limits.MAX_FRAME_BYTES`. A UTF-8 byte-order mark before the first
line is ignored. Whether the command makes sense (sizes, known nodes) is the fold's
business: it answers with ``CommandRejected``. A line that does not parse is
reported with its line number and reason, and reading goes on with the next line.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, BinaryIO

from schemas import COMMAND, registry
from schemas.limits import MAX_FRAME_BYTES, MAX_JSON_DEPTH, MAX_LINE_BYTES

BOM = "\ufeff"

_INT_RANGE = (-(1 << 31), (1 << 31) - 1)
_LONG_RANGE = (-(1 << 63), (1 << 63) - 1)


class JsonCommandError(ValueError):
    """A JSON command that does not match the Avro command schema; ``path`` says where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """A line that parsed: its number and the command as the Avro mapping the codec encodes."""

    line: int
    record: dict[str, Any]
    encoded: bytes | None = None

    @property
    def key(self) -> bytes:
        """The record key: the cluster name (the partition key)."""
        return str(self.record["cluster"]).encode()

    def frame(self) -> bytes:
        """The command as an Avro single-object frame."""
        return self.encoded if self.encoded is not None else registry().codec(COMMAND).encode(self.record)


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that did not parse: its number, why, and the text (shortened)."""

    line: int
    reason: str
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


# ------------------------------------------------------------ schema


@cache
def _named_types() -> dict[str, Any]:
    """Every named type of the contract, by full name, as written in the .avsc files."""
    named: dict[str, Any] = {}

    def collect(schema: Any, namespace: str) -> None:
        if isinstance(schema, list):
            for branch in schema:
                collect(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind == "record":
                space = schema.get("namespace", namespace)
                named[_full_name(schema["name"], space)] = {**schema, "namespace": space}
                for field in schema["fields"]:
                    collect(field["type"], space)
            elif kind == "array":
                collect(schema["items"], namespace)
            elif kind == "map":
                collect(schema["values"], namespace)

    for file_name in ("types.avsc", "command.avsc"):
        document = json.loads(resources.files("schemas").joinpath(file_name).read_text(encoding="utf-8"))
        for schema in document if isinstance(document, list) else [document]:
            collect(schema, "")
    return named


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def command_schema() -> dict[str, Any]:
    """The command envelope schema (``gpufold.Command``) as written in ``schemas/command.avsc``."""
    return _named_types()["gpufold.Command"]  # type: ignore[no-any-return]


def command_types() -> list[str]:
    """The payload type names a JSON line may use (short names)."""
    payload = next(field for field in command_schema()["fields"] if field["name"] == "payload")
    return [branch["name"] for branch in payload["type"]]


# ------------------------------------------------------------ JSON -> Avro mapping


def parse_command(data: Any) -> dict[str, Any]:
    """Check a decoded JSON value against the command schema, fill defaults, return the Avro mapping.

    Raises :class:`JsonCommandError` naming the offending field.
    """
    return _convert(data, command_schema(), "gpufold", "")  # type: ignore[no-any-return]


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _convert(value: Any, schema: Any, namespace: str, path: str) -> Any:
    if isinstance(schema, list):
        return _convert_union(value, schema, namespace, path)
    if isinstance(schema, str):
        named = _named_types().get(_full_name(schema, namespace)) or _named_types().get(schema)
        if named is not None:
            return _convert_record(value, named, path)
        return _convert_primitive(value, schema, None, path)
    kind = schema["type"]
    if kind == "record":
        return _convert_record(value, {**schema, "namespace": schema.get("namespace", namespace)}, path)
    if kind == "array":
        if not isinstance(value, list):
            raise JsonCommandError(path, f"expected a list, got {_describe(value)}")
        return [_convert(item, schema["items"], namespace, f"{path}[{i}]") for i, item in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise JsonCommandError(path, f"expected an object, got {_describe(value)}")
        for k in value:
            _check_unicode(k, f"{path} key")
        return {str(k): _convert(v, schema["values"], namespace, f"{path}.{k}") for k, v in value.items()}
    if isinstance(kind, (dict, list)):
        return _convert(value, kind, namespace, path)
    return _convert_primitive(value, kind, schema.get("logicalType"), path)


def _convert_record(value: Any, schema: dict[str, Any], path: str) -> dict[str, Any]:
    name = schema["name"]
    if not isinstance(value, dict):
        raise JsonCommandError(path, f"expected an object ({name}), got {_describe(value)}")
    fields = schema["fields"]
    known = {field["name"] for field in fields}
    unknown = sorted(set(value) - known)
    if unknown:
        raise JsonCommandError(
            path, f"unknown field {unknown[0]!r} in {name} (fields: {', '.join(f['name'] for f in fields)})"
        )
    out: dict[str, Any] = {}
    for field in fields:
        field_name = field["name"]
        field_path = f"{path}.{field_name}" if path else field_name
        if field_name in value:
            out[field_name] = _convert(value[field_name], field["type"], schema["namespace"], field_path)
        elif "default" in field:
            out[field_name] = copy.deepcopy(field["default"])
        else:
            raise JsonCommandError(field_path, f"missing required field of {name}")
    return out


def _convert_union(value: Any, branches: list[Any], namespace: str, path: str) -> Any:
    if value is None and "null" in branches:
        return None
    records = {}
    for branch in branches:
        if isinstance(branch, dict) and branch.get("type") == "record":
            records[branch["name"]] = {**branch, "namespace": branch.get("namespace", namespace)}
    if records:
        if not isinstance(value, dict) or len(value) != 1:
            raise JsonCommandError(
                path, f"expected an object with exactly one key, the type: one of {', '.join(records)}"
            )
        ((type_name, body),) = value.items()
        short = type_name.rsplit(".", 1)[-1]
        schema = records.get(short)
        if schema is None or (type_name != short and type_name != _full_name(short, schema["namespace"])):
            raise JsonCommandError(path, f"unknown type {type_name!r}; one of {', '.join(records)}")
        full = _full_name(short, schema["namespace"])
        return (full, _convert_record(body, schema, f"{path}.{short}"))
    others = [branch for branch in branches if branch != "null"]
    if len(others) == 1:
        return _convert(value, others[0], namespace, path)
    raise JsonCommandError(path, f"cannot tell which branch of {branches} {_describe(value)} is")


def _convert_primitive(value: Any, kind: str, logical: str | None, path: str) -> Any:
    if kind == "string":
        if not isinstance(value, str):
            raise JsonCommandError(path, f"expected a string, got {_describe(value)}")
        _check_unicode(value, path)
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise JsonCommandError(path, f"expected true or false, got {_describe(value)}")
        return value
    if kind in ("int", "long"):
        if logical == "timestamp-millis" and isinstance(value, str):
            return _parse_timestamp(value, path)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            what = "epoch milliseconds or an ISO-8601 time" if logical == "timestamp-millis" else "an integer"
            raise JsonCommandError(path, f"expected {what}, got {_describe(value)}")
        low, high = _INT_RANGE if kind == "int" else _LONG_RANGE
        if not low <= value <= high:
            raise JsonCommandError(path, f"{value} does not fit in an Avro {kind}")
        return value
    if kind in ("float", "double"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise JsonCommandError(path, f"expected a number, got {_describe(value)}")
        return float(value)
    if kind == "null":
        if value is not None:
            raise JsonCommandError(path, f"expected null, got {_describe(value)}")
        return None
    if kind == "bytes":
        if not isinstance(value, str):
            raise JsonCommandError(path, f"expected base64 text, got {_describe(value)}")
        return base64.b64decode(value)
    raise JsonCommandError(path, f"unsupported schema type {kind!r}")


def _check_unicode(text: str, path: str) -> None:
    """A string Avro can carry: no lone surrogate (JSON's "\\ud800" escape is valid JSON, not valid text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise JsonCommandError(path, f"not valid text: lone surrogate {text[error.start]!r}") from None


def _parse_timestamp(text: str, path: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise JsonCommandError(path, f"{text!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        raise JsonCommandError(path, f"{text!r} has no time zone (add Z or +00:00)")
    seconds = moment.timestamp()
    return round(seconds * 1000)


# ------------------------------------------------------------ lines


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonCommandError("", f"duplicate key {_describe(key)} in one object (which one is meant?)")
        out[key] = value
    return out


_decoder = json.JSONDecoder(object_pairs_hook=_unique_keys)


def _depth(text: str) -> int:
    """How deeply brackets nest outside strings (cheap, so no parser recursion ever gets deep)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def check_json_text(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON text as this reader accepts it (nesting at most ``max_depth``, no key twice in one object)
    -> its value; raises JsonCommandError with a reason."""
    if ("[" in text or "{" in text) and text.count("[") + text.count("{") > max_depth:
        depth = _depth(text)
        if depth > max_depth:
            raise JsonCommandError("", f"nested {depth} levels deep; a command needs 4 (at most {max_depth})")
    try:
        return _decoder.decode(text)
    except json.JSONDecodeError as error:
        raise JsonCommandError("", f"not JSON: {error.msg} at column {error.colno}") from None
    except (ValueError, RecursionError) as error:  # e.g. an integer of more than 4300 digits
        raise JsonCommandError("", f"not JSON this reader accepts: {str(error).splitlines()[0][:120]}") from None


def parse_line(text: str) -> dict[str, Any]:
    """One JSON line -> the Avro command mapping; raises JsonCommandError with a reason."""
    data = check_json_text(text)
    if not isinstance(data, dict):
        raise JsonCommandError("", f"expected a JSON object (a command), got {_describe(data)}")
    return parse_command(data)


def _shorten(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def parse_text(number: int, text: str) -> ParsedCommand | LineError | None:
    """One line's text -> a command (encoded, so a frame too large is caught here), an error, or None (blank)."""
    text = text.strip()
    if not text or text.startswith("#"):
        return None
    try:
        record = parse_line(text)
        frame = registry().codec(COMMAND).encode(record)
    except JsonCommandError as error:
        return LineError(number, str(error), _shorten(text))
    if len(frame) > MAX_FRAME_BYTES:
        return LineError(number, f"the command is {len(frame)} bytes encoded, over {MAX_FRAME_BYTES}", _shorten(text))
    return ParsedCommand(number, record, frame)


def read_commands(lines: Iterable[str], first_line: int = 1) -> Iterator[ParsedCommand | LineError]:
    """Parse JSON lines, yielding a ParsedCommand or a LineError per non-blank, non-comment line."""
    for number, raw in enumerate(lines, start=first_line):
        if number == first_line and raw.startswith(BOM):
            raw = raw[1:]
        item = parse_text(number, raw)
        if item is not None:
            yield item


def read_command_bytes(stream: BinaryIO, first_line: int = 1) -> Iterator[ParsedCommand | LineError]:
    """Like :func:`read_commands` from bytes: each line is decoded on its own, so one bad byte costs one line.

    A line over :data:`~schemas.limits.MAX_LINE_BYTES` is skipped without being held in memory.
    """
    number = first_line - 1
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            size = len(raw)
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line, a bounded piece at a time
                raw = stream.readline(MAX_LINE_BYTES)
                size += len(raw)
            yield LineError(number, f"line of {size} bytes or more is over the limit of {MAX_LINE_BYTES}", "")
            continue
        if number == first_line and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            column = len(raw[: error.start].decode("utf-8", "replace")) + 1
            yield LineError(number, f"not UTF-8: byte 0x{raw[error.start]:02x} at column {column}", "")
            continue
        item = parse_text(number, text)
        if item is not None:
            yield item


# ------------------------------------------------------------ Avro mapping -> JSON


def to_json_value(value: Any) -> Any:
    """An Avro mapping as fastavro reads it -> plain JSON: a union branch becomes {"Type": {...}}, bytes base64."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
        return {value[0].rsplit(".", 1)[-1]: to_json_value(value[1])}
    if isinstance(value, dict):
        return {key: to_json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(item) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def dumps(value: Any) -> str:
    """One compact JSON line for an Avro mapping (keys in schema order)."""
    return json.dumps(to_json_value(value), separators=(",", ":"), ensure_ascii=False)
