"""``gpufold state``: the processor's current state over the embedded log (listNodes, listPods, getUtilization)."""

from __future__ import annotations

import argparse
import json
import sys

from gpufold.cli import CliError
from gpufold.cli_commands._embedded import add_log_argument, committed_states, log_path, open_log
from gpufold.cli_commands.options import add_cluster_option, add_json_option
from gpufold.state_view import (
    list_nodes,
    list_pods,
    render_nodes,
    render_pods,
    render_summary,
    render_utilization,
    summary,
    utilization,
)

VIEWS = ("summary", "nodes", "pods", "utilization")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "state",
        help="show the current state: summary, nodes, pods or GPU utilization per model",
        description="Show the state the processor has committed (latest snapshot + the commands folded since), "
        "without writing anything. Commands appended but not yet folded are not included: run `gpufold run`.",
    )
    add_log_argument(parser)
    parser.add_argument("view", nargs="?", choices=VIEWS, default="summary", help="what to show (default summary)")
    add_cluster_option(parser)
    add_json_option(parser, help="print JSON (a list of objects, or one object)")
    parser.set_defaults(handler=_state)


def _state(args: argparse.Namespace) -> int:
    with open_log(args, readonly=True) as log:
        states = committed_states(log)
        lag = log.lag()
    names = sorted(name for state in states.values() for name in state.clusters)
    if args.cluster is not None and args.cluster not in names:
        # An empty table would look like an idle cluster (a typo must say so).
        raise CliError(f"no cluster {args.cluster!r} in the committed state (clusters: {', '.join(names) or 'none'})")
    if args.view == "nodes":
        data: object = list_nodes(states, args.cluster)
        text = render_nodes(data)  # type: ignore[arg-type]
    elif args.view == "pods":
        data = list_pods(states, args.cluster)
        text = render_pods(data)  # type: ignore[arg-type]
    elif args.view == "utilization":
        data = utilization(states, args.cluster)
        text = render_utilization(data)  # type: ignore[arg-type]
    else:
        data = {**summary(states, args.cluster), "lag": lag}
        text = render_summary(data)  # type: ignore[arg-type]
    print(json.dumps(data) if args.json else text)
    if lag and not args.json:
        print(f"note: {lag} command(s) not folded yet: gpufold run --log {log_path(args)}", file=sys.stderr)
    return 0
