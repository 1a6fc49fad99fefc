"""A live, read-only replica of the fold: follows the commands log to its head and answers from memory.

Any number of replicas can run beside the processor: each restores every partition from its latest
snapshot, folds the commands after it with the same ``decide`` the processor uses, and keeps
following the log (Kafka's commands topic, or the embedded log) without writing anything. Because
the fold is deterministic, a replica's state at offset N is the processor's state at offset N.

It answers what needs the scheduler's state rather than the projected events:

- :meth:`Replica.what_if`: fold commands on a private fork of the head state (see
  ``processor.runtime.whatif``) and return the events they would produce, publishing nothing;
- :meth:`Replica.explain`: why a pending pod does not fit now (``processor.core.explain``);
- :meth:`Replica.pods` / :meth:`Replica.nodes`: paged listings (``processor.runtime.pod_index``);
- :meth:`Replica.clusters`, :meth:`Replica.history`, :meth:`Replica.tenants`: what the dashboard draws.

Every answer carries :meth:`Replica.position`: the offset each partition was answered at and the
lag behind the log's head. One lock serialises folding and answering; folding takes it per batch
of ``batch_size`` commands, so an answer waits at most one small batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from logs.port import InputRecord, ReplicaSource
from processor.core.explain import Explanation, explain, live_reasons
from processor.core.fold import decide
from processor.core.fragmentation import cluster_fragmentation
from processor.core.resources import PodShape
from processor.core.snapshot import from_snapshot, state_hash
from processor.core.state import ClusterState, PartitionState
from processor.runtime.loop import wrong_partition
from processor.runtime.pod_index import PodIndex, pod_row
from processor.runtime.whatif import fork
from schemas import COMMAND, DecodeError, registry
from schemas.codes import DeadLetterCode
from schemas.commands import GPU_MILLI, Command
from schemas.events import Event, NodeAdded, NodeRemoved
from schemas.fastcodec import decode_command
from schemas.partitioner import partition_for
from schemas.snapshots import decode_snapshot

log = logging.getLogger("gpufold.replica")

DEFAULT_BATCH_SIZE = 500
HISTORY_POINTS = 720
HISTORY_STEP_MS = 60_000
ENDS_REFRESH_SECONDS = 0.5


@dataclass(slots=True)
class WhatIfResult:
    """What one command would produce: where it would be folded and its events."""

    command: Command
    partition: int
    offset: int
    events: list[Event]


@dataclass(slots=True)
class WhatIf:
    """The answer to a what-if: each command's result and the head the fork was taken at."""

    results: list[WhatIfResult]
    position: dict[str, Any]
    state_hashes: dict[int, str] = field(default_factory=dict)  # of each forked partition afterwards


