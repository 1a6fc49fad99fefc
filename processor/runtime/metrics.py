"""Prometheus metrics of the processor (an adapter: it reads the fold state, never changes it).

``ProcessorMetrics.observe_batch`` counts each committed batch; ``refresh``
(every few seconds, not per batch) reads the partitions' states for the gauges:
queue length, GPUs allocated and total per model, fragmentation. Served by
``gpufold processor run --metrics-port``; needs the ``api`` extra
(``prometheus-client``).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from processor.core.fragmentation import cluster_fragmentation
from processor.core.state import PartitionState


class ProcessorMetrics:
    """The processor's metrics, in their own registry (so tests and several runners do not collide)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.commands = Counter("gpufold_processor_commands_total", "Command records folded and committed", registry=r)
        self.rejected = Counter(
            "gpufold_processor_rejected_total", "Commands refused (CommandRejected), by code", ["code"], registry=r
        )
        self.dead_letters = Counter(
            "gpufold_processor_dead_letters_total", "Records that did not decode (dead-lettered)", registry=r
        )
        self.refused = Counter(
            "gpufold_processor_refused_total",
            "Commands not folded, dead-lettered with a code (WRONG_PARTITION: on a partition that is not "
            "murmur2(cluster) mod the partition count, or keyed other than its cluster), by code",
            ["code"],
            registry=r,
        )
        self.commit_seconds = Histogram(
            "gpufold_processor_commit_seconds",
            "Latency of one Kafka transaction commit (events + offsets)",
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.queue_length = Gauge(
            "gpufold_processor_pending_pods", "Pods waiting in the queue", ["cluster"], registry=r
        )
        self.gpus_allocated = Gauge(
            "gpufold_processor_gpus_allocated", "GPUs allocated (milli / 1000)", ["cluster", "gpu_model"], registry=r
        )
        self.gpus_total = Gauge(
            "gpufold_processor_gpus_total", "GPUs on nodes that have not failed", ["cluster", "gpu_model"], registry=r
        )
        self.fragmentation = Gauge(
            "gpufold_processor_fragmentation_ratio",
            "Fragmented share of idle GPU (FGD's metric over the learned typical pods)",
            ["cluster"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "gpufold_processor_consumer_lag", "Command records not yet folded, per partition", ["partition"], registry=r
        )

    def observe_batch(
        self,
        commands: int,
        rejected_by_code: dict[str, int],
        dead_letters: int,
        refused_by_code: dict[str, int] | None = None,
    ) -> None:
        self.commands.inc(commands)
        for code, count in rejected_by_code.items():
            self.rejected.labels(code=code).inc(count)
        if dead_letters:
            self.dead_letters.inc(dead_letters)
        for code, count in (refused_by_code or {}).items():
            self.refused.labels(code=code).inc(count)

    def refresh(self, states: Iterable[PartitionState], lag: dict[int, int] | None = None) -> None:
        """Set the gauges from the fold states. O(nodes + signatures x typical pods) per cluster."""
        for state in states:
            for name, cluster in state.clusters.items():
                self.queue_length.labels(cluster=name).set(len(cluster.queue))
                allocated: dict[str, int] = {}
                total: dict[str, int] = {}
                for node in cluster.nodes.values():
                    allocated[node.gpu_model] = allocated.get(node.gpu_model, 0) + node.gpu_milli_allocated
                    if not node.failed:
                        total[node.gpu_model] = total.get(node.gpu_model, 0) + node.gpu_count * 1000
                for model in sorted(set(allocated) | set(total)):
                    self.gpus_allocated.labels(cluster=name, gpu_model=model).set(allocated.get(model, 0) / 1000)
                    self.gpus_total.labels(cluster=name, gpu_model=model).set(total.get(model, 0) / 1000)
                self.fragmentation.labels(cluster=name).set(cluster_fragmentation(cluster).fragment_pct_of_idle / 100)
        for partition, value in (lag or {}).items():
            self.consumer_lag.labels(partition=str(partition)).set(value)
