"""Every command type of the contract has a handler in the fold, and every event type an applier (or is
named as changing nothing but the position and the clock): a new command or event cannot be forgotten."""

from __future__ import annotations

import pytest

from processor.core import appliers
from processor.core.fold import HANDLERS
from schemas.commands import PAYLOAD_TYPES as COMMAND_TYPES
from schemas.events import PAYLOAD_TYPES as EVENT_TYPES


def missing_handlers() -> list[str]:
    return sorted(name for name, kind in COMMAND_TYPES.items() if kind not in HANDLERS)


def missing_appliers() -> list[str]:
    handled = set(appliers.APPLIERS) | set(appliers.APPLIED_IN_APPLY)
    return sorted(name for name, kind in EVENT_TYPES.items() if kind not in handled)


def test_every_command_has_a_handler() -> None:
    assert missing_handlers() == []


def test_every_event_has_an_applier() -> None:
    assert missing_appliers() == []


def test_a_removed_handler_or_applier_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: without the SubmitPod handler or the PodScheduled applier, they name them."""
    submit = next(kind for name, kind in COMMAND_TYPES.items() if name.endswith("SubmitPod"))
    scheduled = next(kind for name, kind in EVENT_TYPES.items() if name.endswith("PodScheduled"))
    monkeypatch.delitem(HANDLERS, submit)
    monkeypatch.delitem(appliers.APPLIERS, scheduled)
    assert [name.rsplit(".", 1)[-1] for name in missing_handlers()] == ["SubmitPod"]
    assert [name.rsplit(".", 1)[-1] for name in missing_appliers()] == ["PodScheduled"]
