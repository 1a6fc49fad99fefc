"""Every event type of the contract has a projector decision: a handler, or a reason it is not projected."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import schemas
from projections import handlers


def event_types_of_the_schema() -> list[str]:
    """The names in the payload union of schemas/event.avsc (the contract, not our copy of it)."""
    schema = json.loads((Path(schemas.__file__).parent / "event.avsc").read_text())
    (payload,) = [field for field in schema["fields"] if field["name"] == "payload"]
    return [branch["name"] if isinstance(branch, dict) else branch.rsplit(".", 1)[-1] for branch in payload["type"]]


def undecided() -> list[str]:
    """Event types of the schema that neither have a handler nor are listed as not projected."""
    handled = {kind.__name__ for kind in handlers.HANDLERS}
    return [name for name in event_types_of_the_schema() if name not in handled and name not in handlers.NOT_PROJECTED]


def test_every_event_type_is_handled_or_listed_as_not_projected() -> None:
    """No event type of the schema is silently skipped by the projector."""
    assert undecided() == []


def test_no_event_type_is_both_handled_and_not_projected() -> None:
    """A type with a handler is not also listed as not projected, and the list names only real types."""
    handled = {kind.__name__ for kind in handlers.HANDLERS}
    assert handled.isdisjoint(handlers.NOT_PROJECTED)
    assert set(handlers.NOT_PROJECTED) <= set(event_types_of_the_schema())
    assert handled <= set(event_types_of_the_schema())


def test_a_removed_handler_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing one handler (here PodMigrated's) makes the completeness check name that event type."""
    table = dict(handlers.HANDLERS)
    (migrated,) = [kind for kind in table if kind.__name__ == "PodMigrated"]
    del table[migrated]
    monkeypatch.setattr(handlers, "HANDLERS", table)
    assert undecided() == ["PodMigrated"]


def test_a_new_event_type_in_the_schema_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event type added to the schema with no decision is named."""
    names = [*event_types_of_the_schema(), "PodResized"]
    monkeypatch.setattr(sys.modules[__name__], "event_types_of_the_schema", lambda: names)
    assert undecided() == ["PodResized"]
