"""fgd-pack: shares packed by the learned mix's prices, CPU kept where GPUs need it, pinned models' supply kept."""

from __future__ import annotations

from processor.core.policies import get_policy
from processor.core.resources import PodShape
from schemas.commands import AddNode, SetPolicy, SubmitPod
from schemas.events import GpuShare, PodScheduled
from schemas.fragmentation import TypicalKey, TypicalPod
from tests.strategies import Fold


def shape(num_gpu: int, gpu_milli: int, cpu: int = 1000, models: tuple[str, ...] = ()) -> PodShape:
    return PodShape(num_gpu, gpu_milli, cpu, 1024, models, (), ())


def choose(fold: Fold, pod: PodShape, policy: str | None = None) -> tuple[str, tuple[GpuShare, ...]]:
    chosen = get_policy(policy or fold.cluster.policy)
    assert chosen is not None
    choice = chosen.place(fold.cluster, pod, fold.cluster.index.feasible(pod))
    return choice.node_id, choice.gpus


MIX = (
    TypicalPod(TypicalKey(1, 470, 1000, ()), 0.25),
    TypicalPod(TypicalKey(1, 320, 1000, ()), 0.125),
    TypicalPod(TypicalKey(1, 650, 1000, ()), 0.125),
    TypicalPod(TypicalKey(1, 1000, 1000, ()), 0.5),
)


def share_cluster() -> Fold:
    """Node a (2 GPUs) holds a 470 on GPU 0; node b (2 GPUs) is idle. The learned mix: 470s, 320s and 650s
    (two 470s, or a 650 and a 320, fill a GPU) and whole-GPU pods."""
    fold = Fold()
    fold.run_all(
        AddNode("a", 64000, 262144, "V100", 2),
        AddNode("b", 64000, 262144, "V100", 2),
        SetPolicy("fgd-pack"),
        SubmitPod("first", num_gpu=1, gpu_milli=470, cpu_milli=1000),
    )
    assert fold.placement("first") == "a"
    fold.cluster.typical = MIX
    return fold


def test_a_share_keeps_out_of_a_gap_its_partner_should_fill() -> None:
    """A 320 beside the 470 would leave 210 that nothing in the mix fills; it takes an idle GPU instead (a 650
    will join it). fgd-plus takes the 470's gap: FGD's measure sees the idle GPU lost to whole-GPU pods."""
    fold = share_cluster()
    assert choose(fold, shape(1, 320)) == ("a", (GpuShare(1, 320),))
    assert choose(fold, shape(1, 320), "fgd-plus") == ("a", (GpuShare(0, 320),))


def test_a_share_joins_the_gpu_that_waits_for_it() -> None:
    """After the 320, a 650 goes onto the 320's GPU (the pattern 650 + 320) and a 470 onto the other 470's."""
    fold = share_cluster()
    fold.run(SubmitPod("small", num_gpu=1, gpu_milli=320, cpu_milli=1000))
    fold.cluster.typical = MIX  # as learned from a longer history than this test's three pods
    assert choose(fold, shape(1, 650)) == ("a", (GpuShare(1, 650),))
    assert choose(fold, shape(1, 470)) == ("a", (GpuShare(0, 470),))


def test_fgd_pack_reports_the_price_it_paid() -> None:
    """PodScheduled carries the share's reduced cost (0 where an optimal packing would put it), the FGD score,
    the leftovers and the growth; a whole-GPU pod has no reduced cost."""
    fold = share_cluster()
    event = fold.run(SubmitPod("p", num_gpu=1, gpu_milli=320, cpu_milli=1000))[-1].payload
    assert isinstance(event, PodScheduled) and event.policy == "fgd-pack"
    assert event.scores["share_reduced_cost"] == 0.0
    assert {"fgd_score", "gpu_milli_left", "cpu_milli_left", "frag_growth_milli"} <= set(event.scores)
    whole = fold.run(SubmitPod("w", num_gpu=1, gpu_milli=1000, cpu_milli=1000))[-1].payload
    assert isinstance(whole, PodScheduled) and "share_reduced_cost" not in whole.scores


