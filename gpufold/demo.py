"""``gpufold demo``: replay the bundled openb trace on the embedded log, in event time.

Every node is added at time 0; each pod is submitted at its creation time and
released at its deletion time (the trace's seconds become ``issued_at``
milliseconds). The commands are appended to an embedded log, the processor
folds them exactly as it would from Kafka, and the summary is read back from the
events the processor published.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gpufold import trace
from logs.embedded import EmbeddedLog
from processor.core.snapshot import state_hash
from processor.runtime.loop import Processor
from schemas import COMMAND, EVENT, registry
from schemas.commands import DEFAULT_MAX_CLOCK_JUMP_MS, Command, Release, Tick
from schemas.events import Event, NodeAdded, NodeFailed, NodeRemoved, PodQueued, PodReleased, PodScheduled

CLUSTER = "openb"
SAMPLES = 16
APPEND_CHUNK = 5_000
PRESSURE_SEED = 42
PRESSURE_POLICIES = ("best-fit-paper", "fgd", "fgd-plus", "fgd-pack")
# Published means over seeds 42..51 (Weng et al., ATC '23; ../shared/traces/openb/README.md).
PUBLISHED_DEFAULT = {"best-fit-paper": 7.14, "fgd": 4.77}


def trace_commands(nodes: list[trace.TraceNode], pods: list[trace.TracePod], cluster: str = CLUSTER) -> list[Command]:
    """The trace as commands in event time: AddNode at 0, SubmitPod at creation, Release at deletion.

    Commands at one instant are ordered by pod name, a pod's submission before
    its release, so the order is the same on every machine.
    """
    commands = [trace.add_node(node, node.name, cluster) for node in nodes]
    timed: list[tuple[int, str, int, Command]] = []
    for pod in pods:
        created = (pod.creation_time or 0) * 1000
        timed.append((created, pod.name, 0, trace.submit_pod(pod, pod.name, cluster, created)))
        if pod.deletion_time is not None and pod.deletion_time >= (pod.creation_time or 0):
            deleted = pod.deletion_time * 1000
            release = Command(f"release-{pod.name}", cluster, deleted, Release(pod.name), "openb-trace")
            timed.append((deleted, pod.name, 1, release))
    timed.sort(key=lambda item: item[:3])
    return commands + _forced_ticks([item[3] for item in timed], cluster)


def _forced_ticks(commands: list[Command], cluster: str) -> list[Command]:
    """The trace's quiet spells run longer than a day: a ``Tick {force: true}`` moves time on purpose before a
    command dated more than ``max_clock_jump_ms`` (24 h) after the one before, which the fold would refuse."""
    out: list[Command] = []
    clock = 0
    for command in commands:
        if clock and command.issued_at - clock > DEFAULT_MAX_CLOCK_JUMP_MS:
            out.append(
                Command(f"jump-{command.command_id}", cluster, command.issued_at, Tick(force=True), "openb-trace")
            )
        clock = max(clock, command.issued_at)
        out.append(command)
    return out


@dataclass
class Summary:
    """What the demo prints, computed from the published events."""

    commands: int = 0
    events: int = 0
    nodes: int = 0
    gpu_milli_capacity: int = 0
    pods_submitted: int = 0
    pods_scheduled: int = 0
    pods_queued_ever: int = 0
    pods_pending_at_end: int = 0
    rejections: Counter[str] = field(default_factory=Counter)
    queue_reasons: Counter[str] = field(default_factory=Counter)
    utilization: list[tuple[int, float]] = field(default_factory=list)  # (event time ms, allocated %)
    peak_utilization: float = 0.0
    state_hash: str = ""
    log_path: str = ""
    projection_url: str = ""
    projected_events: int = 0
    utilization_by_model: list[dict[str, Any]] = field(default_factory=list)
    pressure: list[dict[str, Any]] = field(default_factory=list)  # the published experiment, one seed

    def as_json(self) -> dict[str, Any]:
        return {
            "commands": self.commands,
            "events": self.events,
            "nodes": self.nodes,
            "gpus": self.gpu_milli_capacity // 1000,
            "pods_submitted": self.pods_submitted,
            "pods_scheduled": self.pods_scheduled,
            "pods_queued_ever": self.pods_queued_ever,
            "pods_pending_at_end": self.pods_pending_at_end,
            "rejections": dict(sorted(self.rejections.items())),
            "top_queue_reasons": dict(self.queue_reasons.most_common(5)),
            "utilization": [[time_ms, round(pct, 2)] for time_ms, pct in self.utilization],
            "peak_utilization_pct": round(self.peak_utilization, 2),
            "state_hash": self.state_hash,
            "log": self.log_path,
            "projection": self.projection_url,
            "projected_events": self.projected_events,
            "utilization_by_model_at_end": self.utilization_by_model,
            "pressure_experiment": self.pressure,
        }


def summarise(events: Iterable[Event], total_time_ms: int) -> Summary:
    """Fold the published events into the demo's summary (a tiny projection)."""
    summary = Summary()
    allocated = 0
    gpu_of: dict[str, int] = {}
    queued: set[str] = set()
    pending: set[str] = set()
    scheduled: set[str] = set()
    step = max(1, total_time_ms // SAMPLES)
    next_sample = 0
    for event in events:
        summary.events += 1
        while event.occurred_at >= next_sample and next_sample <= total_time_ms:
            if summary.gpu_milli_capacity:
                summary.utilization.append((next_sample, 100.0 * allocated / summary.gpu_milli_capacity))
            next_sample += step
        payload = event.payload
        if isinstance(payload, NodeAdded):
            summary.nodes += 1
            summary.gpu_milli_capacity += payload.gpu_count * 1000
        elif isinstance(payload, (NodeRemoved, NodeFailed)):
            summary.nodes -= 1
        elif isinstance(payload, PodScheduled):
            pod = payload.pod
            if not payload.from_queue and pod.pod_id not in queued:
                summary.pods_submitted += 1
            scheduled.add(pod.pod_id)
            pending.discard(pod.pod_id)
            gpu_of[pod.pod_id] = pod.num_gpu * pod.gpu_milli
            allocated += gpu_of[pod.pod_id]
        elif isinstance(payload, PodQueued):
            if not payload.requeued:
                summary.pods_submitted += 1
            queued.add(payload.pod.pod_id)
            pending.add(payload.pod.pod_id)
            if payload.reasons:
                summary.queue_reasons[payload.reasons[0].code] += 1
        elif isinstance(payload, PodReleased):
            allocated -= gpu_of.pop(payload.pod_id, 0)
            pending.discard(payload.pod_id)
        elif type(payload).__name__ == "PodEvicted":
            allocated -= gpu_of.pop(payload.pod_id, 0)  # type: ignore[union-attr]
        elif type(payload).__name__ == "CommandRejected":
            summary.rejections[payload.code] += 1  # type: ignore[union-attr]
        if summary.gpu_milli_capacity:
            summary.peak_utilization = max(summary.peak_utilization, 100.0 * allocated / summary.gpu_milli_capacity)
    summary.pods_scheduled = len(scheduled)
    summary.pods_queued_ever = len(queued)
    summary.pods_pending_at_end = len(pending)
    return summary


def run_demo(
    log_path: Path,
    nodes_path: str | None = None,
    pods_path: str | None = None,
    *,
    limit_pods: int | None = None,
    progress: bool = True,
    pressure_policies: tuple[str, ...] = PRESSURE_POLICIES,
) -> Summary:
    """Append the trace to a fresh embedded log, fold it, and summarise the events."""
    nodes = trace.load_nodes(nodes_path)
    pods = trace.load_pods(pods_path)
    if limit_pods is not None:
        pods = pods[:limit_pods]
    commands = trace_commands(nodes, pods)
    if log_path.exists():
        log_path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{log_path}{suffix}").unlink(missing_ok=True)
    encode = registry().codec(COMMAND).encode
    with EmbeddedLog(log_path) as log_:
        bar = tqdm(total=len(commands), desc="append ", unit="cmd", disable=not progress, file=sys.stderr)
        for start in range(0, len(commands), APPEND_CHUNK):
            chunk = commands[start : start + APPEND_CHUNK]
            log_.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in chunk)
            bar.update(len(chunk))
        bar.close()
        processor = Processor(log_, snapshot_every=10_000)
        bar = tqdm(total=len(commands), desc="fold   ", unit="cmd", disable=not progress, file=sys.stderr)
        while processor.processed < len(commands):
            folded = processor.run_batch(timeout=0.0)
            if not folded:
                break
            bar.update(folded)
        bar.close()
        decode = registry().codec(EVENT).decode
        events: list[Event] = []
        for partition in log_.topic_partitions(log_.topics.events):
            events.extend(Event.from_avro(decode(r.value or b"")) for r in log_.read(log_.topics.events, partition))
        events.sort(key=lambda e: (e.occurred_at, e.partition, e.sequence))
        total_time = max((c.issued_at for c in commands), default=0)
        summary = summarise(events, total_time)
        summary.commands = len(commands)
        summary.state_hash = state_hash(processor.folder(log_.partition_for(CLUSTER.encode())).state)
        summary.log_path = str(log_path)
    project(summary, log_path)
    if pressure_policies:
        summary.pressure = pressure_experiment(nodes, pods, pressure_policies, progress=progress)
    return summary


