"""The options several subcommands share, declared once: the Kafka connection (and loading it), the cluster,
the trace files, ``--json``, ``--partition`` and ``--no-progress``. The embedded log's ``--log`` is in
``gpufold.cli_commands._embedded`` beside the code that opens it."""

from __future__ import annotations

import argparse
from typing import Any

from gpufold.cli import CliError
from kafka_settings.config import KafkaConfig, KafkaConfigError, install_secret_filter, load

DEFAULT_PREFIX = "gpufold"
KAFKA_CONFIG_HELP = (
    "librdkafka properties, key=value per line (security.protocol, sasl.*, ssl.*, ...); "
    "GPUFOLD_KAFKA_<KEY> variables override it (GPUFOLD_KAFKA_SASL_PASSWORD -> sasl.password)"
)
TOPIC_PREFIX_HELP = (
    f"topic names are PREFIX.commands, PREFIX.events, PREFIX.snapshots, PREFIX.dead-letters (default: {DEFAULT_PREFIX})"
)

Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def add_kafka_options(
    parser: argparse.ArgumentParser,
    *,
    title: str = "Kafka connection",
    description: str | None = None,
    bootstrap_help: str = "bootstrap servers (default: $GPUFOLD_KAFKA_BOOTSTRAP)",
    nested: bool = False,
) -> argparse._ArgumentGroup:
    """``--bootstrap``, ``--kafka-config`` and ``--topic-prefix`` in a group of their own (returned, for more).

    ``nested``: a sub-command repeating its parent's options, without defaults, so that they do not overwrite
    values given before the sub-command's name (argparse applies a sub-parser's defaults last).
    """
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if nested else {"default": None}
    group = parser.add_argument_group(title, description)
    group.add_argument("--bootstrap", metavar="HOST:PORT", help=bootstrap_help, **extra)
    group.add_argument("--kafka-config", metavar="FILE", help=KAFKA_CONFIG_HELP, **extra)
    group.add_argument("--topic-prefix", help=TOPIC_PREFIX_HELP, **(extra if nested else {"default": DEFAULT_PREFIX}))
    return group


def kafka_config(args: argparse.Namespace) -> KafkaConfig:
    """The client configuration the Kafka options (and the ``GPUFOLD_KAFKA_*`` variables) name; a bad one is a
    one-line CliError. Secrets are masked in every log line from here on."""
    try:
        config = load(args.kafka_config, bootstrap=args.bootstrap)
    except KafkaConfigError as error:
        raise CliError(str(error)) from None
    install_secret_filter()
    return config


def add_cluster_option(parser: Parser, *, required: bool = False, help: str | None = None) -> None:
    """``--cluster``: the one to act on (required) or a filter (optional)."""
    default_help = "the cluster" if required else "only this cluster"
    parser.add_argument("--cluster", required=required, help=help or default_help)


def add_trace_options(parser: Parser) -> None:
    """``--nodes`` and ``--pods``: the trace's CSV files (default: the bundled openb ones)."""
    parser.add_argument("--nodes", help="node list CSV (default: the bundled openb GPU node list)")
    parser.add_argument("--pods", help="pod list CSV (default: the bundled openb default pod list)")


def add_json_option(parser: Parser, help: str = "print one JSON object") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_partition_option(parser: Parser) -> None:
    parser.add_argument("--partition", type=int, default=None, help="only this partition")


def add_progress_option(parser: Parser, *, nested: bool = False, help: str = "no progress bar") -> None:
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if nested else {}
    parser.add_argument("--no-progress", action="store_true", help=help, **extra)
