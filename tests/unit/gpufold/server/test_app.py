"""``gpufold serve`` on the embedded log: the write API, the replica's routes, what-if and the dashboard files."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufold.server.app import create_app
from gpufold.server.embedded_processor import EmbeddedProcessor
from gpufold.server.writers import EmbeddedWriter
from logs.embedded import EmbeddedLog
from logs.embedded_replica import EmbeddedReplicaSource
from processor.runtime.replica import Replica

# Now: commands the server dates itself (no issued_at) come within the cluster's max_clock_jump_ms of these.
T0 = int(time.time() * 1000)


def line(command_id: str, payload: dict[str, Any], cluster: str = "lab", t: int = 0) -> dict[str, Any]:
    return {"command_id": command_id, "cluster": cluster, "issued_at": T0 + t, "payload": payload}


NODES = [
    line("n1", {"AddNode": {"node_id": "a100-1", "gpu_model": "A100", "gpu_count": 8, "cpu_milli": 96000,
                            "memory_mib": 786432, "labels": {"topology.kubernetes.io/zone": "z1"}}}),
    line("n2", {"AddNode": {"node_id": "t4-1", "gpu_model": "T4", "gpu_count": 2, "cpu_milli": 32000,
                            "memory_mib": 131072, "labels": {"topology.kubernetes.io/zone": "z2"}}}),
]  # fmt: skip


class Server:
    def __init__(self, path: Path, token: str | None = None, processor: bool = True) -> None:
        self.path = path
        self.writer = EmbeddedWriter(path)
        self.processor = EmbeddedProcessor(path, poll=0.02).start() if processor else None
        self.replica = Replica(EmbeddedReplicaSource(path)).start()
        assert self.replica.restored.wait(30)
        self.client = TestClient(create_app(replica=self.replica, writer=self.writer, token=token))

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        if path.startswith("/v1/what-if"):
            self.replica.catch_up()  # a what-if answers at the replica's position: make it the log's head
        return self.client.post(path, json=body, **kwargs)

    def get(self, path: str, **params: Any) -> Any:
        self.replica.catch_up()
        response = self.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def close(self) -> None:
        if self.processor is not None:
            self.processor.stop()
        self.replica.stop()
        self.writer.close()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "log.sqlite")
    yield running
    running.close()


def test_post_commands_batch_and_wait_for_outcomes(server: Server) -> None:
    """A batch is appended in order and ?wait returns each command's committed events."""
    response = server.post("/v1/commands?create_cluster=true", NODES)
    assert response.status_code == 202
    assert [c["command_id"] for c in response.json()["commands"]] == ["n1", "n2"]
    pod = {"cluster": "lab", "payload": {"SubmitPod": {"pod_id": "p1", "num_gpu": 1, "gpu_milli": 500}}}
    waited = server.post("/v1/commands?wait=10", pod)
    assert waited.status_code == 200, waited.text
    body = waited.json()
    assert body["complete"] is True
    command_id = body["commands"][0]["command_id"]  # made by the server: a uuid4
    assert len(command_id) == 36
    outcome = body["outcomes"][0]
    assert outcome["kind"] == "PodScheduled" and outcome["command_id"] == command_id
    assert outcome["events"][0]["payload"]["PodScheduled"]["node_id"] in ("a100-1", "t4-1")


def test_stateless_checks_answer_422_with_the_rejection_code(server: Server) -> None:
    """A command the fold would refuse without the cluster is 422 with its code; nothing is written."""
    bad = line("b1", {"SubmitPod": {"pod_id": "p", "num_gpu": 1, "gpu_milli": 1000, "memory_mib": -5}})
    response = server.post("/v1/commands?create_cluster=true", [NODES[0], bad])
    assert response.status_code == 422
    assert response.json()["code"] == "INVALID_RESOURCES" and response.json()["index"] == 1
    typo = line("b2", {"SubmitPod": {"pod_id": "p", "gpus": 1}})
    response = server.post("/v1/commands", typo)
    assert response.status_code == 422 and response.json()["code"] == "INVALID_JSON"
    assert "unknown field 'gpus'" in response.json()["detail"]
    with EmbeddedLog(server.path, readonly=True) as log:
        assert log.end_offset(log.topics.commands, 0) == 0


