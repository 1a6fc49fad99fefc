"""An ordinary mixed stream against the benchmark stream, in the same run (issue #20).

Not a test: a measurement. The issue found that an ordinary day (``tests.adversarial.ordinary_mixed``:
submissions and releases with drains, node failures and repairs, and a big pod waiting for a whole idle node,
reservations on) folded ~20x slower per command than the submit/release stream of ``bench/fold_throughput.py``
(``tests.adversarial.baseline``: a full cluster, a ``Release`` then a ``SubmitPod`` of the same shape), most of
it re-planning reservations. This folds both at ``--nodes`` nodes and reports the mean CPU time per command
of each and their ratio; the build is whatever this process loads (``GPUFOLD_PURE_PYTHON=1`` for pure).

    python bench/mixed_stream.py --nodes 1000 --commands 5000
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.core.fold import decide
from processor.core.state import PartitionState
from tests import adversarial


def attacked(commands: list) -> int:
    return sum(1 for command in commands if command.command_id.startswith("x-"))


def per_command_us(commands: list) -> float:
    """Fold the stream; the mean CPU µs of its attack commands (ids ``x-...``)."""
    state = PartitionState()
    spent = 0.0
    for offset, command in enumerate(commands):
        if command.command_id.startswith("x-"):
            started = time.process_time()
            decide(state, command, offset)
            spent += time.process_time() - started
        else:
            decide(state, command, offset)
    return spent * 1e6 / attacked(commands)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--commands", type=int, default=5_000)
    args = parser.parse_args()
    pure = os.environ.get("GPUFOLD_PURE_PYTHON", "") not in ("", "0")
    print(f"# {platform.machine()} | python {platform.python_version()} | {'pure' if pure else 'as installed'} | "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    mixed = adversarial.ordinary_mixed(args.nodes, args.commands)
    base = adversarial.baseline(args.nodes, rounds=args.commands // 2)
    mixed_us, base_us = per_command_us(mixed), per_command_us(base)
    print(f"ordinary_mixed: {attacked(mixed):,} commands, {mixed_us:,.1f} us each")
    print(f"baseline (release + submit): {attacked(base):,} commands, {base_us:,.1f} us each")
    print(f"ratio: {mixed_us / base_us:.1f}x (load {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
