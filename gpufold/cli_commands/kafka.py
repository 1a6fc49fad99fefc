"""Kafka subcommands: ``gpufold processor run``, ``gpufold topics create``, ``gpufold publish ...``.

Every one of them takes ``--bootstrap``, ``--kafka-config FILE`` and the ``GPUFOLD_KAFKA_*`` variables
(see ``kafka_settings.config``), so the same flags reach a production cluster with TLS/SASL.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import sys
from typing import Any

from gpufold.cli import CliError
from gpufold.cli_commands.options import (
    add_cluster_option,
    add_kafka_options,
    add_progress_option,
    add_trace_options,
    kafka_config,
)
from gpufold.text import printable
from kafka_settings.config import KafkaConfig
from kafka_settings.topics import DEFAULT_PARTITIONS, DEFAULT_REPLICATION_FACTOR, TopicError, create_topics, topic_specs
from schemas.topics import topics_for


def _kafka_options(parser: argparse.ArgumentParser, nested: bool = False) -> None:
    add_kafka_options(parser, nested=nested)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    _register_processor(subparsers)
    _register_topics(subparsers)
    _register_publish(subparsers)


# ---------------------------------------------------------------------- processor run


def _register_processor(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from logs.kafka import DEFAULT_SESSION_TIMEOUT_MS, DEFAULT_TRANSACTION_TIMEOUT_MS
    from processor.runtime.loop import DEFAULT_BATCH_SIZE, DEFAULT_SNAPSHOT_EVERY

    parser = subparsers.add_parser("processor", help="the exactly-once processor on Kafka")
    commands = parser.add_subparsers(dest="processor_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="fold commands from Kafka into events, exactly once, until SIGTERM",
        description="Consume the commands topic in a consumer group (read_committed) and write each batch's "
        "events, dead letters, snapshots and consumer offsets in one Kafka transaction. Exit status: 0 after "
        "SIGTERM/SIGINT, 3 when fenced by a newer instance or on a fatal Kafka error, 4 on a broken invariant.",
    )
    _kafka_options(run)
    run.add_argument("--group", default="gpufold-processor", help="consumer group id (default: %(default)s)")
    run.add_argument(
        "--instance-id",
        default=os.environ.get("GPUFOLD_INSTANCE_ID") or socket.gethostname(),
        help="stable id of this instance: static group member and transactional.id GROUP.ID, so a restarted "
        "instance fences its predecessor (default: $GPUFOLD_INSTANCE_ID or the host name)",
    )
    run.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="max commands per transaction")
    run.add_argument(
        "--linger-ms",
        type=float,
        default=5.0,
        help="a batch is committed when full or when its first command has waited this long (default 5)",
    )
    run.add_argument(
        "--snapshot-every",
        type=int,
        default=DEFAULT_SNAPSHOT_EVERY,
        help="write a partition snapshot every N commands (default: %(default)s)",
    )
    run.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=DEFAULT_TRANSACTION_TIMEOUT_MS,
        help="the broker aborts a transaction left open this long (default: %(default)s; at most the broker's "
        "transaction.max.timeout.ms)",
    )
    run.add_argument(
        "--session-timeout-ms",
        type=int,
        default=DEFAULT_SESSION_TIMEOUT_MS,
        help="a dead instance's partitions move to the others after this long (default: %(default)s)",
    )
    run.add_argument("--stop-when-idle", type=float, default=0.0, metavar="SECONDS", help="stop after idle seconds")
    run.add_argument("--log-format", choices=("json", "text"), default="json", help="log lines (default: json)")
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus /metrics here: commands, rejections by code, commit latency, queue length, "
        "GPUs allocated/total per model, fragmentation (needs the api extra)",
    )
    run.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port (default: 127.0.0.1)")
    run.add_argument(
        "--tick-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="publish a Tick command into each owned partition this often, so gang timeouts, time limits and "
        "reservations fire when no other command moves event time (default: 0, never)",
    )
    run.add_argument(
        "--trace-batches",
        action="store_true",
        help="log one 'batch' line per committed batch with the wall-clock time of each stage (poll, first "
        "record, fold done, produced, offsets sent, committed), for bench/kafka_end_to_end.py --stages",
    )
    run.add_argument(
        "--no-pipeline",
        dest="pipeline",
        action="store_false",
        help="commit each batch before polling the next (default: fold the next batch while the previous "
        "batch's transaction commits; its events are still produced only after that commit)",
    )
    run.set_defaults(handler=_processor_run)


def _processor_run(args: argparse.Namespace) -> int:
    from processor.runtime.kafka_runner import RunnerSettings, configure_logging, run

    configure_logging(args.log_format == "json", logging.DEBUG if args.verbose >= 2 else logging.INFO)
    config = kafka_config(args)
    if args.batch_size < 1:
        raise CliError("--batch-size must be >= 1")
    if args.tick_interval < 0:
        raise CliError("--tick-interval must be >= 0 seconds")
    settings = RunnerSettings(
        group_id=args.group,
        instance_id=args.instance_id,
        batch_size=args.batch_size,
        linger=args.linger_ms / 1000,
        snapshot_every=args.snapshot_every,
        transaction_timeout_ms=args.transaction_timeout_ms,
        session_timeout_ms=args.session_timeout_ms,
        stop_when_idle=args.stop_when_idle,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        tick_interval=args.tick_interval,
        trace_batches=args.trace_batches,
        pipeline=args.pipeline,
    )
    return run(config, topics_for(args.topic_prefix), settings)


# ---------------------------------------------------------------------- topics create


def _register_topics(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("topics", help="create the gpufold topics on Kafka")
    commands = parser.add_subparsers(dest="topics_command", metavar="COMMAND", required=True)
    create = commands.add_parser(
        "create",
        help="create the commands, events, snapshots and dead-letter topics (idempotent)",
        description="Create what is missing: commands (retention forever, the source of truth), events (same "
        "partition count), snapshots (compacted) and dead letters. Existing topics are kept; a partition count "
        "that differs is an error. Production defaults: 12 partitions, replication factor 3, min.insync.replicas "
        "2; a single-broker development cluster needs --replication-factor 1.",
    )
    _kafka_options(create)
    create.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS, help="default: %(default)s")
    create.add_argument(
        "--replication-factor", type=int, default=DEFAULT_REPLICATION_FACTOR, help="default: %(default)s"
    )
    create.add_argument(
        "--min-insync-replicas", type=int, default=None, help="default: 2, or 1 with --replication-factor 1"
    )
    create.set_defaults(handler=_topics_create)


def _topics_create(args: argparse.Namespace) -> int:
    config = kafka_config(args)
    try:
        specs = topic_specs(
            topics_for(args.topic_prefix), args.partitions, args.replication_factor, args.min_insync_replicas
        )
        result = create_topics(config.client(), specs)
    except (ValueError, TopicError) as error:
        raise CliError(config.scrub(str(error))) from None
    for spec in specs:
        print(f"{spec.name}: {result[spec.name]} ({spec.partitions} partitions, RF {spec.replication_factor})")
    return 0


# ---------------------------------------------------------------------- publish


def verb_of(type_name: str) -> str:
    """The CLI verb of a command type: ``SubmitPod`` -> ``submit-pod``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", type_name).lower()


