"""The generator of the Avro codecs for commands and events: fastavro's exact bytes, straight from the dataclasses.

It walks the parsed Command and Event schemas of :func:`schemas.codec.registry` and writes the source of
``schemas/fastcodec_generated.py``: one specialised, typed function per record type with every field
inlined, so the hot path never builds the intermediate ``to_avro`` / ``from_avro`` mappings. The module
is generated ahead of time (``python -m schemas.fastcodec_gen`` rewrites it; a test checks that the
checked-in file equals :func:`module_source`), so it is a real module that mypyc compiles with the fold.
What the functions do and refuse is said in ``schemas/fastcodec.py``.

Nothing is cached between calls: PodSpec (encoded for PodQueued, then again for PodScheduled) is a
mutable dataclass, so bytes cached by identity could go stale.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from schemas import commands, events
from schemas.avro_binary import _NEGATIVE, SMALL, STRICT, _long
from schemas.codec import COMMAND, EVENT, HEADER_SIZE, MAGIC, registry
from schemas.commands import Command
from schemas.events import Event
from schemas.records import Record

__all__ = ["GENERATED", "main", "module_source"]

GENERATED = Path(__file__).with_name("fastcodec_generated.py")

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_SMALL = SMALL
assert _NEGATIVE > 0


def _rlong_source() -> str:
    """Unrolled reader of a varint of 2 to 10 bytes starting at buf[pos] (whose byte is >= 0x80)."""
    lines = ["def _rlong(buf: bytes, pos: int) -> tuple[int, int]:", "    n = buf[pos] & 127"]
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
        self.constants: list[str] = []  # module-level definitions before the functions
        self.late: list[str] = []  # definitions that name functions (tables), after them
        self.aliases: dict[type, str] = {}  # record class -> the name the generated module imports it as
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

    def const(self, value: bytes) -> str:
        name = f"_k{self.counter}"
        self.counter += 1
        self.constants.append(f"{name} = {value!r}")
        return name

    def alias(self, cls: type) -> str:
        """The generated module's name for a record class (imported under it)."""
        if cls not in self.aliases:
            self.aliases[cls] = f"_c_{cls.__name__}"
        return self.aliases[cls]

    def annotation(self, schema: Any) -> str:
        """The Python type of a decoded value of this schema (unions: Any)."""
        schema = self.resolve(schema)
        kind = _type_of(schema)
        simple = {"null": "None", "boolean": "bool", "int": "int", "long": "int", "float": "float", "double": "float"}
        if kind in simple:
            return simple[kind]
        if kind == "string":
            return "str"
        if kind == "bytes":
            return "bytes"
        if kind == "array":
            return "tuple[Any, ...]"
        if kind == "map":
            return "dict[str, Any]"
        if kind == "record":
            return self.alias(self.record_class(schema["name"], schema)[0])
        return "Any"

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
        cls, _ = self.record_class(name, schema)
        self.chunks.append(f'def {function}(o: {self.alias(cls)}) -> bytes:\n    return b"".join(({body},))\n')
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
            f"def {function}(a: Any) -> bytes:\n"
            f"    out: list[bytes] = [{count}]\n"
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
            self.chunks.append(f'def {function}(v: Any) -> bytes:\n    return b"".join(({body},))\n')
            if null is None:
                return f"{function}({value})"
            return f"({self.const(_long(null))} if ({v} := {value}) is None else {function}({v}))"
        entries = []
        for index, branch in others:
            cls, _ = self.record_class(branch["name"], branch)
            entries.append(f"    {self.alias(cls)}: {self.record_encoder(branch, prefix=_long(index))},")
        name = f"_k{self.counter}"
        self.counter += 1
        self.late.append(f"{name}: dict[type, Callable[[Any], bytes]] = {{\n" + "\n".join(entries) + "\n}")
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
            f"{pad}    {acc}: {'list[Any]' if is_array else 'dict[str, Any]'} = {'[]' if is_array else '{}'}",
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
                signature = f"def {function}(buf: bytes, pos: int, end: int) -> tuple[Any, int]:\n"
                self.chunks.append(signature + "\n".join(body) + "\n    return v, pos\n")
                readers.append(function)
        table = f"_k{self.counter}"
        self.counter += 1
        self.late.append(f"{table}: tuple[Callable[[bytes, int, int], tuple[Any, int]], ...] = ({', '.join(readers)},)")
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
        cls, _ = self.record_class(name, schema)
        body = [
            f"def {function}(buf: bytes, pos: int, end: int) -> tuple[{self.alias(cls)}, int]:",
            *self.record_body(schema, "    "),
            "    return o, pos",
        ]
        self.chunks.append("\n".join(body) + "\n")
        return function

    def record_body(self, schema: dict[str, Any], pad: str) -> list[str]:
        """Statements that read a record's fields at ``pos`` and leave the dataclass in ``o``."""
        cls, order = self.record_class(schema["name"], schema)
        local = {f["name"]: f"f_{f['name']}" for f in schema["fields"]}
        body = [f"{pad}{local[f['name']]}: {self.annotation(f['type'])}" for f in schema["fields"]]
        for field in schema["fields"]:
            body += self.read(field["type"], local[field["name"]], pad)
        # The constructor, called directly: a compiled record's is a C call (slot writes would be attribute sets).
        return [*body, f"{pad}o = {self.alias(cls)}({', '.join(local[name] for name in order)})"]

    def frame_decoder(self, schema: dict[str, Any], fingerprint: bytes, cls: Any) -> str:
        """The public decoder: header check, the top record inline, errors as DecodeError, no trailing bytes.

        Any other header (another writer schema, a bad magic, an unknown fingerprint) and anything
        that is not bytes take ``cls.from_avro(codec.decode(frame))``, the fastavro path.
        """
        function = f"decode_{schema['name'].rsplit('.', 1)[-1].lower()}"
        slow_path = "_slow_command" if schema["name"] == COMMAND else "_slow_event"
        body = [
            f"def {function}(frame: Any) -> {self.alias(cls)}:",
            "    if type(frame) is not bytes:",
            "        if not isinstance(frame, (bytearray, memoryview)):",
            f"            return {slow_path}(frame)",
            "        frame = bytes(frame)",
            f"    if frame[:{HEADER_SIZE}] != {self.const(MAGIC + fingerprint)}:",
            f"        return {slow_path}(frame)",
            "    buf: bytes = frame",
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

    def module(self, public: dict[str, str]) -> str:
        """The whole generated module; ``public`` maps its public names to generated functions."""
        imports: dict[str, list[str]] = {}
        for cls, alias in sorted(self.aliases.items(), key=lambda item: item[1]):
            imports.setdefault(cls.__module__, []).append(f"    {cls.__name__} as {alias},")
        parts = [
            '"""Generated by ``python -m schemas.fastcodec_gen`` from the Avro schemas: do not edit.',
            "",
            "The encoders and decoders that ``schemas/fastcodec.py`` exports (read that module for what they do).",
            "tests/unit/schemas/test_fastcodec.py checks that this file equals what the generator writes now.",
            '"""',
            "",
            "# fmt: off",
            "from __future__ import annotations",
            "",
            "from collections.abc import Callable",
            "from typing import Any",
            "",
            "from schemas.avro_binary import (",
            *(
                f"    {name},"
                for name in (
                    "_P",
                    "_T",
                    "_ZD",
                    "_ZL",
                    "_count_error",
                    "_length_error",
                    "_long",
                    "_pack_d",
                    "_pack_f",
                    "_slow_command",
                    "_slow_event",
                    "_union_error",
                    "_unpack_d",
                    "_unpack_f",
                )
            ),
            ")",
            "from schemas.codec import DecodeError",
        ]
        for module in sorted(imports):
            parts += [f"from {module} import (", *imports[module], ")"]
        parts += ["", "__all__ = [" + ", ".join(f'"{name}"' for name in sorted(public)) + "]", ""]
        parts += self.constants
        parts += ["", ""]
        parts.append("\n\n".join(self.chunks))
        parts += ["", *("\n".join([item, ""]) for item in self.late)]
        parts += [f"{name} = {function}" for name, function in sorted(public.items())]
        text = "\n".join(parts)
        while "\n\n\n\n" in text:
            text = text.replace("\n\n\n\n", "\n\n\n")
        return text.rstrip("\n") + "\n"


def _classes() -> dict[str, type]:
    """Avro full name -> dataclass, for every record of schemas.commands and schemas.events."""
    classes: dict[str, type] = {COMMAND: Command, EVENT: Event}
    for module in (commands, events):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Record) and value is not Record:
                classes[value.AVRO_NAME] = value
    return classes


def module_source() -> str:
    """The source of ``schemas/fastcodec_generated.py`` for today's schemas and record classes."""
    classes = _classes()
    generator = _Generator(classes)
    public = {}
    for name, noun in ((COMMAND, "command"), (EVENT, "event")):
        codec = registry().codec(name)
        generator.learn(codec.schema)
        public["encode_" + noun] = generator.record_encoder(codec.schema, prefix=MAGIC + codec.fingerprint)
        public["decode_" + noun] = generator.frame_decoder(codec.schema, codec.fingerprint, classes[name])
    return generator.module(public)


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check``, compare) ``schemas/fastcodec_generated.py``."""
    args = sys.argv[1:] if argv is None else argv
    text = module_source()
    if "--check" in args:
        if GENERATED.read_text() != text:
            print(f"{GENERATED} is stale: run python -m schemas.fastcodec_gen", file=sys.stderr)
            return 1
        return 0
    GENERATED.write_text(text)
    print(f"wrote {GENERATED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
