"""fgd and fgd-plus: node and GPU chosen by least fragmentation growth; never an over-commit; deterministic.

fgd-pack's own choices are in test_policies_fgd_pack.py."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from processor.core.fold import decide
from processor.core.policies import get_policy
from processor.core.policies.fgd import FragMemo, after_share, after_whole, options_for
from processor.core.policies.fgd_plus import model_demand_shares, scarce_models
from processor.core.resources import PodShape
from processor.core.snapshot import state_hash
from processor.core.state import DEFAULT_POLICY, PartitionState
from schemas.commands import AddNode, Command, SetPolicy, SubmitPod
from schemas.events import GpuShare, PodScheduled
from schemas.fragmentation import TypicalKey, TypicalPod
from tests.property.test_fold_properties import check_no_overcommit
from tests.strategies import Fold, command_streams

SHARE_500 = TypicalPod(TypicalKey(1, 500, 1000, ()), 1.0)


def two_nodes(policy: str) -> Fold:
    """Node a: GPUs with 1000 and 600 milli free; node b: idle; typical pod: a 500-milli share."""
    fold = Fold()
    fold.run_all(
        AddNode("a", 64000, 262144, "V100", 2),
        AddNode("b", 64000, 262144, "V100", 2),
        SetPolicy("first-fit"),
        SubmitPod("used", num_gpu=1, gpu_milli=400, cpu_milli=1000),
    )
    fold.cluster.nodes["a"].gpu_free.reverse()  # the 600-milli GPU becomes index 1 (test set-up only)
    fold.cluster.reindex(fold.cluster.nodes["a"])
    fold.run(SetPolicy(policy))
    fold.cluster.typical = (SHARE_500,)
    return fold


def shape(num_gpu: int, gpu_milli: int, cpu: int = 1000) -> PodShape:
    return PodShape(num_gpu, gpu_milli, cpu, 1024, (), (), ())


def choose(fold: Fold, pod_shape: PodShape) -> tuple[str, tuple[GpuShare, ...]]:
    policy = get_policy(fold.cluster.policy)
    assert policy is not None
    choice = policy.place(fold.cluster, pod_shape, fold.cluster.index.feasible(pod_shape))
    return choice.node_id, choice.gpus


def test_free_vectors_after_placement() -> None:
    """A share comes off the chosen GPU, whole GPUs off idle ones; vectors stay sorted descending."""
    assert after_share((1000, 600, 300), 600, 500) == (1000, 300, 100)
    assert after_whole((1000, 1000, 400), 2) == (400, 0, 0)


def test_options_measure_growth_per_gpu() -> None:
    """Each distinct GPU a share fits on is an option, with the node's fragmentation before and after."""
    memo = FragMemo((SHARE_500,))
    options = options_for(memo, two_nodes("fgd").cluster.index.signature_of("a"), shape(1, 500))
    assert options == [(0.0, 100.0, 600), (0.0, 0.0, 1000)]  # 600 -> 100 left (a fragment), 1000 -> 500 left


def test_fgd_picks_the_gpu_with_least_growth() -> None:
    """FGD puts a 500-milli share on the idle GPU of node a (no growth), not on the GPU with 600 free."""
    node_id, gpus = choose(two_nodes("fgd"), shape(1, 500))
    assert (node_id, gpus) == ("a", (GpuShare(0, 500),))


def test_fgd_whole_gpus_go_where_nothing_is_stranded() -> None:
    """A 1-GPU pod takes a's idle GPU (the 600 left still fit a 500-milli pod: no growth, ties on id); a 2-GPU
    pod only fits on b."""
    fold = two_nodes("fgd")
    assert choose(fold, shape(1, 1000)) == ("a", (GpuShare(0, 1000),))
    assert choose(fold, shape(2, 1000)) == ("b", (GpuShare(0, 1000), GpuShare(1, 1000)))


def test_fgd_reports_its_integer_score() -> None:
    """PodScheduled carries the published integer sigmoid score of the chosen node."""
    fold = two_nodes("fgd")
    event = fold.run(SubmitPod("p", num_gpu=1, gpu_milli=500, cpu_milli=1000))[-1].payload
    assert isinstance(event, PodScheduled)
    assert "fgd_score" in event.scores


def test_fgd_plus_explains_its_choice() -> None:
    """fgd-plus reports the FGD score, the fragmentation growth and the leftovers of the chosen node."""
    fold = two_nodes("fgd-plus")
    event = fold.run(SubmitPod("p", num_gpu=1, gpu_milli=500, cpu_milli=1000))[-1].payload
    assert isinstance(event, PodScheduled)
    assert event.node_id == "a" and event.gpus == (GpuShare(0, 500),)
    assert set(event.scores) == {"fgd_score", "frag_growth_milli", "gpu_milli_left", "cpu_milli_left", "model_scarce"}
    assert event.scores["frag_growth_milli"] == 0.0
    assert event.scores["model_scarce"] == 0.0


