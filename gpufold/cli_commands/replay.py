"""``gpufold replay``: re-fold the embedded log's commands into a fresh state, without touching the log."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from gpufold.cli import CliError
from gpufold.cli_commands._embedded import add_log_argument, open_log, partitions_arg
from gpufold.cli_commands.options import add_json_option, add_partition_option
from gpufold.replay import Replayed, replay_partition
from gpufold.state_view import render_summary, summary
from logs.embedded import EmbeddedLog
from logs.port import InputRecord
from schemas.codec import DecodeError
from schemas.fastcodec import decode_command


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "replay",
        help="re-fold the commands from offset 0 and print the state summary and state_hash",
        description="Fold the commands of the log from offset 0 into a fresh state (snapshots and the "
        "processor's events are not used), opening the log read-only, and print the state summary and its "
        "state_hash: the same commands give the same hash on any machine. With several partitions, "
        "state_hash combines the partitions' hashes (see gpufold.state_view.combined_hash).",
    )
    add_log_argument(parser)
    parser.add_argument(
        "--until",
        type=_until,
        default=None,
        metavar="OFFSET|TIME",
        help="stop after the command at OFFSET (inclusive; per partition), or before the first command issued "
        "after TIME (ISO-8601 with a zone, e.g. 2026-01-05T10:00:00Z): what the cluster looked like then; "
        "default: every command",
    )
    add_partition_option(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="also compare the derived events, byte for byte, with the events the processor published "
        "(exit status 1 on a difference)",
    )
    add_json_option(parser)
    parser.set_defaults(handler=_replay)


def _check(log: EmbeddedLog, replayed: Replayed, end: int) -> dict[str, Any]:
    """Compare derived events with the published ones, for the commands both cover.

    The processor published the events of the commands below its committed offset;
    those derived from the same commands must be the same bytes in the same order,
    and if the replay went at least as far, there must be no other published event.
    """
    partition = replayed.partition
    covered = min(log.committed(partition), end)
    derived = [frame for command_offset, frame in replayed.events if command_offset < covered]
    published = log.read(log.topics.events, partition)

    def result(ok: bool, compared: int, problem: str | None = None) -> dict[str, Any]:
        return {"partition": partition, "ok": ok, "compared": compared, "problem": problem}

    for index, frame in enumerate(derived):
        stored = next(published, None)
        if stored is None:
            return result(False, index, f"the events topic ends after {index} events; {len(derived)} derived")
        if bytes(stored.value or b"") != frame:
            return result(False, index, f"event {index} (offset {stored.offset}) differs from the derived one")
    if covered == log.committed(partition):
        extra = next(published, None)
        if extra is not None:
            return result(False, len(derived), f"the events topic has more events than derived (offset {extra.offset})")
    return result(True, len(derived))


class Until(int):
    """An --until bound: an offset, or with ``time_ms`` set, an event time."""

    time_ms: int | None = None


def _until(text: str) -> Until:
    text = text.strip()
    if text.isdigit():
        return Until(int(text))
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset or an ISO-8601 time: {text!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"the time {text!r} needs a zone (e.g. Z or +02:00)")
    until = Until(-1)
    until.time_ms = int(moment.timestamp() * 1000)
    return until


def _issued_until(records: Iterable[InputRecord], time_ms: int) -> Iterator[InputRecord]:
    """Records in log order up to the first command issued after ``time_ms`` (undecodable ones pass)."""
    for record in records:
        try:
            issued_at = decode_command(record.value).issued_at  # type: ignore[arg-type]
        except DecodeError:
            issued_at = None
        if issued_at is not None and issued_at > time_ms:
            return
        yield record


def _replay(args: argparse.Namespace) -> int:
    if args.until is not None and args.until.time_ms is None and args.until < 0:
        raise CliError("--until must be >= 0")
    started = time.perf_counter()
    with open_log(args, readonly=True) as log:
        partitions = partitions_arg(log, args.partition)
        results = []
        ends = []
        for partition in partitions:
            end = log.end_offset(log.topics.commands, partition)
            records: Iterable[InputRecord]
            if args.until is not None and args.until.time_ms is not None:
                records = _issued_until(log.read_commands(partition, 0, end), args.until.time_ms)
            else:
                if args.until is not None:
                    end = min(end, args.until + 1)
                records = log.read_commands(partition, 0, end)
            replayed = replay_partition(
                partition,
                records,
                log.topics,
                keep_events=args.check,
                placement=log.placement(partition),
                history=log,
            )
            ends.append(replayed.state.next_offset)
            results.append(replayed)
        checks = [_check(log, r, e) for r, e in zip(results, ends, strict=True)] if args.check else []
    seconds = time.perf_counter() - started
    commands = sum(r.commands for r in results)
    data = {
        **summary({r.partition: r.state for r in results}),
        "until": None
        if args.until is None
        else (args.until.time_ms if args.until.time_ms is not None else int(args.until)),
        "commands": commands,
        "events": sum(r.state.sequence for r in results),
        "dead_letters": sum(r.dead_letters for r in results),
        "seconds": round(seconds, 3),
        "commands_per_sec": round(commands / seconds) if commands and seconds > 0 else 0,
    }
    if args.check:
        data["check"] = checks
    ok = all(check["ok"] for check in checks)
    if args.json:
        print(json.dumps(data))
        return 0 if ok else 1
    until = ""
    if args.until is not None:
        until = (
            f" up to offset {int(args.until)}"
            if args.until.time_ms is None
            else f" issued up to {args.until.time_ms} ms"
        )
    print(
        f"replayed {commands} command(s){until} into {data['events']} event(s), {data['dead_letters']} dead "
        f"letter(s) in {seconds:.2f} s; the log was not modified"
    )
    print(render_summary(data))
    for check in checks:
        if check["ok"]:
            print(f"partition {check['partition']}: {check['compared']} event(s) identical to the published ones")
        else:
            print(f"partition {check['partition']}: MISMATCH: {check['problem']}")
    return 0 if ok else 1
