"""The cyclic collector kept off the folded state (processor.runtime.collector): a processor collects and
freezes between batches every FREEZE_EVERY commands, and once it restores a state that large (issue #20: a full
collection walked the whole state inside whichever command set it off, up to ~250 ms at 100,000 pods)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from logs.embedded import EmbeddedLog
from processor.runtime.collector import FREEZE_EVERY, Collector
from processor.runtime.loop import Processor
from schemas.commands import AddNode, Command, SubmitPod
from schemas.fastcodec import encode_command


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Every test starts and ends with nothing frozen (the test process's objects go back to the collector)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_it_freezes_every_so_many_commands_and_only_then() -> None:
    collector = Collector(every=3)
    assert collector.folded(1) == 0.0 and collector.folded(1) == 0.0
    assert gc.get_freeze_count() == 0 and collector.freezes == 0
    assert collector.folded(1) > 0.0
    assert gc.get_freeze_count() > 0 and collector.freezes == 1 and collector.since == 0
    gc.unfreeze()
    assert collector.folded(5) > 0.0 and collector.freezes == 2  # a batch past the mark freezes once


def test_a_restored_state_is_frozen_only_if_it_is_large() -> None:
    collector = Collector(every=100)
    assert collector.restored(99) == 0.0 and gc.get_freeze_count() == 0
    assert collector.restored(100) > 0.0 and gc.get_freeze_count() > 0
    assert Collector(every=0).restored(10**9) == 0.0 and Collector(every=0).folded(10**9) == 0.0
    assert FREEZE_EVERY == 10_000


def test_a_frozen_state_is_still_freed_by_its_reference_counts() -> None:
    import weakref

    class Thing:
        pass

    thing = Thing()
    alive = weakref.ref(thing)
    Collector().now()
    assert gc.get_freeze_count() > 0
    del thing
    assert alive() is None  # no collection needed: the fold's state holds no cycle


def test_the_processor_freezes_between_batches(tmp_path: Path) -> None:
    commands = [Command("n", "c", 1_000, AddNode("n1", 64_000, 65_536, "A100", 8), "test")]
    commands += [
        Command(f"p{i}", "c", 2_000 + i, SubmitPod(f"p{i}", num_gpu=0, gpu_milli=0), "test") for i in range(15)
    ]
    with EmbeddedLog(tmp_path / "log.sqlite", partitions=1) as log:
        log.append_commands((c.cluster.encode(), encode_command(c)) for c in commands)
        processor = Processor(log, batch_size=4, freeze_every=5, pipeline=False)
        assert processor.run_until_idle() == 16
        assert processor.collector.freezes == 2  # batches of 4: after 8 commands and after 16
        assert gc.get_freeze_count() > 0 and processor.times.cpu["gc"] >= 0.0 and processor.times.wall["gc"] > 0.0
        gc.unfreeze()
        restored = Processor(log, freeze_every=10)
        restored.folder(0)  # a state of 16 commands: frozen as it is restored
        assert restored.collector.freezes == 1 and gc.get_freeze_count() > 0
