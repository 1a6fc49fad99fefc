"""``gpufold run``: fold the embedded log's new commands into events, the same loop as on Kafka."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from tqdm import tqdm

from gpufold.cli import CliError
from gpufold.cli_commands._embedded import add_log_argument, log_path, open_log
from gpufold.cli_commands.options import add_json_option, add_progress_option
from logs.embedded import EmbeddedLog, FencedError
from processor.core.errors import InvariantViolation
from processor.runtime.collector import collect_and_freeze
from processor.runtime.loop import DEFAULT_BATCH_SIZE, DEFAULT_SNAPSHOT_EVERY, Processor
from processor.runtime.ticks import TickSchedule
from schemas.commands import Command
from schemas.fastcodec import encode_command
from schemas.partitioner import partition_for


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="run the processor over the embedded log until it is idle",
        description="Fold every command not yet processed into events, dead letters and snapshots. Each batch "
        "is committed atomically with the processor's position, so an interrupted run loses and duplicates "
        "nothing: run it again to continue.",
    )
    add_log_argument(parser)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="commands per atomic batch")
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=DEFAULT_SNAPSHOT_EVERY,
        help="write a snapshot every N commands of a partition (0: never)",
    )
    parser.add_argument("--follow", action="store_true", help="keep waiting for new commands (Ctrl-C to stop)")
    parser.add_argument(
        "--tick-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --follow: append a Tick command to each partition this often, so timeouts, time limits and "
        "reservations fire when no other command moves event time (default: 0, never)",
    )
    add_progress_option(parser)
    add_json_option(parser, help="print the summary as one JSON object")
    parser.set_defaults(handler=_run)


def _append_ticks(log: EmbeddedLog, commands: list[Command]) -> None:
    """Append due ticks to the commands topic, each to its cluster's partition, in one transaction."""
    if commands:
        records = [
            (partition_for(c.cluster.encode(), log.partitions), c.cluster.encode(), encode_command(c)) for c in commands
        ]
        log.append(log.topics.commands, records)


def _totals(log: EmbeddedLog) -> dict[str, int]:
    topics = log.topics
    return {
        name: sum(log.end_offset(topic, p) for p in log.topic_partitions(topic))
        for name, topic in (
            ("events", topics.events),
            ("dead_letters", topics.dead_letters),
            ("snapshots", topics.snapshots),
        )
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.snapshot_every < 0:
        raise CliError("--batch-size must be >= 1 and --snapshot-every >= 0")
    if args.tick_interval < 0 or (args.tick_interval and not args.follow):
        raise CliError("--tick-interval needs --follow and a value >= 0 seconds")
    ticks = TickSchedule(args.tick_interval)
    with open_log(args, readonly=False) as log:
        before = _totals(log)
        processor = Processor(log, snapshot_every=args.snapshot_every, batch_size=args.batch_size)
        collect_and_freeze()  # the process's own objects (modules, the log) out of the collector's sight, once
        folded = 0
        started = time.perf_counter()
        bar = tqdm(
            total=log.lag(),
            unit="cmd",
            desc="folding",
            disable=True if args.no_progress else None,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        # In --follow, SIGTERM (systemd, docker stop, kill) stops like Ctrl-C: after the batch being
        # committed, with the summary, exit 0 (Python's default would die mid-way without a word).
        previous = signal.signal(signal.SIGTERM, _interrupt) if args.follow else None
        try:
            while True:
                count = processor.run_batch(timeout=0.5 if args.follow else 0.0)
                folded += count
                bar.update(count)
                if count == 0:
                    if not args.follow:
                        break
                    _append_ticks(log, ticks.due([f.state for f in processor.folders.values()], "embedded"))
                    bar.total = bar.n + log.lag()
                    bar.refresh()
        except KeyboardInterrupt:
            if not args.follow:
                raise
        except FencedError as error:
            raise CliError(f"stopped: {error}") from None
        except InvariantViolation as error:
            # A bug in the fold: nothing of the failing batch was committed.
            raise CliError(f"stopped without committing the current batch: invariant violated: {error}") from None
        finally:
            bar.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        seconds = time.perf_counter() - started
        after = _totals(log)
        lag = log.lag()
    summary = {
        "log": log_path(args),
        "commands": folded,
        "events": after["events"] - before["events"],
        "dead_letters": after["dead_letters"] - before["dead_letters"],
        "snapshots": after["snapshots"] - before["snapshots"],
        "seconds": round(seconds, 3),
        "commands_per_sec": round(folded / seconds) if folded and seconds > 0 else 0,
        "lag": lag,
    }
    if args.json:
        import json

        print(json.dumps(summary))
        return 0
    if not folded:
        print("nothing to fold: every command in the log has been processed")
        return 0
    print(
        f"folded {folded} command(s) into {summary['events']} event(s), {summary['dead_letters']} dead letter(s), "
        f"{summary['snapshots']} snapshot(s) in {seconds:.2f} s ({summary['commands_per_sec']} commands/s)"
    )
    return 0
