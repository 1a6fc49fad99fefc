"""The dashboard in a real headless browser (Debian's Chromium): summary first, the queue in scheduling order
with live explain, running pods, gangs, quotas, disruption budgets, disruptions, the GPU grid folded by model
with a node panel, state in the URL, 390 px without sideways scrolling, refresh by ETag, and banners when the
data is not live.
Screenshots go to build/artifacts/ (the README's come from there)."""

from __future__ import annotations

import json
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
from processor.core.state import Halt
from processor.runtime.replica import Replica
from schemas import COMMAND, registry
from schemas.commands import (
    AddNode,
    Command,
    Defragment,
    DrainNode,
    GangMember,
    Release,
    SetDisruptionBudget,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Taint,
    Tick,
)
from tests import workload
from tests.browser.chromium import Chromium, find_chromium

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("GPUFOLD_ARTIFACTS", REPO / "build" / "artifacts"))
MINUTE = 60_000
NONE = "\N{EN DASH}"  # what a cell shows for nothing


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

    def __init__(self, path: Path, processor: bool = False, max_lag_seconds: float = 30) -> None:
        self.writer = EmbeddedWriter(path)
        self.processor = EmbeddedProcessor(path, poll=0.02).start() if processor else None
        self.replica = Replica(EmbeddedReplicaSource(path)).start()
        assert self.replica.restored.wait(60)
        probes = Probes(replica=self.replica, fold_thread=self.processor, fold_positions=_embedded_positions(path),
                        fold_where="in this process")  # fmt: skip
        self.health = HealthMonitor(probes, max_lag_seconds=max_lag_seconds).start()
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
    """A cluster with something in every view: zones and a taint, a quota, a cohort where one tenant borrows
    what another lends, running and queued pods of several tenants and priorities, a gang that waits, a
    defragmentation that migrates two pods, preemptions, a reservation in the queue, and disruption budgets
    one of which blocks a drain (from event time
    ``t0``: after the other clusters' commands on the partition, whose clock it shares)."""
    out: list[Command] = []

    def add(payload: Any, at: int = 0) -> None:
        out.append(Command(f"lab-{len(out)}", "lab", t0 + at, payload, "test"))

    add(SetPolicy("first-fit"))
    for i in range(4):
        labels = {"zone": f"z{i % 2}", "topology/rack": f"r{i}"}
        taints = (Taint("dedicated", "ml"),) if i == 3 else ()
        add(AddNode(f"a100-{i}", 96_000, 786_432, "A100", 8, labels, taints))
    add(AddNode("t4-0", 32_000, 131_072, "T4", 2, {"zone": "z0"}))
    add(AddNode("t4-1", 32_000, 131_072, "T4", 1, {"zone": "z1"}))
    add(AddNode("h100-0", 96_000, 786_432, "H100", 8, {"zone": "z1"}))
    add(SetQuota("capped", nominal_gpus={"A100": 2}))
    add(SetQuota("lender", cohort="research", nominal_gpus={"H100": 4}))
    add(SetQuota("borrower", cohort="research", nominal_gpus={"H100": 1}))
    for i in range(3):  # 2 H100s beyond its nominal 1: borrowed from the lender's unused 4
        add(SubmitPod(f"borrow-{i}", "borrower", 0, 1, 1000, 1000, 1024, ("H100",)))
    for name, milli in (("frag-a", 300), ("frag-b", 700), ("frag-c", 300)):  # t4-0: 300 + 700 on GPU 0, 300 on 1
        add(SubmitPod(name, "t0", 0, 1, milli, 100, 128, ("T4",), movable=True))
    add(Release("frag-b"))  # two T4 GPUs a third used each: no room for two whole ones
    add(SubmitPod("t4-pair", "t0", 0, 2, 1000, 100, 128, ("T4",)))
    add(Defragment(4, "t4-pair"))  # migrates frag-a and frag-c to t4-1
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
    add(SetDisruptionBudget("keep-borrower", tenant="borrower", max_unavailable=0), at=8 * MINUTE)
    add(SetDisruptionBudget("zone-z0", label_selector={"zone": "z0"}, max_unavailable=2), at=8 * MINUTE)
    add(DrainNode("h100-0"), at=8 * MINUTE)  # the borrower's 3 pods there: their evictions are blocked
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


