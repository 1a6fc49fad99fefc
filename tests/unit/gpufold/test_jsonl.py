"""JSON-lines commands: schema field names, defaults filled, bad lines reported by number and skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold.jsonl import (
    JsonCommandError,
    LineError,
    ParsedCommand,
    command_types,
    dumps,
    parse_command,
    parse_line,
    read_commands,
    to_json_value,
)
from schemas import COMMAND, registry
from schemas.commands import Command, SubmitPod, Taint

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "commands.jsonl"


def envelope(payload: dict[str, object], **fields: object) -> dict[str, object]:
    return {"command_id": "c1", "cluster": "lab", "issued_at": 1_000, "payload": payload, **fields}


def test_defaults_from_the_schema_fill_omitted_fields() -> None:
    """A SubmitPod with only pod_id gets every schema default, and the envelope's source defaults to empty."""
    record = parse_command(envelope({"SubmitPod": {"pod_id": "p1"}}))
    assert record["source"] == ""
    assert record["payload"] == (
        "gpufold.SubmitPod",
        {
            "pod_id": "p1",
            "tenant": "default",
            "priority": 0,
            "num_gpu": 0,
            "gpu_milli": 0,
            "cpu_milli": 0,
            "memory_mib": 0,
            "gpu_models": [],
            "node_selector": {},
            "tolerations": [],
            "time_limit_ms": None,
            "depends_on": [],
            "dependency": "afterok",
            "preemption": "lower_priority",
            "movable": False,
            "gpu_memory_mib": 0,
            "retry": None,
            "preemptible": True,
        },
    )


def test_parsed_line_decodes_to_the_same_command() -> None:
    """The frame of a parsed line decodes to the Command the line describes, nested records included."""
    line = json.dumps(
        envelope(
            {
                "AddNode": {
                    "node_id": "n1",
                    "gpu_model": "T4",
                    "gpu_count": 2,
                    "cpu_milli": 8000,
                    "memory_mib": 1024,
                    "taints": [{"key": "gpu"}],
                }
            },
            source="test",
        )
    )
    parsed = ParsedCommand(1, parse_line(line))
    command = Command.from_avro(registry().codec(COMMAND).decode(parsed.frame()))
    assert command.source == "test" and parsed.key == b"lab"
    assert command.payload.taints == (Taint("gpu", "", "NoSchedule"),)  # type: ignore[union-attr]


def test_full_type_name_and_iso_time_are_accepted() -> None:
    """The payload may name its type gpufold.SubmitPod; issued_at may be an ISO-8601 time with a zone."""
    record = parse_command(envelope({"gpufold.Release": {"pod_id": "p"}}, issued_at="2026-01-01T00:00:01.5Z"))
    assert record["payload"][0] == "gpufold.Release"
    assert record["issued_at"] == 1_767_225_601_500


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cluster": "lab", "issued_at": 1, "payload": {"Release": {"pod_id": "p"}}}, "command_id: missing required"),
        (envelope({"Launch": {}}), "payload: unknown type 'Launch'"),
        (envelope({"SubmitPod": {"pod_id": "p"}, "Release": {"pod_id": "p"}}), "exactly one key"),
        (envelope({"SubmitPod": {"pod_id": "p", "cpu_mili": 1}}), "unknown field 'cpu_mili' in SubmitPod"),
        (
            envelope({"SubmitPod": {"pod_id": "p", "cpu_milli": "4000"}}),
            "payload.SubmitPod.cpu_milli: expected an integer",
        ),
        (envelope({"SubmitPod": {"pod_id": "p", "num_gpu": True}}), "num_gpu: expected an integer"),
        (envelope({"SubmitPod": {"pod_id": "p", "num_gpu": 1 << 31}}), "does not fit in an Avro int"),
        (envelope({"SubmitPod": {"pod_id": 7}}), "pod_id: expected a string"),
        (envelope({"SubmitPod": {"pod_id": "p", "gpu_models": "A100"}}), "gpu_models: expected a list"),
        (envelope({"SubmitPod": {"pod_id": "p", "tolerations": [{"kee": "x"}]}}), "tolerations[0]: unknown field"),
        (envelope({"RemoveNode": {"node_id": "n", "force": "yes"}}), "force: expected true or false"),
        (envelope({"Release": {"pod_id": "p"}}, issued_at="2026-01-01T00:00:00"), "has no time zone"),
        (envelope({"Release": {"pod_id": "p"}}, issued_at="yesterday"), "not an ISO-8601 time"),
        (envelope({"Release": {"pod_id": "p"}}, extra=1), "unknown field 'extra' in Command"),
    ],
)
def test_shape_errors_name_the_field_and_reason(data: dict[str, object], message: str) -> None:
    """A command that does not match the schema is refused with the path of the bad field and why."""
    with pytest.raises(JsonCommandError) as caught:
        parse_command(data)
    assert message in str(caught.value)


