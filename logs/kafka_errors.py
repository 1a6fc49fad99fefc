"""The Kafka adapter's errors, and how a librdkafka error is classified (fenced, transient, abortable).

Errors raised by :class:`logs.kafka.KafkaCommandLog`::

    KafkaLogError         an infrastructure fault still failing after RETRY_FOR seconds of retries: exit
    ├── BatchAborted      an abortable error: the transaction was aborted (or, if the broker had already
    │                     timed it out, the producer was replaced by a new one with the same transactional.id)
    │                     and the consumer rewound to the committed offsets; the Processor forgets those
    │                     partitions and rebuilds them from snapshot + commands
    └── KafkaFatalError   fenced (a newer instance with the same id took over), or a fatal error that keeps
                          coming back after MAX_RENEWALS fresh producers: exit non-zero
"""

from __future__ import annotations

from confluent_kafka import KafkaError

FENCED = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


# Errors of a broker or coordinator that is restarting or moving: retried with backoff.
TRANSIENT = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        # A client whose metadata lost a partition while its leader moved (a broker killed): asked again, it
        # learns the new leader. The bounded retry (RETRY_FOR) still ends on a topic that is really gone.
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._DESTROY_BROKER,  # a handle to a broker dropped from the metadata while it was down (chaos.py)
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    }
)


class KafkaLogError(Exception):
    """Base of the Kafka adapter's errors."""


class BatchAborted(KafkaLogError):
    """The batch's transaction was aborted and the consumer rewound; folding can go on."""


class KafkaFatalError(KafkaLogError):
    """This instance cannot go on (fenced by a newer instance, or a fatal client error)."""


class Stalled(Exception):
    """A producer call overran its timeout: librdkafka is stuck inside it (see :meth:`KafkaCommandLog._bounded`)."""


def describe(error: KafkaError) -> str:
    flags = [name for name, on in (("fatal", error.fatal()), ("retriable", error.retriable())) if on]
    if error.txn_requires_abort():
        flags.append("abortable")
    return f"{error.name()}: {error.str()}" + (f" ({', '.join(flags)})" if flags else "")


def kafka_error(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def is_fenced(error: KafkaError) -> bool:
    """The producer was fenced by a newer instance with the same transactional.id.

    FENCED_INSTANCE_ID from send_offsets_to_transaction is not that: the consumer's group membership in the
    offsets is stale (its session timed out and it rejoined, e.g. across a broker restart), which aborts the
    transaction. A real newer instance also fences the producer, which the abort then reports.
    """
    return error.code() in FENCED or (error.code() == KafkaError.FENCED_INSTANCE_ID and error.fatal())
