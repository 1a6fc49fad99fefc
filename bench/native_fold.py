"""A native core prototype against the Python fold: same stream, same event bytes, commands/s (issue #14).

Not a test: a measurement, with a byte-for-byte check. Run ``python bench/native_fold.py``. For each
policy and cluster size it

1. generates the stream of ``bench/fold_throughput.py`` (same generator, seed and sizes: AddNode,
   SetPolicy, a warm-up of SubmitPod to ~70% full, then measured SubmitPod/Release pairs) and writes
   it as Avro single-object frames, each prefixed by its length (little-endian u32);
2. folds it with the Python fold (``PartitionFolder.fold``: decode, decide, encode) in a child
   process, pure (``GPUFOLD_PURE_PYTHON=1``) and, when an interpreter with the compiled hot path is
   at hand, compiled: the event frames are the reference;
3. builds and runs the Rust prototype in ``bench/native_fold/`` (``cargo build --release``) on
   the same file, and checks that its event frames are the reference's, byte for byte (it stops
   with the first differing event if not);
4. prints commands/s of the measured part for each: ``codec`` = decode + fold + encode,
   ``fold`` = ``decide`` alone on decoded commands, and the ratios, all from this one run.

Times are CPU time of the measuring process (``time.process_time`` / ``CLOCK_PROCESS_CPUTIME_ID``).
The native figures are the median of ``--repeats`` runs; the Python ones are one run each, as in
``fold_throughput.py``. The prototype covers only this stream's commands (see bench/native_fold/README.md);
it stops with an error naming anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CRATE = HERE / "native_fold"
BINARY = CRATE / "target" / "release" / "native_fold"


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def _framed(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(frame)) + frame for frame in frames)


def worker(commands_path: str, events_path: str, warm: int) -> None:
    """The Python fold on a command file (run in a child process: pure or compiled, as its interpreter is)."""
    from logs.port import InputRecord, OutputRecord
    from processor.core.fold import decide
    from processor.core.state import PartitionState
    from processor.runtime.loop import PartitionFolder
    from schemas.fastcodec import decode_command
    from schemas.topics import Topics

    sys.path.insert(0, str(HERE.parent))  # build_config.py, beside setup.py (not installed)
    import build_config

    frames = _frames(Path(commands_path).read_bytes())
    records = [InputRecord(0, offset, b"bench", frame) for offset, frame in enumerate(frames)]
    folder = PartitionFolder(0, Topics(), PartitionState(), snapshot_every=0)
    out: list[OutputRecord] = []
    for record in records[:warm]:
        folder.fold(record, out)
    started = time.process_time()
    for record in records[warm:]:
        folder.fold(record, out)
    codec_seconds = time.process_time() - started
    Path(events_path).write_bytes(_framed([record.value for record in out]))

    state = PartitionState()
    for offset, frame in enumerate(frames[:warm]):
        decide(state, decode_command(frame), offset)
    commands = [decode_command(frame) for frame in frames[warm:]]
    started = time.process_time()
    for i, command in enumerate(commands):
        decide(state, command, warm + i)
    fold_seconds = time.process_time() - started
    measured = len(frames) - warm
    print(
        json.dumps(
            {
                "compiled": build_config.summary(),
                "codec_commands_per_sec": measured / codec_seconds,
                "fold_commands_per_sec": measured / fold_seconds,
            }
        )
    )


def stream(nodes: int, commands: int, seed: int, policy: str) -> tuple[list[bytes], int]:
    """fold_throughput.run's stream as command frames, and how many of them are set-up (not measured)."""
    sys.path.insert(0, str(HERE))
    from fold_throughput import Stream, build_nodes

    from schemas.commands import Command, SetPolicy
    from schemas.fastcodec import encode_command

    rng = random.Random(seed)
    setup = [Command("policy", "bench", 0, SetPolicy(policy))] if policy else []
    setup += build_nodes(nodes, rng)
    generator = Stream(nodes, seed)
    setup += generator.warmup()
    measured = generator.mix(commands)
    return [encode_command(command) for command in setup + measured], len(setup)


