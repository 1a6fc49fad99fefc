"""A log recorded with a released contract still replays: same decisions, same outputs, same state.

``tests/data/recorded/contract-v1.jsonl`` was written once by the processor of
contract v1 (``tests/data/recorded/record.py``) and is never regenerated. Replaying
its command frames with today's code must give, command by command, the outputs
it recorded (events and dead letters decoded with today's reader, so fields added
since then take their defaults), and a final state equal to the one in its last
snapshot. Free-text messages may be reworded; codes, placements and counts may not.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from processor.core.snapshot import from_snapshot, state_hash
from processor.runtime.loop import InputRecord, OutputRecord, PartitionFolder
from schemas.codec import HEADER_SIZE, registry
from schemas.dead_letters import decode_dead_letter
from schemas.fastcodec import decode_event
from schemas.snapshots import decode_snapshot
from schemas.topics import Topics

RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded"
FREE_TEXT = ("message", "error")  # wording may improve; the decision may not change


def load(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RECORDED / name).read_text().splitlines()]


def comparable(value: Any) -> Any:
    """An output as plain data, with free-text fields blanked."""
    if isinstance(value, dict):
        return {key: "" if key in FREE_TEXT else comparable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [comparable(item) for item in value]
    return value


def decoded(topic: str, frame: bytes, topics: Topics) -> Any:
    if topic == topics.events:
        return ("event", comparable(decode_event(frame).to_avro()))
    if topic == topics.dead_letters:
        return ("dead letter", comparable(decode_dead_letter(frame).to_avro()))
    return ("snapshot", state_hash(from_snapshot(decode_snapshot(frame))))


@pytest.fixture(scope="module")
def recorded_v1() -> list[dict[str, Any]]:
    return load("contract-v1.jsonl")


def test_the_recorded_frames_are_of_the_released_contract(recorded_v1: list[dict[str, Any]]) -> None:
    """Every decodable frame of the file carries a fingerprint of contract v1 (so the test keeps its meaning)."""
    v1 = set(registry().versions["v1"].values())
    frames = [base64.b64decode(r["value"]) for r in recorded_v1 if r["kind"] != "command" and r["value"]]
    assert frames and all(frame[2:HEADER_SIZE] in v1 for frame in frames)


def test_replaying_the_v1_log_gives_the_recorded_outputs_and_state(recorded_v1: list[dict[str, Any]]) -> None:
    """Command by command, today's fold publishes what v1 published, and ends in the recorded state."""
    topics = Topics()
    folder = PartitionFolder(0, topics, snapshot_every=500)
    expected: dict[int, list[Any]] = {}
    commands = []
    final = None
    for row in recorded_v1:
        if row["kind"] == "command":
            value = base64.b64decode(row["value"]) if row["value"] is not None else None
            key = row["key"].encode() if row["key"] is not None else None
            commands.append(InputRecord(0, row["offset"], key, value))
        elif row["kind"] == "output":
            expected.setdefault(row["offset"], []).append(decoded(row["topic"], base64.b64decode(row["value"]), topics))
        else:
            final = base64.b64decode(row["value"])
    assert len(commands) > 1000 and final is not None
    mismatches = []
    for record in commands:
        outputs: list[OutputRecord] = []
        folder.fold(record, outputs)
        got = [decoded(output.topic, output.value, topics) for output in outputs]
        if got != expected.get(record.offset, []):
            mismatches.append(record.offset)
    assert mismatches == []
    assert state_hash(folder.state) == state_hash(from_snapshot(decode_snapshot(final)))
