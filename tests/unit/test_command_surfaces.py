"""Every command of schemas/command.avsc reaches every way in without hand-written code per command.

The JSON-lines reader (gpufold.jsonl) decodes any command; the publisher sends any payload
(``publish_payload``); ``gpufold publish`` derives a verb per command type (``--payload JSON`` where no
flags of its own were written); ``POST /v1/commands`` accepts any command. These tests read the command
types from the schema file itself, so a new command that one of them misses is named here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

import schemas
from gpufold.cli import build_parser
from gpufold.cli_commands import kafka as kafka_cli
from gpufold.server.commands_json import payload_types
from kafka_settings.config import load
from producers.publisher import CommandPublisher, InvalidCommand
from schemas import COMMAND, registry
from schemas.commands import Command


def schema_command_types() -> list[str]:
    """The payload union of schemas/command.avsc, short names, in the schema's order."""
    schema = json.loads((Path(schemas.__file__).parent / "command.avsc").read_text())
    (payload,) = [field for field in schema["fields"] if field["name"] == "payload"]
    return [branch["name"] for branch in payload["type"]]


def record_schemas() -> dict[str, dict[str, Any]]:
    """Every named record of the command schema, by short name."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if node.get("type") == "record":
                found[node["name"]] = node
            for value in node.values():
                walk(value)

    walk(json.loads((Path(schemas.__file__).parent / "command.avsc").read_text()))
    return found


def sample(schema: Any, records: dict[str, dict[str, Any]]) -> Any:
    """A JSON value of this Avro type (required fields only): strings "s1", numbers 1, the first enum symbol."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return None if len(branches) < len(schema) else sample(branches[0], records)
    if isinstance(schema, str):
        name = schema.rsplit(".", 1)[-1]
        if name in records:
            return sample(records[name], records)
        return {"string": "s1", "int": 1, "long": 1, "boolean": False, "float": 1.0, "double": 1.0}[schema]
    kind = schema["type"]
    if kind == "record":
        return {f["name"]: sample(f["type"], records) for f in schema["fields"] if "default" not in f}
    if kind == "enum":
        return schema["symbols"][0]
    if kind == "array":
        return []
    if kind == "map":
        return {}
    return sample(kind, records)


def publish_verb_parsers() -> dict[str, argparse.ArgumentParser]:
    """The sub-commands of ``gpufold publish`` as the CLI builds them."""
    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    publish = top.choices["publish"]
    verbs = next(a for a in publish._actions if isinstance(a, argparse._SubParsersAction))
    return dict(verbs.choices)


def test_every_command_type_has_a_publish_verb() -> None:
    """`gpufold publish <verb>` exists for every command of the schema (submit-pod, set-quota, defragment, ...)."""
    verbs = publish_verb_parsers()
    missing = [name for name in schema_command_types() if kafka_cli.verb_of(name) not in verbs]
    assert missing == []


def test_a_new_command_type_gets_a_verb_without_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command added to the schema (here a made-up ResizeGang) gets `gpufold publish resize-gang --payload`."""
    import gpufold.jsonl

    names = [*gpufold.jsonl.command_types(), "ResizeGang"]
    monkeypatch.setattr(gpufold.jsonl, "command_types", lambda: names)
    verbs = publish_verb_parsers()
    assert "resize-gang" in verbs
    assert any("--payload" in action.option_strings for action in verbs["resize-gang"]._actions)


def test_the_http_api_accepts_every_command_type() -> None:
    """POST /v1/commands parses every command type of the schema (its pydantic models derive from it)."""
    assert sorted(payload_types()) == sorted(schema_command_types())


@pytest.mark.parametrize("type_name", schema_command_types())
def test_the_publisher_sends_every_command_type(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A payload of each type, from JSON as `gpufold publish VERB --payload` reads it, goes out through
    ``publish_payload`` as one command frame of that type (or is refused by the stateless checks, by code)."""
    records = record_schemas()
    payload = kafka_cli.payload_from_json(type_name, json.dumps(sample(records[type_name], records)))
    publisher = CommandPublisher(load(bootstrap="127.0.0.1:1", environ={}), "t.commands", clock=lambda: 1.0)
    sent: list[tuple[bytes | None, bytes]] = []
    monkeypatch.setattr(publisher, "send", lambda key, value: sent.append((key, value)))
    try:
        command_id = publisher.publish_payload("lab", payload, command_id="c1")
    except InvalidCommand as refused:  # the sample broke a stateless rule: still a decision, not a crash
        assert refused.code
        return
    finally:
        publisher.close(timeout=0.1)
    ((key, value),) = sent
    command = Command.from_avro(registry().codec(COMMAND).decode(value))
    assert (command_id, key, command.cluster, type(command.payload).__name__) == ("c1", b"lab", "lab", type_name)


def test_a_bad_payload_is_one_cli_error_naming_the_field() -> None:
    """--payload that does not match the schema is refused with the field's path."""
    from gpufold.cli import CliError

    with pytest.raises(CliError, match="tenant"):
        kafka_cli.payload_from_json("SetQuota", '{"tenant": 5}')


def test_a_derived_verb_refuses_a_bad_payload_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpufold publish set-quota --payload` with a wrong field type exits 2 with one line, sending nothing."""
    from gpufold.cli import main

    argv = ["publish", "set-quota", "--bootstrap", "127.0.0.1:1", "--cluster", "lab", "--payload", '{"tenant": 5}']
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "--payload" in err and "tenant" in err and "Traceback" not in err
