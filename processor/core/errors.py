"""The fold's own error: a broken invariant, which is a bug and never input.

Refusals of input are data (``schemas.codes.Rejected`` -> ``CommandRejected``); this is
the third tier of STYLE.md: ``apply`` raises it rather than over-commit, and the
runtime stops without committing so nothing wrong is published.
"""

from __future__ import annotations


class InvariantViolation(RuntimeError):
    """An event would break an invariant of the state (e.g. over-commit): a bug, never input."""
