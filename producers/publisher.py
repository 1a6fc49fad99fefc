"""``CommandPublisher``: how services send commands to gpufold over Kafka.

An idempotent confluent-kafka producer (``enable.idempotence``, ``acks=all``) writes Avro command frames
to the commands topic, keyed by cluster with Kafka's murmur2 partitioner (so every client, Java or
librdkafka, sends a cluster to the same partition). Typed methods check their arguments before anything
is sent (a ``ValueError`` says which one and why) and return the command's ``command_id``: the caller's
own (deterministic, for retries) or a fresh uuid4 made here, never by the fold.

Delivery is asynchronous; a failed delivery is remembered and raised as :class:`DeliveryError` by the
next ``flush()`` or ``close()``. Use it as a context manager so that ``close()`` flushes::

    with CommandPublisher(load_config(), topic="gpufold.commands") as publisher:
        publisher.add_node("lab", "n1", cpu_milli=64_000, memory_mib=262_144, gpu_model="A100", gpu_count=8)
        command_id = publisher.submit_pod("lab", "p1", num_gpu=1, gpu_milli=500, cpu_milli=4_000)
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from gpufold.kafka_config import KafkaConfig
from processor.commands import (
    AddNode,
    Command,
    CommandPayload,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
)
from processor.fold import MAX_CPU_MILLI, MAX_GPUS_PER_NODE, MAX_ID_LENGTH, MAX_MEMORY_MIB
from processor.policies import policy_names
from processor.resources import GPU_MILLI
from schemas import COMMAND, registry

DEFAULT_TOPIC = "gpufold.commands"
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_OPERATORS = ("Equal", "Exists")


class DeliveryError(RuntimeError):
    """Some commands were not written to Kafka; ``failures`` lists (command key, error) pairs."""

    def __init__(self, failures: list[tuple[bytes | None, str]]) -> None:
        first = failures[0][1]
        super().__init__(f"{len(failures)} command(s) were not delivered to Kafka; first error: {first}")
        self.failures = failures


# ------------------------------------------------------------------ client-side validation


def _check_id(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} must be at most {MAX_ID_LENGTH} characters, got {len(value)}")
    if not value.isprintable() or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} must be printable without spaces, got {value!r}")
    return value


def _check_int(what: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer between {low} and {high}, got {value!r}")
    return value


def _check_model(what: str, value: object) -> str:
    if not isinstance(value, str) or not _MODEL_NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a GPU model name (letters, digits, '.', '_', '-'; at most 64)")
    return value


def _check_labels(what: str, labels: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (labels or {}).items():
        _check_id(f"{what} key", key)
        if not isinstance(value, str) or len(value) > MAX_ID_LENGTH:
            raise ValueError(f"{what} {key!r} value must be a string of at most {MAX_ID_LENGTH} characters")
        out[key] = value
    return out


def validate_submit(payload: SubmitPod) -> None:
    """The checks the fold makes on a SubmitPod that need no cluster state."""
    _check_id("pod_id", payload.pod_id)
    _check_id("tenant", payload.tenant)
    _check_int("priority", payload.priority, -(1 << 31), (1 << 31) - 1)
    _check_int("num_gpu", payload.num_gpu, 0, MAX_GPUS_PER_NODE)
    _check_int("cpu_milli", payload.cpu_milli, 0, MAX_CPU_MILLI)
    _check_int("memory_mib", payload.memory_mib, 0, MAX_MEMORY_MIB)
    if payload.num_gpu == 0:
        _check_int("gpu_milli of a pod with num_gpu 0", payload.gpu_milli, 0, 0)
    elif payload.num_gpu == 1:
        _check_int("gpu_milli", payload.gpu_milli, 1, GPU_MILLI)
    else:
        _check_int("gpu_milli of a multi-GPU pod", payload.gpu_milli, GPU_MILLI, GPU_MILLI)
    if not (payload.num_gpu or payload.cpu_milli or payload.memory_mib):
        raise ValueError(f"pod {payload.pod_id!r} requests no GPU, CPU or memory")
    for model in payload.gpu_models:
        _check_model("gpu_models entry", model)
    _check_labels("node_selector", payload.node_selector)
    for toleration in payload.tolerations:
        if toleration.operator not in _OPERATORS:
            raise ValueError(f"toleration operator must be one of {_OPERATORS}, got {toleration.operator!r}")
        if toleration.effect and toleration.effect not in _TAINT_EFFECTS:
            raise ValueError(f"toleration effect must be empty or one of {_TAINT_EFFECTS}, got {toleration.effect!r}")


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
        _check_id("command_id", command.command_id)
        _check_id("cluster", command.cluster)
        _check_int("issued_at", command.issued_at, 0, (1 << 63) - 1)
        if isinstance(command.payload, SubmitPod):
            validate_submit(command.payload)
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

    def _command(self, cluster: str, payload: CommandPayload, command_id: str | None, issued_at: int | None) -> str:
        command_id = _check_id("command_id", command_id) if command_id is not None else str(uuid.uuid4())
        _check_id("cluster", cluster)
        if issued_at is None:
            issued_at = int(self._clock() * 1000)
        _check_int("issued_at", issued_at, 0, (1 << 63) - 1)
        command = Command(command_id, cluster, issued_at, payload, self.source)
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
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Add a node with its capacity; returns the command_id."""
        _check_id("node_id", node_id)
        _check_int("cpu_milli", cpu_milli, 1, MAX_CPU_MILLI)
        _check_int("memory_mib", memory_mib, 1, MAX_MEMORY_MIB)
        _check_int("gpu_count", gpu_count, 0, MAX_GPUS_PER_NODE)
        if gpu_count:
            _check_model("gpu_model", gpu_model)
        elif gpu_model:
            raise ValueError(f"gpu_model {gpu_model!r} given for a node with gpu_count 0")
        taints = tuple(taints)
        for taint in taints:
            _check_id("taint key", taint.key)
            if taint.effect not in _TAINT_EFFECTS:
                raise ValueError(f"taint effect must be one of {_TAINT_EFFECTS}, got {taint.effect!r}")
        payload = AddNode(node_id, cpu_milli, memory_mib, gpu_model, gpu_count, _check_labels("label", labels), taints)
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
        payload = RemoveNode(_check_id("node_id", node_id), bool(force))
        return self._command(cluster, payload, command_id, issued_at)

    def cordon_node(
        self, cluster: str, node_id: str, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Stop placing pods on a node (running pods stay)."""
        return self._command(cluster, CordonNode(_check_id("node_id", node_id)), command_id, issued_at)

    def uncordon_node(
        self, cluster: str, node_id: str, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Allow placing pods on a cordoned node again."""
        return self._command(cluster, UncordonNode(_check_id("node_id", node_id)), command_id, issued_at)

    def drain_node(
        self, cluster: str, node_id: str, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Cordon a node and move its pods elsewhere (or queue them)."""
        return self._command(cluster, DrainNode(_check_id("node_id", node_id)), command_id, issued_at)

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
        return self._command(cluster, MarkNodeFailed(_check_id("node_id", node_id), reason), command_id, issued_at)

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
        command_id: str | None = None,
        issued_at: int | None = None,
    ) -> str:
        """Ask for a pod: ``num_gpu`` whole GPUs, one GPU share (``num_gpu=1, gpu_milli<1000``) or none.

        ``gpu_milli`` defaults to 1000 when ``num_gpu`` > 0 and to 0 otherwise.
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
        )
        validate_submit(payload)
        return self._command(cluster, payload, command_id, issued_at)

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
        return self._command(cluster, Release(_check_id("pod_id", pod_id), reason), command_id, issued_at)

    def set_policy(
        self, cluster: str, policy: str, *, command_id: str | None = None, issued_at: int | None = None
    ) -> str:
        """Switch the cluster's placement policy (one of ``processor.policies.policy_names()``)."""
        if policy not in policy_names():
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(policy_names())}")
        return self._command(cluster, SetPolicy(policy), command_id, issued_at)

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
