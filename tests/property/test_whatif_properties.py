"""What-if on a fork is the fold: for random streams (pods, gangs, dependencies, reservations, ticks,
repeated command ids), the fork's events for each command equal the live fold's, byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.fold import decide
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from processor.runtime.whatif import fork
from tests.strategies import command_streams, contended_streams, encode_events, job_streams

WHAT_IF_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@pytest.mark.parametrize(
    "streams", [command_streams(), job_streams(), contended_streams()], ids=["pods", "jobs", "contended"]
)
@WHAT_IF_SETTINGS
@given(data=st.data())
def test_fork_answers_what_the_fold_then_does(streams: st.SearchStrategy, data: st.DataObject) -> None:  # type: ignore[type-arg]
    """Before every command, folding it on a fork gives the events the live fold gives, and leaves the live state."""
    live = PartitionState()
    for offset, command in enumerate(data.draw(streams)):
        before = state_hash(live) if offset % 4 == 0 else None
        twin = fork(live)
        asked = encode_events(decide(twin, command, offset))
        assert before is None or state_hash(live) == before
        assert encode_events(decide(live, command, offset)) == asked
