"""What the queue's retry skips would not have started.

Each eviction of a command retries its tenant's queued gangs; one whose quota rules out any start now
(``handlers.gangs.quota_rules_out``) is skipped without its trial placement. The claim: placing it from the queue
(``place_gang``, as the retry would) emits nothing, leaves no work and does not start it. Held here for every
queued gang after every command of random mixed streams (pods, gangs, quotas in a cohort, priorities), on a copy
of the state restored from a snapshot.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.decision import Decision
from processor.core.fold import decide
from processor.core.handlers.gangs import place_gang, quota_rules_out
from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.state import GANG_QUEUED, PartitionState
from schemas.commands import Command, Tick
from tests.adversarial import SeededChooser, mixed_stream


def _check_screens(commands: list[Command]) -> int:
    """Fold the stream; after each command, hold the claim for each queued gang the screen skips. How many."""
    state = PartitionState()
    skipped = 0
    for offset, command in enumerate(commands):
        decide(state, command, offset)
        for name, cluster in state.clusters.items():
            probe = Command(f"probe-{offset}", name, state.clock, Tick())
            screened = Decision(state, probe, offset)
            specs = [
                cluster.gangs[key[2]].spec
                for key in cluster.gang_queue
                if cluster.gangs[key[2]].state == GANG_QUEUED
                and quota_rules_out(screened, cluster, cluster.gangs[key[2]].spec)
            ]
            if not specs:
                continue
            skipped += len(specs)
            copy = from_snapshot(to_snapshot(state))  # one copy: a gang that does not start changes nothing
            for spec in specs:
                decision = Decision(copy, probe, offset)
                started = place_gang(decision, copy.clusters[name], spec, from_queue=True, requeued=False)
                assert not started, spec.gang_id
                assert decision.events == [], (spec.gang_id, [e.payload for e in decision.events])
                assert decision.pending() == 0, spec.gang_id
    return skipped


def test_the_gangs_a_quota_cascade_skips_would_not_have_started() -> None:
    """The stream of the worst-case bench's ``random_seed_100029`` case (one SetQuota retried ~90 queued gangs
    after each of 16 evictions), to where the queue is long."""
    assert _check_screens(mixed_stream(SeededChooser(100029), 800, 4)) > 100


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.sampled_from((2, 4, 6)))
def test_the_gangs_the_queue_retry_skips_would_not_have_started(seed: int, nodes: int) -> None:
    _check_screens(mixed_stream(SeededChooser(seed), 300, nodes))