def shown_age(ms: int) -> str:
    """A duration as the dashboard writes it (views.js ``age``)."""
    s = int(ms / 1000 + 0.5)
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{int(s / 60 + 0.5)} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} d"


def cells(browser: Chromium, row: str, *classes: str) -> list[list[str]]:
    """The text of the cells of each ``row`` (a selector in #content), one per class."""
    picks = ", ".join(f"r.querySelector('td.{c}').textContent" for c in classes)
    return list(browser.evaluate(f"[...document.querySelectorAll('#content {row}')].map(r => [{picks}])"))


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
    shown = cells(browser, "tr.job", "age", "prio", "tenant")
    assert shown == [[shown_age(j["age_ms"]), str(j["priority"]), j["tenant"]] for j in queue["jobs"]]
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


def test_the_queue_is_searched_by_id(live: LiveServer, browser: Chromium) -> None:
    """The id search keeps each match's position in the whole queue; the gang is found by its id too."""
    browser.open(live.url + "?cluster=lab&search=wait-1&refresh=500")
    wanted = live.replica.queue("lab", search="wait-1", limit=50)["jobs"]
    assert 1 < len(wanted) < 50 and all("wait-1" in j["id"] for j in wanted)
    assert [j["position"] for j in wanted] != list(range(1, len(wanted) + 1))  # positions in the whole queue
    listed = "[...document.querySelectorAll('#content tr.job')].map(r => [r.dataset.job, r.dataset.position])"
    expected = [[j["id"], str(j["position"] or "")] for j in wanted]
    browser.wait_for(f"JSON.stringify({listed}) === '{json.dumps(expected, separators=(',', ':'))}'")
    assert browser.evaluate("document.getElementById('search-filter').value") == "wait-1"
    choose = (
        "const i = document.getElementById('search-filter'); i.value = 'train'; i.dispatchEvent(new Event('change'))"
    )
    browser.evaluate(f"(() => {{ {choose}; }})()")
    browser.wait_for(f"JSON.stringify({listed.replace('r.dataset.position', 'r.className')}) === "
                     "'[[\"train\",\"job gang\"]]'")  # fmt: skip
    assert "search=train" in browser.evaluate("location.search")


def test_the_reservation_holder_shows_its_expected_start(live: LiveServer, browser: Chromium) -> None:
    """The job the nodes are reserved for shows when it is expected to start (event time), on its page."""
    (holder,) = [j for j in live.replica.queue("lab", limit=500)["jobs"] if j["holds_reservation"]]
    assert holder["expected_start"] is not None
    (lab,) = [c for c in live.replica.clusters()["clusters"] if c["cluster"] == "lab"]
    offset = (holder["position"] - 1) // 50 * 50
    browser.open(live.url + f"?cluster=lab&offset={offset}&refresh=500")
    row = f'#content tr.job[data-job="{holder["id"]}"]'
    browser.wait_for(f"!!document.querySelector('{row}')")
    shown = browser.evaluate(f"document.querySelector('{row} td.expected').textContent")
    assert shown == "in " + shown_age(holder["expected_start"] - lab["event_time"]), shown
    others = browser.evaluate(
        f"[...document.querySelectorAll('#content tr.job')].filter(r => r.dataset.job !== '{holder['id']}')"
        ".map(r => r.querySelector('td.expected').textContent)"
    )
    assert others and set(others) == {NONE}


