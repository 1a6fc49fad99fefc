"""Fixtures for tests that talk to the real Kafka broker and PostgreSQL server.

`scripts/test.sh` (what `make test` and `.ci/run` call) starts both services and
exports their addresses. Outside CI a missing service skips these tests with a
reason; in CI (CI=true) a missing service is a failure, never a silent skip.
"""

from __future__ import annotations

import os

import pytest


def _service(var: str, what: str) -> str:
    value = os.environ.get(var, "")
    if value:
        return value
    message = f"{what} is not running: {var} is unset (start it with `make services` or run `make test`)"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The bootstrap address (host:port) of the real Kafka broker."""
    return _service("GPUFOLD_KAFKA_BOOTSTRAP", "Kafka")


@pytest.fixture(scope="session")
def database_url() -> str:
    """The SQLAlchemy URL of the real PostgreSQL server."""
    return _service("GPUFOLD_DATABASE_URL", "PostgreSQL")
