"""Embedded-log throughput: appends/s, JSON-lines ingest/s, processor run loop and replay in commands/s.

Not a test: a measurement. Run ``python bench/embedded_log.py`` (defaults: 100,000
commands on a 1,000-node cluster, the SubmitPod/Release stream of
``bench/fold_throughput.py``). Each stage uses a fresh SQLite file in a temporary
directory:

- ``append``: ``EmbeddedLog.append_commands`` of pre-encoded frames, 10,000 per transaction;
- ``jsonl``: ``gpufold log append FILE.jsonl`` end to end (parse, check, Avro-encode, append);
- ``run``: ``Processor.run_until_idle`` on the log (poll, decode, fold, encode, atomic commit
  of events + position per 2,000-command batch, a snapshot every 50,000 commands);
- ``fold``: the same fold in memory, no log (``gpufold.replay.replay_partition``), for the log's overhead;
- ``replay``: ``gpufold replay``'s path: read-only log, fold from offset 0, nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fold_throughput import Stream, build_nodes

from gpufold.cli import main as cli_main
from gpufold.jsonl import dumps
from gpufold.replay import replay_partition
from logs.embedded import EmbeddedLog
from logs.port import InputRecord
from processor.runtime.loop import Processor
from schemas import COMMAND, registry
from schemas.commands import Command, SetPolicy


def commands(total: int, nodes: int, seed: int, policy: str) -> list[Command]:
    setup: list[Command] = [Command("policy", "bench", 0, SetPolicy(policy))]
    setup += build_nodes(nodes, random.Random(seed))
    stream = Stream(nodes, seed)
    setup += stream.warmup()
    return (setup + stream.mix(max(0, total - len(setup))))[:total]


class Timer:
    """Wall and CPU time of a stage: on a shared machine the CPU rate is the steadier figure."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def rate(self, count: int) -> dict[str, object]:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        return {
            "count": count,
            "seconds": round(wall, 3),
            "per_sec": round(count / wall),
            "cpu_seconds": round(cpu, 3),
            "per_cpu_sec": round(count / cpu) if cpu else None,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policy", default="best-fit", help="placement policy set by the first command")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    stream = commands(args.commands, args.nodes, args.seed, args.policy)
    codec = registry().codec(COMMAND)
    timer = Timer()
    frames = [(c.cluster.encode(), codec.encode(c.to_avro())) for c in stream]
    results: dict[str, object] = {"encode": timer.rate(len(frames))}

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.sqlite"
        with EmbeddedLog(path) as log:
            timer = Timer()
            for i in range(0, len(frames), 10_000):
                log.append_commands(frames[i : i + 10_000])
            results["append"] = timer.rate(len(frames))

            timer = Timer()
            processor = Processor(log)
            folded = processor.run_until_idle()
            results["run"] = timer.rate(folded)
            results["events"] = log.count(log.topics.events)
        results["log_mib"] = round(sum(f.stat().st_size for f in Path(tmp).glob("bench.sqlite*")) / 2**20, 1)

        records = [InputRecord(0, i, key, value) for i, (key, value) in enumerate(frames)]
        timer = Timer()
        reference = replay_partition(0, records)
        results["fold"] = timer.rate(reference.commands)

        with EmbeddedLog(path, readonly=True) as log:
            timer = Timer()
            replayed = replay_partition(0, log.read_commands(0, 0, len(frames)), log.topics)
            results["replay"] = timer.rate(replayed.commands)

        jsonl = Path(tmp) / "commands.jsonl"
        jsonl.write_text("".join(dumps(c.to_avro()) + "\n" for c in stream), encoding="utf-8")
        timer = Timer()
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli_main(["log", "append", "--create", "--log", str(Path(tmp) / "jsonl.sqlite"), str(jsonl)])
        results["jsonl"] = timer.rate(len(stream))
        assert code == 0

    results.update(
        commands=len(frames),
        nodes=args.nodes,
        policy=args.policy,
        machine=f"{platform.machine()} {os.cpu_count()} cpu | python {platform.python_version()}",
    )
    if args.json:
        print(json.dumps(results))
        return 0
    print(
        f"# {results['machine']} | load {os.getloadavg()[0]:.1f} | "
        f"{len(frames):,} commands, {args.nodes:,} nodes, {args.policy}"
    )
    for stage in ("encode", "append", "jsonl", "run", "fold", "replay"):
        row = results[stage]
        print(
            f"{stage:7} {row['per_sec']:>9,} /s wall  {row['per_cpu_sec']:>9,} /s cpu"  # type: ignore[index]
            f"  ({row['count']:,} in {row['seconds']} s wall, {row['cpu_seconds']} s cpu)"  # type: ignore[index]
        )
    print(f"events  {results['events']:,}; log file {results['log_mib']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
