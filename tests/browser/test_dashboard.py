"""The dashboard in a real headless browser (Debian's Chromium): summary first, the queue in scheduling order
with live explain, running pods, gangs, quotas, disruptions, the GPU grid folded by model with a node panel,
state in the URL, 390 px without sideways scrolling, refresh by ETag, and banners when the data is not live.
Screenshots go to build/artifacts/ (the README's come from there)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gpufold.server.app import create_app
from gpufold.server.cli import _embedded_positions
from gpufold.server.embedded_processor import EmbeddedProcessor
from gpufold.server.health import HealthMonitor, Probes
from gpufold.server.writers import EmbeddedWriter
from logs.embedded import EmbeddedLog
from logs.embedded_replica import EmbeddedReplicaSource
from processor.runtime.replica import Replica
from schemas import COMMAND, registry
from schemas.commands import AddNode, Command, GangMember, SetPolicy, SetQuota, SubmitGang, SubmitPod, Taint, Tick
from tests import workload
from tests.browser.chromium import Chromium, find_chromium

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("GPUFOLD_ARTIFACTS", REPO / "build" / "artifacts"))
MINUTE = 60_000


def chromium_binary() -> str:
    binary = find_chromium()
    if binary is None:
        message = "Chromium is not installed (scripts/chromium.sh ensure installs Debian's package; make test runs it)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """The composed app on a real port, the replica following the embedded log in its thread; with
    ``processor``, the fold runs in a thread too and a health monitor watches it (as ``gpufold serve``)."""

    def __init__(self, path: Path, processor: bool = False) -> None:
        self.writer = EmbeddedWriter(path)
        self.processor = EmbeddedProcessor(path, poll=0.02).start() if processor else None
        self.replica = Replica(EmbeddedReplicaSource(path)).start()
        assert self.replica.restored.wait(60)
        probes = Probes(replica=self.replica, fold_thread=self.processor, fold_positions=_embedded_positions(path),
                        fold_where="in this process")  # fmt: skip
        self.health = HealthMonitor(probes, max_lag_seconds=30).start()
        self.port = free_port()
        app = create_app(replica=self.replica, writer=self.writer, health=self.health)
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def stop_http(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def close(self) -> None:
        self.stop_http()
        self.health.stop()
        if self.processor is not None:
            self.processor.stop()
        self.replica.stop()
        self.writer.close()


def lab_commands(t0: int = workload.START_MS) -> list[Command]:
    """A cluster with something in every view: zones and a taint, a quota, running and queued pods of several
    tenants and priorities, a gang that waits, preemptions, and a reservation for the head of the queue (from
    event time ``t0``: after the other clusters' commands on the partition, whose clock it shares)."""
    out: list[Command] = []

    def add(payload: Any, at: int = 0) -> None:
        out.append(Command(f"lab-{len(out)}", "lab", t0 + at, payload, "test"))

    add(SetPolicy("first-fit"))
    for i in range(4):
        labels = {"zone": f"z{i % 2}", "topology/rack": f"r{i}"}
        taints = (Taint("dedicated", "ml"),) if i == 3 else ()
        add(AddNode(f"a100-{i}", 96_000, 786_432, "A100", 8, labels, taints))
    add(AddNode("t4-0", 32_000, 131_072, "T4", 2, {"zone": "z0"}))
    add(SetQuota("capped", nominal_gpus={"A100": 2}))
    for i in range(24):
        add(SubmitPod(f"run-{i:02d}", f"t{i % 3}", 0, 1, 1000, 1000, 1024, ("A100",), time_limit_ms=10 * MINUTE))
    for i in range(3):
        add(SubmitPod(f"capped-{i}", "capped", 0, 1, 1000, 1000, 1024, ("A100",)))
    for i in range(64):
        add(SubmitPod(f"wait-{i:02d}", f"t{i % 4}", 5 if i % 7 == 0 else 0, 1 + i % 2, 1000, 1000, 1024, ("A100",)),
            at=MINUTE)  # fmt: skip
    add(SubmitGang("train", "t1", 0, (GangMember("w0", 8, 1000), GangMember("w1", 8, 1000))), at=MINUTE)
    add(SubmitPod("urgent", "t2", 10, 1, 1000, 1000, 1024, ("A100",)), at=2 * MINUTE)  # preempts a run-* pod
    add(Tick(), at=8 * MINUTE)  # the head of the queue has waited: nodes reserved for it
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    path = tmp_path_factory.mktemp("dashboard") / "log.sqlite"
    encode = registry().codec(COMMAND).encode
    with EmbeddedLog(path) as log:
        first = list(workload.commands(700, nodes=24, release_ratio=0.3))
        commands = [*first, *lab_commands(max(c.issued_at for c in first) + MINUTE)]
        log.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in commands)
    server = LiveServer(path, processor=True)
    deadline = time.monotonic() + 120
    while server.health.check()["fold"]["partitions"][0]["lag_commands"]:
        assert time.monotonic() < deadline, "the processor did not fold the fixture"
        time.sleep(0.2)
    server.replica.catch_up()
    yield server
    server.close()


