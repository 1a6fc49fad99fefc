"""``/metrics`` of ``gpufold serve``: the cluster gauges read from the live replica at scrape time (the numbers
``gpufold state`` shows), the replica's and the fold's lag, and health.

The cluster gauges are the projection's (``projections.metrics``: same names and labels), set from the
replica instead of the database, so alerts fire on what the fold decided, not on what was projected.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from projections import metrics as projection_metrics
from schemas.commands import GPU_MILLI

REPLICA_LAG = Gauge("gpufold_replica_lag_commands", "Commands in the log the replica has not folded yet", ["partition"])
REPLICA_OFFSET = Gauge("gpufold_replica_offset", "The next command offset the replica folds", ["partition"])
REPLICA_LAG_SECONDS = Gauge(
    "gpufold_replica_lag_seconds", "How long ago the oldest command the replica has not folded reached the log",
    ["partition"],
)  # fmt: skip
FOLD_LAG = Gauge("gpufold_fold_lag_commands", "Commands in the log the processor has not committed yet", ["partition"])
FOLD_LAG_SECONDS = Gauge(
    "gpufold_fold_lag_seconds", "How long ago the oldest command the processor has not committed reached the log",
    ["partition"],
)  # fmt: skip
HEALTHY = Gauge("gpufold_healthy", "1 when /healthz answers 200, else 0")
HALTED = Gauge("gpufold_cluster_halted", "1 for a cluster whose fold halted (ClusterHalted)", ["cluster"])
REFUSED = Gauge(
    "gpufold_commands_dead_lettered",
    "Commands in the log the fold does not fold, dead-lettered with a code (e.g. WRONG_PARTITION: a producer to "
    "fix), counted by the replica since it started",
    ["code"],
)
HALTED_REFUSED = Gauge(
    "gpufold_cluster_halted_refused_commands",
    "Commands for a halted cluster refused with CLUSTER_HALTED since it halted (kept in the log for its resume)",
    ["cluster"],
)


def scrape(replica: Any, health: Any) -> tuple[bytes, str]:
    """Set every gauge from the replica and the last health report; the exposition and its content type."""
    if replica is not None:
        _clusters(replica)
        status = replica.status()
        for partition, offset in status.get("offsets", {}).items():
            REPLICA_OFFSET.labels(partition).set(offset)
            REPLICA_LAG.labels(partition).set(max(0, status.get("head", {}).get(partition, offset) - offset))
        for code, count in sorted(status.get("refused", {}).items()):
            REFUSED.labels(code).set(count)
    if health is not None:
        report = health.report()
        HEALTHY.set(1 if report.get("ok") else 0)
        for row in (report.get("replica") or {}).get("partitions", []):
            REPLICA_LAG_SECONDS.labels(str(row["partition"])).set(row["lag_seconds"])
        for row in (report.get("fold") or {}).get("partitions", []):
            FOLD_LAG.labels(str(row["partition"])).set(row["lag_commands"])
            FOLD_LAG_SECONDS.labels(str(row["partition"])).set(row["lag_seconds"])
        HALTED.clear()
        HALTED_REFUSED.clear()
        for item in report.get("halted", []):
            HALTED.labels(item["cluster"]).set(1)
            HALTED_REFUSED.labels(item["cluster"]).set(item.get("refused", 0))
    return generate_latest(), CONTENT_TYPE_LATEST


def _clusters(replica: Any) -> None:
    """GPUs allocated and usable per (cluster, model), pending pods and fragmentation, from the replica."""
    rows = replica.clusters()["clusters"]
    for gauge in (projection_metrics.GPUS_ALLOCATED, projection_metrics.GPUS_TOTAL):
        gauge.clear()
    for (cluster, model), (allocated, capacity) in replica.gpu_totals().items():
        projection_metrics.GPUS_ALLOCATED.labels(cluster, model).set(allocated / GPU_MILLI)
        projection_metrics.GPUS_TOTAL.labels(cluster, model).set(capacity / GPU_MILLI)
    for row in rows:
        projection_metrics.PENDING_PODS.labels(row["cluster"]).set(row["pending"])
        projection_metrics.FRAGMENTATION.labels(row["cluster"]).set(round(row["fragmentation_pct"] / 100, 6))