class Replica:
    """See the module docstring. Thread-safe: one thread follows, any number answer."""

    def __init__(
        self,
        source: ReplicaSource,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        history_points: int = HISTORY_POINTS,
        history_step_ms: int = HISTORY_STEP_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.batch_size = batch_size
        self._clock = clock
        self._lock = threading.RLock()
        self.partitions = source.partition_count()
        self.states: dict[int, PartitionState] = {}
        self.index = PodIndex()
        self._ends: dict[int, int] = {}
        self._ends_at = -1e9
        self._event_time: dict[str, int] = {}  # cluster -> largest issued_at folded
        self._node_version: dict[str, int] = {}
        self._sorted_nodes: dict[str, tuple[int, list[str]]] = {}
        self._history_points = history_points
        self._history_step = history_step_ms
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._history_steps: dict[str, int] = {}
        self.folded = 0
        self.refused: dict[str, int] = {}
        """Commands seen since the restore that the processor does not fold (dead-lettered), by code."""
        self.restored = threading.Event()
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._encode_command = registry().codec(COMMAND).encode

    # ------------------------------------------------------------ following

    def restore(self) -> None:
        """Load each partition's latest snapshot, then fold to the head of the log."""
        states = {}
        for partition in range(self.partitions):
            frame = self.source.latest_snapshot(partition)
            states[partition] = from_snapshot(decode_snapshot(frame)) if frame else PartitionState(partition=partition)
        with self._lock:
            self.states = states
            self.index.rebuild(c for s in states.values() for c in s.clusters.values())
            for state in states.values():
                for name, cluster in state.clusters.items():
                    self._node_version[name] = self._node_version.get(name, 0) + 1
                    self._sample(cluster, force=True)
        self.catch_up()
        self.restored.set()
        log.info("replica restored at %s", {p: s.next_offset for p, s in self.states.items()})

    def catch_up(self, timeout: float = 0.0) -> int:
        """Fold until the log has nothing more (at the time of asking); returns commands folded."""
        total = 0
        while True:
            count = self.step(timeout)
            total += count
            if not count and self.lag(refresh=True) == 0:
                return total
            if not count and timeout == 0.0:
                timeout = 0.05  # the head moved while we looked: wait a little for it

    def step(self, timeout: float = 0.0) -> int:
        """Fetch and fold one batch; returns commands folded."""
        with self._lock:
            positions = {p: s.next_offset for p, s in self.states.items()}
        records = self.source.fetch(positions, self.batch_size, timeout)
        if records:
            with self._lock:
                for record in records:
                    self._fold(record)
                self.folded += len(records)
        if self._clock() - self._ends_at >= ENDS_REFRESH_SECONDS:
            self._refresh_ends()
        return len(records)

    def run(self, poll_timeout: float = 0.2) -> None:
        """Restore, then follow the log until :meth:`stop` (what the background thread runs)."""
        try:
            self.restore()
            while not self._stop.is_set():
                self.step(poll_timeout)
        except Exception as error:  # reported in every answer; the server keeps serving what it has
            self.error = f"{type(error).__name__}: {error}"
            log.exception("the replica stopped following the log")
            self.restored.set()

    def start(self) -> Replica:
        """Follow the log in a background thread."""
        self._thread = threading.Thread(target=self.run, name="gpufold-replica", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.source.close()

    def _refresh_ends(self) -> None:
        try:
            ends = self.source.end_offsets()
        except Exception as error:  # a broker hiccup: keep the last known head
            log.warning("cannot read the log's head: %s", error)
            return
        self._ends = ends
        self._ends_at = self._clock()

    def _fold(self, record: InputRecord) -> None:
        """Fold one record exactly as ``PartitionFolder.fold`` does (without encoding the outputs)."""
        state = self.states[record.partition]
        if record.offset < state.next_offset:
            return
        try:
            command = decode_command(record.value)  # type: ignore[arg-type]
        except DecodeError:
            state.next_offset = record.offset + 1  # the processor dead-letters it
            return
        if wrong_partition(record, command.cluster, self.partitions) is not None:
            state.next_offset = record.offset + 1  # the processor dead-letters it (WRONG_PARTITION)
            self.refused[DeadLetterCode.WRONG_PARTITION] = self.refused.get(DeadLetterCode.WRONG_PARTITION, 0) + 1
            return
        events = decide(state, command, record.offset)
        update = self.index.update
        touched: dict[str, ClusterState] = {}
        for event in events:  # a command's events may be about other clusters too (timers it reached)
            cluster = touched.get(event.cluster) or state.clusters.get(event.cluster)
            if cluster is None:
                continue
            touched[event.cluster] = cluster
            if event.occurred_at > self._event_time.get(cluster.name, -1):
                self._event_time[cluster.name] = event.occurred_at
            payload = event.payload
            for pod_id in _pods_named(payload):
                update(cluster, pod_id)
            if isinstance(payload, (NodeAdded, NodeRemoved)):
                self._node_version[cluster.name] = self._node_version.get(cluster.name, 0) + 1
        for cluster in touched.values():
            self._sample(cluster)

    # ------------------------------------------------------------ position and lag

    def lag(self, refresh: bool = False) -> int:
        """Commands in the log not folded yet, over all partitions (as of the last look at the head)."""
        if refresh:
            self._refresh_ends()
        with self._lock:
            return sum(max(0, end - self.states[p].next_offset) for p, end in self._ends.items() if p in self.states)

    def position(self) -> dict[str, Any]:
        """Where the replica is: per partition the next offset it folds, the log's head, and the lag."""
        with self._lock:
            offsets = {str(p): s.next_offset for p, s in sorted(self.states.items())}
            ends = {str(p): e for p, e in sorted(self._ends.items())}
        lag = sum(max(0, self._ends.get(int(p), 0) - o) for p, o in offsets.items())
        answer: dict[str, Any] = {"offsets": offsets, "head": ends, "lag": lag, "ready": self.restored.is_set()}
        if self.refused:  # e.g. {"WRONG_PARTITION": 2}: a producer not on murmur2, or keyed other than its cluster
            answer["refused"] = dict(sorted(self.refused.items()))
        if self.error:
            answer["error"] = self.error
        return answer

    def partition_of(self, cluster: str) -> int:
        return partition_for(cluster.encode(), self.partitions)

    def state_hashes(self) -> dict[int, str]:
        with self._lock:
            return {p: state_hash(s) for p, s in sorted(self.states.items())}

    # ------------------------------------------------------------ what-if

    def what_if(self, commands: Iterable[Command], *, hashes: bool = False) -> WhatIf:
        """Fold the commands, in order, on a fork of the head state; the live state is not touched.

        Each command goes through the same bytes the processor would read (encoded, then decoded),
        and is folded at the offset it would get if it were published now: the head of its
        partition, plus the what-if commands before it on that partition. ``hashes``: also the
        ``state_hash`` of each forked partition afterwards (O(n log n): for tests and audits).
        """
        commands = list(commands)
        # The forks are private, but the placement policies' memo caches are shared with the live
        # fold: the lock keeps one fold at a time in them, as in the processor.
        with self._lock:
            partitions = sorted({self.partition_of(command.cluster) for command in commands})
            forks = {p: fork(self.states.get(p) or PartitionState(partition=p)) for p in partitions}
            position = self.position()
            results = []
            for command in commands:
                partition = self.partition_of(command.cluster)
                state = forks[partition]
                decoded = decode_command(self._encode_command(command.to_avro()))
                offset = state.next_offset
                results.append(WhatIfResult(decoded, partition, offset, decide(state, decoded, offset)))
            # Still under the lock: a fork shares what it has not copied with the live state.
            after = {p: state_hash(s) for p, s in sorted(forks.items())} if hashes else {}
        return WhatIf(results, position, after)

    # ------------------------------------------------------------ explain

    def explain(self, cluster: str, pod_id: str) -> Explanation | None:
        with self._lock:
            state = self.states.get(self.partition_of(cluster))
            found = state.clusters.get(cluster) if state is not None else None
            return explain(found, pod_id) if found is not None else None

    # ------------------------------------------------------------ listings

    def knows_cluster(self, name: str) -> bool:
        """Whether a cluster with this name exists at the replica's position (queries answer 404 if not)."""
        with self._lock:
            return self._cluster(name) is not None

    def _cluster(self, name: str) -> ClusterState | None:
        state = self.states.get(self.partition_of(name))
        return state.clusters.get(name) if state is not None else None

    def pods(
        self,
        *,
        state: str | None = None,
        cluster: str | None = None,
        tenant: str | None = None,
        node_id: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> dict[str, Any]:
        """One page of pods, sorted by (cluster, pod id); pending ones with their reasons now."""
        with self._lock:
            keys, total = self.index.query(
                state=state, cluster=cluster, tenant=tenant, node_id=node_id, offset=offset, limit=limit
            )
            reasons: dict[tuple[str, PodShape], list[dict[str, Any]]] = {}
            rows = []
            for name, pod_id in keys:
                found = self._cluster(name)
                pod = found.pods.get(pod_id) if found is not None else None
                if found is None or pod is None:
                    continue
                row = pod_row(name, pod_id, pod)
                row["state"] = row["status"]  # the field's name before pod rows had one shape (kept for API clients)
                if not pod.running:
                    key = (name, pod.shape)
                    if key not in reasons:
                        reasons[key] = live_reasons(found, pod.shape)
                    row["reasons"] = reasons[key]
                rows.append(row)
            return {"total": total, "offset": offset, "limit": limit, "pods": rows, "replica": self.position()}

    def nodes(
        self, *, cluster: str | None = None, gpu_model: str | None = None, offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """One page of nodes, sorted by (cluster, node id), each GPU with its allocation and pods."""
        with self._lock:
            clusters = sorted(self._clusters(cluster), key=lambda c: c.name)
            matched: list[tuple[ClusterState, str]] = []
            for c in clusters:
                for node_id in self._node_ids(c):
                    if gpu_model is None or c.nodes[node_id].gpu_model == gpu_model:
                        matched.append((c, node_id))
            rows = [_node_row(c, node_id) for c, node_id in matched[offset : offset + limit]]
            return {"total": len(matched), "offset": offset, "limit": limit, "nodes": rows, "replica": self.position()}

    def _clusters(self, name: str | None = None) -> list[ClusterState]:
        if name is not None:
            found = self._cluster(name)
            return [found] if found is not None else []
        return [c for s in self.states.values() for c in s.clusters.values()]

    def _node_ids(self, cluster: ClusterState) -> list[str]:
        version = self._node_version.get(cluster.name, 0)
        cached = self._sorted_nodes.get(cluster.name)
        if cached is None or cached[0] != version:
            cached = self._sorted_nodes[cluster.name] = (version, sorted(cluster.nodes))
        return cached[1]

    def clusters(self) -> dict[str, Any]:
        """Each cluster now: nodes, GPUs, allocation, pods, fragmentation, policy, event time."""
        with self._lock:
            clusters = sorted(self._clusters(), key=lambda c: c.name)
            rows = [_cluster_row(c, self._event_time.get(c.name)) for c in clusters]
            return {"clusters": rows, "replica": self.position()}

    def tenants(self, cluster: str | None = None) -> dict[str, Any]:
        """Per (cluster, tenant): GPU milli running now, running and pending pods."""
        with self._lock:
            usage = self.index.tenant_gpu_milli()
            rows: dict[tuple[str, str], dict[str, Any]] = {}
            for c in self._clusters(cluster):
                for (state, tenant), count in self.index.tenant_counts(c.name).items():
                    row = rows.setdefault(
                        (c.name, tenant),
                        {"cluster": c.name, "tenant": tenant, "gpu_milli": 0, "running": 0, "pending": 0},
                    )
                    row[state] = count
                    row["gpu_milli"] = usage.get((c.name, tenant), 0)
            ordered = sorted(rows.values(), key=lambda r: (r["cluster"], -r["gpu_milli"], r["tenant"]))
            return {"tenants": ordered, "replica": self.position()}

    def quotas(self, cluster: str | None = None) -> dict[str, Any]:
        """Per (cluster, tenant, key): nominal quota, used, what it may hold now, borrowed and lent."""
        from dataclasses import asdict

        from processor.core.quotas import quota_report

        with self._lock:
            rows = [
                {"cluster": c.name, **asdict(line)}
                for c in sorted(self._clusters(cluster), key=lambda c: c.name)
                for line in quota_report(c)
            ]
            return {"quotas": rows, "replica": self.position()}

    def history(self, cluster: str) -> dict[str, Any]:
        """Utilization and fragmentation of a cluster over event time, as the replica folded it."""
        with self._lock:
            points = list(self._history.get(cluster, ()))
            return {"cluster": cluster, "points": points, "step_ms": self._history_steps.get(cluster, 0)}

    def _sample(self, cluster: ClusterState, force: bool = False) -> None:
        """Record a history point when the cluster's event time moved a step (the series halves its
        resolution when full, so it always spans the whole history in at most ``history_points``)."""
        now = self._event_time.get(cluster.name, 0)
        points = self._history.get(cluster.name)
        if points is None:
            points = self._history[cluster.name] = deque()
            self._history_steps[cluster.name] = self._history_step
        step = self._history_steps[cluster.name]
        if not force and points and now - points[-1]["t"] < step:
            return
        frag = cluster_fragmentation(cluster)
        running = self.index.query(state="running", cluster=cluster.name, limit=0)[1]
        pending = len(cluster.queue)
        points.append(
            {
                "t": now,
                "gpu_milli_allocated": cluster.gpu_milli_allocated,
                "gpu_milli_capacity": cluster.gpu_milli_capacity,
                "fragmentation_pct": round(frag.fragment_pct_of_idle, 3),
                "running": running,
                "pending": pending,
            }
        )
        if len(points) > self._history_points:
            kept = list(points)[::2]
            points.clear()
            points.extend(kept)
            self._history_steps[cluster.name] = step * 2


def _pods_named(payload: Any) -> list[str]:
    """The pod ids an event payload is about: ``pod`` (a spec), ``pod_id``, ``pods`` (specs or ids),
    ``members`` (placements) and a gang's member specs (a requeued gang's members stop being pods)."""
    found: list[str] = []
    pod = getattr(payload, "pod", None)
    if pod is not None:
        found.append(pod.pod_id)
    pod_id = getattr(payload, "pod_id", None)
    if isinstance(pod_id, str):
        found.append(pod_id)
    gang = getattr(payload, "gang", None)
    items = [*(getattr(payload, "pods", None) or ()), *(getattr(payload, "members", None) or ())]
    items.extend(getattr(gang, "members", None) or ())
    for item in items:
        found.append(item if isinstance(item, str) else getattr(item, "pod_id", str(item)))
    return found


def _node_row(cluster: ClusterState, node_id: str) -> dict[str, Any]:
    node = cluster.nodes[node_id]
    gpus: list[dict[str, Any]] = [
        {"index": i, "allocated_milli": GPU_MILLI - free, "free_milli": free, "pods": []}
        for i, free in enumerate(node.gpu_free)
    ]
    for pod_id in node.pods:
        pod = cluster.pods[pod_id]
        for share in pod.gpus:
            gpus[share.index]["pods"].append({"pod_id": pod_id, "tenant": pod.spec.tenant, "milli": share.milli})
    return {
        "cluster": cluster.name,
        "node_id": node_id,
        "gpu_model": node.gpu_model,
        "gpu_count": node.gpu_count,
        "labels": dict(sorted(node.labels.items())),
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
        "status": "failed" if node.failed else "cordoned" if node.cordoned else "ready",
        "cpu_milli": node.cpu_milli,
        "cpu_milli_allocated": node.cpu_milli - node.cpu_free,
        "memory_mib": node.memory_mib,
        "memory_mib_allocated": node.memory_mib - node.memory_free,
        "pods": len(node.pods),
        "gpus": gpus,
    }


def _cluster_row(cluster: ClusterState, event_time: int | None) -> dict[str, Any]:
    frag = cluster_fragmentation(cluster)
    running = sum(len(node.pods) for node in cluster.nodes.values())
    return {
        "cluster": cluster.name,
        "policy": cluster.policy,
        "nodes": len(cluster.nodes),
        "nodes_unschedulable": cluster.unschedulable_nodes,
        "gpus": sum(node.gpu_count for node in cluster.nodes.values()),
        "gpu_milli_capacity": cluster.gpu_milli_capacity,
        "gpu_milli_allocated": cluster.gpu_milli_allocated,
        "running": running,
        "pending": len(cluster.queue),
        "fragmentation_pct": round(frag.fragment_pct_of_idle, 3),
        "event_time": event_time,
    }
