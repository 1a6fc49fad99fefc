"""``gpufold log``: append JSON-lines commands to the embedded log, inspect it, export and import it."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from gpufold.cli import CliError
from gpufold.cli_commands._embedded import add_log_argument, log_path, open_log
from gpufold.cli_commands.options import add_json_option
from gpufold.jsonl import LineError, ParsedCommand, command_types, read_command_bytes
from gpufold.log_export import ROLES, export_log, import_log
from gpufold.text import printable
from logs.embedded import DEFAULT_PARTITIONS, EmbeddedLog, LogError
from schemas import DecodeError
from schemas.codes import DeadLetterCode
from schemas.dead_letters import decode_dead_letter
from schemas.limits import MAX_LINE_BYTES

APPEND_CHUNK = 10_000

_JSONL_HELP = (
    'One command per line, field names as in schemas/command.avsc, payload as {"Type": {...}} '
    f"(types: {', '.join(command_types())}). Fields with a schema default may be left out; issued_at is "
    "epoch milliseconds or an ISO-8601 time with a zone. Blank lines and lines starting with # are skipped. "
    "Each line is decoded (UTF-8; a byte-order mark before the first line is ignored), parsed and checked on "
    f"its own: a line that is not UTF-8, not JSON, repeats a key, nests too deeply, is over {MAX_LINE_BYTES} bytes "
    "or does not match the schema is reported with its number and reason and skipped; the others are appended "
    "(exit status 1 if any line was skipped). Whether a command makes sense is the fold's business: it answers "
    "with CommandRejected."
)
_JSONL_EXAMPLE = (
    "Example line:\n"
    '  {"command_id": "c1", "cluster": "lab", "issued_at": 1767225600000, '
    '"payload": {"SubmitPod": {"pod_id": "p1", "num_gpu": 1, "gpu_milli": 500, "cpu_milli": 4000}}}'
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "log",
        help="the embedded log: append commands, show what it holds, export/import it",
        description="The embedded log: one SQLite file with Kafka's topics, partitions and offsets (no servers).",
    )
    commands = parser.add_subparsers(dest="log_command", metavar="ACTION", required=True)

    append = commands.add_parser(
        "append",
        help="append JSON-lines commands (a file or - for stdin)",
        description=textwrap.fill(
            "Append JSON-lines commands to the embedded log (a new log only with --create, so a mistyped --log "
            "is an error, not a second log). " + _JSONL_HELP
        )
        + "\n\n"
        + _JSONL_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_argument(append)
    append.add_argument("file", metavar="FILE.jsonl", help="the commands, or - to read standard input")
    append.add_argument(
        "--partitions",
        type=int,
        default=None,
        help=f"command partitions of a NEW log (default {DEFAULT_PARTITIONS}); a cluster's partition is "
        "murmur2(cluster) mod this, as on Kafka",
    )
    append.add_argument("--strict", action="store_true", help="append nothing if any line is bad (all or nothing)")
    append.add_argument("--create", action="store_true", help="create the log if it does not exist yet")
    append.set_defaults(handler=_append)

    info = commands.add_parser("info", help="partitions, record counts, processor position and lag")
    add_log_argument(info)
    add_json_option(info)
    info.set_defaults(handler=_info)

    export = commands.add_parser(
        "export",
        help="export topics as Avro object container files",
        description="Write one Avro object container file per topic (commands.avro, events.avro, snapshots.avro, "
        "dead-letters.avro) into DIR, and manifest.json with each file's SHA-256, size and record count (import "
        "verifies them). Record bytes and offsets are kept exactly, so the commands replay to "
        "identical events anywhere.",
    )
    add_log_argument(export)
    export.add_argument("out_dir", metavar="DIR", help="directory to write (created if missing)")
    export.add_argument("--topics", default=",".join(ROLES), help=f"comma-separated roles (default {','.join(ROLES)})")
    from gpufold.cli_commands import log_export_kafka

    log_export_kafka.add_arguments(export)
    export.set_defaults(handler=_export)

    imp = commands.add_parser(
        "import",
        help="import an export into a new log",
        description="Create a new embedded log from an export directory (e.g. taken from production). Every "
        "file is first checked against the export's manifest.json (SHA-256, size, record count) and read in full; "
        "a damaged, truncated or changed export is refused before anything is written. With "
        "--topics commands only, `gpufold run` re-derives every event locally; with events too, the "
        "processor's committed positions come along.",
    )
    add_log_argument(imp)
    imp.add_argument("in_dir", metavar="DIR", help="an export directory")
    imp.add_argument("--topics", default=None, help="comma-separated roles to import (default: all files present)")
    imp.add_argument(
        "--unverified",
        action="store_true",
        help="import an export that has no manifest.json (written by an older gpufold) without checking it",
    )
    imp.set_defaults(handler=_import)


# ------------------------------------------------------------ append


def _open_input(path: str) -> BinaryIO:
    """The input as bytes (lines are decoded one by one); a missing file is an error before the log is touched."""
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except OSError as error:
        raise CliError(f"cannot read {printable(path)}: {error.strerror}") from None


def _report(name: str, error: LineError, stream: TextIO) -> None:
    print(printable(f"gpufold: {name} {error}"), file=stream)


def _append(args: argparse.Namespace) -> int:
    name = "<stdin>" if args.file == "-" else args.file
    if args.partitions is not None and args.partitions < 1:
        raise CliError(f"--partitions must be >= 1, got {args.partitions}")
    stream = _open_input(args.file)
    try:
        return _append_from(args, name, stream)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _append_from(args: argparse.Namespace, name: str, stream: BinaryIO) -> int:
    target = log_path(args)
    created = not Path(target).exists() or Path(target).stat().st_size == 0
    if created and not args.create:
        raise CliError(
            f"no log at {printable(target)}: pass --create to start a new one (a mistyped --log must not make a log)"
        )
    parsed: Iterable[ParsedCommand | LineError] = read_command_bytes(stream)
    appended = 0
    bad = 0
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    if args.strict:  # all or nothing: read everything before the log is even opened
        good: list[ParsedCommand | LineError] = []
        for item in parsed:
            if isinstance(item, LineError):
                _report(name, item, sys.stderr)
                bad += 1
            else:
                good.append(item)
        if bad:
            raise CliError(f"{bad} bad line(s) in {printable(name)}; nothing appended (--strict)")
        chunks: Iterable[list[ParsedCommand | LineError]] = [good]
    else:
        chunks = _chunked(parsed, APPEND_CHUNK)
    with open_log(args, readonly=False, partitions=args.partitions, create=args.create) as log:
        if created:
            print(f"created a new log at {printable(log.path)} ({log.partitions} command partition(s))")
        last_line = 0
        try:
            for chunk in chunks:
                frames = []
                for item in chunk:
                    if isinstance(item, LineError):
                        _report(name, item, sys.stderr)
                        bad += 1
                    else:
                        frames.append((item.key, item.frame()))  # type: ignore[union-attr]
                for partition, offset in log.append_commands(frames):
                    first.setdefault(partition, offset)
                    last[partition] = offset
                appended += len(frames)
                last_line = chunk[-1].line if chunk else last_line
        except (LogError, OSError, KeyboardInterrupt) as error:
            # Earlier chunks are committed: say exactly how far the file got.
            reason = "interrupted" if isinstance(error, KeyboardInterrupt) else printable(error)
            raise CliError(
                f"stopped after appending {appended} command(s) of {name} (through line {last_line}); "
                f"the rest was not appended: {reason}"
            ) from None
        where = ", ".join(f"partition {p} offsets {first[p]}-{last[p]}" for p in sorted(first))
        print(f"appended {appended} command(s) to {printable(log.path)}" + (f" ({where})" if where else ""))
        if bad:
            print(f"skipped {bad} bad line(s) (reported above)")
        lag = log.lag()
    if lag:
        print(f"{lag} command(s) waiting: gpufold run --log {printable(log_path(args))}")
    return 1 if bad else 0


def _chunked(items: Iterable[ParsedCommand | LineError], size: int) -> Iterator[list[ParsedCommand | LineError]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


# ------------------------------------------------------------ info


def _refused(log: EmbeddedLog, partition: int, code: str) -> int:
    """Dead letters of a partition carrying ``code`` (commands not folded, e.g. on the wrong partition)."""
    count = 0
    for record in log.read(log.topics.dead_letters, partition):
        try:
            count += record.value is not None and decode_dead_letter(record.value).code == code
        except DecodeError:
            continue
    return count


def log_info(log: EmbeddedLog) -> dict[str, object]:
    topics = log.topics
    partitions = []
    for partition in range(log.partitions):
        end = log.end_offset(topics.commands, partition)
        committed = log.committed(partition)
        partitions.append(
            {
                "partition": partition,
                "commands": end,
                "committed": committed,
                "lag": end - committed,
                "events": log.count(topics.events, partition),
                "snapshots": log.count(topics.snapshots, partition),
                "dead_letters": log.count(topics.dead_letters, partition),
                "wrong_partition": _refused(log, partition, DeadLetterCode.WRONG_PARTITION),
            }
        )
    return {"log": str(log.path), "group": log.group, "partitions": partitions}


def _info(args: argparse.Namespace) -> int:
    with open_log(args, readonly=True) as log:
        info = log_info(log)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"log {info['log']} (processor group {info['group']})")
    for p in info["partitions"]:  # type: ignore[attr-defined]
        print(
            f"partition {p['partition']}: {p['commands']} commands, committed {p['committed']} (lag {p['lag']}), "
            f"{p['events']} events, {p['snapshots']} snapshots, {p['dead_letters']} dead letters"
            + (f" ({p['wrong_partition']} on the wrong partition: WRONG_PARTITION)" if p["wrong_partition"] else "")
        )
    return 0


# ------------------------------------------------------------ export / import


def _roles(text: str | None) -> list[str] | None:
    if text is None:
        return None
    roles = [role.strip() for role in text.split(",") if role.strip()]
    unknown = [role for role in roles if role not in ROLES]
    if unknown:
        raise CliError(f"unknown topic(s) {', '.join(unknown)}; choose from {', '.join(ROLES)}")
    return roles


def _export(args: argparse.Namespace) -> int:
    roles = _roles(args.topics) or list(ROLES)
    if args.bootstrap:
        from gpufold.cli_commands import log_export_kafka

        return log_export_kafka.export(args, roles)
    with open_log(args, readonly=True) as log:
        try:
            counts = export_log(log, args.out_dir, roles)
        except OSError as error:
            raise CliError(f"cannot write {args.out_dir}: {error.strerror}") from None
    for role, count in counts.items():
        print(f"{role}: {count} record(s) -> {args.out_dir}/{role}.avro")
    return 0


def _import(args: argparse.Namespace) -> int:
    target = log_path(args)
    try:
        counts = import_log(args.in_dir, target, _roles(args.topics), verify=not args.unverified)
    except LogError as error:
        raise CliError(str(error)) from None
    except OSError as error:
        raise CliError(f"cannot import {args.in_dir}: {error}") from None
    for role, count in counts.items():
        print(f"{role}: {count} record(s) imported into {target}")
    if "events" not in counts:
        print(f"no events imported: gpufold run --log {target} derives them")
    return 0