@pytest.mark.parametrize(
    ("route", "body", "says"),
    [
        ("/v1/commands", b'{"command_id": "a", "command_id": "b", "cluster": "lab", "payload": {"Tick": {}}}',
         "duplicate key 'command_id'"),
        ("/v1/clusters/lab/pods", b'{"pod_id": "a", "num_gpu": 1, "num_gpu": 8}', "duplicate key 'num_gpu'"),
        ("/v1/what-if", b'{"cluster": "lab", "payload": {"Tick": {}, "Tick": {}}}', "duplicate key 'Tick'"),
        ("/v1/commands", b'{"command_id": "u\xff", "cluster": "lab", "payload": {"Tick": {}}}', "not UTF-8: byte 0xff"),
        ("/v1/commands", b"[" * 5000 + b"]" * 5000, "nested 5000 levels deep"),
        ("/v1/clusters/lab/nodes/n1/cordon", b'{"a": 1, "a": 2}', "duplicate key 'a'"),
    ],
    ids=["envelope", "typed", "what-if", "utf-8", "nesting", "typed without body"],
)  # fmt: skip
def test_json_bodies_are_read_like_json_lines(server: Server, route: str, body: bytes, says: str) -> None:
    """A key given twice, a byte that is not UTF-8 or deep nesting is a short 400 that says so (FastAPI took the
    last key silently, and said only "error parsing the body"); nothing is written."""
    response = server.client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "INVALID_JSON" and says in response.json()["detail"]
    assert len(response.content) < 500
    with EmbeddedLog(server.path, readonly=True) as log:
        assert log.end_offset(log.topics.commands, 0) == 0
    bom = b'\xef\xbb\xbf{"cluster": "lab", "payload": {"Tick": {}}}'
    assert server.client.post("/v1/what-if", content=bom, headers={"Content-Type": "application/json"}).is_success


def test_typed_routes_publish_the_same_commands(server: Server) -> None:
    """Typed routes (add node, submit pod, cordon, drain, release) become the contract's commands."""
    assert server.post("/v1/clusters/lab/nodes?create_cluster=true", NODES[0]["payload"]["AddNode"]).status_code == 202
    submitted = server.post("/v1/clusters/lab/pods?wait=10", {"pod_id": "p1", "num_gpu": 2, "tenant": "acme"})
    assert submitted.json()["outcomes"][0]["kind"] == "PodScheduled"
    assert server.post("/v1/clusters/lab/nodes/a100-1/cordon?wait=10").json()["outcomes"][0]["kind"] == "NodeCordoned"
    drained = server.post("/v1/clusters/lab/nodes/a100-1/drain?wait=10").json()["outcomes"][0]
    assert [next(iter(e["payload"])) for e in drained["events"]] == ["NodeDrained", "PodEvicted", "PodQueued"]
    released = server.post("/v1/clusters/lab/pods/p1/release?wait=10", {"reason": "cancelled"}).json()
    assert released["outcomes"][0]["events"][0]["payload"]["PodReleased"]["reason"] == "cancelled"
    schema = server.client.get("/openapi.json").json()
    body = schema["components"]["schemas"]["SubmitPodBody"]["properties"]
    assert {"pod_id", "num_gpu", "gpu_milli", "tolerations", "command_id", "issued_at"} <= set(body)
    assert server.post("/v1/clusters/lab/pods", {"pod_id": "x", "bogus": 1}).status_code == 422