def test_fgd_plus_prefers_the_fuller_node_among_equal_scores() -> None:
    """Where FGD ties (equal integer score) fgd-plus takes the node left with less free GPU: a whole-GPU pod goes to
    the partly used node a, on its idle GPU, rather than to the idle node b."""
    fold = two_nodes("fgd-plus")
    fold.cluster.typical = (TypicalPod(TypicalKey(1, 1000, 1000, ()), 1.0),)
    # On a the 600-milli GPU is already a fragment for whole-GPU pods: taking the idle GPU adds none.
    assert choose(fold, shape(1, 1000)) == ("a", (GpuShare(0, 1000),))


def two_models(t4_weight: float, v100_nodes: int = 1, v100_gpus: int = 2) -> Fold:
    """Node a (T4, 2 GPUs, a half-GPU T4-only pod on one) and V100 nodes v0, v1, ... (idle); the typical pods are
    a whole-GPU pod restricted to T4 (popularity ``t4_weight``) and an unrestricted one."""
    fold = Fold()
    fold.run_all(
        AddNode("a", 64000, 262144, "T4", 2),
        *(AddNode(f"v{n}", 64000, 262144, "V100", v100_gpus) for n in range(v100_nodes)),
        SetPolicy("fgd-plus"),
        SubmitPod("t4-only", num_gpu=1, gpu_milli=500, cpu_milli=1000, gpu_models=("T4",)),
    )
    fold.cluster.typical = (
        TypicalPod(TypicalKey(1, 1000, 1000, ("T4",)), t4_weight),
        TypicalPod(TypicalKey(1, 1000, 1000, ()), 1.0 - t4_weight),
    )
    return fold


def test_model_demand_shares_count_only_restricted_pods() -> None:
    """The T4-only half of the typical GPU demand makes T4's share 0.5; unrestricted pods count for no model."""
    assert model_demand_shares(two_models(0.5).cluster.typical) == {"T4": 0.5}
    assert model_demand_shares((TypicalPod(TypicalKey(0, 0, 1000, ("T4",)), 1.0),)) == {}


def test_fgd_plus_keeps_a_scarce_model_for_the_pods_that_need_it() -> None:
    """7% of the demand is T4-only and T4 has 1500 of the 33,500 idle milli (less than 7%): T4 is scarce. The FGD
    scores of a and a V100 node tie, and best fit alone would pick the fuller T4 node a; fgd-plus sends an
    unrestricted whole-GPU pod to V100 instead. A T4-only pod still gets T4, and the choice says T4 was scarce."""
    fold = two_models(0.07, v100_nodes=4, v100_gpus=8)
    assert scarce_models(fold.cluster, model_demand_shares(fold.cluster.typical)) == frozenset({"T4"})
    policy = get_policy("fgd-plus")
    assert policy is not None
    anywhere = shape(1, 1000)
    choice = policy.place(fold.cluster, anywhere, fold.cluster.index.feasible(anywhere))
    assert choice.node_id == "v0" and choice.scores["model_scarce"] == 0.0
    on_a = policy.place(fold.cluster, anywhere, [g for g in fold.cluster.index.feasible(anywhere) if "a" in g.node_ids])
    assert on_a.scores["fgd_score"] == choice.scores["fgd_score"]  # a tie that scarcity, not FGD, broke
    assert on_a.scores["gpu_milli_left"] < choice.scores["gpu_milli_left"]  # and best fit would have taken a
    t4_only = PodShape(1, 1000, 1000, 1024, ("T4",), (), ())
    choice = policy.place(fold.cluster, t4_only, fold.cluster.index.feasible(t4_only))
    assert choice.node_id == "a" and choice.scores["model_scarce"] == 1.0


def test_fgd_plus_uses_a_model_that_is_not_scarce_by_best_fit() -> None:
    """With 2% of the demand T4-only and T4 holding 1500 of 3500 idle milli nothing is scarce: on an FGD tie best
    fit picks the fuller T4 node a."""
    fold = two_models(0.02)
    assert scarce_models(fold.cluster, model_demand_shares(fold.cluster.typical)) == frozenset()
    assert choose(fold, shape(1, 1000))[0] == "a"


def test_fgd_plus_is_the_default_policy() -> None:
    """New clusters use fgd-plus."""
    assert DEFAULT_POLICY == "fgd-plus"


def _with_policy(commands: list[Command], policy: str) -> list[Command]:
    """The stream with every SetPolicy pointing at the policy under test, and one first."""
    head = Command("set-policy", commands[0].cluster, 0, SetPolicy(policy))
    body = [
        Command(c.command_id, c.cluster, c.issued_at, SetPolicy(policy)) if isinstance(c.payload, SetPolicy) else c
        for c in commands
    ]
    return [head, *body]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_streams())
def test_fragmentation_policies_never_over_commit(commands: list[Command]) -> None:
    """Over random streams (drains, failures, releases included) fgd, fgd-plus and fgd-pack never over-commit,
    and folding the same stream twice gives the same state hash."""
    for policy in ("fgd-plus", "fgd", "fgd-pack"):
        stream = _with_policy(commands, policy)
        states = []
        for _ in range(2):
            state = PartitionState()
            for offset, command in enumerate(stream):
                decide(state, command, offset)
                for cluster in state.clusters.values():
                    check_no_overcommit(cluster)
            states.append(state)
        assert state_hash(states[0]) == state_hash(states[1])
