"""The processor over the embedded log, in a background thread of ``gpufold serve`` (the one-machine default)."""

from __future__ import annotations

import logging
import os
import threading

from logs.embedded import EmbeddedLog, FencedError
from processor.runtime.loop import Processor
from processor.runtime.ticks import TickSchedule
from schemas.fastcodec import encode_command

log = logging.getLogger("gpufold.serve.processor")


class EmbeddedProcessor:
    """Folds the embedded log's new commands as they arrive (its own SQLite handle, in its own thread)."""

    def __init__(self, path: str | os.PathLike[str], poll: float = 0.1, tick_interval: float = 0.0) -> None:
        self.path = path
        self.poll = poll
        self.tick_interval = tick_interval
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufold-processor", daemon=True)

    def start(self) -> EmbeddedProcessor:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            ticks = TickSchedule(self.tick_interval)
            with EmbeddedLog(self.path) as handle:
                processor = Processor(handle)
                while not self._stop.is_set():
                    processor.run_batch(self.poll)
                    due = ticks.due([folder.state for folder in processor.folders.values()], "serve")
                    if due:  # event time moves in quiet partitions, so deadlines fire (as gpufold run --follow)
                        handle.append_commands((c.cluster.encode(), encode_command(c)) for c in due)
        except FencedError as error:
            self.error = f"another processor folds this log: {error}"
            log.error("%s", self.error)
        except Exception as error:
            self.error = f"{type(error).__name__}: {error}"
            log.exception("the embedded processor stopped")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