def test_bearer_token_guards_writes_only(tmp_path: Path) -> None:
    """With a token, writes need it (401 otherwise); reads and what-if stay open."""
    running = Server(tmp_path / "log.sqlite", token="s3cret", processor=False)
    try:
        assert running.post("/v1/commands", NODES[0]).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert running.post("/v1/commands", NODES[0], headers=wrong).status_code == 401
        right = {"Authorization": "Bearer s3cret"}
        assert running.post("/v1/commands?create_cluster=true", NODES[0], headers=right).status_code == 202
        assert running.post("/v1/clusters/lab/nodes/a100-1/cordon").status_code == 401
        assert running.post("/v1/what-if", NODES[1]).status_code == 200
        assert running.get("/v1/nodes")["total"] == 1
    finally:
        running.close()


def test_what_if_over_http_equals_what_is_published(server: Server) -> None:
    """The frames /v1/what-if returns are the bytes the processor then publishes for the same command."""
    server.post("/v1/commands?wait=10&create_cluster=true", NODES)
    asked = line("w1", {"SubmitPod": {"pod_id": "p9", "num_gpu": 1, "gpu_milli": 250, "tenant": "acme"}}, t=50)
    server.replica.catch_up()
    answer = server.post("/v1/what-if?frames=true", asked).json()
    (result,) = answer["results"]
    assert result["outcome"] == "PodScheduled" and result["offset"] == 2
    assert answer["replica"]["offsets"] == {"0": 2}
    assert server.get("/v1/pods")["total"] == 0, "the what-if changed the live state"
    published = server.post("/v1/commands?wait=10", asked).json()["outcomes"][0]
    assert published["command_offset"] == result["offset"]
    with EmbeddedLog(server.path, readonly=True) as log:
        frames = [bytes(r.value) for r in log.read(log.topics.events, 0)][-len(result["frames"]) :]
    assert frames == [base64.b64decode(f) for f in result["frames"]]
    assert server.post("/v1/what-if", {"commands": []}).status_code == 422


def test_replica_routes_list_explain_and_summarise(server: Server) -> None:
    """Pods (filters), nodes with per-GPU shares, explain, clusters, tenants and history answer from the replica."""
    pods = [
        line(f"s{i}", {"SubmitPod": {"pod_id": f"p{i}", "tenant": t, "num_gpu": 1, "gpu_milli": m,
                                     "gpu_models": ["A100"]}})
        for i, (t, m) in enumerate([("acme", 1000), ("acme", 500), ("globex", 500)])
    ]  # fmt: skip
    waiting = line("big", {"SubmitPod": {"pod_id": "big", "num_gpu": 8, "gpu_milli": 1000, "gpu_models": ["A100"]}})
    server.post("/v1/commands?wait=10&create_cluster=true", [*NODES, *pods, waiting])
    running = server.get("/v1/pods", state="running", cluster="lab", tenant="acme")
    assert [p["pod_id"] for p in running["pods"]] == ["p0", "p1"] and running["total"] == 2
    assert running["replica"]["lag"] == 0
    on_node = server.get("/v1/pods", node="a100-1")
    assert on_node["total"] == 3
    pending = server.get("/v1/pods", state="pending")
    assert [p["pod_id"] for p in pending["pods"]] == ["big"]
    assert pending["pods"][0]["reasons"][0]["message"]
    nodes = server.get("/v1/nodes", cluster="lab", gpu_model="A100")["nodes"]
    shared = [g for g in nodes[0]["gpus"] if len(g["pods"]) == 2]
    assert len(shared) == 1 and shared[0]["allocated_milli"] == 1000
    explained = server.get("/v1/clusters/lab/pods/big/explain")
    assert explained["state"] == "pending" and explained["nearest_miss"]["node_id"] == "a100-1"
    assert server.client.get("/v1/clusters/lab/pods/nope/explain").status_code == 404
    (cluster,) = server.get("/v1/clusters")["clusters"]
    assert (cluster["nodes"], cluster["gpus"], cluster["running"], cluster["pending"]) == (2, 10, 3, 1)
    tenants = {t["tenant"]: t for t in server.get("/v1/tenants", cluster="lab")["tenants"]}
    assert tenants["acme"]["gpu_milli"] == 1500 and tenants["default"]["pending"] == 1
    assert server.get("/v1/clusters/lab/history")["points"]
    assert server.client.get("/v1/pods", params={"state": "done"}).status_code == 422
    # A cluster the replica never saw is a 404, not an empty answer that looks like an idle cluster.
    for route in ("/v1/pods", "/v1/nodes", "/v1/quotas", "/v1/tenants"):
        assert server.client.get(route, params={"cluster": "nope"}).status_code == 404, route
    missing = server.client.get("/v1/clusters/nope/history")
    assert missing.status_code == 404 and "no cluster 'nope'" in missing.json()["detail"]


