"""The processor's Prometheus endpoint on the real broker."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from kafka_support import BackgroundProcessor, command_stream, new_topics, publish

from schemas.commands import Command, Release

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_endpoint_counts_commands_and_rejections(kafka_bootstrap: str) -> None:
    """/metrics reports every folded command, rejections by code, commit latency and per-model GPU gauges."""
    topics = new_topics(kafka_bootstrap, "metrics", partitions=1)
    commands = command_stream(300, clusters=1)
    bad = Command("bad-1", "c0", commands[-1].issued_at + 1, Release("never-submitted"))  # within the clock jump
    publish(kafka_bootstrap, topics, [*commands, bad])
    port = _free_port()
    with BackgroundProcessor(kafka_bootstrap, topics, metrics_port=port, metrics_every=0.0) as processor:
        deadline = time.monotonic() + 120
        text = ""
        while time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                text = ""
            if (_sample(text, "gpufold_processor_commands_total") or 0) >= len(commands) + 1:
                break
            time.sleep(0.5)
        processor.runner.stop()
        assert processor.wait() == 0
    assert _sample(text, "gpufold_processor_commands_total") == len(commands) + 1
    assert 'gpufold_processor_rejected_total{code="UNKNOWN_POD"}' in text
    assert (_sample(text, "gpufold_processor_commit_seconds_count") or 0) >= 1
    assert "gpufold_processor_gpus_total{" in text
    assert "gpufold_processor_consumer_lag{" in text
