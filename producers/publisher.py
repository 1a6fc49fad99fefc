"""``CommandPublisher``: how services send commands to gpufold over Kafka.

An idempotent confluent-kafka producer (``enable.idempotence``, ``acks=all``) writes Avro command frames
to the commands topic, keyed by cluster with Kafka's murmur2 partitioner (so every client, Java or
librdkafka, sends a cluster to the same partition). Typed methods check their arguments before anything
is sent (a ``ValueError`` says which one and why) and return the command's ``command_id``: the caller's
own (deterministic, for retries) or a fresh uuid4 made here, never by the fold. Any command type of the
schema, typed method or not, goes through :meth:`CommandPublisher.publish_payload` (or ``publish``, a
whole envelope).

Delivery is asynchronous; a failed delivery is remembered and raised as :class:`DeliveryError` by the
next ``flush()`` or ``close()``. Use it as a context manager so that ``close()`` flushes::

    with CommandPublisher(load_config(), topic="gpufold.commands") as publisher:
        publisher.add_node("lab", "n1", cpu_milli=64_000, memory_mib=262_144, gpu_model="A100", gpu_count=8)
        command_id = publisher.submit_pod("lab", "p1", num_gpu=1, gpu_milli=500, cpu_milli=4_000)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kafka_settings.config import KafkaConfig
from schemas import COMMAND, registry
from schemas.codes import Rejected, RejectionCode
from schemas.commands import (
    AFTER_OK,
    GPU_MILLI,
    AddNode,
    Command,
    CommandPayload,
    CordonNode,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Release,
    ReleaseGang,
    RemoveNode,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Taint,
    Tick,
    Toleration,
    UncordonNode,
)
from schemas.validation import check_command

DEFAULT_TOPIC = "gpufold.commands"


class DeliveryError(RuntimeError):
    """Some commands were not written to Kafka; ``failures`` lists (command key, error) pairs."""

    def __init__(self, failures: list[tuple[bytes | None, str]]) -> None:
        first = failures[0][1]
        super().__init__(f"{len(failures)} command(s) were not delivered to Kafka; first error: {first}")
        self.failures = failures


# ------------------------------------------------------------------ client-side validation


class InvalidCommand(ValueError):
    """A command the fold would reject without looking at the cluster; ``code`` is the fold's rejection code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def validate(command: Command) -> None:
    """The fold's stateless checks (``schemas.validation``), as :class:`InvalidCommand`."""
    try:
        check_command(command)
    except Rejected as rejection:
        raise InvalidCommand(rejection.code, rejection.message) from None


# ------------------------------------------------------------------ the publisher


