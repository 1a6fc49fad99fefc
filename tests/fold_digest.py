"""A digest of everything the fold and the codec produce for fixed streams, to compare two builds of the hot path.

``python -m tests.fold_digest`` prints one JSON object: for each stream, the SHA-256 of every output frame
(events, dead letters, snapshots, in order) and the final ``state_hash``, plus how the hot path was loaded.
``tests/unit/test_compiled.py`` runs it in this process and in one with ``GPUFOLD_PURE_PYTHON=1``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import build_config
from logs.port import InputRecord, OutputRecord
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from processor.runtime.loop import PartitionFolder
from schemas.commands import Command, SetPolicy
from schemas.fastcodec import encode_command
from schemas.topics import Topics
from tests.workload import commands

RECORDED = Path(__file__).parent / "data" / "recorded"


def _recorded(name: str) -> list[InputRecord]:
    out = []
    for line in (RECORDED / name).read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "command":
            value = base64.b64decode(row["value"]) if row["value"] is not None else None
            out.append(InputRecord(0, row["offset"], b"recorded", value))
    return out


def _workload(policy: str, count: int, seed: int) -> list[InputRecord]:
    stream: list[Command] = []
    if policy:
        stream.append(Command("policy", "c1", 1, SetPolicy(policy)))
    stream += commands(count, seed=seed, nodes=60)
    return [InputRecord(0, offset, b"c1", encode_command(command)) for offset, command in enumerate(stream)]


def streams() -> dict[str, list[InputRecord]]:
    out = {name: _recorded(name) for name in ("contract-v1.jsonl", "contract-v1-policies.jsonl", "contract-v2.jsonl")}
    for policy in ("", "first-fit", "best-fit", "fgd", "random", "gpu-packing", "dot-product"):
        out[f"workload-{policy or 'default'}"] = _workload(policy, 1500, seed=len(policy))
    return out


def records_of(commands: list[Command]) -> list[InputRecord]:
    """Commands as the processor reads them: encoded frames at offsets 0, 1, ..."""
    return [InputRecord(0, offset, command.cluster.encode(), encode_command(command)) for offset, command in
            enumerate(commands)]  # fmt: skip


def fold_digest(records: list[InputRecord]) -> dict[str, object]:
    """Fold the records through the processor's folder (a snapshot every 500): how many output frames, the
    SHA-256 of them all in order, and the final ``state_hash``."""
    state = PartitionState()
    folder = PartitionFolder(0, Topics(), state, snapshot_every=500)
    out: list[OutputRecord] = []
    for record in records:
        folder.fold(record, out)
    frames = hashlib.sha256()
    for record in out:
        frames.update(record.topic.encode() + b"\0" + (record.key or b"") + b"\0" + record.value)
    return {"outputs": len(out), "sha256": frames.hexdigest(), "state_hash": state_hash(state)}


def digest() -> dict[str, object]:
    result: dict[str, object] = {"hot_path": build_config.summary()}
    for name, records in streams().items():
        result[name] = fold_digest(records)
    return result


if __name__ == "__main__":
    print(json.dumps(digest(), sort_keys=True))
