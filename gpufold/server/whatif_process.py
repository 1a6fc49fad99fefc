"""What-if in a forked process: a private copy of the state, a hard time budget, a bounded answer.

The replica is held still only for the moment of ``os.fork()``; the child owns a copy-on-write copy
of the whole state, folds the commands on it directly (no lock: nothing else runs in the child),
renders the answer as JSON and writes it to a pipe. The parent reads at most ``max_bytes`` and waits
at most ``seconds``: past either, it kills the child and answers 413 ``WHAT_IF_BUDGET``. So a what-if
never blocks the replica's reads or folding, a command that takes minutes costs its budget and no
more, and the CPU of folding and encoding is the child's, not the server's.

Where ``os.fork`` does not exist, the replica's in-process fork (``Replica.what_if``) answers, under
its lock, with the same budgets checked after the fact.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import os
import select
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any

from gpufold.jsonl import to_json_value
from gpufold.server.outcomes import event_json, final_outcome, subject_of
from processor.runtime.replica import Replica, WhatIf
from schemas.commands import Command
from schemas.fastcodec import encode_event

DEFAULT_SECONDS = 5.0
DEFAULT_MAX_BYTES = 4 << 20


class BudgetExceeded(Exception):
    """The what-if took longer than its time budget, or its answer is larger than its output budget."""


@dataclass(frozen=True, slots=True)
class Budget:
    seconds: float = DEFAULT_SECONDS
    max_bytes: int = DEFAULT_MAX_BYTES


def render(answer: WhatIf, *, frames: bool) -> dict[str, Any]:
    """The what-if answer as JSON: each command with where it would go, its events and its final outcome."""
    results = []
    for result in answer.results:
        payload = result.command.payload
        item: dict[str, Any] = {
            "command": to_json_value(result.command.to_avro()),
            "partition": result.partition,
            "offset": result.offset,
            "outcome": final_outcome(type(payload).__name__, subject_of(payload), result.events),
            "events": [event_json(e) for e in result.events],
        }
        if frames:
            item["frames"] = [base64.b64encode(encode_event(e)).decode() for e in result.events]
        results.append(item)
    return {
        "results": results,
        "state_hashes_after": {str(p): h for p, h in answer.state_hashes.items()},
        "replica": answer.position,
    }


def run(replica: Replica, commands: list[Command], budget: Budget, *, frames: bool, hashes: bool) -> bytes:
    """The JSON answer of a what-if, within the budget (raises :class:`BudgetExceeded`). Blocks the calling
    thread (not the replica) until the child is done."""
    if not hasattr(os, "fork"):
        return _in_process(replica, commands, budget, frames=frames, hashes=hashes)
    read_end, write_end = os.pipe()
    with replica.frozen():
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(replica, commands, write_end, read_end, frames=frames, hashes=hashes)
    os.close(write_end)
    try:
        return _collect(pid, read_end, budget)
    finally:
        os.close(read_end)


def _child(replica: Replica, commands: list[Command], out: int, unused: int, *, frames: bool, hashes: bool) -> None:
    status = 0
    try:
        os.close(unused)
        gc.disable()  # a collection would touch (and so copy) every page of the state
        answer = replica.fold_here(commands, hashes=hashes)
        data = b"0" + json.dumps(render(answer, frames=frames), separators=(",", ":")).encode()
    except BaseException:  # reported to the parent, which answers 500
        data = b"1" + traceback.format_exc(limit=8).encode()[-4000:]
        status = 1
    try:
        view = memoryview(data)
        while view:
            written = os.write(out, view)
            view = view[written:]
    except BaseException:
        status = 2
    os._exit(status)


def _collect(pid: int, pipe: int, budget: Budget) -> bytes:
    deadline = time.monotonic() + budget.seconds
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BudgetExceeded(f"the what-if took longer than its budget of {budget.seconds:g} s")
            ready, _, _ = select.select([pipe], [], [], left)
            if not ready:
                continue
            chunk = os.read(pipe, 1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > budget.max_bytes + 1:
                raise BudgetExceeded(
                    f"the what-if's answer is larger than its budget of {budget.max_bytes} bytes "
                    "(ask about fewer commands, or without frames)"
                )
            chunks.append(chunk)
    except BudgetExceeded:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    if not data or data[:1] != b"0":
        raise RuntimeError("the what-if failed: " + data[1:].decode(errors="replace")[-2000:])
    return data[1:]


def _in_process(replica: Replica, commands: list[Command], budget: Budget, *, frames: bool, hashes: bool) -> bytes:
    started = time.monotonic()
    data = json.dumps(render(replica.what_if(commands, hashes=hashes), frames=frames), separators=(",", ":"))
    if time.monotonic() - started > budget.seconds:
        raise BudgetExceeded(f"the what-if took longer than its budget of {budget.seconds:g} s")
    if len(data) > budget.max_bytes:
        raise BudgetExceeded(f"the what-if's answer is larger than its budget of {budget.max_bytes} bytes")
    return data.encode()