def test_dashboard_is_served_without_external_resources(server: Server) -> None:
    """The page and its two files come from the app itself; nothing points off the origin."""
    page = server.client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name in ("app.js", "style.css"):
        asset = server.client.get(f"/dashboard/{name}")
        assert asset.status_code == 200
        assert "http://" not in asset.text and "https://" not in asset.text
    assert "http" not in page.text.replace("http-equiv", "")
    assert server.client.get("/dashboard/secret.py").status_code == 404


def test_gang_routes_come_from_the_contract(server: Server) -> None:
    """SubmitGang and ReleaseGang get typed routes (bodies from command.avsc) like the other commands."""
    server.post("/v1/commands?wait=10&create_cluster=true", NODES)
    members = [{"pod_id": f"w{i}", "num_gpu": 2, "gpu_milli": 1000} for i in range(3)]
    placed = server.post("/v1/clusters/lab/gangs?wait=10", {"gang_id": "train", "members": members})
    assert placed.status_code == 200, placed.text
    kinds = [next(iter(e["payload"])) for e in placed.json()["outcomes"][0]["events"]]
    assert kinds[0] == "GangScheduled" and kinds.count("PodScheduled") == 3
    assert server.get("/v1/pods", state="running")["total"] == 3
    released = server.post("/v1/clusters/lab/gangs/train/release?wait=10").json()["outcomes"][0]
    assert [next(iter(e["payload"])) for e in released["events"]][-1] == "GangReleased"
    assert server.get("/v1/pods")["total"] == 0
    schema = server.client.get("/openapi.json").json()["components"]["schemas"]
    assert "members" in schema["SubmitGangBody"]["properties"]


def test_disruption_budgets_show_what_they_allow_and_block_now(server: Server) -> None:
    """The replica's budgets: a drain under a budget of 1 evicts one pod (it has nowhere to go, so it counts),
    the budget allows no more, and the other pod's eviction is listed as blocked on its node."""
    pods = [
        line(f"p{i}", {"SubmitPod": {"pod_id": f"p{i}", "tenant": "acme", "num_gpu": 1, "gpu_milli": 1000,
                                     "gpu_models": ["A100"]}})
        for i in (1, 2)
    ]  # fmt: skip
    budget = line("b", {"SetDisruptionBudget": {"budget_id": "b-acme", "tenant": "acme", "max_unavailable": 1}})
    drain = line("d", {"DrainNode": {"node_id": "a100-1"}})
    assert server.post("/v1/commands?wait=10&create_cluster=true", [*NODES, *pods, budget, drain]).status_code == 200
    answer = server.get("/v1/clusters/lab/disruption-budgets")
    (row,) = answer["budgets"]
    assert (row["budget_id"], row["tenant"], row["gang_id"], row["label_selector"]) == ("b-acme", "acme", None, {})
    assert (row["max_unavailable"], row["unavailable"], row["allowed_disruptions"]) == (1, 1, 0)
    assert row["blocked_evictions"] == [{"pod_id": "p2", "node_id": "a100-1"}]
    assert "replica" in answer
    assert server.client.get("/v1/clusters/nope/disruption-budgets").status_code == 404
