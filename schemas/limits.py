"""The sane range of every time and size in the contract, and the helpers that keep echoes of bad input small.

One table, enforced by the stateless checks (:mod:`schemas.validation`, run by the
fold and by the publisher alike) and documented in the README ("Limits"). Each
limit names the code a command breaking it is rejected with. Inputs the fold
refused before these limits existed keep the code they always had (an id longer
than 253 characters or a negative ``issued_at`` is ``INVALID_COMMAND``), so an old
log replays to the same decisions; what used to pass and no longer does gets a code
of its own (``TIME_OUT_OF_RANGE``, ``TOO_LARGE``).

The point of the bounds is that no input can make an output unboundedly large or
slow: a rejection never echoes more than :data:`MAX_ECHO` characters of a bad value,
its message is at most :data:`MAX_MESSAGE_LENGTH`, and an event or dead letter always
fits a Kafka record of the default size (1 MiB).
"""

from __future__ import annotations

import hashlib
from typing import Any

_MEMBER_OVERHEAD = 32  # characters a member costs in a gang's events besides its strings

# ------------------------------------------------------------------ time

MIN_ISSUED_AT = 0
"""The earliest ``issued_at``: 1970-01-01T00:00:00Z (epoch milliseconds)."""
MAX_ISSUED_AT = 4_102_444_799_999
"""The latest ``issued_at``: 2099-12-31T23:59:59.999Z. Microseconds by mistake (1.7e15) are far beyond it."""

# ------------------------------------------------------------------ sizes

MAX_ID_LENGTH = 253
"""command_id, cluster, node_id, pod_id, tenant, label / selector / taint / toleration keys (characters)."""
MAX_VALUE_LENGTH = 253
"""A label, node-selector, taint or toleration value (characters)."""
MAX_SOURCE_LENGTH = 253
"""The envelope's ``source`` (characters)."""
MAX_REASON_LENGTH = 1_024
"""``Release.reason`` and ``MarkNodeFailed.reason`` (characters)."""
MAX_LABELS = 256
"""Labels per node."""
MAX_TAINTS = 64
"""Taints per node."""
MAX_GPU_MODELS = 64
"""Allowed GPU models per pod."""
MAX_NODE_SELECTOR = 64
"""Node-selector entries per pod."""
MAX_TOLERATIONS = 64
"""Tolerations per pod."""
MAX_GANG_TEXT = 100_000
"""Characters of ids, GPU models, selectors and tolerations across a gang's members: every gang event
carries every member's spec, so this keeps a ``GangScheduled`` far under a Kafka record (at most 1,024
members, ``MAX_GANG_MEMBERS`` in ``schemas.validation``)."""
MAX_GPUS_PER_NODE = 64
MAX_CPU_MILLI = 100_000_000  # 100,000 cores
MAX_MEMORY_MIB = 1 << 30  # 1 PiB

MAX_FRAME_BYTES = 1_000_000
"""The largest command frame a client may send (``gpufold log append`` and the publisher refuse more): under
Kafka's default record size of 1 MiB. Every field bound above keeps a valid command and each of its events
far below it (an AddNode with every label and taint at its limit is ~170 KB)."""
MAX_LINE_BYTES = 1 << 20
"""The longest JSON line ``gpufold log append`` reads; longer lines are reported and skipped unread."""
MAX_JSON_DEPTH = 16
"""How deeply a JSON command may nest (a command needs 4 levels)."""

MAX_ECHO = 64
"""Characters of a bad value a rejection message quotes (the rest is elided, with the length)."""
MAX_MESSAGE_LENGTH = 1_000
"""The longest ``CommandRejected.message``."""
MAX_DEAD_LETTER_VALUE_BYTES = 900_000
"""The largest undecodable record a dead letter copies; a larger one is referenced (topic, partition, offset,
size, SHA-256), since the commands topic keeps the original forever."""
MAX_ERROR_LENGTH = 500
"""The longest ``DeadLetter.error``."""
MAX_DEAD_LETTER_KEY_BYTES = 1_024
"""The largest record key a dead letter copies."""


def show(value: Any, limit: int = MAX_ECHO) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the full length said, for messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters shown"
    return f"{text[:limit]}... ({size})"


def clip(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its start and an ellipsis (``limit`` in all)."""
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def stand_in(value: Any, limit: int = MAX_ID_LENGTH) -> str:
    """A short, deterministic, encodable stand-in for an envelope field a rejection must carry.

    A valid value is returned unchanged. A string that is too long becomes its first characters, its length
    and a SHA-256 prefix (so two different long ids stay distinct); one that cannot be encoded as UTF-8 (a
    lone surrogate, only possible in-process) has those code points escaped.
    """
    if not isinstance(value, str):
        value = repr(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]
    tail = f"...({len(value)} chars, sha256 {digest})"
    return value[: limit - len(tail)] + tail


def spec_text(pod_id: str, gpu_models: Any, node_selector: Any, tolerations: Any) -> int:
    """Characters of a pod's strings, as a gang's events repeat them (for :data:`MAX_GANG_TEXT`)."""
    size = _MEMBER_OVERHEAD + len(pod_id) + sum(len(model) for model in gpu_models)
    size += sum(len(key) + len(value) for key, value in node_selector.items())
    return size + sum(len(t.key) + len(t.operator) + len(t.value) + len(t.effect) for t in tolerations)
