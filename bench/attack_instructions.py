"""Instructions of one worst case's attack command alone, under callgrind (issue #20).

Wall time on a shared machine moves with its neighbours (this one's speed moved 2x within minutes); the
instruction count does not. This folds a case of ``bench/worst_case.py`` up to its first attack command with
callgrind's instrumentation off, switches it on (``callgrind_control -i on``), folds the attack command, and
prints the instructions callgrind counted: the command alone, no setup and no interpreter teardown.

    python bench/attack_instructions.py gang_preempts                       # 10,000 nodes, 100,000 pods
    python bench/attack_instructions.py gang_preempts --nodes 2000 --pods 20000
    GPUFOLD_PURE_PYTHON=1 python bench/attack_instructions.py gang_preempts  # the pure-Python build

Needs ``valgrind`` (with ``callgrind_control``) on the PATH. Compare two trees by running it from each
(the case and the fold are imported from the working directory).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(case: str, nodes: int, pods: int) -> None:
    """Fold the case up to its attack, say so, wait for a line on stdin, fold the attack, exit at once."""
    sys.path.insert(0, os.getcwd())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import worst_case

    from processor.core.fold import decide
    from processor.core.state import PartitionState
    from processor.runtime.collector import Collector
    from tests import adversarial

    commands = worst_case.CASES[case](nodes, pods)
    first = next(i for i, command in enumerate(commands) if command.command_id.startswith(adversarial.ATTACK))
    state = PartitionState()
    for command in commands[:first]:
        decide(state, command)
    Collector().restored(first)  # the collector kept off the state, as the processor keeps it
    print("ready", flush=True)
    sys.stdin.readline()
    events = decide(state, commands[first])
    print(f"events {len(events)} {commands[first].type_name}", flush=True)
    os._exit(0)  # no teardown of the state under the instrumentation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.case, args.nodes, args.pods)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch, "callgrind.out")
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            args.case,
            "--nodes",
            str(args.nodes),
            "--pods",
            str(args.pods),
            "--child",
        ]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdin is not None and process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "ready":
            process.kill()
            print(f"the case did not build: {line!r}", file=sys.stderr)
            return 1
        subprocess.run(["callgrind_control", "-i", "on", str(process.pid)], check=True, capture_output=True)
        time.sleep(0.5)  # callgrind takes the request at its next check
        process.stdin.write("go\n")
        process.stdin.flush()
        result = process.stdout.readline().strip()
        process.wait()
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            print("callgrind wrote no totals", file=sys.stderr)
            return 1
        build = "pure" if os.environ.get("GPUFOLD_PURE_PYTHON", "") not in ("", "0") else "as installed"
        print(
            f"{args.case} ({args.nodes:,} nodes, {args.pods:,} pods, {build}): {result}, "
            f"{int(found.group(1)):,} instructions"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
