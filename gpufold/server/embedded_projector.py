"""The projector over the embedded log, in a background thread of ``gpufold serve``: the server projects as it folds.

With ``--log`` and ``--database-url`` (what ``make demo`` runs), the processor thread commits events and
this thread projects them into the database within a poll interval, so ``/v1/utilization``, ``/metrics``
and ``/v1/commands/{id}`` follow the log as the replica's routes do. ``--no-projector`` leaves projecting
to ``gpufold projector run``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from projections.projector import Projector
from projections.runner import run
from projections.sources import EmbeddedEventSource

log = logging.getLogger("gpufold.serve.projector")


class _Waiting:
    """An event source whose ``poll`` waits a little when there is nothing new (the embedded one returns at
    once, so the runner's reader would spin)."""

    def __init__(self, source: EmbeddedEventSource, pause: float) -> None:
        self._source = source
        self._pause = pause

    def poll(self, max_records: int, timeout: float) -> list[Any]:
        batch = self._source.poll(max_records, timeout)
        if not batch:
            time.sleep(min(timeout, self._pause))
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


def use_wal(engine: Engine) -> None:
    """SQLite: write-ahead logging, so the API reads while this thread writes (the file keeps the setting)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode = WAL")

    @event.listens_for(engine, "connect")
    def busy_timeout(connection: Any, record: Any) -> None:
        connection.execute("PRAGMA busy_timeout = 10000")


class EmbeddedProjector:
    """Projects the embedded log's events into the database until stopped (its own engine and thread)."""

    def __init__(self, path: str | os.PathLike[str], engine: Engine, poll: float = 0.05) -> None:
        self.path = path
        self.engine = engine
        self.poll = poll
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufold-projector", daemon=True)

    def start(self) -> EmbeddedProjector:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            source = EmbeddedEventSource(Path(self.path))
        except Exception as error:
            self.error = f"{type(error).__name__}: {error}"
            log.exception("the embedded projector could not start")
            return
        try:
            run(Projector(self.engine, source.name), _Waiting(source, self.poll), poll_timeout=self.poll,  # type: ignore[arg-type]
                stop=self._stop, pipeline=False)  # fmt: skip
        except Exception as error:
            self.error = f"{type(error).__name__}: {error}"
            log.exception("the embedded projector stopped")
        finally:
            source.close()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
