"""Ticks: the runtime publishes event time into the log when no command does (the fold never reads a clock)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from processor.core.state import ClusterState, PartitionState
from processor.runtime.ticks import TickSchedule, tick_commands
from schemas.commands import Tick

ROOT = Path(__file__).resolve().parents[4]


def test_one_tick_per_partition_with_clusters_under_its_first_cluster() -> None:
    empty = PartitionState(partition=0)
    busy = PartitionState(partition=1)
    busy.clusters = {"zeta": ClusterState("zeta"), "alpha": ClusterState("alpha")}
    (command,) = tick_commands([empty, busy], 1_767_225_600_000, "proc-1")
    assert isinstance(command.payload, Tick)
    assert (command.cluster, command.issued_at) == ("alpha", 1_767_225_600_000)
    assert command.command_id == "tick-proc-1-1-1767225600000"


def test_the_schedule_ticks_once_per_interval_and_never_when_off() -> None:
    now = [100.0]
    state = PartitionState()
    state.clusters = {"c": ClusterState("c")}
    schedule = TickSchedule(5.0, monotonic=lambda: now[0], wall=lambda: 2.5)
    assert schedule.due([state], "i") == []
    now[0] = 105.0
    (tick,) = schedule.due([state], "i")
    assert tick.issued_at == 2500
    assert schedule.due([state], "i") == []
    assert TickSchedule(0.0).due([state], "i") == []


def test_gpufold_run_follow_with_ticks_releases_a_pod_at_its_time_limit(tmp_path: Path) -> None:
    """On the embedded log, ``run --follow --tick-interval`` appends ticks, so a time limit fires unattended."""
    log = tmp_path / "ticks.sqlite"
    now = int(time.time() * 1000)
    lines = [
        {"command_id": "a", "cluster": "lab", "issued_at": now,
         "payload": {"AddNode": {"node_id": "n1", "gpu_model": "A100", "gpu_count": 1, "cpu_milli": 1000,
                                 "memory_mib": 1024}}},
        {"command_id": "b", "cluster": "lab", "issued_at": now,
         "payload": {"SubmitPod": {"pod_id": "p1", "num_gpu": 1, "gpu_milli": 1000, "time_limit_ms": 500}}},
    ]  # fmt: skip
    source = tmp_path / "c.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    gpufold = [sys.executable, "-m", "gpufold"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [*gpufold, "log", "append", "--create", "--log", str(log), str(source)], check=True, env=env, cwd=ROOT
    )
    run = [*gpufold, "run", "--log", str(log), "--follow", "--tick-interval", "0.2", "--no-progress"]
    process = subprocess.Popen(run, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        found = False
        while not found and time.monotonic() < deadline:
            time.sleep(0.3)
            out = subprocess.run(
                [*gpufold, "events", "--log", str(log), "--type", "PodTimeLimitReached"],
                capture_output=True, text=True, env=env, cwd=ROOT,
            )  # fmt: skip
            found = "p1 on n1: time limit 500 ms" in out.stdout
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    assert found, process.stderr.read().decode() if process.stderr else ""


def test_gpufold_run_follow_stops_on_sigterm_like_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (systemd, docker stop) ends ``run --follow`` within seconds after its batch, with the summary
    and exit 0, instead of dying mid-way without a word."""
    log = tmp_path / "term.sqlite"
    line = {"command_id": "a", "cluster": "lab", "issued_at": 1_767_225_600_000, "payload": {"Tick": {}}}
    source = tmp_path / "c.jsonl"
    source.write_text(json.dumps(line) + "\n")
    gpufold = [sys.executable, "-m", "gpufold"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [*gpufold, "log", "append", "--create", "--log", str(log), str(source)], check=True, env=env, cwd=ROOT
    )
    run = [*gpufold, "run", "--log", str(log), "--follow", "--no-progress", "--json"]
    process = subprocess.Popen(run, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.3)
            info = subprocess.run(
                [*gpufold, "state", "--log", str(log), "--json"], capture_output=True, text=True, env=env, cwd=ROOT
            )
            if info.returncode == 0 and json.loads(info.stdout)["lag"] == 0:
                break
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert json.loads(out)["commands"] == 1
