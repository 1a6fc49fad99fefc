"""Quotas and disruptions as an operator sees them: the replica's quota report, the projection's preemptions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from gpufold.cli import main
from processor.core.fold import decide
from processor.core.quotas import cohort_report, quota_report
from processor.core.state import PartitionState
from projections import models, queries
from projections.envelope import Envelope
from projections.projector import Projector
from schemas.commands import AddNode, Command, SetCohort, SetPolicy, SetQuota, SubmitPod
from tests.strategies import Fold

GPU = 1000


def borrowing() -> Fold:
    """Cohort "shared": acme's nominal 16 GPUs, globex's 8; globex runs 16, acme nothing."""
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i in range(3):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", 8))
    fold.run(SetQuota("acme", "shared", {"*": 16}, weight=2))
    fold.run(SetQuota("globex", "shared", {"*": 8}))
    for i in range(2):
        assert fold.run(SubmitPod(f"g{i}", "globex", 0, 8, 1000, 1000))[-1].type_name == "PodScheduled"
    return fold


def test_the_report_shows_borrowed_and_lent_per_key() -> None:
    lines = {(line.tenant, line.key): line for line in quota_report(borrowing().cluster)}
    globex, acme = lines[("globex", "gpu:*")], lines[("acme", "gpu:*")]
    assert (globex.nominal, globex.used, globex.borrowed) == (8 * GPU, 16 * GPU, 8 * GPU)
    assert (acme.nominal, acme.used, acme.borrowed, acme.lent) == (16 * GPU, 0, 0, 8 * GPU)
    assert acme.may_hold == 16 * GPU and acme.weight == 2  # its nominal: it would reclaim what globex borrows
    assert globex.may_hold == 24 * GPU  # the pool (24 GPUs lent in all) has room for 8 more


def test_the_report_shows_the_cohort_tree_and_what_a_tenant_may_hold_through_it() -> None:
    """acme and globex in cohort "shared", itself under "org", which has 8 GPUs of its own: globex may hold
    its 8, acme's 16 and 4 of org's 8; the cohort lines give each level's subtree quota and use."""
    fold = borrowing()
    fold.run(SetCohort("org", nominal_gpus={"*": 8}))
    fold.run(SetCohort("shared", parent="org", borrowing_limit_gpus=4))
    lines = {(line.tenant, line.key): line for line in quota_report(fold.cluster)}
    assert lines[("globex", "gpu:*")].may_hold == 28 * GPU  # shared's 24, and 4 of org's 8 (its borrowing limit)
    cohorts = {(line.cohort, line.key): line for line in cohort_report(fold.cluster)}
    shared, org = cohorts[("shared", "gpu:*")], cohorts[("org", "gpu:*")]
    # in use: what the members hold beyond what they keep (globex lends all of its nominal, so all its 16)
    assert (shared.parent, shared.depth, shared.subtree_quota, shared.in_use) == ("org", 2, 24 * GPU, 16 * GPU)
    assert shared.may_use == 28 * GPU and shared.tenants == ["acme", "globex"]
    assert (org.parent, org.depth, org.subtree_quota, org.in_use, org.may_use) == (None, 1, 32 * GPU, 16 * GPU,
                                                                                   32 * GPU)  # fmt: skip


def test_no_quota_no_lines() -> None:
    fold = Fold()
    fold.run(AddNode("n0", 8000, 8192, "A100", 1))
    fold.run(SubmitPod("p", cpu_milli=1))
    assert quota_report(fold.cluster) == []


def test_gpufold_quotas_reads_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpufold quotas`` builds a replica of the log and prints the report (text, or JSON)."""
    source = tmp_path / "c.jsonl"
    lines = [
        {"AddNode": {"node_id": "n1", "gpu_model": "A100", "gpu_count": 8, "cpu_milli": 8000, "memory_mib": 8192}},
        {"SetQuota": {"tenant": "acme", "nominal_gpus": {"A100": 4}}},
        {"SubmitPod": {"pod_id": "p1", "tenant": "acme", "num_gpu": 2, "gpu_milli": 1000}},
        {"SetCohort": {"cohort": "org", "nominal_gpus": {"A100": 2}}},
        {"SetCohort": {"cohort": "team", "parent": "org", "borrowing_limit_gpus": 1}},
        {"SetQuota": {"tenant": "globex", "cohort": "team", "nominal_gpus": {"A100": 1}}},
    ]
    source.write_text(
        "".join(
            json.dumps({"command_id": f"c{i}", "cluster": "lab", "issued_at": 0, "payload": p}) + "\n"
            for i, p in enumerate(lines)
        )
    )
    log = str(tmp_path / "log.sqlite")
    assert main(["log", "append", "--create", "--log", log, str(source)]) == 0
    assert main(["run", "--log", log, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["quotas", "--log", log, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    rows = {row["key"]: row for row in answer["quotas"] if row["tenant"] == "acme"}
    cohorts = {(row["cohort"], row["key"]): row for row in answer["cohorts"]}
    team = cohorts[("team", "gpu:A100")]
    assert (team["parent"], team["depth"], team["subtree_quota"], team["may_use"]) == ("org", 2, 1000, 2000)
    assert (rows["gpu:A100"]["tenant"], rows["gpu:A100"]["nominal"], rows["gpu:A100"]["used"]) == ("acme", 4000, 2000)
    assert rows["gpu:*"]["nominal"] == 0  # models the quota does not name: none
    assert main(["quotas", "--log", log]) == 0
    out = capsys.readouterr().out
    assert "acme" in out and "subtree" in out and "team" in out


def test_preemptions_are_listed_with_their_cause() -> None:
    """The projection's disruptions: who preempted whom, and why, newest first."""
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    state = PartitionState()
    all_events = []
    payloads = [
        SetPolicy("first-fit", reserve_after_ms=-1),
        AddNode("n0", 64_000, 262_144, "A100", 8),
        SubmitPod("low", "t", 0, 8, 1000, 1000),
        SubmitPod("high", "t", 10, 8, 1000, 1000),
    ]
    for offset, payload in enumerate(payloads):
        all_events += decide(state, Command(f"c{offset}", "lab", offset * 1000, payload), offset)
    Projector(engine, "gpufold.events").project([Envelope.of(e, e.command_offset) for e in all_events])
    with engine.connect() as conn:
        answer = queries.disruptions(conn, cluster="lab")
        (event,) = answer["events"]
        assert event["type"] == "PodPreempted"
        cause = (event["payload"]["pod_id"], event["payload"]["by"], event["payload"]["reason"])
        assert cause == ("low", "high", "priority")
        assert queries.disruptions(conn, cluster="lab", pod_id="nobody")["events"] == []
