"""The FGD experiment harness (`gpufold simulate`): workload construction, determinism and the CLI on a small slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufold import simulate
from gpufold.cli import main
from gpufold.trace import TraceError, TraceNode, TracePod, load_nodes, load_pods

NODES = [TraceNode(f"node-{i}", 32000, 131072, 8 if i % 2 else 4, "V100" if i % 3 else "T4") for i in range(8)]
PODS = [
    TracePod(f"pod-{i:03d}", 1000 * (1 + i % 4), 4096, *((1, 300 + 100 * (i % 5)) if i % 3 else (1 + i % 2, 1000)))
    for i in range(40)
]


def test_inflation_stops_before_passing_the_target() -> None:
    """Copies are appended until the next one would pass inflate x capacity, then everything is shuffled."""
    workload = simulate.build_workload(NODES, PODS, seed=42, inflate=1.3)
    requested = sum(pod.gpu_milli_total for _, pod in workload.pods)
    assert requested <= 1.3 * workload.gpu_milli_capacity
    assert len(workload.pods) > len(PODS)
    assert len({pod_id for pod_id, _ in workload.pods}) == len(workload.pods)  # copies get unique ids
    assert [pod_id for pod_id, _ in workload.pods] != sorted(pod_id for pod_id, _ in workload.pods)


def test_node_ids_follow_the_shuffled_order() -> None:
    """Node ids start with the shuffled position, so the fold's tie-break on id follows the seed's order."""
    workload = simulate.build_workload(NODES, PODS, seed=7)
    ids = [node_id for node_id, _ in workload.nodes]
    assert ids == sorted(ids)
    assert [node.name for _, node in workload.nodes] != [node.name for node in NODES]


def test_seed_changes_the_order_and_the_same_seed_repeats_it() -> None:
    """The same seed gives the same workload; another seed another order."""
    first = simulate.build_workload(NODES, PODS, seed=42)
    assert first == simulate.build_workload(NODES, PODS, seed=42)
    assert first.pods != simulate.build_workload(NODES, PODS, seed=43).pods


@pytest.mark.parametrize("policy", ["fgd-plus", "fgd", "random"])
def test_same_seed_same_result(policy: str) -> None:
    """Two runs with the same inputs and seed give the same curve and state hash."""
    first = simulate.run(NODES, PODS, policy, seed=42)
    second = simulate.run(NODES, PODS, policy, seed=42)
    assert first.state_hash == second.state_hash
    assert first.curve == second.curve
    assert first.pods_scheduled + first.pods_failed == first.pods_total


def test_allocation_never_exceeds_what_arrived() -> None:
    """The curve is bucketed by whole percent and allocated never exceeds arrived (nor 100%)."""
    result = simulate.run(NODES, PODS, "fgd-plus", seed=1)
    assert result.curve
    for arrived, allocated in result.curve:
        assert arrived == int(arrived)
        assert allocated <= min(arrived + 0.5, 100.0)
    assert result.gpu_milli_allocated <= result.gpu_milli_total


def test_parse_seeds() -> None:
    """Seed lists accept ranges and commas."""
    assert simulate.parse_seeds("42-45") == [42, 43, 44, 45]
    assert simulate.parse_seeds("1,5-6") == [1, 5, 6]
    with pytest.raises(ValueError):
        simulate.parse_seeds("9-3")


def test_bundled_trace_loads() -> None:
    """The bundled openb trace has 1,213 GPU nodes (6,212 GPUs) and 8,152 pods."""
    nodes, pods = load_nodes(), load_pods()
    assert (len(nodes), sum(node.gpu_count for node in nodes), len(pods)) == (1213, 6212, 8152)
    assert all(pod.gpu_milli == 0 for pod in pods if pod.num_gpu == 0)


def test_bad_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    """A missing column is reported with the file name."""
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli\npod-1,1000\n")
    with pytest.raises(TraceError, match="missing column"):
        load_pods(path)


def test_simulate_json_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpufold simulate --json` on a slice of the bundled trace prints one object with the agreed fields."""
    assert main(["simulate", "--policy", "fgd", "--limit", "300", "--inflate", "0", "--seed", "42", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "policy",
        "seed",
        "pods_total",
        "pods_scheduled",
        "pods_failed",
        "gpu_milli_total",
        "gpu_milli_allocated",
        "unallocated_gpu_pct_at_100",
        "fragmentation_pct_at_100",
        "curve",
        "commands_per_sec",
        "state_hash",
    ):
        assert key in result
    assert (result["policy"], result["pods_total"], result["unallocated_gpu_pct_at_100"]) == ("fgd", 300, None)
    assert result["pods_scheduled"] + result["pods_failed"] == result["pods_total"]


def test_simulate_seeds_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """With several seeds and policies, --json prints every run and a mean/median summary per policy."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,131072,2,V100\n" for i in range(6)))
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i},1000,1024,1,{200 + 100 * (i % 7)}\n" for i in range(30))
    )
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,best-fit-paper", "--seeds", "1-3"]
    assert main([*argv, "--json"]) == 0
    output = json.loads(capsys.readouterr().out)
    assert len(output["runs"]) == 6
    assert set(output["summary"]) == {"fgd", "best-fit-paper"}
    assert output["summary"]["fgd"]["seeds"] == [1, 2, 3]


def test_simulate_unknown_policy_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown policy exits with status 2 and names the known ones."""
    assert main(["simulate", "--policy", "nope", "--limit", "10"]) == 2
    assert "known:" in capsys.readouterr().err


def test_observe_sees_every_pod_and_can_stop_the_run() -> None:
    """``observe`` gets each pod's arrived bucket (never decreasing) with the cluster; True stops the run there."""
    seen: list[int] = []
    full = simulate.run(NODES, PODS, "fgd-plus", seed=3, observe=lambda bucket, cluster: seen.append(bucket) or False)
    assert len(seen) == full.pods_total
    assert seen == sorted(seen)
    calls: list[int] = []

    def stop_at_ten(bucket: int, cluster: object) -> bool:
        calls.append(bucket)
        return len(calls) == 10

    cut = simulate.run(NODES, PODS, "fgd-plus", seed=3, observe=stop_at_ten)
    assert len(calls) == 10
    assert cut.pods_scheduled + cut.pods_failed == 10
    assert cut.curve == [point for point in full.curve if point[0] < seen[9]] + cut.curve[-1:]
