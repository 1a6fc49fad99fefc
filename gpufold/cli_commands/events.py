"""``gpufold events``: list the events (or dead letters) the processor published to the embedded log."""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from typing import Any

from gpufold.cli import CliError
from gpufold.cli_commands._embedded import add_log_argument, open_log, partitions_arg
from gpufold.cli_commands.options import add_cluster_option, add_json_option, add_partition_option
from gpufold.jsonl import to_json_value
from gpufold.text import iso, printable
from schemas import DEAD_LETTER, EVENT, DecodeError, registry
from schemas.events import PAYLOAD_TYPES

EVENT_TYPES = tuple(sorted(cls.__name__ for cls in PAYLOAD_TYPES.values()))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "events",
        help="list the events in the embedded log",
        description="List the events the processor published, in offset order per partition. Text lines read "
        "PARTITION:OFFSET TIME CLUSTER COMMAND_ID TYPE DETAILS; --json prints one event envelope per line "
        '(payload as {"Type": {...}}) with its partition and offset.',
    )
    add_log_argument(parser)
    add_json_option(parser, help="one JSON object per line")
    parser.add_argument("--from", dest="start", type=int, default=0, metavar="N", help="first event offset (default 0)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="print at most N events")
    add_partition_option(parser)
    add_cluster_option(parser, help="only events of this cluster")
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        default=None,
        metavar="TYPE",
        help="only events of this type, e.g. CommandRejected (repeatable)",
    )
    parser.add_argument(
        "--dead-letters",
        action="store_true",
        help="list the dead letters instead (command records that did not decode)",
    )
    parser.set_defaults(handler=_events)


def describe(type_name: str, body: dict[str, Any]) -> str:
    """A short human description of an event payload."""
    if type_name == "PodScheduled":
        pod = body["pod"]
        gpus = ",".join(f"{g['index']}:{g['milli']}" for g in body["gpus"])
        extra = " from queue" if body["from_queue"] else ""
        return (
            f"{pod['pod_id']} -> {body['node_id']}" + (f" gpus {gpus}" if gpus else "") + f" ({body['policy']}{extra})"
        )
    if type_name == "PodQueued":
        reasons = ", ".join(f"{r['code']} x{r['nodes']}" for r in body["reasons"])
        return f"{body['pod']['pod_id']}" + (" requeued" if body["requeued"] else "") + f": {reasons}"
    if type_name == "CommandRejected":
        return f"{body['command_type']} {body['code']}: {body['message']}"
    if type_name == "NodeAdded":
        gpus = f" {body['gpu_count']}x{body['gpu_model']}" if body["gpu_count"] else ""
        return f"{body['node_id']}{gpus} cpu {body['cpu_milli']} mem {body['memory_mib']}"
    if type_name == "PodReleased":
        where = f" from {body['node_id']}" if body["node_id"] else " (was queued)"
        return f"{body['pod_id']}{where}: {body['reason']}"
    if type_name == "PodEvicted":
        return f"{body['pod_id']} from {body['node_id']}: {body['reason']}"
    if type_name in ("NodeDrained", "NodeFailed"):
        return f"{body['node_id']} evicted {body['evicted']}" + (f": {body['reason']}" if body.get("reason") else "")
    if type_name == "PolicyChanged":
        settings = "".join(
            f", {name} {body[name]}" for name in ("reserve_after_ms", "queue_order") if body.get(name) not in (None, "")
        )
        return f"{body['previous']} -> {body['policy']}{settings}"
    if type_name == "GangScheduled":
        placed = ", ".join(f"{m['pod_id']}->{m['node_id']}" for m in body["members"][:4])
        more = f" and {len(body['members']) - 4} more" if len(body["members"]) > 4 else ""
        return f"{body['gang_id']}: {body['message']} [{placed}{more}]"
    if type_name == "GangQueued":
        reasons = "; ".join(r["message"] or f"{r['code']} x{r['nodes']}" for r in body["reasons"][:2])
        return f"{body['gang_id']}" + (" requeued" if body["requeued"] else "") + f": {reasons}"
    if type_name == "GangReleased":
        return f"{body['gang_id']}: {body['reason']}" + ("" if body["ok"] else " (not ok)")
    if type_name == "PodTimeLimitReached":
        return f"{body['pod_id']} on {body['node_id']}: time limit {body['time_limit_ms']} ms"
    if type_name == "Ticked":
        return iso(body["clock"])
    if body.get("message"):
        return body["message"]
    return " ".join(f"{key}={value}" for key, value in body.items())


def _events(args: argparse.Namespace) -> int:
    if args.start < 0 or (args.limit is not None and args.limit < 0):
        raise CliError("--from and --limit must be >= 0")
    unknown = sorted(set(args.types or ()) - set(EVENT_TYPES))
    if unknown:
        raise CliError(f"unknown event type {printable(', '.join(unknown))}; types: {', '.join(EVENT_TYPES)}")
    if args.dead_letters and (args.types or args.cluster):
        raise CliError("--type and --cluster filter events; dead letters have neither")
    clusters: set[str] = set()
    found = False
    with open_log(args, readonly=True) as log:
        topic = log.topics.dead_letters if args.dead_letters else log.topics.events
        codec = registry().codec(DEAD_LETTER if args.dead_letters else EVENT)
        partitions = partitions_arg(log, args.partition)
        # Merge partitions in (offset, partition) order: with one partition it is simply offset order.
        streams = [((r.offset, r.partition, r.value) for r in log.read(topic, p, args.start)) for p in partitions]
        printed = 0
        wanted = set(args.types) if args.types else None
        for offset, partition, value in heapq.merge(*streams):
            if args.limit is not None and printed >= args.limit:
                break
            try:
                record = codec.decode(value)  # type: ignore[arg-type]
            except DecodeError as error:  # never expected: the processor wrote these
                print(f"{partition}:{offset} undecodable record: {printable(error)}")
                printed += 1
                continue
            if args.dead_letters:
                _print_dead_letter(partition, offset, record, args.json)
                printed += 1
                continue
            type_name = record["payload"][0].rsplit(".", 1)[-1]
            if args.cluster and len(clusters) < 1_000:
                clusters.add(record["cluster"])  # to name some in the message if the asked one never shows
            found = found or record["cluster"] == args.cluster
            if (args.cluster and record["cluster"] != args.cluster) or (wanted and type_name not in wanted):
                continue
            if args.json:
                print(json.dumps({"partition": partition, "offset": offset, **to_json_value(record)}))
            else:
                print(
                    printable(
                        f"{partition}:{offset}  {iso(record['occurred_at'])}  {record['cluster']}  "
                        f"{record['command_id']}  {type_name}  {describe(type_name, record['payload'][1])}"
                    )
                )
            printed += 1
    if printed or (args.limit is not None and args.limit == 0):
        return 0
    where = f" from offset {args.start}" if args.start else ""
    if args.cluster and not found:
        known = sorted(clusters)
        listed = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        print(
            printable(f"gpufold: no events of cluster {args.cluster!r}{where} (clusters: {listed or 'none'})"),
            file=sys.stderr,
        )
        return 1
    what = "dead letters" if args.dead_letters else "events"
    print(f"gpufold: no {what}{where} match", file=sys.stderr)
    return 0


def _print_dead_letter(partition: int, offset: int, record: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"partition": partition, "offset": offset, **to_json_value(record)}))
    else:
        size = len(record["value"]) if record["value"] is not None else 0
        print(
            printable(
                f"{partition}:{offset}  {record['topic']}[{record['partition']}]@{record['offset']}  "
                f"{size} bytes  {record['error']}"
            )
        )
