"""Default names the read side's command line shows before anything heavy is imported.

Kept apart from ``projections.sources`` (which imports the projector and SQLAlchemy) so that building
the ``gpufold`` parser, which shows these defaults in ``--help``, stays cheap.
"""

from __future__ import annotations

from schemas.topics import Topics

DEFAULT_TOPIC = Topics().events
DEFAULT_GROUP = "gpufold-projector"