def publish_verbs() -> dict[str, str]:
    """Command type -> its ``gpufold publish`` verb, for every command of ``schemas/command.avsc``: a new command
    gets a verb (taking ``--payload JSON``) with no code here; :data:`_TYPED` gives some verbs their own flags."""
    from gpufold.jsonl import command_types

    return {name.rsplit(".", 1)[-1]: verb_of(name.rsplit(".", 1)[-1]) for name in command_types()}


def payload_from_json(type_name: str, text: str) -> Any:
    """A command payload from its fields as JSON text, checked as a JSON line's payload is (``gpufold.jsonl``)."""
    from gpufold.jsonl import JsonCommandError, check_json_text, parse_command
    from schemas.commands import Command

    try:
        fields = check_json_text(text)
        record = parse_command({"command_id": "-", "cluster": "-", "issued_at": 0, "payload": {type_name: fields}})
    except (JsonCommandError, ValueError) as error:
        raise CliError(f"--payload: {error}") from None
    return Command.from_avro(record).payload


# Verbs with flags of their own (the common commands); every other command type takes --payload JSON.
_TYPED: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "add-node": [
        ("node_id", {}),
        ("--cpu-milli", {"type": int, "required": True}),
        ("--memory-mib", {"type": int, "required": True}),
        ("--gpu-model", {"default": ""}),
        ("--gpu-count", {"type": int, "default": 0}),
        ("--label", {"action": "append", "default": [], "metavar": "KEY=VALUE"}),
        ("--gpu-memory-mib", {"type": int, "default": 0}),
    ],
    "remove-node": [("node_id", {}), ("--force", {"action": "store_true"})],
    "cordon-node": [("node_id", {})],
    "uncordon-node": [("node_id", {})],
    "drain-node": [
        ("node_id", {}),
        ("--grace-ms", {"type": int, "default": 0}),
        ("--ignore-budgets", {"action": "store_true"}),
    ],
    "mark-node-failed": [("node_id", {}), ("--reason", {"default": ""})],
    "submit-pod": [
        ("pod_id", {}),
        ("--num-gpu", {"type": int, "default": 0}),
        ("--gpu-milli", {"type": int, "default": None}),
        ("--cpu-milli", {"type": int, "default": 0}),
        ("--memory-mib", {"type": int, "default": 0}),
        ("--tenant", {"default": "default"}),
        ("--priority", {"type": int, "default": 0}),
        ("--gpu-models", {"default": "", "help": "allowed GPU models, comma-separated"}),
        ("--selector", {"action": "append", "default": [], "metavar": "KEY=VALUE"}),
        ("--gpu-memory-mib", {"type": int, "default": 0}),
    ],
    "release": [("pod_id", {}), ("--reason", {"default": "completed"})],
    "set-policy": [("policy", {})],
}
_TYPED_HELP = {
    "node_id": "the node",
    "pod_id": "the pod",
    "policy": "the placement policy (gpufold simulate --list-policies)",
    "--cpu-milli": "CPU in milli-cores",
    "--memory-mib": "memory in MiB",
    "--gpu-model": "the GPU model, e.g. A100 (needed with --gpu-count)",
    "--gpu-count": "whole GPUs on the node (default 0)",
    "--label": "a node label (repeatable)",
    "--force": "remove even with pods running (they are evicted and re-placed)",
    "--reason": "why (free text, at most 1024 characters)",
    "--num-gpu": "whole GPUs, or 1 with --gpu-milli below 1000 for a share (default 0)",
    "--gpu-milli": "milli of each GPU: 1000 for whole GPUs, 1-999 for a share",
    "--tenant": "who is charged (default: default)",
    "--priority": "higher is placed first (default 0)",
    "--selector": "a node label the pod needs (repeatable)",
    "--grace-ms": "evict each pod this long after telling it (PodEvictionScheduled; default 0: at once)",
    "--ignore-budgets": "evict without waiting for the disruption budgets (respect_budgets false)",
    "--gpu-memory-mib": "GPU memory in MiB: of each GPU of the node, or needed on each of the pod's GPUs (default 0)",
}


