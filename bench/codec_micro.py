"""Codec micro-benchmark: fastavro (with to_avro/from_avro) against schemas.fastcodec, per record type.

Not a test: a measurement. Run ``python bench/codec_micro.py`` (``--json`` for one JSON object per row).
For one typical command or event of each payload type it times, in microseconds per record:

- ``fastavro enc``: ``codec.encode(obj.to_avro())``; ``fast enc``: ``encode_command`` / ``encode_event``;
- ``fastavro dec``: ``X.from_avro(codec.decode(frame))``; ``fast dec``: ``decode_command`` / ``decode_event``.

Times are CPU time (``time.process_time``), the best of ``--repeat`` runs of ``--number`` calls, so
other processes on the machine disturb them less than wall-clock time would.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from schemas import COMMAND, EVENT, registry
from schemas.commands import (
    AddNode,
    Command,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
)
from schemas.events import (
    CommandRejected,
    Event,
    GpuShare,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRemoved,
    NodeUncordoned,
    PodEvicted,
    PodQueued,
    PodReleased,
    PodScheduled,
    PodSpec,
    PolicyChanged,
    QueueReason,
)
from schemas.fastcodec import decode_command, decode_event, encode_command, encode_event

T0 = 1_764_500_000_000  # epoch millis, like issued_at in production
NODE = "node-004217"


def spec(pod: str = "pod-123456") -> PodSpec:
    return PodSpec(pod, "team-a", 0, 1, 500, 4_000, 16_384, (), {}, (), T0, 123_456)


def commands() -> list[Command]:
    def command(payload: Any) -> Command:
        return Command("s-pod-123456", "bench", T0, payload, "loadgen")

    return [
        command(AddNode(NODE, 96_000, 786_432, "H100", 8, {"zone": "a", "rack": "r12"}, (Taint("dedicated", "ml"),))),
        command(RemoveNode(NODE, True)),
        command(CordonNode(NODE)),
        command(UncordonNode(NODE)),
        command(DrainNode(NODE)),
        command(MarkNodeFailed(NODE, "ecc")),
        command(SubmitPod("pod-123456", "team-a", 0, 1, 500, 4_000, 16_384)),
        command(
            SubmitPod(
                "pod-123457", "team-b", 5, 2, 1000, 16_000, 65_536, ("H100", "A100"), {"zone": "a"}, (Toleration(),)
            )
        ),
        command(Release("pod-123456")),
        command(SetPolicy("fgd-plus")),
    ]


def events() -> list[Event]:
    def event(payload: Any) -> Event:
        return Event(0, 1_234_567, "bench", "s-pod-123456", 2_345_678, T0, payload)

    scores = {"growth": 0.125, "before": 3.5, "after": 3.625}
    return [
        event(NodeAdded(NODE, "H100", 8, 96_000, 786_432, {"zone": "a"}, (Taint("dedicated", "ml"),))),
        event(NodeRemoved(NODE, False)),
        event(NodeCordoned(NODE)),
        event(NodeUncordoned(NODE)),
        event(NodeDrained(NODE, 3)),
        event(NodeFailed(NODE, "ecc", 3)),
        event(PodQueued(spec(), (QueueReason("insufficient_gpu", 812), QueueReason("node_unschedulable", 3)))),
        event(PodScheduled(spec(), NODE, (GpuShare(3, 500),), "fgd-plus", False, scores)),
        event(PodEvicted("pod-123456", NODE, "drain")),
        event(PodReleased("pod-123456", NODE, "completed")),
        event(PolicyChanged("fgd-plus", "best-fit")),
        event(CommandRejected("s-pod-123456", "SubmitPod", "duplicate_pod", "pod 'pod-123456' is already running")),
    ]


def per_call(function: Callable[[], Any], number: int, repeat: int) -> float:
    """Best CPU microseconds per call."""
    return min(timeit.repeat(function, number=number, repeat=repeat, timer=time.process_time)) / number * 1e6


def time_record(obj: Any, codec: Any, envelope: Any, encode: Any, decode: Any, number: int, repeat: int) -> dict:
    """Microseconds per call of the four operations on one record."""
    frame = codec.encode(obj.to_avro())
    assert encode(obj) == frame and decode(frame) == obj, obj
    return {
        "fastavro_encode_us": per_call(lambda: codec.encode(obj.to_avro()), number, repeat),
        "fast_encode_us": per_call(lambda: encode(obj), number, repeat),
        "fastavro_decode_us": per_call(lambda: envelope.from_avro(codec.decode(frame)), number, repeat),
        "fast_decode_us": per_call(lambda: decode(frame), number, repeat),
    }


def rows(number: int, repeat: int) -> list[dict[str, Any]]:
    out = []
    for kind, objects, name, encode, decode in (
        ("command", commands(), COMMAND, encode_command, decode_command),
        ("event", events(), EVENT, encode_event, decode_event),
    ):
        codec = registry().codec(name)
        envelope = Command if kind == "command" else Event
        for obj in objects:
            timings = time_record(obj, codec, envelope, encode, decode, number, repeat)
            row: dict[str, Any] = {"kind": kind, "type": obj.type_name, "bytes": len(codec.encode(obj.to_avro()))}
            row.update({key: round(value, 2) for key, value in timings.items()})
            row["encode_speedup"] = round(timings["fastavro_encode_us"] / timings["fast_encode_us"], 1)
            row["decode_speedup"] = round(timings["fastavro_decode_us"] / timings["fast_decode_us"], 1)
            out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=5_000, help="calls per timing run")
    parser.add_argument("--repeat", type=int, default=5, help="timing runs (the best is kept)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()} | python {platform.python_version()}", file=sys.stderr)
    if not args.json:
        print(
            f"{'kind':8} {'type':16} {'bytes':>5} {'fastavro enc':>12} {'fast enc':>9} {'x':>5}"
            f" {'fastavro dec':>12} {'fast dec':>9} {'x':>5}   (us per record)"
        )
    for row in rows(args.number, args.repeat):
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"{row['kind']:8} {row['type']:16} {row['bytes']:>5} {row['fastavro_encode_us']:>12} "
                f"{row['fast_encode_us']:>9} {row['encode_speedup']:>5} {row['fastavro_decode_us']:>12} "
                f"{row['fast_decode_us']:>9} {row['decode_speedup']:>5}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