def edge_stream() -> list[bytes]:
    """Small hand-made stream for the paths the throughput stream never takes: rejections (duplicate command,
    node and pod; unknown pod; ids that Python quotes with double quotes or escapes), a late command, policy
    changes mid-stream, a CPU-only node, priorities, ``preemption: never``, a second cluster, a reused pod id."""
    from schemas.commands import AddNode, Command, Release, SetPolicy, SubmitPod
    from schemas.fastcodec import encode_command

    def c(command_id: str, at: int, payload: object, cluster: str = "edge") -> Command:
        return Command(command_id, cluster, at, payload, "edge-source")  # type: ignore[arg-type]

    commands = [
        c("p1", 5, SetPolicy("first-fit")),
        c("n1", 6, AddNode("node-b", 96_000, 786_432, "H100", 8)),
        c("n2", 7, AddNode("node-a", 32_000, 262_144, "A10", 4)),
        c("n3", 8, AddNode("node-a", 32_000, 262_144, "A10", 4)),  # DUPLICATE_NODE
        c("n4", 9, AddNode("cpu-1", 8_000, 16_384)),  # no GPU
        c("s1", 20, SubmitPod("pod-1", "t1", 0, 1, 500, 4_000, 16_384)),
        c("s2", 21, SubmitPod("pod-2", "t2", 7, 2, 1000, 16_000, 65_536)),
        c("s3", 22, SubmitPod("pod-3", "t1", -3, 0, 0, 2_000, 1_024, preemption="never", movable=True)),
        c("s4", 23, SubmitPod("pod-1", "t1", 0, 1, 250, 1_000, 1_024)),  # DUPLICATE_POD
        c("s1", 24, SubmitPod("pod-9", "t1", 0, 1, 250, 1_000, 1_024)),  # DUPLICATE_COMMAND
        c("r1", 25, Release("nobody")),  # UNKNOWN_POD
        c("r2", 26, Release("it's")),  # repr in double quotes
        c("r3", 27, Release("back\\slash'\"")),  # repr with escapes
        c("late", 3, SubmitPod("pod-4", "t1", 0, 1, 1000, 1_000, 1_024)),  # folded at the clock (27)
        c("p2", 30, SetPolicy("best-fit", reserve_after_ms=5_000, queue_order="skip-ahead")),
        c("s5", 31, SubmitPod("pod-5", "t1", 0, 1, 250, 1_000, 1_024)),
        c("s6", 32, SubmitPod("pod-6", "t1", 0, 4, 1000, 8_000, 8_192)),
        c("r4", 33, Release("pod-1", "failed")),
        c("s7", 34, SubmitPod("pod-1", "t1", 0, 1, 750, 1_000, 1_024)),  # a released id, reused
        c("p3", 35, SetPolicy("", queue_order="strict-fifo")),  # keeps best-fit
        c("s8", 36, SubmitPod("pod-8", "t1", 0, 0, 0, 0, 4_096)),
        c("o1", 37, SetPolicy("first-fit"), "other"),
        c("o2", 38, AddNode("node-z", 64_000, 524_288, "A100", 8), "other"),
        c("o3", 39, SubmitPod("pod-1", "t9", 0, 8, 1000, 1_000, 1_024), "other"),
        c("o4", 40, Release("pod-1"), "other"),
        c("r5", 41, Release("pod-1")),
    ]
    return [encode_command(command) for command in commands]


def unsupported_streams() -> dict[str, list[bytes]]:
    """Streams the prototype must refuse, with a word its error must name."""
    from schemas.commands import AddNode, Command, SetPolicy, SubmitPod, Tick
    from schemas.fastcodec import encode_command

    node = Command("n", "u", 1, AddNode("node-1", 8_000, 16_384, "T4", 1))
    policy = Command("p", "u", 0, SetPolicy("first-fit"))
    pod = SubmitPod("pod-1", "t", 0, 1, 1000, 1_000, 1_024)
    return {
        "fgd-plus": [encode_command(c) for c in (node, Command("s", "u", 2, pod))],
        "Tick": [encode_command(c) for c in (policy, node, Command("t", "u", 2, Tick()))],
        "fits no node": [
            encode_command(c)
            for c in (policy, node, Command("s", "u", 2, pod), Command("s2", "u", 3, replace(pod, pod_id="pod-2")))
        ],
        "time_limit_ms": [
            encode_command(c) for c in (policy, node, Command("s", "u", 2, replace(pod, time_limit_ms=5)))
        ],
    }


