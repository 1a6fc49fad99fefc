"""first-fit, best-fit and spread on small hand-built clusters: which node (and GPUs) each one picks, and why."""

from __future__ import annotations

import pytest

from processor.core.policies import get_policy, policy_names
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node


def cluster_of(*nodes: tuple[str, list[int], int, int, int, int]) -> ClusterState:
    """A cluster from (node_id, gpu_free, cpu_capacity, cpu_free, memory_capacity, memory_free); all A100."""
    cluster = ClusterState("c")
    for node_id, gpu_free, cpu, cpu_free, memory, memory_free in nodes:
        node = Node(node_id, "A100", len(gpu_free), cpu, memory, {}, ())
        node.gpu_free = list(gpu_free)
        node.cpu_free = cpu_free
        node.memory_free = memory_free
        cluster.nodes[node_id] = node
        cluster.reindex(node)
    return cluster


def shape(num_gpu: int = 0, gpu_milli: int = 0, cpu: int = 0, memory: int = 0) -> PodShape:
    return PodShape(num_gpu, gpu_milli, cpu, memory, (), (), ())


def place(policy: str, cluster: ClusterState, pod: PodShape) -> tuple[str, list[tuple[int, int]]]:
    chosen = get_policy(policy)
    assert chosen is not None
    choice = chosen.place(cluster, pod, cluster.index.feasible(pod))
    return choice.node_id, [(share.index, share.milli) for share in choice.gpus]


# n1: idle 4 GPUs; n2: 3 of 4 GPUs used; n3: 2 of 8 GPUs used. CPU and memory all free.
MIXED = (
    ("n1", [1000] * 4, 8000, 8000, 16384, 16384),
    ("n2", [0, 0, 0, 1000], 8000, 8000, 16384, 16384),
    ("n3", [0, 0] + [1000] * 6, 8000, 8000, 16384, 16384),
)

CHOICES = [
    ("first-fit takes the smallest id", "first-fit", MIXED, shape(1, 1000), ("n1", [(0, 1000)])),
    ("best-fit takes the least leftover", "best-fit", MIXED, shape(1, 1000), ("n2", [(3, 1000)])),
    ("spread takes the least allocated", "spread", MIXED, shape(1, 1000), ("n1", [(0, 1000)])),
    (
        "first-fit skips nodes that do not fit",
        "first-fit",
        MIXED,
        shape(5, 1000),
        ("n3", [(i, 1000) for i in range(2, 7)]),
    ),
    ("best-fit for two GPUs", "best-fit", MIXED, shape(2, 1000), ("n1", [(0, 1000), (1, 1000)])),
    (
        "best-fit puts a share on the fullest GPU node",
        "best-fit",
        (("a", [1000, 1000], 8000, 8000, 100, 100), ("b", [1000, 300], 8000, 8000, 100, 100)),
        shape(1, 250),
        ("b", [(1, 250)]),
    ),
    (
        "spread puts a share on the emptiest node",
        "spread",
        (("a", [1000, 1000], 8000, 8000, 100, 100), ("b", [1000, 300], 8000, 8000, 100, 100)),
        shape(1, 250),
        ("a", [(0, 250)]),
    ),
    (
        "best-fit breaks a GPU tie on CPU left",
        "best-fit",
        (("a", [1000], 8000, 8000, 100, 100), ("b", [1000], 8000, 2000, 100, 100)),
        shape(1, 1000, cpu=1000),
        ("b", [(0, 1000)]),
    ),
    (
        "best-fit breaks a GPU and CPU tie on memory left",
        "best-fit",
        (("a", [1000], 8000, 8000, 100, 50), ("b", [1000], 8000, 8000, 100, 100)),
        shape(1, 1000, memory=10),
        ("a", [(0, 1000)]),
    ),
    (
        "spread averages GPU, CPU and memory fractions",
        "spread",
        # a: GPU free, CPU nearly full; b: GPU half used, CPU free -> b keeps more on average.
        (("a", [1000, 1000], 8000, 1000, 100, 100), ("b", [1000, 0], 8000, 8000, 100, 100)),
        shape(1, 500, cpu=500),
        ("b", [(0, 500)]),
    ),
    (
        "spread on CPU-only nodes",
        "spread",
        (("a", [], 8000, 2000, 100, 100), ("b", [], 4000, 3000, 100, 100)),
        shape(cpu=1000),
        ("b", []),
    ),
]


@pytest.mark.parametrize(("policy", "nodes", "pod", "expected"), [c[1:] for c in CHOICES], ids=[c[0] for c in CHOICES])
def test_policy_choice(policy: str, nodes: tuple, pod: PodShape, expected: tuple[str, list[tuple[int, int]]]) -> None:
    """Each policy picks the node (and GPUs) its definition says on a small cluster."""
    assert place(policy, cluster_of(*nodes), pod) == expected


@pytest.mark.parametrize("policy", ["first-fit", "best-fit", "spread"])
def test_ties_break_on_the_smallest_node_id(policy: str) -> None:
    """Identical nodes tie; every policy then takes the smallest id (string order), whatever the insertion order."""
    same = [(node_id, [1000, 1000], 8000, 8000, 100, 100) for node_id in ("n9", "n10", "n2")]
    assert place(policy, cluster_of(*same), shape(1, 1000))[0] == "n10"
    assert place(policy, cluster_of(*reversed(same)), shape(1, 1000))[0] == "n10"


@pytest.mark.parametrize("policy", ["first-fit", "best-fit", "spread"])
def test_choice_does_not_depend_on_insertion_order(policy: str) -> None:
    """The same nodes added in any order give the same choice."""
    forward = place(policy, cluster_of(*MIXED), shape(1, 500))
    backward = place(policy, cluster_of(*reversed(MIXED)), shape(1, 500))
    assert forward == backward


def test_scoring_policies_report_their_scores() -> None:
    """best-fit and spread explain a choice with named scores (reported in PodScheduled.scores)."""
    cluster = cluster_of(*MIXED)
    pod = shape(1, 1000)
    best = get_policy("best-fit").place(cluster, pod, cluster.index.feasible(pod))  # type: ignore[union-attr]
    assert best.scores == {"gpu_milli_left": 0.0, "cpu_milli_left": 8000.0, "memory_mib_left": 16384.0}
    spread = get_policy("spread").place(cluster, pod, cluster.index.feasible(pod))  # type: ignore[union-attr]
    assert spread.scores == pytest.approx({"free_fraction_negated": -(0.75 + 1 + 1) / 3})


def test_core_policies_are_registered() -> None:
    """The registry holds first-fit, best-fit and spread under those names."""
    assert {"first-fit", "best-fit", "spread"} <= set(policy_names())
    assert all(get_policy(name).name == name for name in ("first-fit", "best-fit", "spread"))  # type: ignore[union-attr]


def test_the_registry_holds_exactly_the_contracts_policy_names() -> None:
    """SetPolicy is checked against the contract's list, so the fold must register exactly those names."""
    from processor.core.policies import policy_names
    from schemas.validation import POLICY_NAMES

    assert tuple(policy_names()) == POLICY_NAMES
