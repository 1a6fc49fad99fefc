"""Health that means something: is the fold alive, halted for a cluster, or behind, and by how much.

A :class:`HealthMonitor` thread samples, every half second, the commands log's head per partition
and three positions against it: the **fold**'s (the processor's committed offsets: the embedded
log's consumer position, or the Kafka group's committed offsets), the **replica**'s (what the
server answers from) and, with a database, the **projection**'s (its event-time watermark per
cluster against the replica's). From the samples it keeps, per partition, the lag in commands and
in seconds: how long ago the oldest command not yet folded reached the log.

``/healthz`` answers 503 with the reasons when the fold or the replica is dead, a cluster is halted
(``ClusterHalted``: its fold raised; the others go on), the database is unreachable, or the fold,
the replica or the projection is behind by more than ``max_lag_seconds``; ``/v1/status`` gives
everything. Both read the monitor's last sample, unless it is old: an unhealthy sample older than
``SAMPLE_SECONDS``, or a healthy one older than ``STALE_SECONDS``, is taken again on the request (one
at a time), so neither a 503 nor an "ok" is stale, even when the sampling thread is slow (a busy
machine) and what was wrong (a replica restoring) has cleared, or what was fine has broken. While a
sample is being taken (it may wait on a database or the log), the request gets the last one with its
in-memory part (the replica, the threads, halted clusters) read now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gpufold.serve.health")

DEFAULT_MAX_LAG_SECONDS = 30.0
SAMPLE_SECONDS = 0.5
STALE_SECONDS = 4 * SAMPLE_SECONDS  # a healthy sample older than this is taken again on the request
MAX_SAMPLES = 7_200  # an hour of samples per partition while behind; older ones are dropped


class LagClock:
    """How long ago the oldest unprocessed record of one partition reached the log, from (time, head) samples."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()  # (when seen, head then), heads increasing
        self.capped = False

    def observe(self, now: float, head: int, position: int) -> float:
        """Record the head seen now; the lag in seconds of ``position`` behind it (0 when caught up)."""
        if not self._samples or head > self._samples[-1][1]:
            self._samples.append((now, head))
            if len(self._samples) > MAX_SAMPLES:
                self._samples.popleft()
                self.capped = True
        # Samples whose head the position has reached are history: the oldest record still waiting
        # arrived after the last such sample, and no later than the first one above the position.
        while self._samples and self._samples[0][1] <= position:
            self._samples.popleft()
            self.capped = False
        if position >= head or not self._samples:
            return 0.0
        return max(0.0, now - self._samples[0][0])


@dataclass
class Probes:
    """Where the monitor looks. Every callable may raise: the failure becomes a problem, not a crash."""

    replica: Any = None  # processor.runtime.replica.Replica
    fold_where: str = "elsewhere"  # "in this process", "Kafka group gpufold-processor", ...
    fold_positions: Callable[[], dict[int, int]] | None = None  # the processor's committed next offsets
    fold_thread: Any = None  # an in-process processor: .error, .alive
    projection: Callable[[], dict[str, Any]] | None = None  # offsets, watermarks, database reachable
    projector_thread: Any = None  # an in-process projector: .error, .alive
    extra: list[Callable[[], list[str]]] = field(default_factory=list)  # more problems (e.g. dead letters)


