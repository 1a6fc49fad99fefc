"""The fold's own error: a broken invariant, which is a bug and never input.

Refusals of input are data (``schemas.codes.Rejected`` -> ``CommandRejected``); this is
the third tier of STYLE.md: ``apply`` raises it rather than over-commit, and the
runtime stops without committing so nothing wrong is published.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr


@mypyc_attr(native_class=False)  # compiled with mypyc, which cannot subclass RuntimeError natively
class InvariantViolation(RuntimeError):
    """An event would break an invariant of the state (e.g. over-commit): a bug, never input."""
