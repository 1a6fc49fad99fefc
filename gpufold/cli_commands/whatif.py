"""``gpufold what-if FILE.jsonl`` and ``gpufold explain``: ask a replica of the fold, built in this process.

The replica restores every partition from its latest snapshot and folds the log to its head (the
embedded log by default, or Kafka with ``--bootstrap``), read-only: nothing is written anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpufold.cli import CliError
from gpufold.cli_commands._embedded import add_log_argument, log_path
from gpufold.cli_commands.options import add_cluster_option, add_json_option, add_kafka_options, kafka_config


def _source_options(parser: argparse.ArgumentParser) -> None:
    add_log_argument(parser)
    add_kafka_options(
        parser, title="Kafka (instead of the embedded log)", bootstrap_help="replay from Kafka's commands topic"
    )
    add_json_option(parser, help="print JSON")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    what_if = subparsers.add_parser(
        "what-if",
        help="fold commands on a copy of the current state and print their events; nothing is published",
        description="Where would these go, and what would they move? Fold the JSON-lines commands of FILE, in "
        "order, on a copy of the log's head state (a replica built here from the latest snapshot plus the "
        "commands after it) and print the events each would produce, at the offset it would get if published "
        "now. The log is not changed.",
    )
    what_if.add_argument("file", metavar="FILE.jsonl", help="the commands (- for standard input)")
    _source_options(what_if)
    what_if.set_defaults(handler=_what_if)

    explain = subparsers.add_parser(
        "explain",
        help="why a pending pod does not fit now: live reasons, nearest miss, what would make it fit",
        description="Explain a pod on the log's head state: for a pending pod, the reasons recomputed now "
        "(counts per check, per node class), the node that comes closest and what it lacks, and single changes "
        "that would let it be placed; for a running pod, where it runs.",
    )
    explain.add_argument("pod_id", metavar="POD", help="the pending or running pod to explain")
    add_cluster_option(explain, required=True, help="the pod's cluster")
    _source_options(explain)
    explain.set_defaults(handler=_explain)

    quotas = subparsers.add_parser(
        "quotas",
        help="per tenant and quota key, now: nominal, used, what it may hold, borrowed and lent",
        description="Quotas on the log's head state (a replica built here): for each tenant with a quota, or "
        "running under the cluster's default, and each key it limits (gpu:<model>, gpu:*, cpu, memory; GPUs "
        "in milli): the nominal quota, what its running pods use, the most it may hold now (nominal plus "
        "what its cohort can lend it), what it borrows beyond its nominal, and its share of what its cohort "
        "borrows (lent, split among lenders by their unused lendable quota).",
    )
    add_cluster_option(quotas)
    _source_options(quotas)
    quotas.set_defaults(handler=_quotas)


def _replica(args: argparse.Namespace) -> Any:
    from processor.runtime.replica import Replica

    if args.bootstrap:
        from logs.kafka_replica import KafkaReplicaSource
        from schemas.topics import topics_for

        config = kafka_config(args)
        try:
            source: Any = KafkaReplicaSource(config, topics_for(args.topic_prefix))
        except ValueError as error:
            raise CliError(str(error)) from None
    else:
        from logs.embedded import LogError
        from logs.embedded_replica import EmbeddedReplicaSource

        try:
            source = EmbeddedReplicaSource(log_path(args))
        except LogError as error:
            raise CliError(str(error)) from None
    replica = Replica(source, batch_size=5_000)
    replica.restore()
    return replica


def _what_if(args: argparse.Namespace) -> int:
    from gpufold.cli_commands.log import _open_input
    from gpufold.jsonl import LineError, read_command_bytes, to_json_value
    from gpufold.text import printable
    from schemas.commands import Command

    name = "<stdin>" if args.file == "-" else args.file
    commands, lines, bad = [], [], 0
    stream = _open_input(args.file)  # bytes, decoded line by line as log append does
    try:
        items = list(read_command_bytes(stream))
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    for item in items:
        if isinstance(item, LineError):
            print(printable(f"gpufold: {name} {item}"), file=sys.stderr)
            bad += 1
        else:
            commands.append(Command.from_avro(item.record))
            lines.append(item.line)
    if bad:
        raise CliError(f"{bad} bad line(s) in {name}; nothing was folded")
    if not commands:
        raise CliError(f"no commands in {name}")
    replica = _replica(args)
    try:
        answer = replica.what_if(commands)
    finally:
        replica.stop()
    if args.json:
        for line, result in zip(lines, answer.results, strict=True):
            record = {
                "line": line,
                "command_id": result.command.command_id,
                "partition": result.partition,
                "offset": result.offset,
                "events": [to_json_value(e.to_avro()) for e in result.events],
            }
            print(json.dumps(record))
        return 0
    at = ", ".join(f"partition {p} offset {o}" for p, o in answer.position["offsets"].items())
    print(f"what-if on the head state ({at}; lag {answer.position['lag']}); nothing was published")
    for line, result in zip(lines, answer.results, strict=True):
        print(f"line {line}: {result.command.command_id} {result.command.type_name} -> offset {result.offset}")
        for event in result.events:
            print(f"  {_describe(event)}")
    return 0


def _describe(event: Any) -> str:
    payload = event.payload
    kind = type(payload).__name__
    if kind == "PodScheduled":
        gpus = ",".join(f"{g.index}:{g.milli}" for g in payload.gpus) or "no GPU"
        return f"PodScheduled {payload.pod.pod_id} on {payload.node_id} (GPUs {gpus}, policy {payload.policy})"
    if kind == "PodQueued":
        reasons = ", ".join(f"{r.code} x{r.nodes}" for r in payload.reasons)
        return f"PodQueued {payload.pod.pod_id} ({reasons})"
    if kind == "CommandRejected":
        return f"CommandRejected {payload.code}: {payload.message}"
    fields = {k: v for k, v in payload.to_avro().items() if not isinstance(v, (dict, list))}
    return f"{kind} " + " ".join(f"{k}={v}" for k, v in fields.items())


def _explain(args: argparse.Namespace) -> int:
    replica = _replica(args)
    try:
        found = replica.explain(args.cluster, args.pod_id)
        position = replica.position()
    finally:
        replica.stop()
    if found is None:
        print(
            f"gpufold: pod {args.pod_id!r} is neither pending nor running in cluster {args.cluster!r}", file=sys.stderr
        )
        return 1
    data = found.as_json()
    if args.json:
        print(json.dumps({**data, "replica": position}))
        return 0
    print(f"{data['cluster']}/{data['pod_id']}: {data['state']}, asks {data['request']}")
    print(f"  {data['message']}")
    for reason in data["reasons"]:
        print(f"  - {reason['code']}: {reason['message']}")
    if data["nearest_miss"]:
        print(f"  nearest miss: {data['nearest_miss']['message']}")
    for remedy in data["would_fit_if"]:
        print(f"  would fit if: {remedy['message']}")
    return 0


def _quotas(args: argparse.Namespace) -> int:
    replica = _replica(args)
    try:
        answer = replica.quotas(args.cluster)
    finally:
        replica.stop()
    if args.json:
        print(json.dumps(answer))
        return 0
    rows = answer["quotas"]
    if not rows:
        print("no quotas: every tenant runs unlimited (SetQuota sets one; SetPolicy default_quota a default)")
        return 0
    print(f"{'cluster':12} {'tenant':16} {'cohort':12} {'key':14} {'nominal':>10} {'used':>10} {'may hold':>10} "
          f"{'borrowed':>10} {'lent':>10}")  # fmt: skip
    for row in rows:
        tenant = row["tenant"] + (" (default)" if row["default"] else "")
        print(f"{row['cluster']:12} {tenant:16} {row['cohort'] or '-':12} {row['key']:14} {row['nominal']:>10} "
              f"{row['used']:>10} {row['may_hold']:>10} {row['borrowed']:>10} {row['lent']:>10}")  # fmt: skip
    cohorts = answer.get("cohorts", [])
    if cohorts:
        print()
        print(f"{'cluster':12} {'cohort':16} {'parent':12} {'key':14} {'level':>5} {'subtree':>10} {'kept':>10} "
              f"{'in use':>10} {'may use':>10}")  # fmt: skip
        for row in cohorts:
            may_use = "-" if row["may_use"] is None else row["may_use"]
            print(f"{row['cluster']:12} {row['cohort']:16} {row['parent'] or '-':12} {row['key']:14} "
                  f"{row['depth']:>5} {row['subtree_quota']:>10} {row['kept']:>10} {row['in_use']:>10} "
                  f"{may_use:>10}")  # fmt: skip
    return 0
