"""librdkafka client properties for every gpufold Kafka client (processor, publisher, CLI).

Properties come, later sources winning, from:

1. a config file (``--kafka-config FILE`` or ``GPUFOLD_KAFKA_CONFIG``): ``key=value`` lines, ``#`` comments,
   the same keys as librdkafka (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...);
2. environment variables ``GPUFOLD_KAFKA_<KEY>``: the key lower-cased with ``_`` turned into ``.``
   (``GPUFOLD_KAFKA_SASL_PASSWORD`` -> ``sasl.password``); ``GPUFOLD_KAFKA_BOOTSTRAP`` is ``bootstrap.servers``;
3. explicit options such as ``--bootstrap``.

Secrets (``sasl.password``, ``ssl.key.password``, any key containing ``password`` or ``secret``,
``sasl.jaas.config``, ``ssl.key.pem``) never appear in logs or error messages: :meth:`KafkaConfig.masked`
shows them as ``***`` and :class:`SecretFilter` scrubs their values from every log record.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "GPUFOLD_KAFKA_"
MASK = "***"

# GPUFOLD_KAFKA_* variables that are not client properties (scripts/kafka.sh and this module use them).
_NOT_PROPERTIES = frozenset(
    {"CONFIG", "PORT", "CONTROLLER_PORT", "START_TIMEOUT", "STOP_TIMEOUT", "HEAP", "JVM_OPTS", "CDS"}
)
_ALIASES = {"BOOTSTRAP": "bootstrap.servers"}
_SECRET_KEYS = frozenset({"sasl.jaas.config", "ssl.key.pem", "ssl_key", "sasl.oauthbearer.config"})


class KafkaConfigError(ValueError):
    """A config file or variable that cannot be used (the message never contains a secret value)."""


def is_secret(key: str) -> bool:
    """Whether a property holds a secret that must never be logged."""
    key = key.lower()
    return key in _SECRET_KEYS or "password" in key or "secret" in key


def parse_properties(text: str, source: str = "<config>") -> dict[str, str]:
    """Parse ``key=value`` lines (blank lines and ``#`` comments ignored)."""
    properties: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise KafkaConfigError(f"{source}:{number}: expected key=value, got {line.split('=')[0][:40]!r}")
        properties[key] = value.strip()
    return properties


def properties_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The client properties given as ``GPUFOLD_KAFKA_*`` environment variables."""
    properties: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or value == "":
            continue
        suffix = name[len(ENV_PREFIX) :]
        if suffix in _NOT_PROPERTIES:
            continue
        key = _ALIASES.get(suffix, suffix.lower().replace("_", "."))
        properties[key] = value
    return properties


@dataclass(frozen=True)
class KafkaConfig:
    """The merged client properties; ``client()`` adds role-specific ones on top."""

    properties: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return self.properties.get("bootstrap.servers", "")

    def client(
        self, defaults: Mapping[str, object] | None = None, overrides: Mapping[str, object] | None = None
    ) -> dict[str, object]:
        """Properties for one client: ``defaults`` < user properties < ``overrides`` (what the role needs)."""
        merged: dict[str, object] = dict(defaults or {})
        merged.update(self.properties)
        merged.update(overrides or {})
        return merged

    def secrets(self) -> list[str]:
        return [value for key, value in self.properties.items() if is_secret(key) and value]

    def masked(self) -> dict[str, str]:
        """The properties with every secret value replaced by ``***`` (safe to log)."""
        return {key: (MASK if is_secret(key) else value) for key, value in self.properties.items()}

    def scrub(self, text: str) -> str:
        """``text`` with every secret value replaced by ``***``."""
        return scrub(text, self.secrets())


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def masked_dict(properties: Mapping[str, object]) -> dict[str, object]:
    """Any property mapping with its secrets masked."""
    return {key: (MASK if is_secret(key) else value) for key, value in properties.items()}


def load(
    config_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    bootstrap: str | None = None,
) -> KafkaConfig:
    """Merge file, environment and explicit options (see the module docstring for the order)."""
    environ = os.environ if environ is None else environ
    path = config_file or environ.get(ENV_PREFIX + "CONFIG") or None
    properties: dict[str, str] = {}
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise KafkaConfigError(f"cannot read Kafka config file {path}: {error.strerror}") from None
        properties.update(parse_properties(text, str(path)))
    properties.update(properties_from_env(environ))
    if bootstrap:
        properties["bootstrap.servers"] = bootstrap
    if not properties.get("bootstrap.servers"):
        raise KafkaConfigError(
            "no Kafka bootstrap address: pass --bootstrap HOST:PORT, set GPUFOLD_KAFKA_BOOTSTRAP, "
            "or put bootstrap.servers in the --kafka-config file"
        )
    config = KafkaConfig(properties)
    SecretFilter.register(config.secrets())
    return config


class SecretFilter(logging.Filter):
    """Scrubs every registered secret value from log records (installed on the root handlers)."""

    _secrets: set[str] = set()

    @classmethod
    def register(cls, secrets: Iterable[str]) -> None:
        cls._secrets.update(secret for secret in secrets if secret)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            cleaned = scrub(message, self._secrets)
            if cleaned != message:
                record.msg, record.args = cleaned, None
        return True


def install_secret_filter(logger: logging.Logger | None = None) -> None:
    """Attach :class:`SecretFilter` to every handler of ``logger`` (default: root)."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(existing, SecretFilter) for existing in handler.filters):
            handler.addFilter(SecretFilter())
