"""The compiled hot path against the pure-Python one, in the same run: fold-only and with the codec.

Not a test: a measurement. Run ``python bench/compiled_vs_pure.py`` (after an install that compiled the hot
path; ``python -c 'import build_config; print(build_config.summary())'`` says). For each policy, cluster
size and mode it runs ``bench/fold_throughput.py`` once compiled and once with ``GPUFOLD_PURE_PYTHON=1``,
alternating (``--rounds`` times, best of each), and prints commands/s of both and the ratio. The codec alone:
``bench/codec_micro.py`` both ways (``--codec``). Times are CPU time of each process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fold_rows(env_pure: bool, nodes: str, commands: int, policy: str, mode: str) -> list[dict[str, object]]:
    env = {**os.environ, "GPUFOLD_PURE_PYTHON": "1" if env_pure else "0"}
    command = [sys.executable, str(HERE / "fold_throughput.py"), "--json", "--nodes", nodes]
    command += ["--commands", str(commands), "--policies", policy, "--modes", mode]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=HERE.parent).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def codec_rows(env_pure: bool) -> list[dict[str, object]]:
    env = {**os.environ, "GPUFOLD_PURE_PYTHON": "1" if env_pure else "0"}
    command = [sys.executable, str(HERE / "codec_micro.py"), "--json", "--number", "2000", "--repeat", "7"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=HERE.parent).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000")
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--policies", default="first-fit,best-fit,fgd-plus")
    parser.add_argument("--modes", default="fold,codec")
    parser.add_argument("--rounds", type=int, default=2, help="alternate compiled/pure this many times, keep the best")
    parser.add_argument("--codec", action="store_true", help="also the per-record codec micro-benchmark")
    args = parser.parse_args()
    print("| policy | mode | nodes | pure (cmd/s) | compiled (cmd/s) | ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for policy in args.policies.split(","):
        for mode in args.modes.split(","):
            best: dict[tuple[bool, int], float] = {}
            for _ in range(args.rounds):
                for pure in (True, False):
                    for row in fold_rows(pure, args.nodes, args.commands, policy, mode):
                        key = (pure, int(row["nodes"]))  # type: ignore[call-overload]
                        best[key] = max(best.get(key, 0.0), float(row["commands_per_sec"]))  # type: ignore[arg-type]
            for nodes in (int(n) for n in args.nodes.split(",")):
                slow, fast = best[(True, nodes)], best[(False, nodes)]
                print(f"| {policy} | {mode} | {nodes:,} | {slow:,.0f} | {fast:,.0f} | {fast / slow:.2f}x |", flush=True)
    if args.codec:
        pure, built = codec_rows(True), codec_rows(False)
        print("\n| record | encode pure / compiled (µs) | decode pure / compiled (µs) |")
        print("|---|---|---|")
        for slow, fast in zip(pure, built, strict=True):
            print(
                f"| {slow['kind']} {slow['type']} | {slow['fast_encode_us']:.2f} / {fast['fast_encode_us']:.2f} "
                f"| {slow['fast_decode_us']:.2f} / {fast['fast_decode_us']:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