def _register_publish(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "publish",
        help="send commands to the Kafka commands topic",
        description="Send one typed command (gpufold publish submit-pod ...), a JSON-lines file "
        "(gpufold publish --file commands.jsonl) or a whole trace (gpufold publish trace ...).",
    )
    _kafka_options(parser)
    parser.add_argument("--file", metavar="FILE.jsonl", help="publish every command of a JSON-lines file (- = stdin)")
    add_progress_option(parser)
    parser.set_defaults(handler=_publish_file)
    commands = parser.add_subparsers(dest="publish_command", metavar="COMMAND")
    for type_name, name in publish_verbs().items():
        sub = commands.add_parser(name, help=f"publish one {type_name} command")
        _kafka_options(sub, nested=True)
        add_cluster_option(sub, required=True, help="the cluster (partition key)")
        sub.add_argument("--command-id", help="idempotency key (default: a new uuid4)")
        sub.add_argument("--wait", type=float, metavar="SECONDS", help="wait for the outcome and print it as JSON")
        if name in _TYPED:
            for flag, options in _TYPED[name]:
                sub.add_argument(flag, **{"help": _TYPED_HELP.get(flag), **options})
        else:  # derived from the schema: the payload's fields as one JSON object, checked like a JSON line's
            sub.add_argument(
                "--payload",
                metavar="JSON",
                default="{}",
                help=f"the {type_name} fields as a JSON object, as in a JSON line (schemas/command.avsc)",
            )
        sub.set_defaults(handler=_publish_one, typed=name, type_name=type_name)
    trace = commands.add_parser("trace", help="bulk-load an openb trace: AddNode per node, SubmitPod per pod")
    _kafka_options(trace, nested=True)
    add_trace_options(trace)
    trace.add_argument("--cluster", default="openb", help="cluster name (default: %(default)s)")
    trace.add_argument("--limit-pods", type=int, help="only the first N pods")
    add_progress_option(trace, nested=True)
    trace.set_defaults(handler=_publish_trace)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"{what} must be KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _publisher(args: argparse.Namespace, config: KafkaConfig) -> Any:
    from producers.publisher import CommandPublisher

    try:
        return CommandPublisher(config, topics_for(args.topic_prefix).commands, source="gpufold-cli")
    except ValueError as error:
        raise CliError(str(error)) from None