def test_an_open_explain_follows_the_state(live: LiveServer, browser: Chromium) -> None:
    """The explain panel is recomputed on every refresh: a pod that waits for a GPU says so, and once a node
    that holds it is added, the open panel says where it runs, without a reload."""
    at = max(live.replica.event_times().values()) + 1
    live.writer.append([
        Command("solo-0", "solo", at, AddNode("solo-cpu", 8_000, 16_384), "test"),
        Command("solo-1", "solo", at, SubmitPod("solo-pod", "t0", 0, 1, 1000, 1000, 1024), "test"),
    ])  # fmt: skip
    browser.open(live.url + "?cluster=solo&explain=solo-pod&refresh=300")
    panel = "document.querySelector('#panel .message')"
    browser.wait_for(f"document.getElementById('panel').dataset.id === 'solo-pod' && !!{panel}")
    waiting = live.replica.explain("solo", "solo-pod")
    assert waiting is not None and waiting.state == "pending"
    assert browser.evaluate(f"{panel}.textContent") == waiting.message
    live.writer.append([Command("solo-2", "solo", at + 1, AddNode("solo-gpu", 8_000, 16_384, "T4", 1), "test")])
    browser.wait_for(f"{panel}.textContent.startsWith('running on node solo-gpu')", timeout=30)
    running = live.replica.explain("solo", "solo-pod")
    assert running is not None and running.state == "running"
    assert browser.evaluate(f"{panel}.textContent") == running.message
    assert browser.evaluate("document.getElementById('panel-title').textContent") == "why solo-pod runs where it runs"


def test_running_pods_are_paged_and_filtered_by_tenant_and_node(live: LiveServer, browser: Chromium) -> None:
    """The running tab lists the replica's running pods 50 at a time; next shows 51..100; a node or tenant
    filter lists just that node's or tenant's pods, and goes into the URL."""
    total = live.replica.pods(state="running", cluster="c1", limit=1)["total"]
    assert total > 50
    browser.open(live.url + "?cluster=c1&tab=running&refresh=500")
    listed = "[...document.querySelectorAll('#content tr.pod')].map(r => r.dataset.pod)"
    first = [p["pod_id"] for p in live.replica.pods(state="running", cluster="c1", limit=50)["pods"]]
    browser.wait_for(f"JSON.stringify({listed}) === '{json.dumps(first, separators=(',', ':'))}'")
    assert f"of {total}" in browser.evaluate("document.getElementById('pager').textContent")
    browser.evaluate("document.getElementById('page-next').click()")
    second = [p["pod_id"] for p in live.replica.pods(state="running", cluster="c1", offset=50, limit=50)["pods"]]
    browser.wait_for(f"JSON.stringify({listed}) === '{json.dumps(second, separators=(',', ':'))}'")
    assert "offset=50" in browser.evaluate("location.search")
    busiest = max(
        {p["node_id"] for p in live.replica.pods(state="running", cluster="c1", limit=1000)["pods"]},
        key=lambda n: (live.replica.pods(state="running", cluster="c1", node_id=n, limit=1)["total"], n),
    )
    on_node = [p["pod_id"] for p in live.replica.pods(state="running", cluster="c1", node_id=busiest, limit=50)["pods"]]
    assert len(on_node) > 1
    choose = "const i = document.getElementById('node-filter'); i.value = '%s'; i.dispatchEvent(new Event('change'))"
    browser.evaluate(f"(() => {{ {choose % busiest}; }})()")
    browser.wait_for(f"JSON.stringify({listed}) === '{json.dumps(on_node, separators=(',', ':'))}'")
    search = browser.evaluate("location.search")
    assert f"node={busiest}" in search and "offset" not in search
    nodes = browser.evaluate("[...document.querySelectorAll('#content tr.pod a.node-link')].map(a => a.textContent)")
    assert set(nodes) == {busiest}
    tenant = live.replica.pods(state="running", cluster="c1", node_id=busiest, limit=1)["pods"][0]["tenant"]
    both = live.replica.pods(state="running", cluster="c1", node_id=busiest, tenant=tenant, limit=50)["pods"]
    choose = "const s = document.getElementById('tenant-filter'); s.value = '%s'; s.dispatchEvent(new Event('change'))"
    browser.evaluate(f"(() => {{ {choose % tenant}; }})()")
    browser.wait_for(f"JSON.stringify({listed}) === '{json.dumps([p['pod_id'] for p in both], separators=(',', ':'))}'")