def project(summary: Summary, log_path: Path) -> None:
    """Project the events into SQLite next to the log: the same tables and queries as PostgreSQL."""
    from sqlalchemy import create_engine

    from projections.queries import utilization_now
    from projections.runner import project_embedded_log

    database = log_path.with_suffix(".projections.sqlite")
    database.unlink(missing_ok=True)
    summary.projection_url = f"sqlite:///{database}"
    summary.projected_events = project_embedded_log(log_path, summary.projection_url).events
    engine = create_engine(summary.projection_url)
    try:
        with engine.connect() as conn:
            summary.utilization_by_model = utilization_now(conn, by="model")
    finally:
        engine.dispose()


def pressure_experiment(
    nodes: list[trace.TraceNode], pods: list[trace.TracePod], policies: tuple[str, ...], *, progress: bool
) -> list[dict[str, Any]]:
    """The published FGD experiment for one seed: pods arrive until 130% of capacity and never leave."""
    from gpufold import simulate

    rows = []
    for policy in policies:
        bar = tqdm(desc=f"{policy:<7}", unit="pod", disable=not progress, file=sys.stderr)
        result = simulate.run(nodes, pods, policy, seed=PRESSURE_SEED, progress=bar.update)
        bar.close()
        rows.append(
            {
                "policy": policy,
                "seed": PRESSURE_SEED,
                "unallocated_gpu_pct_at_100": result.unallocated_gpu_pct_at_100,
                "fragmentation_pct_at_100": result.fragmentation_pct_at_100,
                "pods_per_sec": result.pods_per_sec,
            }
        )
    return rows


