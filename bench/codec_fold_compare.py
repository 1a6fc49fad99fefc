"""What the generated codecs save inside ``PartitionFolder.fold``: fastavro path against schemas.fastcodec.

Not a test: a measurement. Run ``python bench/codec_fold_compare.py --policy first-fit``. It folds the
stream of ``bench/fold_throughput.py`` (submit / release-oldest at about 70% full) three ways, in
one process, on identical states:

- ``fold``: ``decide`` on ``Command`` objects (no codec at all);
- ``fastavro``: ``PartitionFolder.fold`` as it was before schemas.fastcodec (``Command.from_avro(
  codec.decode(frame))`` and ``codec.encode(event.to_avro())``);
- ``fastcodec``: ``PartitionFolder.fold`` as it is (``decode_command`` and ``encode_event``).

``codec us`` is the row's cost per command minus the ``fold`` row's: what decoding and encoding add.
Being a difference of two timings it is noisy, so each size also gets an ``isolated`` row: the same
stream's command frames decoded and its events encoded with no fold in between, by both paths (best
of ``--repeat`` runs), in microseconds per command.

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

from logs.port import InputRecord, OutputRecord
from processor.core.fold import decide
from processor.core.state import PartitionState
from processor.runtime.loop import PartitionFolder
from schemas import COMMAND, EVENT, DecodeError, registry
from schemas.commands import Command, SetPolicy
from schemas.fastcodec import decode_command, encode_event
from schemas.topics import Topics


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


def isolated(nodes: int, commands: int, policy: str | None, seed: int, repeat: int) -> dict[str, Any]:
    """Decode the stream's frames and encode its events, with no fold in between, by both paths."""
    rng = random.Random(seed)
    state = PartitionState()
    setup = [Command("policy", "bench", 0, SetPolicy(policy))] if policy else []
    setup += build_nodes(nodes, rng)
    stream = Stream(nodes, seed)
    setup += stream.warmup()
    for offset, command in enumerate(setup):
        decide(state, command, offset)
    measured = stream.mix(commands)
    events = [event for i, c in enumerate(measured) for event in decide(state, c, len(setup) + i)]
    command_codec, event_codec = registry().codec(COMMAND), registry().codec(EVENT)
    frames = [command_codec.encode(c.to_avro()) for c in measured]

    def best(function: Any, items: list[Any]) -> float:
        runs = []
        for _ in range(repeat):
            started = time.process_time()
            for item in items:
                function(item)
            runs.append(time.process_time() - started)
        return min(runs) / commands * 1e6

    times = {
        "fastavro_decode_us": best(lambda f: Command.from_avro(command_codec.decode(f)), frames),
        "fastcodec_decode_us": best(decode_command, frames),
        "fastavro_encode_us": best(lambda e: event_codec.encode(e.to_avro()), events),
        "fastcodec_encode_us": best(encode_event, events),
    }
    row: dict[str, Any] = {"nodes": nodes, "mode": "isolated", "policy": policy or "default", "commands": commands}
    row["events"] = len(events)
    row.update({key: round(value, 2) for key, value in times.items()})
    row["fastavro_us_per_command"] = round(times["fastavro_decode_us"] + times["fastavro_encode_us"], 2)
    row["fastcodec_us_per_command"] = round(times["fastcodec_decode_us"] + times["fastcodec_encode_us"], 2)
    row["speedup"] = round(row["fastavro_us_per_command"] / row["fastcodec_us_per_command"], 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated cluster sizes")
    parser.add_argument("--commands", type=int, default=20_000, help="measured commands per row")
    parser.add_argument("--policy", default="first-fit", help="policy set before the nodes ('' = the default)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the isolated codec timing (best kept)")
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
        row = isolated(nodes, args.commands, args.policy or None, args.seed, args.repeat)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"isolated  nodes={nodes:>7} per command: decode {row['fastavro_decode_us']} -> "
                f"{row['fastcodec_decode_us']} us, encode {row['fastavro_encode_us']} -> {row['fastcodec_encode_us']}"
                f" us ({row['events']} events), codec {row['fastavro_us_per_command']} -> "
                f"{row['fastcodec_us_per_command']} us (x{row['speedup']})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