@pytest.fixture()
def browser() -> Iterator[Chromium]:
    chromium = Chromium(chromium_binary())
    yield chromium
    chromium.close()


def settle(browser: Chromium, extra: int = 1) -> None:
    """Wait for the page to finish its current refresh and ``extra`` more."""
    done = int(browser.wait_for("Number(document.body.dataset.refreshes) || 0") or 0)
    browser.wait_for(f"Number(document.body.dataset.refreshes) >= {done + extra}")


def value(browser: Chromium, element_id: str) -> str:
    return str(browser.evaluate(f"document.getElementById('{element_id}').dataset.value"))


def test_summary_first_with_the_replicas_numbers_and_live(live: LiveServer, browser: Chromium) -> None:
    """Cards equal the replica's row; the summary and the chart come before any list (the chart starts in the
    first screen, its axis at the first event); a pod submitted while the page is open shows up."""
    (cluster,) = [c for c in live.replica.clusters()["clusters"] if c["cluster"] == "c1"]
    browser.open(live.url + "?cluster=c1&refresh=400")
    browser.wait_for("Number(document.body.dataset.refreshes) >= 1 && !!document.querySelector('#content table')")
    settle(browser)
    assert value(browser, "nodes-count") == str(cluster["nodes"])
    assert value(browser, "gpus-count") == str(cluster["gpus"])
    assert value(browser, "pending-count") == str(cluster["pending"])
    assert value(browser, "running-count") == str(cluster["running"])
    assert float(value(browser, "frag-pct")) == cluster["fragmentation_pct"]
    assert value(browser, "health") == "ok"
    chart_bottom = browser.evaluate("document.getElementById('chart').getBoundingClientRect().bottom")
    assert chart_bottom < 600, chart_bottom
    assert int(browser.evaluate("document.getElementById('chart').dataset.points")) >= 2
    first = live.replica.history("c1")["points"][0]["t"]
    assert int(browser.evaluate("document.getElementById('chart').dataset.t0")) == first > 10**12
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = browser.screenshot(ARTIFACTS / "dashboard.png", full_page=False)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

    before = int(value(browser, "running-count")) + int(value(browser, "pending-count"))
    pod = SubmitPod("live-pod", "acme", 100, 0, 0, 100, 100)  # no GPU: fits any node with CPU left
    at = max(live.replica.event_times().values()) + 1  # the partition's clock: no timer of another cluster fires
    live.writer.append([Command("live-1", "c1", at, pod, "test")])
    browser.wait_for(
        "Number(document.getElementById('running-count').dataset.value) + "
        f"Number(document.getElementById('pending-count').dataset.value) === {before + 1}",
        timeout=30,
    )


