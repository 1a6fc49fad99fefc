"""The dashboard in a real headless browser (Debian's Chromium): it renders the fixture's cluster with the
right counts, refreshes live, and leaves a screenshot in build/artifacts/dashboard.png."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from gpufold.server.app import create_app
from gpufold.server.writers import EmbeddedWriter
from logs.embedded import EmbeddedLog
from logs.embedded_replica import EmbeddedReplicaSource
from processor.runtime.replica import Replica
from schemas import COMMAND, registry
from schemas.commands import Command, SubmitPod
from tests import workload
from tests.browser.chromium import Chromium, find_chromium

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("GPUFOLD_ARTIFACTS", REPO / "build" / "artifacts"))


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
    """The composed app on a real port, the replica following the embedded log in its thread."""

    def __init__(self, path: Path) -> None:
        self.writer = EmbeddedWriter(path)
        self.replica = Replica(EmbeddedReplicaSource(path)).start()
        assert self.replica.restored.wait(60)
        self.port = free_port()
        config = uvicorn.Config(
            create_app(replica=self.replica, writer=self.writer), port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.replica.stop()
        self.writer.close()


@pytest.fixture()
def live(tmp_path: Path) -> Iterator[LiveServer]:
    path = tmp_path / "log.sqlite"
    encode = registry().codec(COMMAND).encode
    with EmbeddedLog(path) as log:
        commands = list(workload.commands(700, nodes=24, release_ratio=0.3))
        log.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in commands)
    server = LiveServer(path)
    yield server
    server.close()


def test_dashboard_renders_the_cluster_and_refreshes_live(live: LiveServer) -> None:
    """Counts on the page equal the replica's; a pod submitted while the page is open shows up on it."""
    binary = chromium_binary()
    (cluster,) = live.replica.clusters()["clusters"]
    nodes = live.replica.nodes(cluster="c1", limit=1000)["nodes"]
    free = sum(1 for n in nodes for g in n["gpus"] if g["allocated_milli"] == 0)
    tenants = live.replica.tenants("c1")["tenants"]
    browser = Chromium(binary)
    try:
        browser.open(live.url + "?refresh=400")
        browser.wait_for("Number(document.body.dataset.refreshes) >= 1 && document.querySelectorAll('.node').length")
        assert browser.evaluate("document.getElementById('nodes-count').dataset.value") == str(cluster["nodes"])
        assert browser.evaluate("document.getElementById('gpus-count').dataset.value") == str(cluster["gpus"])
        assert browser.evaluate("document.querySelectorAll('#grid .node').length") == cluster["nodes"]
        assert browser.evaluate("document.querySelectorAll('#grid .gpu').length") == cluster["gpus"]
        assert browser.evaluate("document.querySelectorAll('#grid .gpu[data-state=free]').length") == free
        groups = browser.evaluate("[...document.querySelectorAll('#grid .group h3')].map(h => h.textContent)")
        wanted = sorted({f"{n['gpu_model']} · zone={n['labels']['zone']}" for n in nodes})
        assert [g.split(" — ")[0] for g in groups] == wanted  # grouped by GPU model and the zone label
        assert browser.evaluate("document.getElementById('pending-count').dataset.value") == str(cluster["pending"])
        queue_rows = browser.evaluate("document.querySelectorAll('#queue tr.pod').length")
        assert queue_rows == min(cluster["pending"], 50)
        if queue_rows:
            assert browser.evaluate("document.querySelector('#queue td.reasons').textContent.length > 10")
        assert browser.evaluate("document.querySelectorAll('#tenants .tenant').length") == len(tenants)
        assert int(browser.evaluate("document.getElementById('chart').dataset.points")) >= 2
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(ARTIFACTS / "dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        before = int(browser.evaluate("document.getElementById('running-count').dataset.value"))
        pending_before = int(browser.evaluate("document.getElementById('pending-count').dataset.value"))
        pod = SubmitPod("live-pod", "acme", 100, 0, 0, 100, 100)  # no GPU: fits any node with CPU left
        live.writer.write([Command("live-1", "c1", workload.START_MS + 10**7, pod, "test")])
        browser.wait_for(
            f"Number(document.getElementById('running-count').dataset.value) + "
            f"Number(document.getElementById('pending-count').dataset.value) === {before + pending_before + 1}",
            timeout=30,
        )
    finally:
        browser.close()
