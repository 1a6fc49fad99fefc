"""Keep passwords out of logs and error messages."""

from __future__ import annotations

import re

from sqlalchemy.engine import make_url

# scheme://user:password@host -> scheme://user:***@host, wherever it appears in a text.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<password>[^@\s]*)(?P<tail>@)")
_KEYWORD_PASSWORD = re.compile(r"(?i)(password\s*=\s*)('[^']*'|\S+)")


def mask_url(text: str) -> str:
    """The text with every URL password and ``password=...`` value replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***" + m.group("tail"), text)
    return _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + "***", text)


def safe_url(url: str) -> str:
    """A database URL fit for printing (password hidden)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: still never print its password
        return mask_url(url)
