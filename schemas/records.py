"""The base of every command, event and value record: conversion to and from Avro mappings.

Records are slotted dataclasses. ``to_avro`` turns one into the mapping fastavro
writes; ``from_avro`` builds one from the mapping fastavro reads. Nested record
fields are declared once per class with :func:`nest` (field name -> record class);
a list-valued field holds records of that class. Lists become tuples so that
records stay hashable where their fields allow.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar, Self


class Record:
    """Mixin for slotted dataclasses that map one-to-one onto an Avro record."""

    __slots__ = ()
    AVRO_NAME: ClassVar[str] = ""
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.AVRO_NAME:
            cls.AVRO_NAME = "gpufold." + cls.__name__

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        if not vars(cls).get("_FIELDS"):
            cls._FIELDS = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        return cls._FIELDS

    def to_avro(self) -> dict[str, Any]:
        """The mapping fastavro writes for this record."""
        out: dict[str, Any] = {}
        for name in self.field_names():
            value = getattr(self, name)
            if isinstance(value, Record):
                value = value.to_avro()
            elif isinstance(value, tuple):
                value = [item.to_avro() if isinstance(item, Record) else item for item in value]
            out[name] = value
        return out

    @classmethod
    def from_avro(cls, data: dict[str, Any]) -> Self:
        """Build the record from a mapping as fastavro reads it (defaults already filled)."""
        values: dict[str, Any] = {}
        nested = _NESTED.get(cls, _NONE)
        for name in cls.field_names():
            value = data[name]
            kind = nested.get(name)
            if kind is not None:
                if isinstance(value, list):
                    value = tuple(kind.from_avro(item) for item in value)
                elif value is not None:
                    value = kind.from_avro(value)
            elif isinstance(value, list):
                value = tuple(value)
            values[name] = value
        return cls(**values)


_NESTED: dict[type[Record], dict[str, type[Record]]] = {}
_NONE: dict[str, type[Record]] = {}


def nest(cls: type[Record], fields: dict[str, type[Record]]) -> None:
    """Declare the record-valued fields of ``cls`` (field name -> record class; a tuple field holds several)."""
    _NESTED[cls] = fields