def test_domain_checks_are_left_to_the_fold() -> None:
    """A negative size is well-formed JSON for the schema: it parses, and the fold will reject it."""
    record = parse_command(envelope({"SubmitPod": {"pod_id": "p", "memory_mib": -1}}))
    assert record["payload"][1]["memory_mib"] == -1


def test_bad_lines_are_reported_with_their_number_and_the_rest_goes_on() -> None:
    """read_commands yields a LineError for each bad line, with its number, and parses the lines after it."""
    good = json.dumps(envelope({"Release": {"pod_id": "p"}}))
    lines = [good, "", "# a comment", "{not json", "[1, 2]", good.replace('"c1"', '"c2"')]
    items = list(read_commands(lines))
    assert [type(item) for item in items] == [ParsedCommand, LineError, LineError, ParsedCommand]
    assert [item.line for item in items] == [1, 4, 5, 6]
    assert str(items[1]).startswith("line 4: not JSON")
    assert "expected a JSON object" in str(items[2])
    assert items[3].record["command_id"] == "c2"  # type: ignore[union-attr]


def test_example_file_has_exactly_one_bad_line() -> None:
    """examples/commands.jsonl (used by the README) parses except for its one deliberately broken line."""
    with EXAMPLES.open(encoding="utf-8") as lines:
        items = list(read_commands(lines))
    errors = [item for item in items if isinstance(item, LineError)]
    assert len(errors) == 1 and "not JSON" in errors[0].reason
    types = {item.record["payload"][0] for item in items if isinstance(item, ParsedCommand)}
    assert {"gpufold.AddNode", "gpufold.SubmitPod", "gpufold.Release", "gpufold.DrainNode"} <= types


def test_json_round_trip_of_a_command() -> None:
    """to_json_value writes the payload as {"Type": {...}}; parsing that JSON gives the same mapping back."""
    command = Command("c9", "lab", 5, SubmitPod("p", num_gpu=1, gpu_milli=300, gpu_models=("T4",)), "src")
    mapping = registry().codec(COMMAND).decode(registry().codec(COMMAND).encode(command.to_avro()))
    text = dumps(mapping)
    assert json.loads(text)["payload"]["SubmitPod"]["gpu_milli"] == 300
    assert parse_line(text) == mapping


def test_bytes_become_base64_in_json() -> None:
    """Bytes (dead-letter keys and values) are written as base64 text."""
    assert to_json_value({"value": b"\xc3\x01"}) == {"value": "wwE="}


def test_command_types_lists_the_payload_union() -> None:
    """The command types a JSON line may use are the branches of the schema's payload union."""
    assert command_types()[0] == "AddNode" and "SetPolicy" in command_types() and len(command_types()) == 22
    assert command_types()[12:22] == [
        "SetQuota",
        "RemoveQuota",
        "Defragment",
        "ResumeCluster",
        "RecoverNode",
        "UpdateNode",
        "SetDisruptionBudget",
        "RemoveDisruptionBudget",
        "SetCohort",
        "RemoveCohort",
    ]