def test_quotas_show_nominal_used_borrowed_and_lent_in_their_cohort(live: LiveServer, browser: Chromium) -> None:
    """The quotas tab has a row per tenant and key with its cohort: the borrower holds 3 H100s on a nominal
    1 (2 borrowed), the lender of the same cohort shows the 2 lent; the numbers are the replica's."""
    browser.open(live.url + "?cluster=lab&tab=quotas&refresh=500")
    browser.wait_for("document.querySelectorAll('#content tr.quota').length > 0")
    rows = {(q["tenant"], q["key"]): q for q in live.replica.quotas("lab")["quotas"]}
    shown = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#content tr.quota')].map(r => [r.dataset.tenant + '|' +"
        " r.dataset.key, [...r.querySelectorAll('td')].map(td => td.textContent)]))"
    )
    assert set(shown) == {f"{t}|{k}" for t, k in rows}
    assert shown["borrower|gpu:H100"] == ["borrower", "research", "gpu:H100", "1.00", "3.00", "5.00", "2.00", "0.00"]
    assert shown["lender|gpu:H100"] == ["lender", "research", "gpu:H100", "4.00", "0.00", "4.00", "0.00", "2.00"]
    assert shown["capped|gpu:A100"][1] == NONE and shown["capped|gpu:A100"][3] == "2.00"
    browser.screenshot(ARTIFACTS / "dashboard-quotas.png", full_page=False)
    borrower = rows[("borrower", "gpu:H100")]
    assert (borrower["nominal"], borrower["used"], borrower["borrowed"]) == (1000, 3000, 2000)
    assert rows[("lender", "gpu:H100")]["lent"] == 2000


def test_disruptions_name_their_cause(live: LiveServer, browser: Chromium) -> None:
    """Preemptions say by whom and why, evictions why, migrations from where to where and why; newest first,
    as the replica keeps them."""
    browser.open(live.url + "?cluster=lab&tab=disruptions&refresh=500")
    browser.wait_for("document.querySelectorAll('#content tr.disruption').length > 0")
    events = live.replica.disruptions("lab", 100)
    shown = browser.evaluate(
        "[...document.querySelectorAll('#content tr.disruption')].map(r => [r.dataset.type,"
        " r.querySelector('td.pod').textContent, r.querySelector('td.cause').textContent])"
    )
    assert [[type(e.payload).__name__, e.payload.pod_id] for e in events] == [row[:2] for row in shown]
    browser.screenshot(ARTIFACTS / "dashboard-disruptions.png", full_page=False)
    causes = {(kind, pod): cause for kind, pod, cause in shown}
    assert causes["PodMigrated", "frag-a"] == "t4-0 → t4-1 (defragment): making room for pod 't4-pair'"
    assert causes["PodMigrated", "frag-c"] == "t4-0 → t4-1 (defragment): making room for pod 't4-pair'"
    preemptions = [e.payload for e in events if type(e.payload).__name__ == "PodPreempted"]
    (preempted,) = [p for p in preemptions if p.by == "urgent"]
    assert causes["PodPreempted", preempted.pod_id] == f"by urgent (priority): {preempted.message}"
    assert causes["PodEvicted", preempted.pod_id] == "preempted:priority"