def _publish_one(args: argparse.Namespace) -> int:
    from producers.outcomes import OutcomeTimeout, OutcomeWaiter
    from producers.publisher import DeliveryError

    config = kafka_config(args)
    name = args.typed
    common = {"command_id": args.command_id}
    # A schema-derived verb's --payload is checked before anything connects.
    payload = payload_from_json(args.type_name, args.payload) if name not in _TYPED else None
    waiter = OutcomeWaiter(config, topics_for(args.topic_prefix).events) if args.wait else None
    try:
        with _publisher(args, config) as publisher:
            method: Any = getattr(publisher, name.replace("-", "_"), None)
            if name == "add-node":
                command_id = method(
                    args.cluster,
                    args.node_id,
                    cpu_milli=args.cpu_milli,
                    memory_mib=args.memory_mib,
                    gpu_model=args.gpu_model,
                    gpu_count=args.gpu_count,
                    labels=_pairs(args.label, "--label"),
                    gpu_memory_mib=args.gpu_memory_mib,
                    **common,
                )
            elif name == "submit-pod":
                command_id = method(
                    args.cluster,
                    args.pod_id,
                    num_gpu=args.num_gpu,
                    gpu_milli=args.gpu_milli,
                    cpu_milli=args.cpu_milli,
                    memory_mib=args.memory_mib,
                    tenant=args.tenant,
                    priority=args.priority,
                    gpu_models=[m for m in args.gpu_models.split(",") if m],
                    node_selector=_pairs(args.selector, "--selector"),
                    gpu_memory_mib=args.gpu_memory_mib,
                    **common,
                )
            elif name == "drain-node":
                command_id = method(
                    args.cluster,
                    args.node_id,
                    grace_ms=args.grace_ms,
                    respect_budgets=not args.ignore_budgets,
                    **common,
                )
            elif name == "remove-node":
                command_id = method(args.cluster, args.node_id, force=args.force, **common)
            elif name in ("mark-node-failed", "release"):
                target = args.node_id if name == "mark-node-failed" else args.pod_id
                command_id = method(args.cluster, target, reason=args.reason, **common)
            elif name == "set-policy":
                command_id = method(args.cluster, args.policy, **common)
            elif name in _TYPED:
                command_id = method(args.cluster, args.node_id, **common)
            else:
                command_id = publisher.publish_payload(args.cluster, payload, **common)
        print(command_id)
        if waiter is not None:
            from gpufold.jsonl import to_json_value

            outcome = waiter.wait(command_id, args.wait)
            for event in outcome.events:
                print(json.dumps(to_json_value(event.to_avro()), sort_keys=True))
    except ValueError as error:
        raise CliError(str(error)) from None
    except (DeliveryError, OutcomeTimeout) as error:
        raise CliError(config.scrub(str(error))) from None
    finally:
        if waiter is not None:
            waiter.close()
    return 0


