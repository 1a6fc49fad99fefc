"""The ``gpufold`` command line.

Each subcommand lives in its own module under ``gpufold.cli_commands`` and
exposes ``register(subparsers)``; this module only discovers and dispatches, so
adding a command never touches the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from gpufold import __version__, cli_commands


class CliError(Exception):
    """A user-facing error: printed as one clear line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufold",
        description="Event-sourced GPU scheduler: deterministic allocation fold over Kafka or an embedded log.",
    )
    parser.add_argument("--version", action="version", version=f"gpufold {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(cli_commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{cli_commands.__name__}.{module_info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """A subcommand registered with only a one-line ``help`` gets it as its ``--help`` description too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and summaries.get(name):
                    text = str(summaries[name])
                    sub.description = text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
                _describe(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    from gpufold.text import printable
    from logs.embedded import LogError
    from processor.runtime.loop import RestoreError

    try:
        return int(handler(args) or 0)
    except (CliError, LogError, RestoreError) as error:
        print(f"gpufold: error: {printable(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpufold: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as error:  # a bug, or a failure nobody foresaw: still one line (-vv shows the traceback)
        if args.verbose >= 2:
            raise
        detail = printable(str(error).splitlines()[0] if str(error) else "")[:300]
        print(f"gpufold: error: unexpected {type(error).__name__}: {detail} (rerun with -vv for details)",
              file=sys.stderr)  # fmt: skip
        return 70
