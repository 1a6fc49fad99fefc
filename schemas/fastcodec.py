"""Generated Avro codecs for commands and events: fastavro's exact bytes, straight from the dataclasses.

At import, this module walks the parsed Command and Event schemas of :func:`schemas.codec.registry` and
generates (``exec``) one specialised function per record type with every field inlined, so the hot path
never builds the intermediate ``to_avro`` / ``from_avro`` mappings:

- ``encode_event(event)`` / ``encode_command(command)``: the whole single-object frame (``C3 01`` +
  fingerprint + body), byte for byte what ``registry().codec(X).encode(obj.to_avro())`` writes;
- ``decode_command(frame)`` / ``decode_event(frame)``: the dataclasses themselves (tuples for arrays, dicts
  for maps), equal to ``X.from_avro(registry().codec(X).decode(frame))``. A frame of any other fingerprint
  (an older writer schema, or none known) takes exactly that fastavro path, schema resolution included.

Decoding raises :class:`~schemas.codec.DecodeError` on every malformed frame, never anything else. It
rejects everything fastavro rejects and, on purpose, three malformed bodies fastavro lets through
(``STRICT`` lists the messages): a varint longer than 10 bytes or above 64 bits (fastavro wraps it), a
negative union branch index (fastavro counts it from the end of the union) and a block count that
cannot fit in the bytes left (fastavro fails on those too, except for the count -2**63).

Nothing is cached between calls: PodSpec (encoded for PodQueued, then again for PodScheduled) is a
mutable dataclass, so bytes cached by identity could go stale.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from types import MemberDescriptorType
from typing import Any

from schemas import commands, events
from schemas.codec import COMMAND, EVENT, HEADER_SIZE, MAGIC, DecodeError, registry
from schemas.commands import Command, V1Command
from schemas.events import Event
from schemas.records import Record

__all__ = ["STRICT", "decode_command", "decode_event", "encode_command", "encode_event", "source"]

# Messages of the rejections fastavro would not make (see the module docstring).
STRICT = ("varint longer than 10 bytes or above 64 bits", "negative union branch index", "block count")

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_SMALL = 8192  # non-negative ints below this encode by table lookup (1 or 2 bytes)

# ---------------------------------------------------------------- varints


def _varint(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_T = [_varint(z) for z in range(1 << 14)]  # the varint of z < 2**14
_C = [bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14)]  # 14 bits, both bytes continued
_P = _T[0 : 2 * _SMALL : 2]  # the zigzag varint of 0 <= n < _SMALL


def _long(n: int) -> bytes:
    """The zigzag varint of a 64-bit int (the slow path of the generated ``_P[n]`` lookups)."""
    z = n << 1 if n >= 0 else ~(n << 1)
    if z < 268435456:
        return _C[z & 16383] + _T[z >> 14] if z > 16383 else _T[z]
    if z < 4398046511104:
        return _C[z & 16383] + _C[(z >> 14) & 16383] + _T[z >> 28]
    if z >= 18446744073709551616:
        raise OverflowError(f"{n} does not fit in an Avro long")
    if z < 72057594037927936:
        return _C[z & 16383] + _C[(z >> 14) & 16383] + _C[(z >> 28) & 16383] + _T[z >> 42]
    return _C[z & 16383] + _C[(z >> 14) & 16383] + _C[(z >> 28) & 16383] + _C[(z >> 42) & 16383] + _T[z >> 56]


# First byte of a varint -> its value when the varint is that one byte; None (or -1 for a length) when it
# continues. An odd byte is a negative length: _NEGATIVE always runs past the end of the frame.
_NEGATIVE = 1 << 62
_ZD = [(b >> 1) ^ -(b & 1) if b < 128 else None for b in range(256)]
_ZL = [-1 if b >= 128 else _NEGATIVE if b % 2 else b >> 1 for b in range(256)]


def _rlong_source() -> str:
    """Unrolled reader of a varint of 2 to 10 bytes starting at buf[pos] (whose byte is >= 0x80)."""
    lines = ["def _rlong(buf, pos):", "    n = buf[pos] & 127"]
    for i in range(1, 9):
        lines += [
            f"    b = buf[pos + {i}]",
            f"    n |= (b & 127) << {7 * i}",
            "    if b < 128:",
            f"        return (n >> 1) ^ -(n & 1), pos + {i + 1}",
        ]
    lines += [
        "    b = buf[pos + 9]",
        "    if b > 1:",
        f"        raise DecodeError('corrupt Avro body: {STRICT[0]} at offset ' + str(pos))",
        "    n |= b << 63",
        "    return (n >> 1) ^ -(n & 1), pos + 10",
    ]
    return "\n".join(lines) + "\n"


def _length_error(n: int, left: int) -> DecodeError:
    if n < 0 or n == _NEGATIVE:
        return DecodeError("corrupt Avro body: negative length")
    return DecodeError(f"corrupt Avro body: length {n} runs past the end of the frame ({left} bytes left)")


def _count_error(count: int, left: int) -> DecodeError:
    return DecodeError(f"corrupt Avro body: {STRICT[2]} {count} cannot fit in the {left} bytes left")


def _union_error(index: int, size: int) -> DecodeError:
    if index < 0:
        return DecodeError(f"corrupt Avro body: {STRICT[1]} {index}")
    return DecodeError(f"corrupt Avro body: union branch index {index} out of range (union of {size})")


# ---------------------------------------------------------------- the generator


def _type_of(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return schema["type"]
    return schema


class _Generator:
    """Writes the source of the encoders and decoders of one set of record types."""

    def __init__(self, classes: dict[str, type]) -> None:
        self.classes = classes
        self.named: dict[str, dict[str, Any]] = {}
        self.namespace: dict[str, Any] = {
            "DecodeError": DecodeError,
            "_P": _P,
            "_T": _T,
            "_ZD": _ZD,
            "_ZL": _ZL,
            "_long": _long,
            "_new": object.__new__,
            "_pack_d": struct.Struct("<d").pack,
            "_pack_f": struct.Struct("<f").pack,
            "_unpack_d": struct.Struct("<d").unpack_from,
            "_unpack_f": struct.Struct("<f").unpack_from,
            "_length_error": _length_error,
            "_count_error": _count_error,
            "_union_error": _union_error,
        }
        self.chunks: list[str] = [_rlong_source()]
        self.done: dict[tuple[Any, ...], str] = {}
        self.counter = 0
        self.inlining: set[str] = set()

    # ------------------------------------------------------------ helpers

    def resolve(self, schema: Any) -> Any:
        """Named-type references become their record definitions."""
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in self.named:
                self.learn(registry().codec(schema).schema)
            return self.named[schema]
        if isinstance(schema, dict) and schema["type"] in _PRIMITIVES:
            return schema["type"]  # e.g. a long with a logical type
        return schema

    def learn(self, schema: Any) -> None:
        """Record every named record defined inline in a schema."""
        if isinstance(schema, list):
            for branch in schema:
                self.learn(branch)
        elif isinstance(schema, dict):
            kind = schema["type"]
            if kind == "record":
                self.named[schema["name"]] = schema
                for field in schema["fields"]:
                    self.learn(field["type"])
            elif kind == "array":
                self.learn(schema["items"])
            elif kind == "map":
                self.learn(schema["values"])
            elif kind not in _PRIMITIVES:
                raise NotImplementedError(f"fastcodec does not generate {kind!r} types")

    def const(self, value: Any) -> str:
        name = f"_k{self.counter}"
        self.counter += 1
        self.namespace[name] = value
        return name

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def record_class(self, name: str, schema: dict[str, Any]) -> tuple[type, list[str]]:
        cls = self.classes.get(name)
        if cls is None:
            raise NotImplementedError(f"no dataclass for Avro record {name}")
        order = [f.name for f in dataclasses.fields(cls)]
        if sorted(order) != sorted(f["name"] for f in schema["fields"]):
            raise NotImplementedError(f"{cls.__name__} fields {order} differ from the fields of {name}")
        return cls, order

    def min_size(self, schema: Any) -> int:
        """The fewest body bytes a value of this type takes (0 only for null and empty records)."""
        schema = self.resolve(schema)
        kind = _type_of(schema)
        if kind == "null":
            return 0
        if kind == "double":
            return 8
        if kind == "float":
            return 4
        if kind == "record":
            return sum(self.min_size(f["type"]) for f in schema["fields"])
        return 1

    def union_branches(self, schema: list[Any]) -> tuple[int | None, list[tuple[int, Any]]]:
        """(index of the null branch, the other branches) for the unions fastcodec supports."""
        null = None
        others = []
        for index, branch in enumerate(schema):
            resolved = self.resolve(branch)
            if resolved == "null":
                null = index
            else:
                others.append((index, resolved))
        records = [b for _, b in others if _type_of(b) == "record"]
        if len(others) > 1 and len(records) != len(others):
            raise NotImplementedError(f"fastcodec supports unions of records, or null and one type: {schema}")
        return null, others

    # ------------------------------------------------------------ encoders

    def pieces(self, schema: Any, value: str) -> list[str]:
        """Expressions whose bytes, concatenated in order, encode ``value`` (left-to-right evaluation)."""
        schema = self.resolve(schema)
        kind = _type_of(schema)
        if kind == "null":
            return []
        if kind == "boolean":
            return [f'(b"\\x01" if {value} else b"\\x00")']
        if kind in ("int", "long"):
            n = self.fresh("n")
            return [f"(_P[{n}] if 0 <= ({n} := {value}) < {_SMALL} else _long({n}))"]
        if kind == "double":
            return [f"_pack_d({value})"]
        if kind == "float":
            return [f"_pack_f({value})"]
        if kind in ("string", "bytes"):
            s, n = self.fresh("s"), self.fresh("n")
            raw = f"{value}.encode()" if kind == "string" else value
            return [f"(_P[{n}] if ({n} := len({s} := {raw})) < {_SMALL} else _long({n}))", s]
        if kind in ("array", "map"):
            a = self.fresh("a")
            return [f'({self.block_encoder(schema)}({a}) if ({a} := {value}) else b"\\x00")']
        if kind == "record":
            if schema["name"] in self.inlining:  # a recursive record: no inlining into itself
                return [f"{self.record_encoder(schema)}({value})"]
            return self.record_pieces(schema, value)
        if kind == "union":
            return [self.union_piece(schema, value)]
        raise NotImplementedError(f"fastcodec does not encode {kind!r}")

    def record_pieces(self, schema: dict[str, Any], value: str) -> list[str]:
        """A nested record's fields inlined into its parent's pieces; the first piece binds the record."""
        self.inlining.add(schema["name"])
        record, bound, out = self.fresh("r"), False, []
        if value.isidentifier():  # a plain name needs no binding
            record, bound = value, True
        for field in schema["fields"]:
            pieces = self.pieces(field["type"], f"{record if bound else f'({record} := {value})'}.{field['name']}")
            bound = bound or bool(pieces)
            out += pieces
        self.inlining.discard(schema["name"])
        return out

    def record_encoder(self, schema: dict[str, Any], prefix: bytes = b"") -> str:
        name = schema["name"]
        self.record_class(name, schema)
        key = ("encode", name, prefix)
        if key in self.done:
            return self.done[key]
        function = f"_e_{name.rsplit('.', 1)[-1]}{self.counter}"
        self.counter += 1
        self.done[key] = function
        pieces = [self.const(prefix)] if prefix else []
        self.inlining.add(name)
        for field in schema["fields"]:
            pieces += self.pieces(field["type"], f"o.{field['name']}")
        self.inlining.discard(name)
        body = ", ".join(pieces)
        self.chunks.append(f'def {function}(o):\n    return b"".join(({body},))\n')
        return function

    def block_encoder(self, schema: dict[str, Any]) -> str:
        """An array or map of at least one item: one block (count, items) then the 0 that ends it."""
        key = ("block", repr(schema))
        if key in self.done:
            return self.done[key]
        function = self.fresh("_b")
        self.done[key] = function
        count = f"(_P[n] if (n := len(a)) < {_SMALL} else _long(n))"
        if schema["type"] == "array":
            loop, item = "for x in a:", self.pieces(schema["items"], "x")  # record items inlined too
        else:
            loop, item = "for k, x in a.items():", self.pieces("string", "k") + self.pieces(schema["values"], "x")
        self.chunks.append(
            f"def {function}(a):\n"
            f"    out = [{count}]\n"
            f"    {loop}\n"
            f"        out += ({', '.join(item)},)\n"
            '    out.append(b"\\x00")\n'
            '    return b"".join(out)\n'
        )
        return function

    def union_piece(self, schema: list[Any], value: str) -> str:
        null, others = self.union_branches(schema)
        v = self.fresh("u")
        if len(others) == 1 and _type_of(others[0][1]) != "record":
            index, branch = others[0]
            function = self.fresh("_u")
            body = ", ".join([self.const(_long(index)), *self.pieces(branch, "v")])
            self.chunks.append(f'def {function}(v):\n    return b"".join(({body},))\n')
            if null is None:
                return f"{function}({value})"
            return f"({self.const(_long(null))} if ({v} := {value}) is None else {function}({v}))"
        table: dict[type, str] = {}
        for index, branch in others:
            cls, _ = self.record_class(branch["name"], branch)
            table[cls] = self.record_encoder(branch, prefix=_long(index))
        name = self.const(table)  # class -> function name until build() swaps in the functions
        self.namespace.setdefault("_tables", []).append(name)
        if null is None:
            return f"{name}[type({v} := {value})]({v})"
        return f"({self.const(_long(null))} if ({v} := {value}) is None else {name}[type({v})]({v}))"

    # ------------------------------------------------------------ decoders

    def read(self, schema: Any, target: str, pad: str) -> list[str]:
        """Statements that read one value at ``pos`` of ``buf`` (which ends at ``end``) into ``target``."""
        schema = self.resolve(schema)
        kind = _type_of(schema)
        if kind == "null":
            return [f"{pad}{target} = None"]
        if kind in ("int", "long"):
            return [  # varints of up to 3 bytes inline, longer ones in _rlong
                f"{pad}b = buf[pos]",
                f"{pad}if b < 128:",
                f"{pad}    {target} = _ZD[b]",
                f"{pad}    pos += 1",
                f"{pad}elif (c := buf[pos + 1]) < 128:",
                f"{pad}    z = (b & 127) | (c << 7)",
                f"{pad}    {target} = (z >> 1) ^ -(z & 1)",
                f"{pad}    pos += 2",
                f"{pad}elif (d := buf[pos + 2]) < 128:",
                f"{pad}    z = (b & 127) | ((c & 127) << 7) | (d << 14)",
                f"{pad}    {target} = (z >> 1) ^ -(z & 1)",
                f"{pad}    pos += 3",
                f"{pad}else:",
                f"{pad}    {target}, pos = _rlong(buf, pos)",
            ]
        if kind == "boolean":
            return [f"{pad}{target} = buf[pos] != 0", f"{pad}pos += 1"]
        if kind in ("double", "float"):
            size = 8 if kind == "double" else 4
            return [f"{pad}{target}, = _unpack_{kind[0]}(buf, pos)", f"{pad}pos += {size}"]
        if kind in ("string", "bytes"):
            n, q = self.fresh("n"), self.fresh("q")
            value = f"buf[pos:{q}].decode()" if kind == "string" else f"buf[pos:{q}]"
            return [
                f"{pad}{n} = _ZL[buf[pos]]",
                f"{pad}if {n} < 0:",
                f"{pad}    {n}, pos = _rlong(buf, pos)",
                f"{pad}    if {n} < 0:",
                f"{pad}        raise _length_error({n}, end - pos)",
                f"{pad}else:",
                f"{pad}    pos += 1",
                f"{pad}{q} = pos + {n}",
                f"{pad}if {q} > end:",
                f"{pad}    raise _length_error({n}, end - pos)",
                f"{pad}{target} = {value}",
                f"{pad}pos = {q}",
            ]
        if kind in ("array", "map"):
            return self.read_blocks(schema, target, pad)
        if kind == "record":
            return [f"{pad}{target}, pos = {self.record_decoder(schema)}(buf, pos, end)"]
        if kind == "union":
            return self.read_union(schema, target, pad)
        raise NotImplementedError(f"fastcodec does not decode {kind!r}")

    def read_blocks(self, schema: dict[str, Any], target: str, pad: str) -> list[str]:
        is_array = schema["type"] == "array"
        items = schema["items"] if is_array else schema["values"]
        if is_array and _type_of(self.resolve(items)) in ("array", "map"):
            raise NotImplementedError("Record.from_avro keeps nested arrays as lists: not generated")
        if not is_array and _type_of(self.resolve(items)) == "record":
            raise NotImplementedError("Record.from_avro keeps records in maps as mappings: not generated")
        acc, count, item, key, size = (self.fresh(p) for p in ("acc", "c", "x", "k", "z"))
        step = self.min_size(items) + (0 if is_array else 1)
        lines = [
            f"{pad}if buf[pos] == 0:",
            f"{pad}    pos += 1",
            f"{pad}    {target} = {'()' if is_array else '{}'}",
            f"{pad}else:",
            f"{pad}    {acc} = {'[]' if is_array else '{}'}",
            f"{pad}    while True:",
            *self.read("long", count, pad + "        "),
            f"{pad}        if {count} == 0:",
            f"{pad}            break",
            f"{pad}        if {count} < 0:",
            f"{pad}            {count} = -{count}",
            *self.read("long", size, pad + "            "),
        ]
        if step:
            lines += [
                f"{pad}        if {count} * {step} > end - pos:",
                f"{pad}            raise _count_error({count}, end - pos)",
            ]
        lines.append(f"{pad}        for _ in range({count}):")
        if is_array:
            lines += self.read(items, item, pad + "            ")
            lines.append(f"{pad}            {acc}.append({item})")
            lines.append(f"{pad}    {target} = tuple({acc})")
        else:
            lines += self.read("string", key, pad + "            ")
            lines += self.read(items, item, pad + "            ")
            lines.append(f"{pad}            {acc}[{key}] = {item}")
            lines.append(f"{pad}    {target} = {acc}")
        return lines

    def read_union(self, schema: list[Any], target: str, pad: str) -> list[str]:
        self.union_branches(schema)  # refuses unions the encoder would not support either
        index = self.fresh("i")
        lines = self.read("long", index, pad)
        if len(schema) <= 2:
            for position, branch in enumerate(schema):
                lines.append(f"{pad}{'if' if position == 0 else 'elif'} {index} == {position}:")
                lines += self.read(branch, target, pad + "    ")
            lines += [f"{pad}else:", f"{pad}    raise _union_error({index}, {len(schema)})"]
            return lines
        readers = []
        for branch in schema:
            resolved = self.resolve(branch)
            if _type_of(resolved) == "record":
                readers.append(self.record_decoder(resolved))
            else:
                function = self.fresh("_r")
                body = self.read(resolved, "v", "    ")
                self.chunks.append(f"def {function}(buf, pos, end):\n" + "\n".join(body) + "\n    return v, pos\n")
                readers.append(function)
        table = self.const(None)
        self.namespace.setdefault("_readers", []).append((table, readers))
        return [
            *lines,
            f"{pad}if not 0 <= {index} < {len(schema)}:",
            f"{pad}    raise _union_error({index}, {len(schema)})",
            f"{pad}{target}, pos = {table}[{index}](buf, pos, end)",
        ]

    def record_decoder(self, schema: dict[str, Any]) -> str:
        name = schema["name"]
        key = ("decode", name)
        if key in self.done:
            return self.done[key]
        function = f"_d_{name.rsplit('.', 1)[-1]}{self.counter}"
        self.counter += 1
        self.done[key] = function
        body = [f"def {function}(buf, pos, end):", *self.record_body(schema, "    "), "    return o, pos"]
        self.chunks.append("\n".join(body) + "\n")
        return function

    def record_body(self, schema: dict[str, Any], pad: str) -> list[str]:
        """Statements that read a record's fields at ``pos`` and leave the dataclass in ``o``."""
        cls, order = self.record_class(schema["name"], schema)
        local = {f["name"]: f"f_{f['name']}" for f in schema["fields"]}
        body = []
        for field in schema["fields"]:
            body += self.read(field["type"], local[field["name"]], pad)
        slots: list[Any] = [cls.__dict__.get(name) for name in order]
        if hasattr(cls, "__post_init__") or not all(isinstance(s, MemberDescriptorType) for s in slots):
            return [*body, f"{pad}o = {self.const(cls)}({', '.join(local[name] for name in order)})"]
        # What the dataclass __init__ does (every field is given), without its call.
        body.append(f"{pad}o = _new({self.const(cls)})")
        if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            return body + [f"{pad}{self.const(s.__set__)}(o, {local[n]})" for n, s in zip(order, slots, strict=True)]
        return body + [f"{pad}o.{name} = {local[name]}" for name in order]

    def frame_decoder(self, schema: dict[str, Any], fingerprint: bytes, cls: Any) -> str:
        """The public decoder: header check, the top record inline, errors as DecodeError, no trailing bytes.

        Any other header (another writer schema, a bad magic, an unknown fingerprint) and anything
        that is not bytes take ``cls.from_avro(codec.decode(frame))``, the fastavro path.
        """
        function = f"decode_{schema['name'].rsplit('.', 1)[-1].lower()}"
        decode = registry().codec(schema["name"]).decode
        if schema["name"] == COMMAND:
            slow_path = self.const(_slow_command)
        else:
            slow_path = self.const(lambda frame: cls.from_avro(decode(frame)))
        body = [
            f"def {function}(frame):",
            "    if type(frame) is not bytes:",
            "        if not isinstance(frame, (bytearray, memoryview)):",
            f"            return {slow_path}(frame)",
            "        frame = bytes(frame)",
            f"    if frame[:{HEADER_SIZE}] != {self.const(MAGIC + fingerprint)}:",
            f"        return {slow_path}(frame)",
            "    buf = frame",
            f"    pos = {HEADER_SIZE}",
            "    end = len(buf)",
            "    try:",
            *self.record_body(schema, "        "),
            "    except DecodeError:",
            "        raise",
            "    except Exception as error:  # an IndexError past the end, a UnicodeDecodeError, a struct.error",
            '        raise DecodeError(f"corrupt Avro body: {type(error).__name__}: {error}") from error',
            "    if pos != end:",
            '        raise DecodeError(f"{end - pos} trailing bytes after the record")',
            "    return o",
        ]
        self.chunks.append("\n".join(body) + "\n")
        return function

    # ------------------------------------------------------------ assembly

    def build(self) -> dict[str, Any]:
        source = "\n".join(self.chunks)
        namespace = self.namespace
        exec(compile(source, "<schemas.fastcodec generated>", "exec"), namespace)
        for name in namespace.pop("_tables", []):
            namespace[name] = {cls: namespace[function] for cls, function in namespace[name].items()}
        for name, readers in namespace.pop("_readers", []):
            namespace[name] = tuple(namespace[function] for function in readers)
        namespace["__source__"] = source
        return namespace