def test_budgets_show_their_selector_limit_what_they_allow_and_the_evictions_they_block(
    live: LiveServer, browser: Chromium
) -> None:
    """The budgets tab has a row per budget: its selector, max_unavailable, the pods it counts unavailable, the
    disruptions it allows now and the drain evictions it blocks (pod on node), as the replica says."""
    browser.open(live.url + "?cluster=lab&tab=budgets&refresh=500")
    browser.wait_for("document.querySelectorAll('#content tr.budget').length === 2")
    shown = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#content tr.budget')].map(r => [r.dataset.budget,"
        " [...r.querySelectorAll('td')].map(td => td.textContent)]))"
    )
    blocked = ", ".join(f"borrow-{i} on h100-0" for i in range(3))
    assert shown["keep-borrower"] == ["keep-borrower", "tenant=borrower", "0", "0", "0", blocked]
    assert shown["zone-z0"] == ["zone-z0", "zone=z0", "2", "0", "2", NONE]
    rows = {b["budget_id"]: b for b in live.replica.disruption_budgets("lab")["budgets"]}
    assert rows["keep-borrower"]["allowed_disruptions"] == 0 and len(rows["keep-borrower"]["blocked_evictions"]) == 3
    browser.screenshot(ARTIFACTS / "dashboard-budgets.png", full_page=False)


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
    assert browser.evaluate("[...document.querySelectorAll('#grid details')].map(d => d.open)") == [False, False, False]
    summary = browser.evaluate("document.querySelector('#grid details[data-model=A100] summary').textContent")
    assert "4 nodes, 32 GPUs" in summary
    h100 = browser.evaluate("document.querySelector('#grid details[data-model=H100] summary').textContent")
    assert "1 node, 8 GPUs: 5 free, 0 shared, 3 whole" in h100
    browser.evaluate("document.querySelector('#grid details[data-model=A100] summary').click()")
    browser.wait_for("document.querySelectorAll('#grid .node').length === 4")
    browser.evaluate("document.querySelector('#grid .node[data-node=\"a100-3\"]').click()")
    browser.wait_for("document.getElementById('panel').dataset.id === 'a100-3'")
    text = browser.evaluate("document.getElementById('panel-body').textContent")
    assert "dedicated=ml:NoSchedule" in text and "zone=z1" in text
    node = live.replica.node("lab", "a100-3")
    assert node is not None
    listed = "[...document.querySelectorAll('#panel tr.pod')].map(r => r.dataset.pod)"
    assert browser.evaluate(listed) == [p["pod_id"] for p in node["pod_list"]] == []
    browser.evaluate("document.querySelector('#grid .node[data-node=\"a100-0\"]').click()")
    browser.wait_for("document.getElementById('panel').dataset.id === 'a100-0'")
    busy = live.replica.node("lab", "a100-0")
    assert busy is not None and busy["pod_list"]
    assert browser.evaluate(listed) == [p["pod_id"] for p in busy["pod_list"]]
    assert "a100-0" in browser.evaluate("location.search")
    browser.screenshot(ARTIFACTS / "dashboard-nodes.png", full_page=False)


def test_gangs_with_their_members_and_what_they_wait_for(live: LiveServer, browser: Chromium) -> None:
    """A gang's row says its state, tenant, members placed of the minimum and what it waits for; the row opens
    its explain with each member."""
    browser.open(live.url + "?cluster=lab&tab=gangs&refresh=500")
    browser.wait_for("!!document.querySelector('#content tr.gang[data-gang=train]')")
    (gang,) = live.replica.gangs("lab")["gangs"]
    cells_of = "[...document.querySelector('#content tr.gang[data-gang=train]').querySelectorAll('td')]"
    row = browser.evaluate(f"{cells_of}.map(t => t.textContent)")
    assert row[:5] == ["train", gang["state"], "t1", "0", f"{gang['placed']}/{gang['min_members']} of 2"]
    assert gang["state"] == "pending" and row[6] == (", ".join(gang["waiting_for"]) or NONE)
    browser.evaluate("document.querySelector('#content tr.gang[data-gang=train]').click()")
    browser.wait_for("document.getElementById('panel').dataset.id === 'train'")
    members = browser.evaluate("[...document.querySelectorAll('#panel tbody tr')].map(r => r.firstChild.textContent)")
    assert members == ["w0", "w1"]
    explained = live.replica.explain("lab", "train")
    assert explained is not None
    assert browser.evaluate("document.querySelector('#panel .message').textContent") == explained.message


