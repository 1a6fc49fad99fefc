"""docker-compose.yml is a valid Compose file and wires the gpufold stack as documented.

No Docker engine runs where the tests do, so the file is checked against the official Compose
JSON Schema (tests/data/compose-spec.json) and for what `docker compose up` relies on: every
service present, healthchecks on the backing services, start order gated on health, and the
single-node Kafka settings that transactions and consumer groups need.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
SCHEMA_FILE = Path(__file__).resolve().parent / "data" / "compose-spec.json"
DATABASE_URL = "postgresql+psycopg://gpufold:gpufold@postgres:5432/gpufold"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result = compose["services"]
    assert isinstance(result, dict)
    return result


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def test_valid_against_the_compose_schema(compose: dict[str, Any]) -> None:
    # The schema is draft-07 (its "$schema" lacks the trailing "#", so validator_for would not recognise it).
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_the_schema_catches_mistakes(compose: dict[str, Any]) -> None:
    # Guard against a schema that accepts anything: a misspelt key and a bad condition are rejected.
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft7Validator(schema)
    broken = json.loads(json.dumps(compose))
    broken["services"]["kafka"]["helthcheck"] = broken["services"]["kafka"].pop("healthcheck")
    assert not validator.is_valid(broken)
    broken = json.loads(json.dumps(compose))
    broken["services"]["processor"]["depends_on"]["kafka"]["condition"] = "service_ready"
    assert not validator.is_valid(broken)


def test_services_present(services: dict[str, dict[str, Any]]) -> None:
    assert {"kafka", "postgres", "processor", "projector", "api"} <= set(services)
    assert services["kafka"]["image"] == "apache/kafka:4.4.0"
    assert services["postgres"]["image"] == "postgres:16"
    for name in ("processor", "projector", "api"):
        assert "image" not in services[name] or "build" in services[name], name
        build = services[name]["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (REPO_ROOT / context / dockerfile).resolve() == DOCKERFILE


@pytest.mark.parametrize("name", ["kafka", "postgres"])
def test_backing_services_have_healthchecks(services: dict[str, dict[str, Any]], name: str) -> None:
    healthcheck = services[name].get("healthcheck")
    assert healthcheck, f"{name} has no healthcheck"
    assert not healthcheck.get("disable", False)
    test = healthcheck["test"]
    assert isinstance(test, list) and test[0] in {"CMD", "CMD-SHELL"} and len(test) > 1
    for key in ("interval", "timeout"):
        assert re.fullmatch(r"\d+(ms|s|m)", str(healthcheck[key])), (name, key)
    assert int(healthcheck["retries"]) >= 3


def test_kafka_healthcheck_asks_for_metadata(services: dict[str, dict[str, Any]]) -> None:
    assert "kafka-topics.sh --bootstrap-server localhost:9092 --list" in " ".join(
        services["kafka"]["healthcheck"]["test"]
    )
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_kafka_is_a_transaction_friendly_single_node(services: dict[str, dict[str, Any]]) -> None:
    env = _environment(services["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_MIN_INSYNC_REPLICAS",
    ):
        assert env[key] == "1", key
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    # A valid KRaft cluster id: 16 bytes, URL-safe base64 without padding.
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])


@pytest.mark.parametrize(
    ("name", "needs"),
    [
        ("topics", {"kafka"}),
        ("processor", {"kafka"}),
        ("projector", {"kafka", "postgres"}),
        ("api", {"postgres"}),
    ],
)
def test_start_waits_for_healthy_backing_services(
    services: dict[str, dict[str, Any]], name: str, needs: set[str]
) -> None:
    depends_on = services[name]["depends_on"]
    assert isinstance(depends_on, dict), f"{name}: depends_on must use the long form with conditions"
    for need in needs:
        assert depends_on[need]["condition"] == "service_healthy", (name, need)


def test_commands(services: dict[str, dict[str, Any]]) -> None:
    assert _command(services["processor"]) == ["gpufold", "processor", "run", "--bootstrap", "kafka:9092"]
    projector = _command(services["projector"])
    assert projector[:3] == ["gpufold", "projector", "run"]
    assert projector[projector.index("--bootstrap") + 1] == "kafka:9092"
    assert projector[projector.index("--database-url") + 1] == DATABASE_URL
    api = _command(services["api"])
    assert api[:2] == ["gpufold", "serve"]
    assert api[api.index("--database-url") + 1] == DATABASE_URL
    assert api[api.index("--bootstrap") + 1] == "kafka:9092"  # the live replica and the write API
    assert api[api.index("--host") + 1] == "0.0.0.0"
    assert api[api.index("--port") + 1] == "8000"
    assert any(str(port).split(":")[-2:] == ["8000", "8000"] for port in services["api"]["ports"])


def test_the_api_gets_a_token_or_does_not_start(services: dict[str, dict[str, Any]]) -> None:
    """The api listens on 0.0.0.0, where serve opens writes only with a token: compose requires one
    (``${VAR:?message}`` stops ``docker compose up`` when it is unset or empty)."""
    token = _environment(services["api"])["GPUFOLD_API_TOKEN"]
    assert re.fullmatch(r"\$\{GPUFOLD_API_TOKEN:\?[^}]+\}", token), token


def test_the_database_url_matches_postgres(services: dict[str, dict[str, Any]]) -> None:
    env = _environment(services["postgres"])
    user, password, database = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
    assert f"postgresql+psycopg://{user}:{password}@postgres:5432/{database}" == DATABASE_URL


def test_dockerfile_installs_the_project() -> None:
    text = DOCKERFILE.read_text()
    # The build stage has gcc (the full image), so pip compiles the hot path; the runtime is slim and
    # takes only the installed files, from the same CPython build.
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.MULTILINE)
    assert stages == [("python:3.11", "build"), ("python:3.11-slim", "")], stages
    assert re.search(r"pip install --prefix=/install \"?\.\[postgres,api\]\"?", text)
    assert re.search(r"^COPY --from=build /install /usr/local$", text, re.MULTILINE)
    # setup.py compiles, with the module list of build_config.py
    assert re.search(r"^COPY pyproject\.toml setup\.py build_config\.py README\.md ", text, re.MULTILINE)
    # Every package that pyproject.toml's setuptools config includes is copied into the image.
    with (REPO_ROOT / "pyproject.toml").open("rb") as file:
        included = tomllib.load(file)["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(pattern.rstrip("*") for pattern in included)
    assert "logs" in packages, packages
    for package in packages:
        assert re.search(rf"^COPY {package} ", text, re.MULTILINE), package
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    dockerignore = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    for package in (*packages, "pyproject.toml", "README.md"):
        assert package not in dockerignore, package
