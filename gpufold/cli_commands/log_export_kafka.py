"""``gpufold log export --bootstrap ...``: the Kafka side of ``log export`` (see ``gpufold.kafka_export``)."""

from __future__ import annotations

import argparse

from gpufold.cli import CliError
from gpufold.cli_commands.options import add_kafka_options, kafka_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = add_kafka_options(
        parser,
        title="from Kafka (time travel)",
        description="With --bootstrap, export from a Kafka cluster instead of the embedded log: whole partitions (a "
        "partition's state_hash covers every cluster on it), up to an offset or an event time. "
        "`gpufold log import --log NEW DIR` then `gpufold replay --log NEW` reproduce production's state_hash.",
        bootstrap_help="Kafka bootstrap servers",
    )
    group.add_argument("--group", default="gpufold-processor", help="the processor's consumer group (positions)")
    group.add_argument("--partitions", default=None, metavar="P,Q", help="command partitions to export")
    group.add_argument("--clusters", default=None, metavar="A,B", help="export the partitions these clusters are on")
    group.add_argument(
        "--until",
        default=None,
        metavar="OFFSET|TIME",
        help="stop after the command at OFFSET (inclusive, per partition) or before the first command issued "
        "after TIME (ISO-8601 with a zone); default: everything",
    )


def export(args: argparse.Namespace, roles: list[str]) -> int:
    from gpufold.cli_commands.replay import _until
    from gpufold.kafka_export import KafkaExporter, export_kafka
    from gpufold.log_export import ExportError
    from schemas.topics import topics_for

    try:
        until = _until(args.until) if args.until is not None else None
    except argparse.ArgumentTypeError as error:
        raise CliError(f"--until: {error}") from None
    try:
        partitions = [int(p) for p in args.partitions.split(",") if p.strip()] if args.partitions else None
    except ValueError:
        raise CliError(f"--partitions must be comma-separated numbers, got {args.partitions!r}") from None
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()] if args.clusters else None
    config = kafka_config(args)
    try:
        with KafkaExporter(config, topics_for(args.topic_prefix), group=args.group) as exporter:
            counts = export_kafka(
                exporter,
                args.out_dir,
                roles=roles,
                partitions=partitions,
                clusters=clusters,
                until_offset=None if until is None or until.time_ms is not None else int(until),
                until_ms=None if until is None else until.time_ms,
            )
    except ExportError as error:
        raise CliError(str(error)) from None
    except OSError as error:
        raise CliError(f"cannot write {args.out_dir}: {error.strerror}") from None
    for role, count in counts.items():
        print(f"{role}: {count} record(s) -> {args.out_dir}/{role}.avro")
    return 0
