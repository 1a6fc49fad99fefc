"""Prometheus metrics of the projector and the query API (``prometheus-client``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS_PROJECTED = Counter("gpufold_projector_events_total", "Events applied to the projection tables")
DUPLICATES_SKIPPED = Counter(
    "gpufold_projector_duplicates_total", "Events skipped because their sequence was already applied"
)
UNDECODABLE = Counter("gpufold_projector_undecodable_total", "Event records whose bytes did not decode (skipped)")
BATCHES = Counter("gpufold_projector_batches_total", "Batches committed")
COMMIT_SECONDS = Histogram(
    "gpufold_projector_commit_seconds",
    "Time to apply and commit one batch (one database transaction)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
RETRIES = Counter("gpufold_projector_db_retries_total", "Database operations retried after an outage")
CONSUMER_LAG = Gauge("gpufold_projector_consumer_lag", "Event records in the log not yet projected")
PROJECTION_LAG = Gauge("gpufold_projector_lag_seconds", "Wall time minus the occurred_at of the last projected event")
HOURS_SEALED = Counter("gpufold_projector_hours_sealed_total", "Usage hours sealed by this projector")

API_REQUESTS = Counter("gpufold_api_requests_total", "HTTP requests answered", ["endpoint", "status"])
API_LATENCY = Histogram(
    "gpufold_api_request_seconds",
    "HTTP request latency",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)
GPUS_ALLOCATED = Gauge("gpufold_gpus_allocated", "GPUs allocated (milli / 1000)", ["cluster", "gpu_model"])
GPUS_TOTAL = Gauge("gpufold_gpus_total", "GPUs on nodes that have not failed", ["cluster", "gpu_model"])
PENDING_PODS = Gauge("gpufold_pending_pods", "Pods waiting in the queue", ["cluster"])
FRAGMENTATION = Gauge("gpufold_fragmentation_ratio", "Fragmented share of idle GPU (FGD's metric)", ["cluster"])