class HealthMonitor:
    """See the module docstring."""

    def __init__(
        self,
        probes: Probes,
        max_lag_seconds: float = DEFAULT_MAX_LAG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probes = probes
        self.max_lag = max_lag_seconds
        self._clock = clock
        self._fold = {}  # type: dict[int, LagClock]
        self._replica = {}  # type: dict[int, LagClock]
        self._missing: dict[str, float] = {}  # cluster -> since when the replica has it and the projection not
        self._report: dict[str, Any] = {"ok": False, "problems": ["starting"], "checked_at": None}
        self._sampled = float("-inf")  # self._clock() when self._report was taken
        self._live_at_sample: list[str] = []  # its problems that came from memory (see _with_live_problems)
        self._checking = threading.Lock()  # one sample at a time, the thread's or a request's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HealthMonitor:
        self.check()
        self._thread = threading.Thread(target=self._run, name="gpufold-health", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                self.check()
            except Exception:  # never let health checking die quietly
                log.exception("health check")

    def report(self) -> dict[str, Any]:
        """The last sample's report; an unhealthy one older than a sample period, or a healthy one older than
        :data:`STALE_SECONDS` (the sampling thread starved), is taken again now (unless a sample is being taken:
        then the last one), so a 503 always says what is wrong now and an "ok" is never old."""
        report = self._report
        age = self._clock() - self._sampled
        if age <= (STALE_SECONDS if report["ok"] else SAMPLE_SECONDS):
            return self._with_live_problems(report)
        if not self._checking.acquire(blocking=False):
            return self._with_live_problems(report)  # a sample is being taken (it may wait on a database)
        try:
            return self._check()
        finally:
            self._checking.release()

    def _with_live_problems(self, report: dict[str, Any]) -> dict[str, Any]:
        """The last sample with what memory tells now in place of what memory told then (the replica's and the
        threads' state, halted clusters: no I/O, no lock); what the sample read from the log or the database
        (lags, an unreachable database) stays as sampled."""
        live = self._live_problems()
        then = self._live_at_sample
        if live == then:
            return report
        known = set(then) | set(live)
        problems = live + [p for p in report["problems"] if p not in known]
        return {**report, "ok": not problems, "problems": problems}

    def _live_problems(self) -> list[str]:
        probes = self.probes
        problems: list[str] = []
        halted: list[dict[str, Any]] = []
        if probes.replica is not None:
            found = _replica_problem(probes.replica.status())
            problems.extend([found] if found else [])
            halted = [dict(item) for _, item in sorted(getattr(probes.replica, "halted", {}).items())]
        for thread, what in ((probes.fold_thread, "fold"), (probes.projector_thread, "projector")):
            found = _thread_problem(thread, what)
            problems.extend([found] if found else [])
        return problems + [_halted_problem(item) for item in halted]

    def warning(self) -> str | None:
        """One line for a write's answer when something is wrong (the command is in the log all the same)."""
        report = self._report
        if report["ok"]:
            return None
        return "accepted into the log, but: " + "; ".join(report["problems"][:3])

    def check(self) -> dict[str, Any]:
        """Sample everything now and publish the report."""
        with self._checking:
            return self._check()

    def _check(self) -> dict[str, Any]:
        now = self._clock()
        problems: list[str] = []
        live = self._live_problems()  # read first: what the parts below find in memory is no older than this
        report: dict[str, Any] = {"checked_at": time.time(), "max_lag_seconds": self.max_lag}
        replica_part = self._replica_part(now, problems)
        report["replica"] = replica_part
        heads = {int(p): h for p, h in replica_part.get("head", {}).items()}
        report["fold"] = self._fold_part(now, heads, problems)
        report["projection"] = self._projection_part(problems)
        halted = replica_part.get("halted_clusters") or []
        report["halted"] = halted
        problems.extend(_halted_problem(item) for item in halted)
        for extra in self.probes.extra:
            try:
                problems.extend(extra())
            except Exception as error:
                problems.append(f"a health probe failed: {error}")
        report["ok"] = not problems
        report["problems"] = problems
        report["warnings"] = self._warnings(replica_part)
        from_memory = set(live) | set(self._live_problems())  # before and after the parts read it
        self._live_at_sample = [p for p in problems if p in from_memory]
        self._report = report
        self._sampled = now
        return report

    def _warnings(self, replica_part: dict[str, Any]) -> list[str]:
        """What an operator should see but that does not make the server unhealthy: commands the fold refuses
        without a record in any cluster (a producer that does not partition by murmur2(cluster))."""
        warnings = []
        for code, count in sorted((replica_part.get("refused") or {}).items()):
            warnings.append(
                f"{count} command(s) dead-lettered as {code} since the replica started: a producer does not "
                "partition by murmur2(cluster) or keys by something else (see the README's one writer per cluster)"
            )
        return warnings

    def _replica_part(self, now: float, problems: list[str]) -> dict[str, Any]:
        replica = self.probes.replica
        if replica is None:
            return {"present": False}
        status = replica.status()
        partitions = []
        for p, offset in sorted(status.get("offsets", {}).items(), key=lambda item: int(item[0])):
            head = status.get("head", {}).get(p, offset)
            clock = self._replica.setdefault(int(p), LagClock())
            seconds = clock.observe(now, head, offset)
            partitions.append(
                {"partition": int(p), "head": head, "offset": offset, "lag_commands": max(0, head - offset),
                 "lag_seconds": round(seconds, 3)}
            )  # fmt: skip
            if seconds > self.max_lag:
                problems.append(f"the replica is {seconds:.0f} s behind on partition {p} ({head - offset} commands)")
        found = _replica_problem(status)
        problems.extend([found] if found else [])
        halted = [dict(item) for _, item in sorted(getattr(replica, "halted", {}).items())]
        return {
            "present": True,
            "ready": bool(status.get("ready")),
            "alive": bool(status.get("alive", True)),
            "error": status.get("error"),
            "head": status.get("head", {}),
            "refused": status.get("refused", {}),
            "partitions": partitions,
            "halted_clusters": halted,
        }

    def _fold_part(self, now: float, heads: dict[int, int], problems: list[str]) -> dict[str, Any]:
        probes = self.probes
        part: dict[str, Any] = {"where": probes.fold_where, "alive": None, "error": None, "partitions": []}
        thread = probes.fold_thread
        if thread is not None:
            part["alive"] = bool(thread.alive)
            part["error"] = thread.error
            found = _thread_problem(thread, "fold")
            problems.extend([found] if found else [])
        if probes.fold_positions is None:
            return part
        try:
            positions = probes.fold_positions()
        except Exception as error:
            part["error"] = part["error"] or f"cannot read the fold's position: {error}"
            problems.append(f"cannot read the fold's position: {error}")
            return part
        for p in sorted(set(heads) | set(positions)):
            position = positions.get(p, 0)
            head = max(heads.get(p, position), position)
            seconds = self._fold.setdefault(p, LagClock()).observe(now, head, position)
            part["partitions"].append(
                {"partition": p, "head": head, "committed": position, "lag_commands": head - position,
                 "lag_seconds": round(seconds, 3)}
            )  # fmt: skip
            if seconds > self.max_lag:
                problems.append(
                    f"the fold is {seconds:.0f} s behind on partition {p}: {head - position} command(s) not folded"
                    + ("" if thread is not None else f" ({probes.fold_where})")
                )
        return part

    def _projection_part(self, problems: list[str]) -> dict[str, Any] | None:
        probes = self.probes
        if probes.projection is None:
            return None
        part: dict[str, Any] = {"in_process": probes.projector_thread is not None}
        thread = probes.projector_thread
        if thread is not None:
            part["alive"] = bool(thread.alive)
            part["error"] = thread.error
            found = _thread_problem(thread, "projector")
            problems.extend([found] if found else [])
        try:
            part.update(probes.projection())
        except Exception as error:
            part["database"] = f"unreachable: {error}"
            problems.append(f"the projection database is unreachable: {error}")
            return part
        replica = probes.replica
        times = replica.event_times() if replica is not None else {}
        behind = []
        for row in part.get("clusters", []):
            latest = times.get(row["cluster"])
            if latest is not None:
                lag = max(0, latest - int(row["watermark"])) / 1000
                row["lag_event_seconds"] = round(lag, 3)
                if lag > self.max_lag:
                    behind.append((lag, row["cluster"]))
        projected = {row["cluster"] for row in part.get("clusters", [])}
        now = self._clock()
        missing = sorted(set(times) - projected)
        self._missing = {cluster: self._missing.get(cluster, now) for cluster in missing}
        for cluster in missing:
            waited = now - self._missing[cluster]
            if waited > self.max_lag:
                behind.append((waited, cluster))
        part["not_projected"] = missing
        if behind:
            lag, cluster = max(behind)
            where = "not projected" if cluster in self._missing else "of event time behind"
            problems.append(f"the projection is behind the fold: cluster {cluster!r}, {lag:.0f} s {where}")
        return part


def _replica_problem(status: dict[str, Any]) -> str | None:
    if status.get("error"):
        return f"the replica stopped following the log: {status['error']}"
    if not status.get("alive", True):
        return "the replica's thread is not running"
    if not status.get("ready"):
        return "the replica is restoring the state (not ready yet)"
    return None


def _thread_problem(thread: Any, what: str) -> str | None:
    """A processor's or a projector's thread in this process: stopped with an error, or not running."""
    if thread is None:
        return None
    if thread.error:
        return f"the {what} stopped: {thread.error}"
    if not thread.alive:
        return f"the {what}'s thread is not running"
    return None


def _halted_problem(item: dict[str, Any]) -> str:
    return (
        f"cluster {item['cluster']!r} is halted: its fold raised on command {item['command_id']!r} "
        f"({item['error'] or 'no message'}); {item.get('refused', 0)} of its commands refused since "
        "(CLUSTER_HALTED, kept in the log for a ResumeCluster); the other clusters go on"
    )
