"""The read side of disruption budgets: each budget as set, and the drain evictions it blocks now."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine

from processor.core.fold import decide
from processor.core.state import PartitionState
from projections import models, queries
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import content_hashes
from schemas.commands import (
    AddNode,
    Command,
    DrainNode,
    RemoveDisruptionBudget,
    SetDisruptionBudget,
    SubmitPod,
    UncordonNode,
)

STEPS: list[tuple[str, object]] = [
    ("nodes", AddNode("n0", 8000, 32768, "A100", 2)),
    ("nodes", AddNode("n1", 8000, 32768, "A100", 1)),
    ("pods", SubmitPod("p0", "t", num_gpu=1, gpu_milli=1000, cpu_milli=100)),  # on n1 (best fit)
    ("pods", SubmitPod("p1", "t", num_gpu=1, gpu_milli=1000, cpu_milli=100)),  # on n0
    ("pods", SubmitPod("p2", "t", num_gpu=1, gpu_milli=1000, cpu_milli=100)),  # on n0
    ("set", SetDisruptionBudget("b-t", tenant="t", max_unavailable=0)),
    ("set", SetDisruptionBudget("b-zone", label_selector={"zone": "a"}, max_unavailable=2)),
    ("drain", DrainNode("n0")),  # both of n0's pods blocked by b-t
    ("uncordon", UncordonNode("n0")),  # the drain is cancelled: nothing blocked
    ("drain again", DrainNode("n0")),
    ("raise", SetDisruptionBudget("b-t", tenant="t", max_unavailable=1)),  # p1 evicted (queued); p2 still waits
    ("remove", RemoveDisruptionBudget("b-t")),  # the drain goes on without it
]


def events_by_step() -> list[tuple[str, list]]:
    state = PartitionState()
    out = []
    for offset, (name, payload) in enumerate(STEPS):
        out.append((name, decide(state, Command(f"c{offset}", "lab", 1000 * (offset + 1), payload), offset)))  # type: ignore[arg-type]
    return out


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = create_engine("sqlite://")
    models.Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


def project(engine: Engine, events: list, size: int = 1000) -> None:
    projector = Projector(engine, "gpufold.events")
    batch = [Envelope.of(event, event.command_offset) for event in events]
    for i in range(0, len(batch), size):
        projector.project(batch[i : i + size])


def blocked_after(engine: Engine, step: str) -> dict[str, list[str]]:
    """Project the steps up to ``step`` (more on each call) and answer budget id -> blocked pod ids."""
    steps = events_by_step()
    projected = getattr(engine, "_projected_steps", 0)
    upto = max(i for i, (name, _) in enumerate(steps) if name == step) + 1  # the last step so named
    project(engine, [event for _, events in steps[projected:upto] for event in events])
    engine._projected_steps = upto  # type: ignore[attr-defined]
    with engine.connect() as conn:
        answer = queries.disruption_budgets(conn, cluster="lab")
    return {b["budget_id"]: [e["pod_id"] for e in b["blocked_evictions"]] for b in answer["budgets"]}


def test_a_budget_is_projected_as_set_with_its_filters() -> None:
    """Each budget's filters, max_unavailable and when it was set, by cluster and id."""
    eng = create_engine("sqlite://")
    models.Base.metadata.create_all(eng)
    project(eng, [e for name, events in events_by_step() if name in ("nodes", "pods", "set") for e in events])
    with eng.connect() as conn:
        budgets = queries.disruption_budgets(conn)["budgets"]
    assert [(b["cluster"], b["budget_id"]) for b in budgets] == [("lab", "b-t"), ("lab", "b-zone")]
    assert budgets[0]["tenant"] == "t" and budgets[0]["gang_id"] is None and budgets[0]["label_selector"] == {}
    assert budgets[0]["max_unavailable"] == 0 and budgets[0]["set_at"] == 6000
    assert budgets[1]["label_selector"] == {"zone": "a"} and budgets[1]["max_unavailable"] == 2


def test_blocked_evictions_come_and_go_with_the_drain(engine: Engine) -> None:
    """A drain's blocked evictions are listed under the budget that blocks them; an uncordon cancels them; an
    eviction the budget later allows leaves the list; a removed budget is gone with what it blocked."""
    assert blocked_after(engine, "set") == {"b-t": [], "b-zone": []}
    assert blocked_after(engine, "drain") == {"b-t": ["p1", "p2"], "b-zone": []}
    assert blocked_after(engine, "uncordon") == {"b-t": [], "b-zone": []}
    assert blocked_after(engine, "drain again") == {"b-t": ["p1", "p2"], "b-zone": []}
    assert blocked_after(engine, "raise") == {"b-t": ["p2"], "b-zone": []}
    assert blocked_after(engine, "remove") == {"b-zone": []}


def test_each_blocked_eviction_names_its_node_time_and_reason(engine: Engine) -> None:
    blocked_after(engine, "drain")
    with engine.connect() as conn:
        (budget, _) = queries.disruption_budgets(conn, cluster="lab")["budgets"]
    assert budget["blocked_evictions"][0] == {"pod_id": "p1", "node_id": "n0", "since": 8000, "reason": "drain"}


def test_budget_tables_do_not_depend_on_batch_boundaries() -> None:
    """One event per batch and all events in one batch give identical tables."""
    events = [event for _, step in events_by_step() for event in step]
    small, large = create_engine("sqlite://"), create_engine("sqlite://")
    for eng in (small, large):
        models.Base.metadata.create_all(eng)
    project(small, events, 1)
    project(large, events, 10_000)
    with small.connect() as a, large.connect() as b:
        assert content_hashes(a) == content_hashes(b)
        assert queries.disruption_budgets(a) == queries.disruption_budgets(b)


def test_an_unknown_cluster_is_not_found(engine: Engine) -> None:
    blocked_after(engine, "set")
    with engine.connect() as conn, pytest.raises(queries.NotFound):
        queries.disruption_budgets(conn, cluster="nowhere")
