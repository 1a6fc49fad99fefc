"""The Kafka CLI on the real broker: topics create, publish (typed, file, trace), processor run with secrets."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from kafka_support import GPUFOLD, REPO, check_exactly_once, read_topic

from gpufold.trace import load_nodes
from schemas.topics import topics_for

pytestmark = pytest.mark.integration


def gpufold(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUFOLD, *args], cwd=REPO, capture_output=True, text=True, timeout=180, check=check, env=env
    )


def test_cli_journey_with_a_masked_password(kafka_bootstrap: str, tmp_path: Path) -> None:
    """topics create twice, publish a file, a typed command and a trace, then run the processor to idle."""
    prefix = f"t-cli-{uuid.uuid4().hex[:8]}"
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    created = gpufold("topics", "create", *kafka, "--partitions", "2", "--replication-factor", "1")
    assert created.stdout.count(": created") == 4
    again = gpufold("topics", "create", *kafka, "--partitions", "2", "--replication-factor", "1")
    assert again.stdout.count(": exists") == 4
    wrong = gpufold("topics", "create", *kafka, "--partitions", "3", "--replication-factor", "1", check=False)
    assert wrong.returncode == 2 and "can never change" in wrong.stderr

    lines = [
        {"command_id": "f1", "cluster": "lab", "issued_at": 1, "payload": {"SetPolicy": {"policy": "first-fit"}}},
        {"command_id": "f2", "cluster": "lab", "issued_at": 2,
         "payload": {"AddNode": {"node_id": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpu_model": "T4",
                                 "gpu_count": 1}}},
    ]  # fmt: skip
    path = tmp_path / "commands.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n{not json\n")
    published = gpufold("publish", *kafka, "--file", str(path), check=False)
    assert published.returncode == 1 and "line 3" in published.stderr and "published 2" in published.stderr
    typed = gpufold("publish", "submit-pod", *kafka, "--cluster", "lab", "p1", "--num-gpu", "1", "--cpu-milli", "100")
    command_id = typed.stdout.strip()
    assert len(command_id) == 36
    refused = gpufold("publish", "submit-pod", *kafka, "--cluster", "lab", "p2", check=False)
    assert refused.returncode == 2 and "requests no GPU, CPU or memory" in refused.stderr
    gpufold("publish", "trace", *kafka, "--cluster", "openb", "--limit-pods", "40", "--no-progress")

    env = dict(os.environ, GPUFOLD_KAFKA_SASL_PASSWORD="s3cret-never-logged")
    run = gpufold(
        "processor", "run", *kafka, "--instance-id", "cli", "--group", prefix + ".group", "--stop-when-idle", "2",
        env=env,
    )  # fmt: skip
    assert "s3cret-never-logged" not in run.stderr
    assert "'sasl.password': '***'" in run.stderr
    entries = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    assert entries[-1]["msg"] == "processor stopped" and entries[-1]["exit"] == 0
    topics = topics_for(prefix)
    commands = sum(len(records) for records in read_topic(kafka_bootstrap, topics.commands).values())
    assert commands == 2 + 1 + 40 + len(load_nodes())
    check_exactly_once(kafka_bootstrap, topics)
