"""The published FGD experiment on openb ``default`` with defragmentation, per seed (issue 11).

Not a test: a measurement. ``python bench/defrag_experiment.py [--seeds 42-51] [--every 1] [--budget 1]``
runs ``gpufold.simulate.run`` with fgd-plus for each seed four ways: without moves, and with every pod
movable and a ``Defragment`` (budget: ``--budget``% of the running pods) each time the arrived workload
crosses another ``--every``% of capacity; each either keeping pods that did not fit queued (the fold's
own behaviour: defragmentation may start them later) or withdrawing them at once (the paper's "failed
pods are not retried"). It prints unallocated GPU % at arrived = 100% per seed and the mean, the moves,
the share of pods ever moved, late starts, and the fold's CPU time per ``Defragment``. ``--json``
prints one object per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufold import simulate  # noqa: E402
from gpufold.trace import load_nodes, load_pods  # noqa: E402

MODES = (
    ("no moves", None, False),
    ("defrag, queued pods kept", "defrag", False),
    ("no moves, failed withdrawn", None, True),
    ("defrag, failed withdrawn", "defrag", True),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--policy", default="fgd-plus")
    parser.add_argument("--modes", default="0,1,2,3", help="which of the four modes (indexes)")
    parser.add_argument("--pods", help="an openb pod list (default: openb_pod_list_default.csv)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    nodes, pods = load_nodes(), (load_pods(args.pods) if args.pods else load_pods())
    modes = [MODES[int(i)] for i in args.modes.split(",")]
    table: dict[str, list[simulate.SimulationResult]] = {}
    for seed in simulate.parse_seeds(args.seeds):
        for name, defrag, withdraw in modes:
            result = simulate.run(
                nodes,
                pods,
                args.policy,
                seed,
                defrag_every=args.every if defrag else None,
                defrag_budget=args.budget,
                withdraw_failed=withdraw,
            )
            table.setdefault(name, []).append(result)
            if args.json:
                out = result.to_json()
                out.pop("curve")
                print(json.dumps({"mode": name, **out}), flush=True)
            else:
                print(
                    f"seed {seed}  {name:28}  unallocated@100 {result.unallocated_gpu_pct_at_100:6.2f}%  "
                    f"moves {result.moves:5}  pods moved {100 * result.pods_moved / result.pods_total:5.2f}%  "
                    f"late starts {result.late_starts}  "
                    f"Defragment {_ms_per_defragment(result):.1f} ms CPU each",
                    flush=True,
                )
    if not args.json:
        print()
        print(
            "| mode | unallocated GPU % at arrived = 100% (mean) | per seed | moves (mean) | pods ever moved "
            "| CPU per Defragment (mean) |"
        )
        print("|---|---:|---|---:|---:|---:|")
        for name, results in table.items():
            values = [r.unallocated_gpu_pct_at_100 or 0.0 for r in results]
            moved = statistics.fmean(100 * r.pods_moved / r.pods_total for r in results)
            moves = statistics.fmean(r.moves for r in results)
            seeds = ", ".join(f"{v:.2f}" for v in values)
            cost = statistics.fmean(_ms_per_defragment(r) for r in results)
            print(f"| {name} | {statistics.fmean(values):.2f} | {seeds} | {moves:.0f} | {moved:.2f}% | {cost:.1f} ms |")
    return 0


def _ms_per_defragment(result: simulate.SimulationResult) -> float:
    return 1000 * result.defrag_cpu_seconds / result.defragments if result.defragments else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
