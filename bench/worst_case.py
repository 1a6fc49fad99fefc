"""The worst case per command (issue #20): each adversarial shape of ``tests/adversarial.py``, timed command by command.

Not a test: a measurement. ``python bench/worst_case.py`` builds every case at 10,000 nodes and 100,000 running
pods (``--nodes``, ``--pods``; ``--quick``: 200 and 2,000), folds it with ``decide`` and times each command
(CPU time of the process, ``time.process_time``; the cyclic collector kept off the state as the processor keeps
it, ``processor.runtime.collector``). For the commands a case attacks (ids ``x-...``) it reports, per
command type, the count, max and p99; the worst command's events; and the ratio of its time to a plain
``SubmitPod`` measured in the same run (the ``baseline`` case: a full cluster, a ``Release`` then a ``SubmitPod``
of the same shape, median).

Each case runs in a child process per build: ``GPUFOLD_PURE_PYTHON=1`` (pure) and ``=0`` (compiled, if this
tree has the extensions; see ``bench/compiled_vs_pure.py``). Building the case's state (the commands before its
first attack) may take up to ``--setup-timeout`` s; the rest must end within ``--timeout`` s (default 60), or the
case is reported TIMEOUT (the child is killed); an exception (``RecursionError``) or a dead child (a compiled fold
overflows the C stack: SIGSEGV) is reported CRASH. ``--only a,b`` runs some cases; ``--json`` prints one JSON
object per case and build. The machine's load (``uptime``) is printed first and last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import adversarial as adv  # noqa: E402
from tests.adversarial import SeededChooser, mixed_stream  # noqa: E402

Builder = Callable[[int, int], list]
CASES: dict[str, Builder] = {
    "baseline": lambda n, p: adv.baseline(n, p, 1_000),
    "reclaim_chase": lambda n, p: adv.reclaim_chase(),
    "afterok_chain_fails": lambda n, p: adv.afterok_chain_fails(max(330, p // 10)),
    "preemption_cascade": lambda n, p: adv.preemption_cascade(250),
    "dependency_chain": lambda n, p: adv.dependency_chain(max(1_000, p // 25)),
    "gang_preempts": lambda n, p: adv.gang_preempts(n, min(1_024, n * 4), pods=p),
    "gang_preempts_in_domain": lambda n, p: adv.gang_preempts(n, min(1_024, n * 4), topology=True, pods=p),
    "gang_preempts_spread": lambda n, p: adv.gang_preempts_spread(n, min(1_024, n * 4), pods=p),
    "lender_reclaims": lambda n, p: adv.lender_reclaims(n, pods=p),
    "borrower_meets_guaranteed_work": lambda n, p: adv.borrower_meets_guaranteed_work(n, p, 20),
    "newer_equal_priority_absent": lambda n, p: adv.newer_equal_priority_absent(n, p, 5),
    "defragment_target": lambda n, p: adv.defragment_target(n),
    "consolidate": lambda n, p: adv.consolidate(n, p),
    "tick_time_limits": lambda n, p: adv.tick_time_limits(max(40, p // 50), 2_000),
    "unfit_queue_head": lambda n, p: adv.unfit_queue_head(p, 20),
    "ordinary_mixed": lambda n, p: adv.ordinary_mixed(n, 2_000),
    "queued_big_gang": lambda n, p: adv.queued_big_gang(n, min(1_024, n * 4), 20),
    "unique_node_labels": lambda n, p: adv.unique_node_labels(n, 0, 20),  # no fill: it costs what it shows
    "distinct_priorities": lambda n, p: adv.distinct_priorities(n, p, 5),
    "never_preempting_waits": lambda n, p: adv.never_preempting_waits(n, p, 20),
    "wide_gang_released": lambda n, p: adv.wide_gang_released(min(n, 1_024), 2_000),  # MAX_GANG_MEMBERS
    "queue_retries": lambda n, p: adv.queue_retries(n, p, 2_000),
    "random_seed_10": lambda n, p: mixed_stream(SeededChooser(10), 200),
    "random_seed_201": lambda n, p: mixed_stream(SeededChooser(201), 300),
    # Found by fuzzing (open, issue #20): 175 gangs queued under quotas on 4 nodes' worth of churn; a SetQuota's
    # evictions each leave a queue retry, and each retry tries every queued gang of the cohort again.
    "random_seed_100029": lambda n, p: mixed_stream(SeededChooser(100029), 4_000, 4),
}


# ---------------------------------------------------------------- the child: one case, one build


def child(case: str, nodes: int, pods: int) -> int:
    """Fold one case, print a line when its state is built, then one JSON result (or die trying)."""
    import build_config
    from processor.core.fold import decide
    from processor.core.state import PartitionState
    from processor.runtime.collector import Collector

    commands = CASES[case](nodes, pods)
    first = next((i for i, c in enumerate(commands) if c.command_id.startswith(adv.ATTACK)), len(commands))
    state = PartitionState()
    started = time.process_time()
    for command in commands[:first]:
        decide(state, command)
    setup = time.process_time() - started
    collector = Collector()  # the processor's collector policy: the state frozen as once restored, and so on
    collector.restored(first)
    print(json.dumps({"phase": "built", "setup_s": round(setup, 2), "commands": first}), flush=True)
    times: dict[str, list[float]] = {}
    worst: dict[str, object] = {"ms": -1.0}
    result: dict[str, object] = {"case": case, "hot_path": build_config.summary(), "setup_s": round(setup, 2)}
    for command in commands[first:]:
        attack = command.command_id.startswith(adv.ATTACK)
        if attack:
            print(json.dumps({"phase": "command", "id": command.command_id, "type": command.type_name}), flush=True)
        sequence = state.sequence
        begin = time.process_time()
        try:
            events = decide(state, command)
        except BaseException as error:  # RecursionError above all: the point is to report it
            result.update(
                status="CRASH",
                error=f"{type(error).__name__}: {str(error)[:120]}",
                command=f"{command.command_id} {command.type_name}",
                events=state.sequence - sequence,
                seconds=round(time.process_time() - begin, 3),
            )
            result["command_type"] = command.type_name
            print(json.dumps(result), flush=True)
            return 0
        elapsed = (time.process_time() - begin) * 1000
        collector.folded(1)  # a processor's freeze, between commands (not timed: it pays it between batches)
        if not attack:
            continue
        print(json.dumps({"phase": "timed", "ms": round(elapsed, 3)}), flush=True)
        times.setdefault(command.type_name, []).append(elapsed)
        if elapsed > worst["ms"]:  # type: ignore[operator]
            worst = {"ms": round(elapsed, 3), "command": f"{command.command_id} {command.type_name}",
                     "events": len(events)}  # fmt: skip
    result.update(status="ok", worst=worst, types={name: _stats(values) for name, values in sorted(times.items())})
    print(json.dumps(result), flush=True)
    return 0


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "count": len(values),
        "max_ms": round(ordered[-1], 3),
        "p99_ms": round(p99, 3),
        "median_ms": round(statistics.median(ordered), 4),
    }


# ---------------------------------------------------------------- the parent: every case, both builds


def run_case(case: str, pure: bool, args: argparse.Namespace) -> dict[str, object]:
    """Run one case in a child process with the time limits; its result, or CRASH / TIMEOUT."""
    env = {**os.environ, "GPUFOLD_PURE_PYTHON": "1" if pure else "0", "PYTHONHASHSEED": "0"}
    command = [sys.executable, __file__, "--child", case, "--nodes", str(args.nodes), "--pods", str(args.pods)]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    base: dict[str, object] = {"case": case, "build": "pure" if pure else "compiled"}
    last: dict[str, object] = {}
    done, slowest = 0, (-1.0, "")  # attack commands timed so far, and the slowest of them
    deadline = time.monotonic() + args.setup_timeout
    built = False
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            process.kill()
            process.wait()
            limit = args.timeout if built else args.setup_timeout
            where = f" in {last.get('id')} {last.get('type')}" if last.get("id") else ""
            phase = "" if built else " building its state"
            if done:
                where += f" ({done:,} attack command(s) before it, the slowest {slowest[1]} {slowest[0]:,.1f} ms)"
            return {
                **base,
                "status": "TIMEOUT",
                "error": f"over {limit:g} s{phase}{where}",
                "command_type": last.get("type"),
            }
        if line is None:
            break
        row = json.loads(line)
        if row.get("phase") == "built":
            built = True
            base["setup_s"] = row["setup_s"]
            deadline = time.monotonic() + args.timeout
        elif row.get("phase") == "command":
            last = row
        elif row.get("phase") == "timed":
            done += 1
            if row["ms"] > slowest[0]:
                slowest = (row["ms"], f"{last.get('id')} {last.get('type')}")
        else:
            process.wait()
            return {**base, **row}
    code = process.wait()
    stderr = process.stderr.read() if process.stderr is not None else ""
    where = f" in {last.get('id')} {last.get('type')}" if last.get("id") else ""
    tail = stderr.strip().splitlines()[-1:] if stderr.strip() else []
    died = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    error = f"{died}{where} {' '.join(tail)[:160]}".strip()
    return {**base, "status": "CRASH", "error": error, "command_type": last.get("type")}


def compiled_available() -> bool:
    import build_config

    return bool(build_config.built())


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime: unavailable"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="small: 200 nodes, 2,000 pods")
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--builds", default="pure,compiled", help="pure, compiled or both")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for a case once its state is built")
    parser.add_argument("--setup-timeout", type=float, default=1_800.0, help="seconds to build a case's state")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.pods = 200, 2_000
    if args.child:
        return child(args.child, args.nodes, args.pods)
    cases = [name for name in args.only.split(",") if name] or list(CASES)
    unknown = [name for name in cases if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    cases = ["baseline", *(name for name in cases if name != "baseline")]  # the yardstick first
    builds = [build for build in args.builds.split(",") if build]
    print(f"# {platform.processor() or platform.machine()} | python {platform.python_version()} | {uptime()}")
    print(f"# {' '.join(sys.argv)} (nodes {args.nodes:,}, pods {args.pods:,}, timeout {args.timeout:g} s)")
    if not args.json:
        print("\n| case | build | status | worst command | events | max (ms) | p99 of its type (ms) | x SubmitPod |")
        print("|---|---|---|---|---:|---:|---:|---:|")
    baseline: dict[str, float] = {}
    by_type: dict[tuple[str, str], tuple[float, str]] = {}
    for case in cases:
        for build in builds:
            if build == "compiled" and not compiled_available():
                row: dict[str, object] = {"case": case, "build": build, "status": "not built"}
            else:
                row = run_case(case, build == "pure", args)
            if case == "baseline" and row.get("status") == "ok":
                baseline[build] = float(row["types"]["SubmitPod"]["median_ms"])  # type: ignore[index]
            if row.get("status") == "ok" and build in baseline:
                ratio = float(row["worst"]["ms"]) / baseline[build]  # type: ignore[index]
                row["ratio_to_submit_pod"] = round(ratio, 1)
                for name, stats in row["types"].items():  # type: ignore[attr-defined]
                    key = (name, build)
                    if stats["max_ms"] > by_type.get(key, (-1.0, ""))[0]:
                        by_type[key] = (stats["max_ms"], case)
            elif row.get("command_type"):  # a crash or a timeout outranks any time
                key = (str(row["command_type"]), build)
                if by_type.get(key, (0.0, ""))[0] != float("inf"):
                    by_type[key] = (float("inf"), f"{case}: {row['status']}")
            _print(row, args.json)
    if not args.json and by_type:
        print("\n| command type | build | worst case | max (ms) | x SubmitPod |")
        print("|---|---|---|---:|---:|")
        for (name, build), (worst, case) in sorted(by_type.items()):
            if worst == float("inf"):
                print(f"| {name} | {build} | {case} | | |")
            elif build in baseline:
                print(f"| {name} | {build} | {case} | {worst:,.1f} | {worst / baseline[build]:,.0f} |")
        for build, value in baseline.items():
            print(f"\nplain SubmitPod ({build}), median of the baseline case: {value * 1000:.1f} us")
    print(f"# {uptime()}")
    return 0


def _print(row: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
        return
    case, build, status = row["case"], row["build"], row["status"]
    if status != "ok":
        where = f"{row['command']}: " if row.get("command") else ""
        events = f"{row['events']:,}" if row.get("events") is not None else ""
        print(f"| {case} | {build} | **{status}** | {where}{row.get('error', '')} | {events} | | | |", flush=True)
        return
    worst = row["worst"]
    kind = str(worst["command"]).split()[-1]  # type: ignore[index]
    p99 = row["types"][kind]["p99_ms"]  # type: ignore[index]
    ratio = row.get("ratio_to_submit_pod", "")
    print(
        f"| {case} | {build} | ok | {worst['command']} | {worst['events']} | {worst['ms']:,.1f} | "  # type: ignore[index]
        f"{p99:,.1f} | {ratio:,} |",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