def test_works_at_390_px_without_sideways_scrolling(live: LiveServer) -> None:
    """On a phone-sized screen every view fits its width (no horizontal scroll), the explain panel too."""
    phone = Chromium(chromium_binary(), width=390, height=844, mobile=True)
    try:
        for tab in ("queue", "running", "gangs", "quotas", "budgets", "disruptions", "nodes"):
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
        phone.open(live.url + "?cluster=lab&tab=nodes&nodepanel=a100-0&refresh=500")
        phone.wait_for(
            "document.getElementById('panel').dataset.id === 'a100-0' && !!document.querySelector('#panel tr.pod')"
        )
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        panel = phone.evaluate("document.getElementById('panel').getBoundingClientRect().right")
        assert panel <= 390, panel
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
    """A fold behind by more than the allowed lag is an amber banner saying by how much; a dead fold is a red
    one with why; a fold caught up again clears it; a halted cluster and a server gone are red ones too; each
    greys the numbers."""
    path = tmp_path / "log.sqlite"
    encode = registry().codec(COMMAND).encode
    with EmbeddedLog(path) as log:
        log.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in workload.commands(100, nodes=4))
    server = LiveServer(path, processor=True, max_lag_seconds=1)
    banner = "document.getElementById('banner')"
    try:
        browser.open(server.url + "?refresh=300")
        browser.wait_for("document.getElementById('health').dataset.value === 'ok'")
        assert browser.evaluate(f"{banner}.hidden")
        processor = server.processor
        assert processor is not None
        processor.stop()  # the fold stops folding, but its probe says it is alive: only the lag tells
        server.health.probes.fold_thread = type("Alive", (), {"alive": True, "error": None})()
        at = max(server.replica.event_times().values()) + 1
        server.writer.append([Command("late-1", "c1", at, Tick(), "test")])
        browser.wait_for(f"{banner}.dataset.kind === 'stale'", timeout=30)
        text = browser.evaluate(f"{banner}.textContent")
        assert text.startswith("Behind: the fold is") and "1 command(s) not folded" in text, text
        assert browser.evaluate("document.getElementById('main').classList.contains('stale')")
        assert browser.evaluate("document.getElementById('health').dataset.value") == "problem"

        server.health.probes.fold_thread = type("Dead", (), {"alive": False, "error": "InvariantViolation: boom"})()
        browser.wait_for(f"{banner}.dataset.kind === 'down'")
        assert "the fold stopped: InvariantViolation: boom" in browser.evaluate(f"{banner}.textContent")
        assert browser.evaluate("document.getElementById('main').classList.contains('stale')")

        server.processor = EmbeddedProcessor(path, poll=0.02).start()  # the fold again: it catches up
        server.health.probes.fold_thread = server.processor
        browser.wait_for(f"{banner}.hidden && document.getElementById('health').dataset.value === 'ok'", timeout=30)
        assert not browser.evaluate("document.getElementById('main').classList.contains('stale')")

        (c1,) = [s.clusters["c1"] for s in server.replica.states.values() if "c1" in s.clusters]
        c1.halted = Halt(command_id="c-9", offset=7, error="RecursionError")  # as the fold leaves a cluster it halts
        at = max(server.replica.event_times().values()) + 1
        server.writer.append([Command("after-halt", "c1", at, Tick(), "test")])  # refused: CLUSTER_HALTED
        browser.wait_for(f"{banner}.dataset.kind === 'down'", timeout=30)
        assert browser.evaluate(f"{banner}.textContent") == "Cluster c1 is halted: RecursionError"
        # The banner reads the replica's clusters, the health line the monitor's last sample (up to half a second
        # behind): the next refresh brings the halt there too.
        browser.wait_for("document.getElementById('health-sub').textContent.includes(\"cluster 'c1' is halted\")")

        server.stop_http()
        browser.wait_for(f"{banner}.dataset.kind === 'unreachable'")
        assert "unreachable" in browser.evaluate(f"{banner}.textContent")
        assert browser.evaluate("document.getElementById('main').classList.contains('stale')")
    finally:
        server.close()


def test_the_api_docs_render_offline(live: LiveServer, browser: Chromium) -> None:
    """/docs draws every route from /openapi.json with the page's own script (no CDN)."""
    browser.open(live.url + "docs")
    browser.wait_for("Number(document.body.dataset.routes) > 20")
    assert "Bearer" in browser.evaluate("document.body.textContent")