def run_python(python: str, pure: bool, commands: Path, events: Path, warm: int) -> dict[str, Any]:
    env = dict(os.environ)
    if pure:
        env["GPUFOLD_PURE_PYTHON"] = "1"
    else:
        env.pop("GPUFOLD_PURE_PYTHON", None)
    result = subprocess.run(
        [python, str(Path(__file__).resolve()), "--worker", str(commands), str(events), str(warm)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        sys.exit(f"the Python fold failed ({python}):\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(reference: Path, native: Path, what: str) -> int:
    """Fail loudly at the first event whose bytes differ; returns the number of events."""
    from schemas.fastcodec import decode_event

    expected, got = _frames(reference.read_bytes()), _frames(native.read_bytes())
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            print(f"\nMISMATCH ({what}) at event {i}:", file=sys.stderr)
            print(f"  python: {decode_event(want)!r}\n          {want.hex()}", file=sys.stderr)
            try:
                shown = repr(decode_event(have))
            except Exception as error:
                shown = f"<does not decode: {error}>"
            print(f"  native: {shown}\n          {have.hex()}", file=sys.stderr)
            sys.exit(1)
    if len(expected) != len(got):
        sys.exit(f"MISMATCH ({what}): python wrote {len(expected)} events, native {len(got)}")
    return len(expected)


def compiled_interpreter(requested: str | None) -> str | None:
    """An interpreter whose gpufold hot path is compiled: the one asked for, else this one if it is."""
    candidates = [requested] if requested else [sys.executable]
    for python in candidates:
        probe = subprocess.run(
            [python, "-c", "import build_config; print(build_config.summary())"],
            capture_output=True,
            text=True,
            check=False,
            cwd=HERE.parent,
        )
        if probe.returncode == 0 and "compiled with mypyc" in probe.stdout:
            return python
        if requested:
            sys.exit(f"{requested} has no compiled hot path: {probe.stdout.strip()} {probe.stderr.strip()}")
    return None


def self_check(folder: Path) -> None:
    """The edge stream byte for byte; and every unsupported stream refused with an error naming it."""
    commands, reference, native = folder / "edge.commands", folder / "edge.python", folder / "edge.native"
    commands.write_bytes(_framed(edge_stream()))
    run_python(sys.executable, True, commands, reference, 0)
    result = subprocess.run([str(BINARY), str(commands), str(native), "0", "1"], capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"the native fold stopped on the edge stream:\n{result.stderr}")
    events = compare(reference, native, "edge stream")
    for word, frames in unsupported_streams().items():
        commands.write_bytes(_framed(frames))
        result = subprocess.run([str(BINARY), str(commands), str(native), "0", "1"], capture_output=True, text=True)
        if result.returncode != 2 or word not in result.stderr:
            sys.exit(f"the native fold did not refuse a stream with {word!r}: {result.returncode} {result.stderr}")
    print(
        f"# self-check: edge stream {events} event frames identical; "
        f"{len(unsupported_streams())} unsupported streams refused by name",
        file=sys.stderr,
    )


def _show(value: object, unit: str = "") -> str:
    return "-" if value is None else f"{value:,}{unit}"


def build() -> None:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    subprocess.run([cargo, "build", "--release", "--quiet"], cwd=CRATE, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated cluster sizes")
    parser.add_argument("--commands", type=int, default=100_000, help="measured commands per row")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policies", default="first-fit,best-fit")
    parser.add_argument("--repeats", type=int, default=5, help="native runs per row (median)")
    parser.add_argument(
        "--compiled-python", help="an interpreter with the compiled hot path (default: this one, if compiled)"
    )
    parser.add_argument("--no-build", action="store_true", help="use the binary already built")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("COMMANDS", "EVENTS", "WARM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return 0
    if not args.no_build:
        build()
    compiled_python = compiled_interpreter(args.compiled_python)
    print(
        f"# {platform.machine()} | {os.cpu_count()} cores | python {platform.python_version()} | "
        f"compiled: {compiled_python or 'none'} | load {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    header = (
        f"{'policy':10} {'nodes':>6} {'mode':5} {'pure cmd/s':>11} {'compiled':>9} {'native':>10}"
        f" {'native/pure':>11} {'native/compiled':>15}"
    )
    if not args.json:
        print(header)
    with tempfile.TemporaryDirectory(prefix="native_fold.") as scratch:
        folder = Path(scratch)
        self_check(folder)
        for policy in args.policies.split(","):
            for nodes in (int(n) for n in args.nodes.split(",")):
                frames, warm = stream(nodes, args.commands, args.seed, policy)
                commands = folder / "commands.bin"
                commands.write_bytes(_framed(frames))
                reference, native_events = folder / "python.events", folder / "native.events"
                pure = run_python(sys.executable, True, commands, reference, warm)
                compiled = None
                if compiled_python is not None:
                    compiled = run_python(compiled_python, False, commands, folder / "compiled.events", warm)
                    compare(reference, folder / "compiled.events", "compiled python vs pure python")
                result = subprocess.run(
                    [str(BINARY), str(commands), str(native_events), str(warm), str(args.repeats)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if result.returncode:
                    sys.exit(f"the native fold stopped ({policy}, {nodes} nodes):\n{result.stderr}")
                native = json.loads(result.stdout)
                events = compare(reference, native_events, f"{policy}, {nodes} nodes")
                for mode in ("codec", "fold"):
                    key = f"{mode}_commands_per_sec"
                    row = {
                        "policy": policy,
                        "nodes": nodes,
                        "mode": mode,
                        "commands": args.commands,
                        "events_identical": events,
                        "pure": round(pure[key]),
                        "compiled": round(compiled[key]) if compiled else None,
                        "native": round(native[key]),
                        "native_vs_pure": round(native[key] / pure[key], 1),
                        "native_vs_compiled": round(native[key] / compiled[key], 1) if compiled else None,
                        "load": round(os.getloadavg()[0], 2),
                    }
                    if args.json:
                        print(json.dumps(row), flush=True)
                    else:
                        print(
                            f"{policy:10} {nodes:>6} {mode:5} {row['pure']:>11,} {_show(row['compiled']):>9}"
                            f" {row['native']:>10,} {row['native_vs_pure']:>10}x"
                            f" {_show(row['native_vs_compiled'], 'x'):>15}",
                            flush=True,
                        )
                print(
                    f"# {policy} {nodes} nodes: {events:,} event frames identical (set-up and measured)",
                    file=sys.stderr,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
