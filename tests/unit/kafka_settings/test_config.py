"""Kafka client properties from file and environment, and secrets kept out of logs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kafka_settings.config import KafkaConfigError, SecretFilter, is_secret, load, parse_properties, properties_from_env
from kafka_settings.topics import topic_specs, watermark_offsets
from schemas.topics import topics_for


def test_file_lines_become_properties(tmp_path: Path) -> None:
    """key=value lines are read, comments and blank lines skipped, values may contain '='."""
    path = tmp_path / "client.properties"
    path.write_text("# prod\nbootstrap.servers=k1:9093,k2:9093\n\nsasl.jaas.config=a=b c=d\n")
    config = load(path, environ={})
    assert config.properties == {"bootstrap.servers": "k1:9093,k2:9093", "sasl.jaas.config": "a=b c=d"}


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    """GPUFOLD_KAFKA_<KEY> maps to the dotted key and wins over the file; --bootstrap wins over both."""
    path = tmp_path / "client.properties"
    path.write_text("bootstrap.servers=file:1\nsecurity.protocol=PLAINTEXT\n")
    environ = {"GPUFOLD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "GPUFOLD_KAFKA_BOOTSTRAP": "env:2"}
    assert load(path, environ=environ).properties == {"bootstrap.servers": "env:2", "security.protocol": "SASL_SSL"}
    assert load(path, environ=environ, bootstrap="flag:3").bootstrap == "flag:3"


def test_script_variables_are_not_client_properties() -> None:
    """Variables of scripts/kafka.sh (port, heap, ...) are not passed to librdkafka."""
    environ = {"GPUFOLD_KAFKA_PORT": "9092", "GPUFOLD_KAFKA_JVM_OPTS": "-Xss1m", "GPUFOLD_KAFKA_SASL_USERNAME": "svc"}
    assert properties_from_env(environ) == {"sasl.username": "svc"}


def test_missing_bootstrap_is_a_clear_error() -> None:
    """Without any bootstrap address the error says how to give one."""
    with pytest.raises(KafkaConfigError, match="GPUFOLD_KAFKA_BOOTSTRAP"):
        load(environ={})


def test_malformed_line_names_file_and_line_without_the_value() -> None:
    """A line without '=' is reported with its number; its text after a would-be '=' is not echoed."""
    with pytest.raises(KafkaConfigError, match=r"cfg:2: expected key=value"):
        parse_properties("a=b\njunk-line\n", "cfg")


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.password", True),
        ("ssl.key.password", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.jaas.config", True),
        ("ssl.keystore.password", True),
        ("sasl.username", False),
        ("bootstrap.servers", False),
    ],
)
def test_secret_keys(key: str, secret: bool) -> None:
    """Passwords, secrets and JAAS configs are secrets; user names and addresses are not."""
    assert is_secret(key) is secret


def test_secrets_are_masked_and_scrubbed_from_logs(caplog: pytest.LogCaptureFixture) -> None:
    """masked() hides secret values, and a log line that contains one is scrubbed."""
    config = load(environ={"GPUFOLD_KAFKA_BOOTSTRAP": "k:1", "GPUFOLD_KAFKA_SASL_PASSWORD": "hunter2-xyz"})
    assert config.masked()["sasl.password"] == "***"
    assert "hunter2-xyz" not in config.scrub("auth failed for password hunter2-xyz")
    logger = logging.getLogger("test.secrets")
    filter_ = SecretFilter()
    logger.addFilter(filter_)
    try:
        with caplog.at_level(logging.INFO, logger="test.secrets"):
            logger.info("connecting with %s", "hunter2-xyz")
    finally:
        logger.removeFilter(filter_)
    assert "hunter2-xyz" not in caplog.text
    assert "***" in caplog.text


def test_topic_specs_follow_the_documented_defaults() -> None:
    """Commands and events are kept forever, snapshots compacted, min ISR defaults to min(2, RF)."""
    specs = {spec.name: spec for spec in topic_specs(topics_for("x"))}
    assert specs["x.commands"].config["retention.ms"] == "-1"
    assert specs["x.snapshots"].config["cleanup.policy"] == "compact"
    assert {spec.partitions for spec in specs.values()} == {12}
    assert {spec.config["min.insync.replicas"] for spec in specs.values()} == {"2"}
    assert {s.config["min.insync.replicas"] for s in topic_specs(topics_for("x"), 3, 1)} == {"1"}
    with pytest.raises(ValueError, match=r"min\.insync\.replicas"):
        topic_specs(topics_for("x"), 3, 1, 2)


class _NewTopicConsumer:
    """Answers as librdkafka does for a topic created a moment ago: the partition is unknown locally at first."""

    def __init__(self, code: int, failures: int) -> None:
        self.code, self.failures, self.calls = code, failures, 0

    def get_watermark_offsets(self, tp: object, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return 0, 7


def test_watermark_offsets_waits_for_a_new_topics_metadata() -> None:
    consumer = _NewTopicConsumer(KafkaError._UNKNOWN_PARTITION, failures=2)
    assert watermark_offsets(consumer, TopicPartition("t", 0), timeout=5.0) == (0, 7)
    assert consumer.calls == 3


def test_watermark_offsets_does_not_retry_what_time_cannot_fix() -> None:
    consumer = _NewTopicConsumer(KafkaError.TOPIC_AUTHORIZATION_FAILED, failures=1)
    with pytest.raises(KafkaException):
        watermark_offsets(consumer, TopicPartition("t", 0), timeout=5.0)
    assert consumer.calls == 1