def test_the_queue_in_scheduling_order_paged_filtered_with_live_explain(live: LiveServer, browser: Chromium) -> None:
    """Rows are the replica's queue in order (positions 1.., age, reasons, the reservation holder's expected
    start); the next page starts at 51; a tenant filter keeps positions; a row opens its live explain."""
    queue = live.replica.queue("lab", limit=50)
    assert queue["total"] > 50 and any(j["holds_reservation"] for j in live.replica.queue("lab", limit=200)["jobs"])
    browser.open(live.url + "?cluster=lab&refresh=500")
    browser.wait_for("document.querySelectorAll('#content tr.job').length >= 50")
    rows = browser.evaluate(
        "[...document.querySelectorAll('#content tr.job')].map(r => [r.dataset.job, r.dataset.position])"
    )
    assert rows == [[j["id"], str(j["position"] or "")] for j in queue["jobs"]]
    assert browser.evaluate("document.querySelector('#content tr.job td.reasons').textContent.length") > 10
    browser.evaluate("document.getElementById('page-next').click()")
    first_row = "document.querySelector('#content tr.job')"
    browser.wait_for(f"!!{first_row} && {first_row}.dataset.position === '51'")
    assert "offset=50" in browser.evaluate("location.search")
    tenant = "t1"
    choose = "const s = document.getElementById('tenant-filter'); s.value = '%s'; s.dispatchEvent(new Event('change'))"
    browser.evaluate(f"(() => {{ {choose % tenant}; }})()")
    wanted = live.replica.queue("lab", tenant=tenant, limit=50)["jobs"]
    count = "document.querySelectorAll('#content tr.job').length"
    browser.wait_for(f"{count} === {len(wanted)} && {first_row}.dataset.job === '{wanted[0]['id']}'")
    positions = browser.evaluate("[...document.querySelectorAll('#content tr.job')].map(r => r.dataset.position)")
    assert positions == [str(j["position"] or "") for j in wanted]
    target = wanted[0]["id"]
    browser.evaluate(f"document.querySelector('#content tr.job[data-job=\"{target}\"]').click()")
    browser.wait_for(
        f"document.getElementById('panel').dataset.id === '{target}' && !document.getElementById('panel').hidden"
    )
    explained = live.replica.explain("lab", target)
    assert explained is not None
    assert browser.evaluate("document.querySelector('#panel .message').textContent") == explained.message
    assert f"explain={target}" in browser.evaluate("location.search")
    browser.screenshot(ARTIFACTS / "dashboard-queue.png", full_page=False)


def test_state_lives_in_the_url(live: LiveServer, browser: Chromium) -> None:
    """A URL opens the same view (cluster, tab, filter); choosing a tab writes it back; with no cluster in
    the URL, the largest cluster is shown (never one a typo created) and written into the URL."""
    browser.open(live.url + "?refresh=500")
    browser.wait_for("document.body.dataset.cluster === 'c1'")
    assert "cluster=c1" in browser.evaluate("location.search")
    browser.open(live.url + "?cluster=lab&tab=running&tenant=t0&refresh=500")
    browser.wait_for("document.body.dataset.tab === 'running' && document.querySelectorAll('#content tr.pod').length")
    pods = browser.evaluate("[...document.querySelectorAll('#content tr.pod')].map(r => r.dataset.pod)")
    wanted = live.replica.pods(state="running", cluster="lab", tenant="t0", limit=50)["pods"]
    assert pods == [p["pod_id"] for p in wanted]
    browser.evaluate("document.querySelector('#tabs button[data-tab=gangs]').click()")
    browser.wait_for("document.body.dataset.tab === 'gangs' && !!document.querySelector('#content tr.gang')")
    assert "tab=gangs" in browser.evaluate("location.search")
    assert browser.evaluate("document.querySelector('#content tr.gang').dataset.gang") == "train"
    for tab, row in (("quotas", "tr.quota"), ("disruptions", "tr.disruption")):
        browser.evaluate(f"document.querySelector('#tabs button[data-tab={tab}]').click()")
        browser.wait_for(f"document.body.dataset.tab === '{tab}' && !!document.querySelector('#content {row}')")
    types = browser.evaluate("[...document.querySelectorAll('#content tr.disruption')].map(r => r.dataset.type)")
    assert "PodPreempted" in types and "PodEvicted" in types


def test_the_gpu_grid_folds_by_model_and_opens_a_node(live: LiveServer, browser: Chromium) -> None:
    """Past ``fold`` nodes each model is one line with its counts; opened, its nodes; a node opens its panel
    with labels, taints and pods."""
    browser.open(live.url + "?cluster=lab&tab=nodes&fold=3&refresh=500")
    browser.wait_for("!!document.querySelector('#grid details.group')")
    assert browser.evaluate("document.getElementById('grid').dataset.folded") == "true"
    assert browser.evaluate("[...document.querySelectorAll('#grid details')].map(d => d.open)") == [False, False]
    summary = browser.evaluate("document.querySelector('#grid details[data-model=A100] summary').textContent")
    assert "4 nodes, 32 GPUs" in summary
    browser.evaluate("document.querySelector('#grid details[data-model=A100] summary').click()")
    browser.wait_for("document.querySelectorAll('#grid .node').length === 4")
    browser.evaluate("document.querySelector('#grid .node[data-node=\"a100-3\"]').click()")
    browser.wait_for("document.getElementById('panel').dataset.id === 'a100-3'")
    text = browser.evaluate("document.getElementById('panel-body').textContent")
    assert "dedicated=ml:NoSchedule" in text and "zone=z1" in text
    node = live.replica.node("lab", "a100-3")
    assert node is not None
    pods = browser.evaluate("[...document.querySelectorAll('#panel tr.pod')].map(r => r.dataset.pod)")
    assert pods == [p["pod_id"] for p in node["pod_list"]]
    browser.screenshot(ARTIFACTS / "dashboard-nodes.png", full_page=False)


