"""A live, read-only replica of the fold: follows the commands log to its head and answers from memory.

Any number of replicas can run beside the processor: each restores every partition from its latest
snapshot, folds the commands after it with the same ``decide`` the processor uses, and keeps
following the log (Kafka's commands topic, or the embedded log) without writing anything. Because
the fold is deterministic, a replica's state at offset N is the processor's state at offset N.

It answers what needs the scheduler's state rather than the projected events:

- :meth:`Replica.what_if`: fold commands on a private fork of the head state (see
  ``processor.runtime.whatif``) and return the events they would produce, publishing nothing;
  :meth:`Replica.frozen` and :meth:`Replica.fold_here` let a server run it in a forked process instead;
- :meth:`Replica.explain`: why a pod or gang waits now (``processor.core.explain``);
- listings and the dashboard's views (``processor.runtime.replica_views``): pods, nodes, the queue in
  scheduling order, gangs, quotas, tenants, recent disruptions, history;
- :attr:`Replica.ledger`: where each recent command id was folded, with its body's digest (the
  write API's idempotent retry); :attr:`Replica.halted`: clusters whose fold halted.

Every answer carries :meth:`Replica.position`: the offset each partition was answered at and the
lag behind the log's head; :meth:`Replica.status` is the same without taking the lock (for health).
One lock serialises folding and answering; folding takes it per batch of ``batch_size`` commands,
so an answer waits at most one small batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from logs.port import InputRecord, ReplicaSource
from processor.core.explain import Explanation, explain
from processor.core.fold import decide
from processor.core.fragmentation import cluster_fragmentation
from processor.core.snapshot import from_snapshot, state_hash
from processor.core.state import ClusterState, PartitionState
from processor.runtime import replica_views as views
from processor.runtime.ledger import DEFAULT_SIZE, CommandLedger, Entry, command_digest, frame_digest
from processor.runtime.loop import resumed_for, wrong_partition
from processor.runtime.pod_index import PodIndex
from processor.runtime.whatif import fork
from schemas import COMMAND, DecodeError, registry
from schemas.codes import DeadLetterCode
from schemas.commands import Command, Tick
from schemas.events import Event, NodeAdded, NodeRemoved
from schemas.fastcodec import decode_command
from schemas.fragmentation import derive_typical
from schemas.partitioner import partition_for
from schemas.snapshots import decode_snapshot

log = logging.getLogger("gpufold.replica")

DEFAULT_BATCH_SIZE = 500
HISTORY_POINTS = 720
ENDS_REFRESH_SECONDS = 0.5
FRAGMENTATION_EVERY_SECONDS = 0.5  # a changed cluster's fragmentation is measured at least this often
FRAGMENTATION_SHARE = 0.05  # ... and at most as often as keeps its measuring under this share of the time
RECENT_DISRUPTIONS = 200  # per cluster
DISRUPTIONS = ("PodPreempted", "PodEvicted", "PodMigrated", "PodTimeLimitReached", "GangTimedOut", "NodeFailed")


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
        ledger_size: int = DEFAULT_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.log_history = SourceHistory(source)  # to rebuild a halted cluster for a ResumeCluster, as the processor
        self.batch_size = batch_size
        self._clock = clock
        self._lock = threading.RLock()
        self.partitions = source.partition_count()
        self.states: dict[int, PartitionState] = {}
        self.index = PodIndex()
        self._ends: dict[int, int] = {}
        self._ends_at = -1e9
        self._event_time: dict[str, int] = {}  # cluster -> largest occurred_at folded
        self._node_version: dict[str, int] = {}
        self._sorted_nodes: dict[str, tuple[int, list[str]]] = {}
        self._history_points = history_points
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._fragmentation: dict[str, tuple[float, float, float]] = {}  # cluster -> (measured at, pct, cost)
        self._disruptions: dict[str, deque[Event]] = {}
        self.versions: dict[str, int] = {}  # cluster -> changes folded (an ETag for its views)
        self._queue_order: dict[str, tuple[int, list[tuple[str, str]]]] = {}  # cluster -> (version, order)
        self.ledger = CommandLedger(ledger_size)
        self.folded = 0
        self.folded_at: float | None = None  # clock time of the last fold
        self.refused: dict[str, int] = {}
        """Commands seen since the restore that the processor does not fold (dead-lettered), by code."""
        self.restored = threading.Event()
        self.error: str | None = None
        self._status: dict[str, Any] = {"offsets": {}, "head": {}, "lag": 0, "ready": False}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._encode_command = registry().codec(COMMAND).encode
        self._fingerprint = self._encode_command(Command("x", "x", 0, Tick()).to_avro())[:10]

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
                    if state.clock > 0:
                        self._event_time[name] = state.clock
                    self._sample(cluster)
        self.catch_up()
        self.restored.set()
        self._publish_status()
        log.info("replica restored at %s", {p: s.next_offset for p, s in self.states.items()})

    def catch_up(self, timeout: float = 0.0) -> int:
        """Fold until the log has nothing more (at the time of asking); returns commands folded."""
        total = 0
        while True:
            count = self.step(timeout)
            total += count
            if not count and self.lag(refresh=True) == 0:
                self._publish_status()
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
                touched: dict[str, ClusterState] = {}
                for record in records:
                    self._fold(record, touched)
                self.folded += len(records)
                self.folded_at = self._clock()
        if self._clock() - self._ends_at >= ENDS_REFRESH_SECONDS:
            self._refresh_ends()
        if records or self._status["head"] != self._ends:
            self._publish_status()
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
            self._publish_status()

    def start(self) -> Replica:
        """Follow the log in a background thread."""
        self._thread = threading.Thread(target=self.run, name="gpufold-replica", daemon=True)
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the follower thread runs (True for a replica driven by hand, as in tests)."""
        return self._thread is None or self._thread.is_alive()

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

    def _fold(self, record: InputRecord, touched: dict[str, ClusterState]) -> None:
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
        self.ledger.record(command.command_id, Entry(record.partition, record.offset, self._digest(record, command)))
        events = decide(state, command, record.offset, resumed_for(self.log_history, state, command))
        update = self.index.update
        changed: dict[str, ClusterState] = {}
        for event in events:  # a command's events may be about other clusters too (timers it reached)
            cluster = changed.get(event.cluster) or state.clusters.get(event.cluster)
            payload = event.payload
            kind = type(payload).__name__
            if cluster is None:
                continue
            changed[event.cluster] = cluster
            if event.occurred_at > self._event_time.get(cluster.name, -1):
                self._event_time[cluster.name] = event.occurred_at
            for pod_id in _pods_named(payload):
                update(cluster, pod_id)
            if isinstance(payload, (NodeAdded, NodeRemoved)):
                self._node_version[cluster.name] = self._node_version.get(cluster.name, 0) + 1
            if kind in DISRUPTIONS:
                recent = self._disruptions.get(cluster.name)
                if recent is None:
                    recent = self._disruptions[cluster.name] = deque(maxlen=RECENT_DISRUPTIONS)
                recent.append(event)
        for name, cluster in changed.items():
            self.versions[name] = self.versions.get(name, 0) + 1
            self._sample(cluster)  # a history point per change
        touched.update(changed)

    def _digest(self, record: InputRecord, command: Command) -> bytes:
        frame = bytes(record.value or b"")
        if frame[:10] == self._fingerprint:
            return frame_digest(frame)
        return command_digest(command, lambda c: self._encode_command(c.to_avro()))  # an older writer schema

    def digest(self, command: Command) -> bytes:
        """The ledger's digest of a command as it would be appended now (cluster and payload)."""
        return command_digest(command, lambda c: self._encode_command(c.to_avro()))

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

    @property
    def halted(self) -> dict[str, dict[str, Any]]:
        """Clusters whose fold is halted (``ClusterHalted``, until a ``ResumeCluster``), with why: read from the
        state itself, so a replica restored from a snapshot knows it too."""
        found: dict[str, dict[str, Any]] = {}
        for partition, state in sorted(self.states.items()):
            for name, cluster in sorted(state.clusters.items()):
                halt = cluster.halted
                if halt is not None:
                    found[name] = {
                        "cluster": name,
                        "command_id": halt.command_id,
                        "error": halt.error,
                        "partition": partition,
                        "offset": halt.offset,
                        "refused": halt.refused,
                    }
        return found

    def _publish_status(self) -> None:
        position = self.position()
        position["folded"] = self.folded
        position["halted"] = sorted(self.halted)
        self._status = position  # replaced whole: readers never see half of it

    def status(self) -> dict[str, Any]:
        """:meth:`position` as of the last batch folded, without taking the lock (health checks use it)."""
        answer = dict(self._status)
        answer["ready"] = self.restored.is_set()
        answer["alive"] = self.alive
        if self.error:
            answer["error"] = self.error
        return answer

    def event_times(self) -> dict[str, int]:
        """Each cluster's event time: the largest ``occurred_at`` of its events folded so far."""
        with self._lock:
            return dict(self._event_time)

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
            results = self._fold_on(forks, commands)
            # Still under the lock: a fork shares what it has not copied with the live state.
            after = {p: state_hash(s) for p, s in sorted(forks.items())} if hashes else {}
        return WhatIf(results, position, after)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[dict[str, Any]]:
        """Hold the state still (no fold, no answer) for a moment, e.g. to ``os.fork`` a process that owns a
        copy of it; yields the position it is held at."""
        with self._lock:
            yield self.position()

    def fold_here(self, commands: Iterable[Command], *, hashes: bool = False) -> WhatIf:
        """Fold the commands on the replica's own state: only for a process that owns a private copy of it
        (forked under :meth:`frozen`); the live replica uses :meth:`what_if`."""
        commands = list(commands)
        position = self.position()
        partitions = sorted({self.partition_of(command.cluster) for command in commands})
        states = {p: self.states.setdefault(p, PartitionState(partition=p)) for p in partitions}
        results = self._fold_on(states, commands)
        after = {p: state_hash(s) for p, s in sorted(states.items())} if hashes else {}
        return WhatIf(results, position, after)

    def _fold_on(self, states: dict[int, PartitionState], commands: list[Command]) -> list[WhatIfResult]:
        results = []
        for command in commands:
            partition = self.partition_of(command.cluster)
            state = states[partition]
            decoded = decode_command(self._encode_command(command.to_avro()))
            offset = state.next_offset
            results.append(WhatIfResult(decoded, partition, offset, decide(state, decoded, offset)))
        return results

    # ------------------------------------------------------------ explain

    def explain(self, cluster: str, job_id: str) -> Explanation | None:
        """Why a pod or a gang (or a gang's member) waits, or where it runs, on the state now."""
        with self._lock:
            found = self._cluster(cluster)
            return explain(found, job_id, self._event_time.get(cluster)) if found is not None else None

    # ------------------------------------------------------------ listings

    def knows_cluster(self, name: str) -> bool:
        """Whether a cluster with this name exists at the replica's position (queries answer 404 if not)."""
        with self._lock:
            return self._cluster(name) is not None

    def _cluster(self, name: str) -> ClusterState | None:
        state = self.states.get(self.partition_of(name))
        return state.clusters.get(name) if state is not None else None

    def _clusters(self, name: str | None = None) -> list[ClusterState]:
        if name is not None:
            found = self._cluster(name)
            return [found] if found is not None else []
        return sorted((c for s in self.states.values() for c in s.clusters.values()), key=lambda c: c.name)

    def version(self, cluster: str | None = None) -> str:
        """A tag that changes whenever the answer about the cluster (or any, if None) may change: an ETag."""
        with self._lock:
            if cluster is not None:
                return f"{cluster}:{self.versions.get(cluster, 0)}:{self.restored.is_set():d}"
            return ".".join(f"{s.next_offset}" for _, s in sorted(self.states.items())) + f":{self.restored.is_set():d}"

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
            rows = views.pod_rows(keys, self._cluster)
            return {"total": total, "offset": offset, "limit": limit, "pods": rows, "replica": self.position()}

    def nodes(
        self, *, cluster: str | None = None, gpu_model: str | None = None, offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """One page of nodes, sorted by (cluster, node id), each GPU with its allocation and pods."""
        with self._lock:
            matched: list[tuple[ClusterState, str]] = []
            for c in self._clusters(cluster):
                for node_id in self._node_ids(c):
                    if gpu_model is None or c.nodes[node_id].gpu_model == gpu_model:
                        matched.append((c, node_id))
            rows = [views.node_row(c, node_id) for c, node_id in matched[offset : offset + limit]]
            return {"total": len(matched), "offset": offset, "limit": limit, "nodes": rows, "replica": self.position()}

    def node(self, cluster: str, node_id: str) -> dict[str, Any] | None:
        """One node in full: labels, taints, GPUs, the pods on it, whether it is reserved; None if unknown."""
        with self._lock:
            found = self._cluster(cluster)
            if found is None or node_id not in found.nodes:
                return None
            return {**views.node_detail(found, node_id), "replica": self.position()}

    def grid(self, cluster: str) -> dict[str, Any]:
        """Every node of a cluster in a compact form, grouped by GPU model (the dashboard's GPU grid)."""
        with self._lock:
            found = self._cluster(cluster)
            nodes = self._node_ids(found) if found is not None else []
            return {**views.grid(found, nodes), "replica": self.position()}

    def _node_ids(self, cluster: ClusterState) -> list[str]:
        version = self._node_version.get(cluster.name, 0)
        cached = self._sorted_nodes.get(cluster.name)
        if cached is None or cached[0] != version:
            cached = self._sorted_nodes[cluster.name] = (version, sorted(cluster.nodes))
        return cached[1]

    def clusters(self) -> dict[str, Any]:
        """Each cluster now: nodes, GPUs, allocation, pods, fragmentation, policy, event time, halted."""
        with self._lock:
            rows = [
                views.cluster_row(c, self._event_time.get(c.name), self.fragmentation_pct(c), self.halted.get(c.name))
                for c in self._clusters()
            ]
            return {"clusters": rows, "replica": self.position()}

    def gpu_totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(cluster, GPU model) -> (GPU milli allocated, GPU milli usable) over nodes that have not failed, as
        ``gpufold state utilization`` counts them (CPU-only nodes left out). O(nodes)."""
        with self._lock:
            totals: dict[tuple[str, str], tuple[int, int]] = {}
            for c in self._clusters():
                for node in c.nodes.values():
                    if not node.gpu_count:
                        continue
                    allocated, capacity = totals.get((c.name, node.gpu_model), (0, 0))
                    if not node.failed:
                        allocated += node.gpu_milli_allocated
                        capacity += node.gpu_count * 1000
                    totals[(c.name, node.gpu_model)] = (allocated, capacity)
            return totals

    def fragmentation_pct(self, cluster: ClusterState) -> float:
        """The one fragmentation figure of a cluster (see :func:`fragmentation_of`), now. Under the lock."""
        started = time.perf_counter()
        pct = fragmentation_of(cluster)
        self._fragmentation[cluster.name] = (self._clock(), pct, time.perf_counter() - started)
        return pct

    def queue(
        self, cluster: str, *, tenant: str | None = None, search: str | None = None, offset: int = 0, limit: int = 50
    ) -> dict[str, Any]:
        """The queue in scheduling order (pods and gangs): position, age, priority, tenant, reasons, expected start."""
        with self._lock:
            found = self._cluster(cluster)
            if found is None:
                return {"total": 0, "offset": offset, "limit": limit, "jobs": [], "replica": self.position()}
            now = self._event_time.get(cluster, 0)
            version = self.versions.get(cluster, 0)
            cached = self._queue_order.get(cluster)
            if cached is None or cached[0] != version:
                cached = self._queue_order[cluster] = (version, views.scheduling_order(found))
            page = views.queue_page(found, now, cached[1], tenant=tenant, search=search, offset=offset, limit=limit)
            return {**page, "offset": offset, "limit": limit, "replica": self.position()}

    def gangs(self, cluster: str, state: str | None = None) -> dict[str, Any]:
        with self._lock:
            found = self._cluster(cluster)
            rows = views.gang_rows(found, state) if found is not None else []
            return {"cluster": cluster, "gangs": rows, "replica": self.position()}

    def disruptions(self, cluster: str, limit: int = 50) -> list[Event]:
        """The cluster's recent preemptions, evictions, migrations and time limits, newest first."""
        with self._lock:
            return list(reversed(self._disruptions.get(cluster, ())))[:limit]

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
        """Per (cluster, tenant, key): nominal quota, used, what it may hold now, borrowed and lent; and per
        (cluster, cohort, key) the cohort tree's pools (subtree quota, kept, in use, may use)."""
        with self._lock:
            rows = [row for c in self._clusters(cluster) for row in views.quota_rows(c)]
            cohorts = [row for c in self._clusters(cluster) for row in views.cohort_rows(c)]
            return {"quotas": rows, "cohorts": cohorts, "replica": self.position()}

    def disruption_budgets(self, cluster: str) -> dict[str, Any]:
        """The cluster's disruption budgets with what each allows now and the evictions it blocks."""
        with self._lock:
            rows = [row for c in self._clusters(cluster) for row in views.budget_rows(c)]
            return {"cluster": cluster, "budgets": rows, "replica": self.position()}

    def history(self, cluster: str) -> dict[str, Any]:
        """Utilization and fragmentation of a cluster over event time, as the replica folded it: a point per
        batch that changed the cluster, the last one as of now."""
        with self._lock:
            points = self._history.get(cluster)
            found = self._cluster(cluster)
            if points and found is not None:  # the last point is now: its fragmentation may be older
                points[-1] = {**points[-1], "fragmentation_pct": round(self.fragmentation_pct(found), 3)}
            return {"cluster": cluster, "points": list(points or ())}

    def _sample(self, cluster: ClusterState) -> None:
        """Record a history point of a cluster that changed (one per event time: a later change at the same
        time replaces it). When full, every other point is dropped (the last kept), so the series always spans
        the whole history in at most ``history_points``. Fragmentation costs O(S·T), so a point measures it only
        when that keeps measuring under FRAGMENTATION_SHARE of the time (every change of a small cluster, a few
        times a second of a large one catching up), and at least every FRAGMENTATION_EVERY_SECONDS; else it is
        null (a chart draws it through the measured points). :meth:`history` measures the last point when asked."""
        now = self._event_time.get(cluster.name, 0)
        if now <= 0:
            return  # no event time yet: a point at 0 would draw an axis from 1970
        points = self._history.get(cluster.name)
        if points is None:
            points = self._history[cluster.name] = deque()
        measured_at, _, cost = self._fragmentation.get(cluster.name, (-1e9, 0.0, 0.0))
        pct: float | None = None
        if self._clock() - measured_at >= min(FRAGMENTATION_EVERY_SECONDS, cost / FRAGMENTATION_SHARE):
            pct = round(self.fragmentation_pct(cluster), 3)
        point = {
            "t": now,
            "gpu_milli_allocated": cluster.gpu_milli_allocated,
            "gpu_milli_capacity": cluster.gpu_milli_capacity,
            "fragmentation_pct": pct,
            "running": self.index.query(state="running", cluster=cluster.name, limit=0)[1],
            "pending": len(cluster.queue),
        }
        if points and points[-1]["t"] >= now:
            if pct is None:
                point["fragmentation_pct"] = points[-1]["fragmentation_pct"]
            points[-1] = point
        else:
            points.append(point)
        if len(points) > self._history_points:
            last = points[-1]
            kept = list(points)[::2]
            if kept[-1] is not last:
                kept.append(last)
            points.clear()
            points.extend(kept)


def fragmentation_of(cluster: ClusterState) -> float:
    """The fragmentation the operator sees everywhere: FGD's expected fragment, as a percentage of the idle GPU
    milli of the schedulable nodes, for the typical pods of the pods present now (pending, waiting or running).

    The projection's ``/v1/fragmentation`` computes the same from its rows (``projections.queries``); the fold's
    policies score with the typical pods they learned at arrival checkpoints instead, a cache of the same.
    """
    return cluster_fragmentation(cluster, derive_typical(cluster.shape_counts)).fragment_pct_of_idle


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


class SourceHistory:
    """A replica's source read as the command log (``processor.runtime.loop.History``): its snapshots, and a
    range of commands fetched from it, for the rebuild of a halted cluster on ``ResumeCluster``."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def latest_snapshot(self, partition: int) -> bytes | None:
        frame: bytes | None = self.source.latest_snapshot(partition)
        return frame

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        position, idle = start, 0
        while position < end:  # measure: the offsets left, and at most 100 empty fetches in a row
            records = self.source.fetch({partition: position}, min(2_000, end - position), 1.0)
            idle = 0 if records else idle + 1
            if idle >= 100:
                raise RuntimeError(f"partition {partition}: commands {position}..{end} cannot be read to rebuild")
            for record in records:
                if record.offset >= end:
                    return
                yield record
                position = record.offset + 1
