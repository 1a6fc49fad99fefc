"""Shared by the local-log subcommands: the ``--log`` option and opening the embedded log."""

from __future__ import annotations

import argparse
import os

from gpufold.cli import CliError
from logs.embedded import EmbeddedLog, LogError
from processor.core.state import PartitionState
from processor.runtime.loop import restore_state

LOG_ENV = "GPUFOLD_LOG"
DEFAULT_LOG = "gpufold.log.sqlite"
LOG_HELP = f"the embedded log file (default: ${LOG_ENV}, else ./{DEFAULT_LOG} in the current directory)"


def add_log_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", metavar="PATH", default=None, help=LOG_HELP)


def log_path(args: argparse.Namespace) -> str:
    return args.log or os.environ.get(LOG_ENV) or DEFAULT_LOG


def open_log(
    args: argparse.Namespace, *, readonly: bool, partitions: int | None = None, create: bool = False
) -> EmbeddedLog:
    """Open the log named by ``--log``; a missing or broken file is a one-line CliError.

    Only ``log append --create`` (and ``log import``, into a new file) make a log: a typo in a path
    is an error, never a new empty log.
    """
    path = log_path(args)
    try:
        return EmbeddedLog(path, readonly=readonly, create=create and not readonly, partitions=partitions)
    except LogError as error:
        hint = (
            " (start one with: gpufold log append --create --log PATH FILE.jsonl)" if "no log at" in str(error) else ""
        )
        raise CliError(f"{error}{hint}") from None


def partitions_arg(log: EmbeddedLog, partition: int | None) -> list[int]:
    if partition is None:
        return list(range(log.partitions))
    if not 0 <= partition < log.partitions:
        raise CliError(f"--partition {partition} is outside 0..{log.partitions - 1}")
    return [partition]


def committed_states(log: EmbeddedLog) -> dict[int, PartitionState]:
    """The processor's state of every partition: latest snapshot + re-fold up to the committed offset."""
    return {partition: restore_state(log, partition) for partition in range(log.partitions)}
