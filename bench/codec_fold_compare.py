"""What the generated codecs save inside ``PartitionFolder.fold``: fastavro path against schemas.fastcodec.

Not a test: a measurement. Run ``python bench/codec_fold_compare.py --policy first-fit``. It folds the
stream of ``bench/fold_throughput.py`` (submit / release-oldest at about 70% full) three ways, in
one process, on identical states:

- ``fold``: ``decide`` on ``Command`` objects (no codec at all);
- ``fastavro``: ``PartitionFolder.fold`` as it was before schemas.fastcodec (``Command.from_avro(
  codec.decode(frame))`` and ``codec.encode(event.to_avro())``);
- ``fastcodec``: ``PartitionFolder.fold`` as it is (``decode_command`` and ``encode_event``).

``codec us`` is the row's cost per command minus the ``fold`` row's: what decoding and encoding add.
``--policy`` sets the cluster's policy first (a cheap one makes the codec share visible); times are
CPU time (``time.process_time``) so other processes on the machine disturb them less.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fold_throughput import Stream, build_nodes

from processor.commands import Command, SetPolicy
from processor.fold import decide
from processor.loop import InputRecord, OutputRecord, PartitionFolder, Topics
from processor.state import PartitionState
from schemas import COMMAND, DecodeError, registry


class FastavroFolder(PartitionFolder):
    """``PartitionFolder.fold`` as it was before schemas.fastcodec: fastavro plus to_avro/from_avro."""

    def fold(self, record: InputRecord, out: list[OutputRecord]) -> None:
        state = self.state
        if record.offset < state.next_offset:
            return
        try:
            command = Command.from_avro(self._commands.decode(record.value))  # type: ignore[arg-type]
        except DecodeError as error:
            out.append(self._dead_letter(record, str(error)))
            state.next_offset = record.offset + 1
        else:
            encode = self._events.encode
            topic, partition = self.topics.events, self.partition
            key = command.cluster.encode()
            for event in decide(state, command, record.offset):
                out.append(OutputRecord(topic, partition, key, encode(event.to_avro())))
        if self.snapshot_every and state.next_offset % self.snapshot_every == 0:
            out.append(self.snapshot_record())


def run(nodes: int, commands: int, mode: str, policy: str | None, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    state = PartitionState()
    setup = [Command("policy", "bench", 0, SetPolicy(policy))] if policy else []
    setup += build_nodes(nodes, rng)
    stream = Stream(nodes, seed)
    setup += stream.warmup()
    for offset, command in enumerate(setup):
        decide(state, command, offset)
    measured = stream.mix(commands)
    base = len(setup)
    if mode == "fold":
        started = time.process_time()
        events = sum(len(decide(state, command, base + i)) for i, command in enumerate(measured))
        elapsed = time.process_time() - started
    else:
        codec = registry().codec(COMMAND)
        records = [InputRecord(0, base + i, b"bench", codec.encode(c.to_avro())) for i, c in enumerate(measured)]
        folder = (FastavroFolder if mode == "fastavro" else PartitionFolder)(0, Topics(), state, snapshot_every=0)
        out: list[OutputRecord] = []
        started = time.process_time()
        for record in records:
            folder.fold(record, out)
        elapsed = time.process_time() - started
        events = len(out)
    return {
        "nodes": nodes,
        "mode": mode,
        "policy": policy or "default",
        "commands": commands,
        "events": events,
        "cpu_seconds": round(elapsed, 3),
        "commands_per_sec": round(commands / elapsed),
        "us_per_command": round(elapsed / commands * 1e6, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated cluster sizes")
    parser.add_argument("--commands", type=int, default=20_000, help="measured commands per row")
    parser.add_argument("--policy", default="first-fit", help="policy set before the nodes ('' = the default)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()} | python {platform.python_version()}", file=sys.stderr)
    for nodes in (int(n) for n in args.nodes.split(",")):
        fold_us = None
        for mode in ("fold", "fastavro", "fastcodec"):
            row = run(nodes, args.commands, mode, args.policy or None, args.seed)
            fold_us = fold_us if fold_us is not None else row["us_per_command"]
            row["codec_us_per_command"] = round(row["us_per_command"] - fold_us, 2)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{mode:9} nodes={nodes:>7} policy={row['policy']:10} {row['commands_per_sec']:>9,} cmd/s"
                    f"  {row['us_per_command']:>8} us/cmd  codec {row['codec_us_per_command']:>6} us/cmd",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