def cpu_cluster() -> Fold:
    """Node poor: 4 GPUs, 24 cores; node rich: 4 GPUs, 64 cores. Typical GPU pods ask 8 cores per GPU."""
    fold = Fold()
    fold.run_all(
        AddNode("poor", 24000, 262144, "V100", 4),
        AddNode("rich", 64000, 262144, "V100", 4),
        SetPolicy("fgd-pack"),
    )
    fold.cluster.typical = (TypicalPod(TypicalKey(1, 1000, 8000, ()), 1.0),)
    return fold


def test_a_cpu_heavy_pod_goes_where_cpu_is_to_spare() -> None:
    """A 1-GPU pod asking 12 cores would leave the poor node 3 GPUs and 12 cores: a typical pod still fits, so
    FGD sees no growth, but at 8 cores a GPU 1.5 of them will never be used; on the rich node none. fgd-plus,
    by best fit, takes the poor node."""
    fold = cpu_cluster()
    heavy = shape(1, 1000, cpu=12000)
    assert choose(fold, heavy)[0] == "rich"
    assert choose(fold, heavy, "fgd-plus")[0] == "poor"


def test_a_light_pod_goes_where_cpu_is_short() -> None:
    """A 1-GPU pod asking 1 core lowers what the poor node strands (its GPUs per core improve): it goes there."""
    fold = cpu_cluster()
    assert choose(fold, shape(1, 1000, cpu=1000))[0] == "poor"


def test_a_cpu_only_pod_leaves_idle_gpus_their_cpu() -> None:
    """A CPU-only pod of 8 cores goes to the node where it strands no GPU: the rich one (on the poor one 2 of
    its 4 GPUs would be left without CPU)."""
    fold = cpu_cluster()
    assert choose(fold, shape(0, 0, cpu=8000))[0] == "rich"


def model_cluster(t4_nodes: int) -> Fold:
    """T4 nodes (2 GPUs each, all the CPU a pod could want) and 4 idle 8-GPU V100 nodes; 30% of the present GPU
    demand is pinned to T4 (waiting on a selector no node has, so it counts but takes nothing)."""
    fold = Fold()
    fold.run_all(
        *(AddNode(f"t{n}", 104000, 262144, "T4", 2) for n in range(t4_nodes)),
        *(AddNode(f"v{n}", 96000, 786432, "V100", 8) for n in range(4)),
        SetPolicy("fgd-pack"),
    )
    for n in range(30):
        fold.run(SubmitPod(f"pin{n}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, gpu_models=("T4",),
                           node_selector={"nowhere": "x"}))  # fmt: skip
    for n in range(70):
        fold.run(SubmitPod(f"any{n}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, node_selector={"nowhere": "x"}))
    fold.cluster.typical = (
        TypicalPod(TypicalKey(8, 1000, 8000, ()), 0.05),
        TypicalPod(TypicalKey(1, 1000, 1000, ()), 0.95),
    )
    return fold


def test_an_unpinned_pod_leaves_a_pinned_models_supply_alone() -> None:
    """With T4's 8 idle GPUs below the T4-only need (30% of 40 idle GPUs: risk 0.84), an unpinned 1-GPU pod goes
    to a V100 node, though FGD's measure prefers to keep the 8-GPU nodes whole (growth 350 there; fgd-plus takes
    T4); the score says the model it took is not at risk."""
    fold = model_cluster(4)
    pod = shape(1, 1000)
    assert choose(fold, pod)[0].startswith("v")
    assert choose(fold, pod, "fgd-plus")[0].startswith("t")
    event = fold.run(SubmitPod("x", num_gpu=1, gpu_milli=1000, cpu_milli=1000))[-1].payload
    assert isinstance(event, PodScheduled) and event.scores["model_risk"] == 0.0  # the V100 it took is not at risk


def test_a_pinned_models_supply_to_spare_is_used() -> None:
    """With 40 T4 GPUs idle against a need of ~34 x 30%, T4 is not at risk: FGD's preference stands."""
    fold = model_cluster(20)
    assert choose(fold, shape(1, 1000))[0].startswith("t")


def test_a_pinned_pod_still_gets_its_model() -> None:
    """The T4-only pod goes to T4 whatever the risk: it can go nowhere else."""
    fold = model_cluster(4)
    assert choose(fold, shape(1, 1000, models=("T4",)))[0].startswith("t")