def _slow_command(frame: Any) -> Command:
    """A command through fastavro (another writer schema): a :class:`V1Command` if contract v1 wrote it."""
    codecs = registry()
    data = codecs.codec(COMMAND).decode(frame)
    version = codecs.released_version(COMMAND, bytes(frame[2:HEADER_SIZE]))
    return (V1Command if version == "v1" else Command).from_avro(data)


def _classes() -> dict[str, type]:
    """Avro full name -> dataclass, for every record of schemas.commands and schemas.events."""
    classes: dict[str, type] = {COMMAND: Command, EVENT: Event}
    for module in (commands, events):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Record) and value is not Record:
                classes[value.AVRO_NAME] = value
    return classes


def _generate() -> tuple[dict[str, Callable[..., Any]], str]:
    classes = _classes()
    generator = _Generator(classes)
    functions = {}
    for name in (COMMAND, EVENT):
        codec = registry().codec(name)
        generator.learn(codec.schema)
        functions[name] = (
            generator.record_encoder(codec.schema, prefix=MAGIC + codec.fingerprint),
            generator.frame_decoder(codec.schema, codec.fingerprint, classes[name]),
        )
    namespace = generator.build()
    built = {}
    for name, (encoder, decoder) in functions.items():
        built["encode " + name] = namespace[encoder]
        built["decode " + name] = namespace[decoder]
    return built, namespace["__source__"]


_BUILT, _SOURCE = _generate()


def source() -> str:
    """The generated source (for reading and debugging)."""
    return _SOURCE


encode_command: Callable[[Command], bytes] = _BUILT["encode " + COMMAND]
encode_event: Callable[[Event], bytes] = _BUILT["encode " + EVENT]
decode_command: Callable[[Any], Command] = _BUILT["decode " + COMMAND]
decode_event: Callable[[Any], Event] = _BUILT["decode " + EVENT]
