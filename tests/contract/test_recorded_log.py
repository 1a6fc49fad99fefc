"""A log recorded with a released contract still replays: same decisions, same outputs, same state.

``tests/data/recorded/contract-v1*.jsonl`` were written once by the processor of
contract v1 (``tests/data/recorded/record.py``; the ``-policies`` file switches
between all ten placement policies) and are never regenerated. Replaying their
command frames with today's code must give, command by command, the outputs they
recorded, compared in the fields v1 had (today's outputs are read back with the v1
schemas, so what was added since is left out), and the final state of the last
snapshot. Free-text messages may be reworded; codes, placements and counts may not.

The frames are of contract v1, so they decode to ``V1Command`` and keep v1's
semantics where today's differ (event time of late commands, no reservations): the
outputs must match exactly. ``test_a_v1_log_written_today_folds_with_todays_rules``
shows the same commands written with today's contract do get today's rules.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import schemas
from logs.port import InputRecord, OutputRecord
from processor.core.snapshot import to_snapshot
from processor.runtime.loop import PartitionFolder
from schemas.codec import HEADER_SIZE, DecodeError, registry
from schemas.commands import Command
from schemas.fastcodec import decode_command, decode_event, encode_command
from schemas.snapshots import encode_snapshot
from schemas.topics import Topics

RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded"
LOGS = {
    "contract-v1.jsonl": "v1",
    "contract-v1-policies.jsonl": "v1",
    "contract-v2.jsonl": "v2",
    "contract-v3.jsonl": "v3",
}
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


def _named(version: str) -> dict[str, Any]:
    """Every named type of a released version's .avsc files, by full name."""
    named: dict[str, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if node.get("type") == "record":
                named[f"gpufold.{node['name'].split('.')[-1]}"] = node
                for field in node["fields"]:
                    walk(field["type"])
            else:
                for key in ("items", "values", "type"):
                    if key in node:
                        walk(node[key])

    folder = Path(schemas.__file__).parent / "history" / version
    for path in sorted(folder.glob("*.avsc")):
        walk(json.loads(path.read_text()))
    return named


NAMED = {version: _named(version) for version in sorted(set(LOGS.values()))}


def project(schema: Any, value: Any, named: dict[str, Any]) -> Any:
    """A value decoded with today's schema, cut down to the fields of a released version's schema."""
    if isinstance(schema, str):
        if schema in named or f"gpufold.{schema}" in named:
            return project(named.get(schema) or named[f"gpufold.{schema}"], value, named)
        return value
    if isinstance(schema, list):
        if isinstance(value, tuple):  # a record branch, (name, body)
            name, body = value
            for branch in schema:
                branch = named.get(branch, branch) if isinstance(branch, str) else branch
                if isinstance(branch, dict) and f"gpufold.{branch['name'].split('.')[-1]}" == name:
                    return (name, project(branch, body, named))
            return ("not in the release: " + name, body)
        return value
    kind = schema["type"]
    if kind == "record":
        return {field["name"]: project(field["type"], value[field["name"]], named) for field in schema["fields"]}
    if kind == "array":
        return [project(schema["items"], item, named) for item in value]
    if kind == "map":
        return {key: project(schema["values"], item, named) for key, item in value.items()}
    return project(kind, value, named) if isinstance(kind, (dict, list)) else value


def in_release(frame: bytes, version: str) -> Any:
    """A frame of any known writer schema, decoded today and cut down to a release's fields of its record."""
    codecs = registry()
    writer = codecs.writer_schema(frame[2:HEADER_SIZE])
    assert writer is not None, f"unknown fingerprint {frame[2:HEADER_SIZE].hex()}"
    return project(NAMED[version][writer["name"]], codecs.codec(writer["name"]).decode(frame), NAMED[version])


def outputs_of(commands: list[InputRecord], version: str) -> Iterator[tuple[int, list[tuple[str, Any]], int]]:
    """Today's outputs per command (topic, the release's view) and the clock before it."""
    folder = PartitionFolder(0, Topics(), snapshot_every=500)
    for record in commands:
        clock = folder.state.clock
        out: list[OutputRecord] = []
        folder.fold(record, out)
        yield record.offset, [(o.topic, comparable(in_release(o.value, version))) for o in out], clock


def recorded_log(name: str) -> tuple[list[InputRecord], dict[int, list[tuple[str, Any]]], bytes]:
    version = LOGS[name]
    commands: list[InputRecord] = []
    expected: dict[int, list[tuple[str, Any]]] = {}
    final = b""
    for row in load(name):
        value = base64.b64decode(row["value"]) if row["value"] is not None else None
        if row["kind"] == "command":
            key = row["key"].encode() if row["key"] is not None else None
            commands.append(InputRecord(0, row["offset"], key, value))
        elif row["kind"] == "output":
            assert value is not None
            expected.setdefault(row["offset"], []).append((row["topic"], comparable(in_release(value, version))))
        else:
            assert value is not None
            final = value
    return commands, expected, final


@pytest.mark.parametrize("name", LOGS)
def test_the_recorded_frames_are_of_the_released_contract(name: str) -> None:
    """Every decodable frame of the file carries a fingerprint of its release (so the test keeps its meaning)."""
    released = set(registry().versions[LOGS[name]].values())
    frames = [base64.b64decode(r["value"]) for r in load(name) if r["kind"] != "command" and r["value"]]
    assert frames and all(frame[2:HEADER_SIZE] in released for frame in frames)


@pytest.mark.parametrize("name", LOGS)
def test_replaying_a_released_log_gives_the_recorded_outputs_and_state(name: str) -> None:
    """Command by command, today's fold publishes what the release published (in its fields), and ends in the
    same state."""
    version = LOGS[name]
    commands, expected, final = recorded_log(name)
    assert len(commands) > 1000 and final
    mismatches = [offset for offset, got, _ in outputs_of(commands, version) if got != expected.get(offset, [])]
    assert mismatches == []
    folder = PartitionFolder(0, Topics(), snapshot_every=0)
    for record in commands:
        folder.fold(record, [])
    now = comparable(in_release(encode_snapshot(to_snapshot(folder.state)), version))
    assert now == comparable(in_release(final, version))


def test_a_v1_log_written_today_folds_with_todays_rules() -> None:
    """Re-encoded with today's contract, the same commands fold at the clock and may reserve nodes."""
    commands, _, _ = recorded_log("contract-v1.jsonl")
    today = []
    for record in commands:
        if record.value is not None:
            try:
                command = decode_command(record.value)
            except DecodeError:
                today.append(record)
                continue
            assert command.contract == "v1"
            fresh = Command(command.command_id, command.cluster, command.issued_at, command.payload, command.source)
            record = InputRecord(record.partition, record.offset, record.key, encode_command(fresh))
        today.append(record)
    folder = PartitionFolder(0, Topics(), snapshot_every=0)
    late = reserved = 0
    for record in today:
        clocks = {name: cluster.clock for name, cluster in folder.state.clusters.items()}
        out: list[OutputRecord] = []
        folder.fold(record, out)
        for output in out:
            if output.topic != Topics().events:
                continue
            event = decode_event(output.value)
            assert event.occurred_at >= clocks.get(event.cluster, 0)  # never back in time on its cluster's clock
            late += event.occurred_at > decode_command(record.value).issued_at  # type: ignore[arg-type]
            reserved += event.type_name == "NodesReserved"
    assert late > 0 and reserved > 0
