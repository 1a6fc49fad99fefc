"""``gpufold demo``: the openb trace replayed on the embedded log (no servers)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufold.cli_commands.options import add_json_option, add_progress_option, add_trace_options
from gpufold.trace import TraceError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo",
        help="replay the bundled openb GPU trace in event time on the embedded log and summarise",
        description="Replays the bundled Alibaba openb trace (1,213 nodes, 8,152 pods): every node added, each pod "
        "submitted at its creation time and released at its deletion time, folded by the same processor that "
        "runs on Kafka, then summarised from the published events.",
    )
    parser.add_argument("--log", type=Path, default=Path("gpufold-demo.sqlite"), help="embedded log file to (re)create")
    add_trace_options(parser)
    parser.add_argument("--limit-pods", type=int, help="replay only the first N pods of the list")
    add_json_option(parser, help="print the summary as one JSON object")
    add_progress_option(parser, help="no progress bars")
    parser.add_argument(
        "--pressure",
        default="best-fit-paper,fgd,fgd-plus,fgd-pack",
        help="policies to compare in the published FGD experiment after the replay (comma-separated; '' to skip)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpufold.cli import CliError
    from gpufold.demo import print_json, render, run_demo

    if args.limit_pods is not None and args.limit_pods < 0:
        raise CliError("--limit-pods must be >= 0")
    try:
        summary = run_demo(
            args.log,
            args.nodes,
            args.pods,
            limit_pods=args.limit_pods,
            progress=not args.no_progress,
            pressure_policies=tuple(p for p in args.pressure.split(",") if p),
        )
    except TraceError as error:
        raise CliError(str(error)) from error
    if args.json:
        print_json(summary)
    else:
        print(render(summary))
    return 0