def _progress(total: int | None, disable: bool, unit: str = "cmd") -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, disable=disable or not sys.stderr.isatty(), file=sys.stderr)


def _publish_file(args: argparse.Namespace) -> int:
    if not args.file:
        raise CliError("give a command (gpufold publish submit-pod ...), --file FILE.jsonl, or trace")
    from gpufold.jsonl import LineError, read_command_bytes
    from producers.publisher import DeliveryError
    from schemas.commands import Command

    config = kafka_config(args)
    errors = 0
    sent = 0
    try:  # bytes: each line is decoded on its own, so one bad byte costs one line (as for log append)
        handle = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as error:
        raise CliError(f"cannot read {args.file}: {error.strerror}") from None
    try:
        with _publisher(args, config) as publisher, _progress(None, args.no_progress) as bar:
            for item in read_command_bytes(handle):
                if isinstance(item, LineError):
                    print(printable(f"gpufold: {args.file}: {item}"), file=sys.stderr)
                    errors += 1
                    continue
                try:
                    publisher.publish(Command.from_avro(item.record))
                except ValueError as error:
                    print(printable(f"gpufold: {args.file}: line {item.line}: {error}"), file=sys.stderr)
                    errors += 1
                    continue
                sent += 1
                bar.update(1)
    except DeliveryError as error:
        raise CliError(config.scrub(str(error))) from None
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()
    print(f"published {sent} command(s), {errors} line(s) refused", file=sys.stderr)
    return 1 if errors else 0


def _publish_trace(args: argparse.Namespace) -> int:
    from gpufold import trace as trace_module
    from producers.publisher import DeliveryError

    config = kafka_config(args)
    try:
        nodes = trace_module.load_nodes(args.nodes)
        pods = trace_module.load_pods(args.pods)
    except (OSError, trace_module.TraceError) as error:
        raise CliError(str(error)) from None
    if args.limit_pods is not None:
        pods = pods[: args.limit_pods]
    cluster = args.cluster
    try:
        with _publisher(args, config) as publisher, _progress(len(nodes) + len(pods), args.no_progress) as bar:
            for index, node in enumerate(nodes):
                command = trace_module.add_node(node, node.name, cluster, index, f"{cluster}:add:{node.name}")
                publisher.publish(command)
                bar.update(1)
            for index, pod in enumerate(pods):
                issued_at = pod.creation_time * 1000 if pod.creation_time is not None else len(nodes) + index
                command = trace_module.submit_pod(pod, pod.name, cluster, issued_at, f"{cluster}:submit:{pod.name}")
                publisher.publish(command)
                bar.update(1)
    except (DeliveryError, ValueError) as error:
        raise CliError(config.scrub(str(error))) from None
    print(f"published {len(nodes)} AddNode and {len(pods)} SubmitPod commands to cluster {cluster}", file=sys.stderr)
    return 0