def render(summary: Summary) -> str:
    """The human summary: totals, utilization over event time, top queue reasons."""
    lines = [
        f"openb trace replayed on the embedded log {summary.log_path}",
        f"  {summary.commands:,} commands -> {summary.events:,} events; {summary.nodes:,} nodes, "
        f"{summary.gpu_milli_capacity // 1000:,} GPUs",
        f"  pods: {summary.pods_submitted:,} submitted, {summary.pods_scheduled:,} scheduled, "
        f"{summary.pods_queued_ever:,} queued at some point, {summary.pods_pending_at_end:,} still pending at the end",
        f"  peak GPU allocation: {summary.peak_utilization:.1f}%",
        "",
        "  GPU allocated over event time (days since the first command):",
    ]
    for time_ms, pct in summary.utilization:
        bar = "#" * round(pct / 2.5)
        lines.append(f"    day {time_ms / 86_400_000:6.1f}  {pct:5.1f}%  {bar}")
    if summary.queue_reasons:
        lines.append("")
        lines.append("  top reasons pods waited (first reason of each PodQueued):")
        for code, count in summary.queue_reasons.most_common(5):
            lines.append(f"    {code:<24} {count:,}")
    if summary.rejections:
        lines.append("")
        lines.append("  rejected commands: " + ", ".join(f"{c} x{n}" for c, n in sorted(summary.rejections.items())))
    if summary.utilization_by_model:
        lines.append("")
        lines.append(f"  at the end, from the SQLite projection ({summary.projected_events:,} events projected):")
        for row in summary.utilization_by_model:
            lines.append(f"    {json.dumps(row, sort_keys=True)}")
    if summary.pressure:
        lines.append("")
        lines.append(
            "  the trace's pods live minutes, so real timing never fills the cluster. Under pressure instead "
            f"(the published FGD experiment, seed {PRESSURE_SEED}: pods arrive in shuffled order until 130% of "
            "capacity and never leave), unallocated GPU at arrived = 100%:"
        )
        for row in summary.pressure:
            published = PUBLISHED_DEFAULT.get(row["policy"])
            note = f"   (published mean over 10 seeds: {published:.2f}%)" if published is not None else ""
            lines.append(
                f"    {row['policy']:<14} {row['unallocated_gpu_pct_at_100']:6.2f}%   "
                f"fragmentation {row['fragmentation_pct_at_100']:5.2f}%   {row['pods_per_sec']:,.0f} pods/s{note}"
            )
        lines.append(
            "    fgd, fgd-plus and fgd-pack learn the typical pods online here; the published FGD knew them in advance "
            "(gpufold simulate --prior)"
        )
        lines.append("    all ten seeds and every trace variant: gpufold simulate --seeds 42-51 --policy fgd-pack")
    lines.append("")
    lines.append(f"  state_hash {summary.state_hash}")
    lines.append(f"  explore: gpufold state --log {summary.log_path}   |   gpufold events --log {summary.log_path}")
    if summary.projection_url:
        lines.append(f"           gpufold query utilization --by model --database-url {summary.projection_url}")
    serve = f"gpufold serve --log {summary.log_path}"
    if summary.projection_url:
        serve += f" --database-url {summary.projection_url}"
    lines.append(f"  dashboard: {serve}   then open http://127.0.0.1:8000/")
    return "\n".join(lines)


def print_json(summary: Summary) -> None:
    print(json.dumps(summary.as_json(), indent=2))