def test_works_at_390_px_without_sideways_scrolling(live: LiveServer) -> None:
    """On a phone-sized screen every view fits its width (no horizontal scroll), the explain panel too."""
    phone = Chromium(chromium_binary(), width=390, height=844, mobile=True)
    try:
        for tab in ("queue", "running", "gangs", "quotas", "disruptions", "nodes"):
            phone.open(live.url + f"?cluster=lab&tab={tab}&refresh=500")
            phone.wait_for(f"document.body.dataset.tab === '{tab}' && Number(document.body.dataset.refreshes) >= 1")
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (tab, width)
        phone.open(live.url + "?cluster=lab&refresh=500")
        phone.wait_for("document.querySelectorAll('#content tr.job').length")
        phone.screenshot(ARTIFACTS / "dashboard-phone.png", full_page=False)
        target = live.replica.queue("lab", limit=1)["jobs"][0]["id"]
        phone.evaluate(f"document.querySelector('#content tr.job[data-job=\"{target}\"]').click()")
        phone.wait_for("!document.getElementById('panel').hidden")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        phone.close()


def test_refresh_revalidates_by_etag(live: LiveServer, browser: Chromium) -> None:
    """With nothing changing, a refresh is answered by 304s: a few hundred bytes, not the state again."""
    browser.open(live.url + "?cluster=lab&tab=nodes&refresh=300")
    browser.wait_for("!!document.querySelector('#grid')")
    settle(browser, 2)
    bytes_before = int(browser.evaluate("document.body.dataset.bytes"))
    same_before = int(browser.evaluate("document.body.dataset.notModified"))
    refreshed = int(browser.evaluate("document.body.dataset.refreshes"))
    settle(browser, 5)
    refreshes = int(browser.evaluate("document.body.dataset.refreshes")) - refreshed
    per_refresh = (int(browser.evaluate("document.body.dataset.bytes")) - bytes_before) / refreshes
    assert per_refresh < 3_000, per_refresh  # /v1/status only: every other answer is a 304
    assert int(browser.evaluate("document.body.dataset.notModified")) - same_before >= 3 * refreshes


def test_banners_say_when_the_data_is_not_live(tmp_path: Path, browser: Chromium) -> None:
    """A dead fold is a red banner with why (and the numbers greyed); a server gone is one too."""
    path = tmp_path / "log.sqlite"
    encode = registry().codec(COMMAND).encode
    with EmbeddedLog(path) as log:
        log.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in workload.commands(100, nodes=4))
    server = LiveServer(path, processor=True)
    try:
        browser.open(server.url + "?refresh=300")
        browser.wait_for("document.getElementById('health').dataset.value === 'ok'")
        assert browser.evaluate("document.getElementById('banner').hidden")
        server.health.probes.fold_thread = type("Dead", (), {"alive": False, "error": "InvariantViolation: boom"})()
        browser.wait_for("document.getElementById('banner').dataset.kind === 'down'")
        assert "the fold stopped: InvariantViolation: boom" in browser.evaluate(
            "document.getElementById('banner').textContent"
        )
        assert browser.evaluate("document.getElementById('main').classList.contains('stale')")
        server.stop_http()
        browser.wait_for("document.getElementById('banner').dataset.kind === 'unreachable'")
        assert "unreachable" in browser.evaluate("document.getElementById('banner').textContent")
    finally:
        server.close()


def test_the_api_docs_render_offline(live: LiveServer, browser: Chromium) -> None:
    """/docs draws every route from /openapi.json with the page's own script (no CDN)."""
    browser.open(live.url + "docs")
    browser.wait_for("Number(document.body.dataset.routes) > 20")
    assert "Bearer" in browser.evaluate("document.body.textContent")
