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
    from processor.core.fold import decide
    from processor.core.state import PartitionState
    from processor.runtime.loop import InputRecord, OutputRecord, PartitionFolder
    from schemas import compiled
    from schemas.fastcodec import decode_command
    from schemas.topics import Topics

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
                "compiled": compiled.summary(),
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
            [python, "-c", "from schemas import compiled; print(compiled.summary())"],
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
        )
        if probe.returncode == 0 and "compiled with mypyc" in probe.stdout:
            return python
        if requested:
            sys.exit(f"{requested} has no compiled hot path: {probe.stdout.strip()} {probe.stderr.strip()}")
    return None


def _show(value: object) -> str:
    return "-" if value is None else f"{value:,}"


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
                            f" {_show(row['native_vs_compiled']) + 'x':>15}",
                            flush=True,
                        )
                print(
                    f"# {policy} {nodes} nodes: {events:,} event frames identical (set-up and measured)",
                    file=sys.stderr,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
