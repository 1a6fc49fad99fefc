"""What became of a command: its final outcome named by what happened to it, and the HTTP status that says so.

A command's events are in the order the fold emitted them, so the first is not always the answer: a
``SubmitPod`` that preempts starts with the victims' ``PodPreempted``, and a ``Release`` may end with
other pods' ``PodScheduled`` from the queue. :func:`final_outcome` names the last event that answers
the command about its own subject (the pod, gang or node it names), or ``CommandRejected``.

Status codes of a write (``?wait``): 200 when every command was accepted, 409 when one was refused for
the state it met (with its ``CommandRejected``), 422 when every refusal was for a malformed command
(codes in :data:`MALFORMED`), and 202 while an outcome is not in yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpufold.jsonl import to_json_value
from schemas.codes import RejectionCode
from schemas.events import CommandRejected, Event

# The events that answer each command (the last one about its subject is the final outcome).
ANSWERS: dict[str, tuple[str, ...]] = {
    "AddNode": ("NodeAdded",),
    "RemoveNode": ("NodeRemoved",),
    "CordonNode": ("NodeCordoned",),
    "UncordonNode": ("NodeUncordoned",),
    "DrainNode": ("NodeDrained",),
    "MarkNodeFailed": ("NodeFailed",),
    "SubmitPod": ("PodScheduled", "PodQueued"),
    "Release": ("PodReleased",),
    "SetPolicy": ("PolicyChanged",),
    "SubmitGang": ("GangScheduled", "GangQueued"),
    "ReleaseGang": ("GangReleased",),
    "Tick": ("Ticked",),
    "SetQuota": ("QuotaChanged",),
    "RemoveQuota": ("QuotaChanged",),
    "SetCohort": ("CohortChanged",),
    "RemoveCohort": ("CohortChanged",),
    "Defragment": ("DefragmentationPlanned",),
}

# Refusals of a command that is malformed whatever the state (HTTP 422); others are conflicts (409).
MALFORMED = frozenset(
    {
        RejectionCode.INVALID_COMMAND,
        RejectionCode.INVALID_RESOURCES,
        RejectionCode.TOO_LARGE,
        RejectionCode.TIME_OUT_OF_RANGE,
        RejectionCode.UNKNOWN_POLICY,
    }
)


def event_json(event: Event) -> dict[str, Any]:
    """An event as JSON: the envelope's fields, the payload as ``{"Type": {...}}`` (as ``gpufold events --json``)."""
    return to_json_value(event.to_avro())  # type: ignore[no-any-return]


def subject_of(payload: Any) -> str | None:
    """The id a command or event is about: its pod, gang or node (None for cluster-wide ones)."""
    pod = getattr(payload, "pod", None)
    if pod is not None:
        return str(pod.pod_id)
    for name in ("pod_id", "gang_id", "node_id"):
        value = getattr(payload, name, None)
        if isinstance(value, str):
            return value
    return None


def final_outcome(command_type: str, subject: str | None, events: Sequence[Event]) -> str:
    """The name of what happened to the command: ``CommandRejected``, or the last event answering it."""
    if not events:
        return "none"
    if isinstance(events[0].payload, CommandRejected):
        return "CommandRejected"
    answers = ANSWERS.get(command_type, ())
    found = ""
    for event in events:
        name = type(event.payload).__name__
        if name in answers and (subject is None or subject_of(event.payload) == subject):
            found = name
    return found or type(events[0].payload).__name__


def rejection(events: Sequence[Event]) -> CommandRejected | None:
    """The refusal, if the command was refused (a refusal is the command's only event)."""
    if events and isinstance(events[0].payload, CommandRejected):
        return events[0].payload
    return None


def write_status(rejections: Iterable[CommandRejected | None], complete: bool) -> int:
    """The HTTP status of a write whose outcomes are in (see the module docstring)."""
    refused = [r for r in rejections if r is not None]
    if refused:
        return 422 if all(r.code in MALFORMED for r in refused) else 409
    return 200 if complete else 202
