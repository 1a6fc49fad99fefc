"""Text for a terminal: values from a log escaped so they can never drive the terminal, times that never raise.

Ids, reasons and messages come from whoever sent a command. Printed raw, an ESC or
CSI sequence in them would recolour, retitle or rewrite the operator's terminal, a
newline would forge an output line, and a bidi override would reorder what is shown.
:func:`printable` escapes every such character (``\\x1b``, ``\\u202e``, ...), the
way ``repr`` does; :func:`iso` formats any epoch-millisecond value, even one no
calendar can hold.
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime

_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})  # controls, format (bidi), surrogates, separators
_cache: dict[str, bool] = {}


def _unsafe(char: str) -> bool:
    unsafe = _cache.get(char)
    if unsafe is None:
        unsafe = _cache[char] = unicodedata.category(char) in _UNSAFE
    return unsafe


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: object, *, keep_newlines: bool = False) -> str:
    """``str(value)`` with every control, format and separator character escaped (``\\n`` kept if asked)."""
    text = str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape(char) if _unsafe(char) and not (keep_newlines and char == "\n") else char for char in text)


def iso(millis: int) -> str:
    """Epoch milliseconds as an ISO-8601 UTC time, or ``<n> ms`` for a value outside the calendar."""
    try:
        return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, ValueError, OSError):
        return f"{millis} ms"