class CommandPublisher:
    """Publishes commands to the commands topic; see the module docstring."""

    def __init__(
        self,
        config: KafkaConfig,
        topic: str = DEFAULT_TOPIC,
        *,
        source: str = "",
        clock: Callable[[], float] = time.time,
        producer_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.source = source
        self._clock = clock
        self._encode = registry().codec(COMMAND).encode
        self._failures: list[tuple[bytes | None, str]] = []
        self._lock = threading.Lock()
        self._scrub = config.scrub
        self.delivered = 0
        settings = config.client(
            {"linger.ms": 5, "compression.type": "lz4", "queue.buffering.max.messages": 500_000},
            {
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",
                "logger": logging.getLogger("gpufold.kafka.rdkafka"),
                **(producer_config or {}),
            },
        )
        try:
            self._producer: Producer | None = Producer(settings)
        except KafkaException as exc:
            raise ValueError(config.scrub(f"cannot create the Kafka producer: {exc}")) from None

    # -------------------------------------------------------------- generic

    def publish(self, command: Command) -> str:
        """Send one command envelope (validated like the typed methods); returns its command_id."""
        validate(command)
        self.send(command.cluster.encode(), self._encode(command.to_avro()))
        return command.command_id

    def send(self, key: bytes | None, value: bytes) -> None:
        """Send raw bytes to the commands topic (already-encoded frames, or tests' garbage)."""
        producer = self._require()
        while True:
            try:
                producer.produce(self.topic, value, key, on_delivery=self._on_delivery)
                break
            except BufferError:
                producer.poll(0.05)  # the local queue is full: serve deliveries, then retry
        producer.poll(0)

    def publish_payload(
        self, cluster: str, payload: CommandPayload, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Send any command of ``schemas/command.avsc`` by its payload record, with the envelope filled in
        (``command_id`` a fresh uuid4 and ``issued_at`` this clock unless given); returns the command_id.

        Every command type can be sent this way, so a new one in the schema needs no method here; the typed
        methods below are conveniences (defaults, argument checks) for the common ones."""
        return self._command(cluster, payload, command_id, issued_at)

    def _command(self, cluster: str, payload: CommandPayload, command_id: str | None, issued_at: int | None) -> str:
        if command_id is None:
            command_id = str(uuid.uuid4())
        if issued_at is None:
            issued_at = int(self._clock() * 1000)
        command = Command(command_id, cluster, issued_at, payload, self.source)
        validate(command)
        self.send(cluster.encode(), self._encode(command.to_avro()))
        return command_id

    # -------------------------------------------------------------- typed commands

    def add_node(
        self,
        cluster: str,
        node_id: str,
        *,
        cpu_milli: int,
        memory_mib: int,
        gpu_model: str = "",
        gpu_count: int = 0,
        labels: Mapping[str, str] | None = None,
        taints: Iterable[Taint] = (),
        gpu_memory_mib: int = 0,
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Add a node with its capacity (``gpu_memory_mib``: of each GPU, 0 not checked); returns the command_id."""
        if gpu_model and not gpu_count:
            # The fold accepts this (logs may hold such nodes); a new client is told it is a mistake.
            message = f"gpu_model {gpu_model!r} given for a node with gpu_count 0"
            raise InvalidCommand(RejectionCode.INVALID_RESOURCES, message)
        payload = AddNode(
            node_id, cpu_milli, memory_mib, gpu_model, gpu_count, dict(labels or {}), tuple(taints), gpu_memory_mib
        )
        return self._command(cluster, payload, command_id, issued_at)

    def remove_node(
        self,
        cluster: str,
        node_id: str,
        *,
        force: bool = False,
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Remove a node (``force`` evicts its pods first)."""
        payload = RemoveNode(node_id, bool(force))
        return self._command(cluster, payload, command_id, issued_at)

    def cordon_node(
        self, cluster: str, node_id: str, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Stop placing pods on a node (running pods stay)."""
        return self._command(cluster, CordonNode(node_id), command_id, issued_at)

    def uncordon_node(
        self, cluster: str, node_id: str, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Allow placing pods on a cordoned node again."""
        return self._command(cluster, UncordonNode(node_id), command_id, issued_at)

    def drain_node(
        self,
        cluster: str,
        node_id: str,
        *,
        grace_ms: int = 0,
        respect_budgets: bool = True,
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Cordon a node and move its pods elsewhere (or queue them): each after ``grace_ms``, as the disruption
        budgets allow (unless ``respect_budgets`` is false)."""
        return self._command(cluster, DrainNode(node_id, grace_ms, respect_budgets), command_id, issued_at)

    def mark_node_failed(
        self,
        cluster: str,
        node_id: str,
        *,
        reason: str = "",
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Declare a node failed: its pods are evicted and re-placed or queued."""
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, got {reason!r}")
        return self._command(cluster, MarkNodeFailed(node_id, reason), command_id, issued_at)

    def submit_pod(
        self,
        cluster: str,
        pod_id: str,
        *,
        num_gpu: int = 0,
        gpu_milli: int | None = None,
        cpu_milli: int = 0,
        memory_mib: int = 0,
        tenant: str = "default",
        priority: int = 0,
        gpu_models: Iterable[str] = (),
        node_selector: Mapping[str, str] | None = None,
        tolerations: Iterable[Toleration] = (),
        time_limit_ms: int | None = None,
        depends_on: Iterable[str] = (),
        dependency: str = AFTER_OK,
        gpu_memory_mib: int = 0,
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Ask for a pod: ``num_gpu`` whole GPUs, one GPU share (``num_gpu=1, gpu_milli<1000``) or none.

        ``gpu_milli`` defaults to 1000 when ``num_gpu`` > 0 and to 0 otherwise. ``time_limit_ms``
        releases it that long after it starts (and lets it backfill onto reserved nodes);
        ``depends_on`` holds it until those pods or gangs end (``afterok`` or ``afterany``).
        """
        if gpu_milli is None:
            gpu_milli = GPU_MILLI if num_gpu else 0
        payload = SubmitPod(
            pod_id,
            tenant,
            priority,
            num_gpu,
            gpu_milli,
            cpu_milli,
            memory_mib,
            tuple(gpu_models),
            dict(node_selector or {}),
            tuple(tolerations),
            time_limit_ms,
            tuple(depends_on),
            dependency,
            gpu_memory_mib=gpu_memory_mib,
        )
        return self._command(cluster, payload, command_id, issued_at)

    def submit_gang(
        self,
        cluster: str,
        gang_id: str,
        members: Iterable[GangMember],
        *,
        tenant: str = "default",
        priority: int = 0,
        min_members: int | None = None,
        topology_required: str | None = None,
        topology_preferred: str | None = None,
        timeout_ms: int | None = None,
        time_limit_ms: int | None = None,
        depends_on: Iterable[str] = (),
        dependency: str = AFTER_OK,
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Ask for pods that start together (at least ``min_members``, default all) or not at all.

        ``topology_required`` (a node label key such as ``topology/rack``) keeps every member on
        nodes with one value of it; ``topology_preferred`` tries that first, then wider domains.
        ``timeout_ms`` gives up if it has not started by then.
        """
        payload = SubmitGang(
            gang_id,
            tenant,
            priority,
            tuple(members),
            min_members,
            topology_required,
            topology_preferred,
            timeout_ms,
            time_limit_ms,
            tuple(depends_on),
            dependency,
        )
        return self._command(cluster, payload, command_id, issued_at)

    def release_gang(
        self,
        cluster: str,
        gang_id: str,
        *,
        reason: str = "completed",
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Release every member of a gang (or take a waiting gang out of the queue)."""
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, got {reason!r}")
        return self._command(cluster, ReleaseGang(gang_id, reason), command_id, issued_at)

    def tick(self, cluster: str, *, command_id: str | None = None, issued_at: int | None = None) -> str:
        """Advance event time on the cluster's partition (timeouts and time limits fire), when nothing else does."""
        return self._command(cluster, Tick(), command_id, issued_at)

    def release(
        self,
        cluster: str,
        pod_id: str,
        *,
        reason: str = "completed",
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """A pod finished or was cancelled: free what it holds (or take it off the queue)."""
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, got {reason!r}")
        return self._command(cluster, Release(pod_id, reason), command_id, issued_at)

    def set_policy(
        self,
        cluster: str,
        policy: str = "",
        *,
        reserve_after_ms: int | None = None,
        queue_order: str = "",
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Change the cluster's settings; what is left out stays. ``policy``: one of
        ``schemas.validation.POLICY_NAMES``; ``reserve_after_ms``: how long the head of the queue waits
        before nodes are reserved for it (-1: never); ``queue_order``: ``skip-ahead`` or ``strict-fifo``."""
        return self._command(cluster, SetPolicy(policy, reserve_after_ms, queue_order), command_id, issued_at)

    # -------------------------------------------------------------- delivery

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.delivered += 1
            return
        with self._lock:
            self._failures.append((message.key(), self._scrub(f"{error.name()}: {error.str()}")))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every command is delivered; raise :class:`DeliveryError` if any failed or timed out."""
        producer = self._require()
        remaining = producer.flush(timeout)
        with self._lock:
            failures, self._failures = self._failures, []
        if remaining:
            failures.append((None, f"{remaining} command(s) still undelivered after {timeout:g} s"))
        if failures:
            raise DeliveryError(failures)

    def close(self, timeout: float = 30.0) -> None:
        """Flush (raising :class:`DeliveryError` on failures), then release the producer."""
        if self._producer is None:
            return
        try:
            self.flush(timeout)
        finally:
            self._producer = None

    def __enter__(self) -> CommandPublisher:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # do not mask the original error; still try to deliver what was sent
            with contextlib.suppress(DeliveryError):
                self.close()

    def _require(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("the publisher is closed")
        return self._producer
