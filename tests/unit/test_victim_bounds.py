"""The per-priority summary a preemption search bounds its work with (``Node.by_priority``, ``Held``) forgets a
pod size once its last pod stops: otherwise a node whose whole-GPU pods are gone still promises a one-victim
plan, and every search visits it (a 1,024-member gang met ~87 such nodes per member)."""

from __future__ import annotations

from processor.core.node_victims import lower_bound
from processor.core.resources import PodShape
from processor.core.state import Node
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare, PodSpec


def pod(pod_id: str, gpus: tuple[GpuShare, ...], milli: int, started: int) -> tuple[PodSpec, tuple[GpuShare, ...], int]:
    spec = PodSpec(pod_id, "t", 0, len(gpus) if milli >= GPU_MILLI else 1, milli, 100, 100, (), {}, (), started, 0)
    return spec, gpus, started


def test_the_last_pod_of_a_size_takes_the_size_out_of_the_bound() -> None:
    node = Node("n", "A100", 2, 8_000, 8_192, {}, ())
    whole = pod("whole", (GpuShare(0, 1000),), 1000, 10)
    halves = [pod(f"half{i}", (GpuShare(1, 500),), 500, 20 + i) for i in range(2)]
    for spec, gpus, started in (whole, *halves):
        node.allocate(spec, gpus, started)
    one_gpu = PodShape(1, 1000, 100, 100, (), (), ())
    assert lower_bound(node, one_gpu, 0, 1_000)[0] == 1  # the whole-GPU pod alone would do
    node.free(whole[0], whole[1])
    held = node.by_priority[0]
    assert held.sizes == {500: 2} and set(held.latest_starts) == {500}
    assert (held.latest_start, held.largest_gpu_milli) == (21, 500)
    node.allocate(*pod("taker", (GpuShare(0, 1000),), 1000, 30)[:2], None)  # a preemptor, on trial: no start
    assert lower_bound(node, one_gpu, 0, 1_000)[0] == 2  # only the two halves are left: two victims at least
    node.free(halves[0][0], halves[0][1])
    assert node.by_priority[0].latest_starts == {500: 21}  # stopped without its start given: stays a bound


def test_the_newest_pod_stopping_gives_the_size_the_latest_start_of_the_pods_left() -> None:
    """A node whose newest pod was evicted is bounded by the pods it still runs: else every later search meets it
    in vain (a gang whose members each evicted one node's newest pod searched ~130 such nodes per member)."""
    node = Node("n", "A100", 4, 8_000, 8_192, {}, ())
    older, twin, newest = (pod(f"p{i}", (GpuShare(i, 1000),), 1000, started) for i, started in enumerate((10, 10, 30)))
    half = pod("half", (GpuShare(3, 500),), 500, 40)
    for spec, gpus, started in (older, twin, newest, half):
        node.allocate(spec, gpus, started)
    held = node.by_priority[0]
    assert held.latest_starts == {1000: 30, 500: 40} and held.latest_start == 40
    node.free(newest[0], newest[1], newest[2])
    assert held.latest_starts == {1000: 10, 500: 40}
    node.free(half[0], half[1], half[2])  # the last of its size: the size goes, the latest of all follows
    assert (held.latest_starts, held.latest_start, held.largest_gpu_milli) == ({1000: 10}, 10, 1000)
    node.free(older[0], older[1], 99)  # a start never recorded: nothing is lowered (still a bound)
    assert held.latest_starts == {1000: 10} and held.starts == {1000: {10: 2}}
    node.allocate(*pod("taker", (GpuShare(2, 1000),), 1000, 50)[:2], None)  # on trial: no start recorded
    node.free(twin[0], twin[1], twin[2])
    assert held.latest_starts == {1000: 10} and held.starts == {1000: {10: 1}}
    node.free(*pod("taker", (GpuShare(2, 1000),), 1000, 50)[:2], None)
    assert 0 not in node.by_priority  # the last pod of the level: the summary goes with it
