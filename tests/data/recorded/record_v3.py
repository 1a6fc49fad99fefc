"""How ``contract-v3.jsonl`` was recorded: a log of contract v3 (v2's commands on a clock per cluster, with
``CLOCK_JUMP``, forced and partition-wide ``Tick``s, ``max_clock_jump_ms``, ``ResumeCluster`` of a cluster
that is not halted, Kueue's rule in a cohort, evictions placed back in queue order; and the commands and
fields v3 added: GPU memory, retries with backoff, disruption budgets and graceful drains, RecoverNode and
UpdateNode), kept to replay after every later change.

Run once, on the commit that released contract v3 (``schemas/history/v3``); **never rerun it to make a
test pass**. The file format is that of ``record.py`` (contract v1's recorder).

    .venv/bin/python tests/data/recorded/record_v3.py tests/data/recorded/contract-v3.jsonl
"""

from __future__ import annotations

import base64
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from logs.port import InputRecord, OutputRecord
from processor.runtime.loop import PartitionFolder
from schemas.commands import (
    AddNode,
    Command,
    Defragment,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    RecoverNode,
    Release,
    ReleaseGang,
    RemoveDisruptionBudget,
    RemoveQuota,
    ResumeCluster,
    Retry,
    SetDisruptionBudget,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
    UpdateNode,
)
from schemas.fastcodec import encode_command
from schemas.topics import Topics

START_MS = 1_767_225_600_000


def stream(seed: int = 20261203, count: int = 1500) -> list[bytes | None]:
    rng = random.Random(seed)
    frames: list[bytes | None] = []
    clusters = ("lab", "prod")
    clock = {"lab": START_MS, "prod": START_MS - 7 * 24 * 3_600_000}  # a week apart: a clock per cluster
    serial = 0

    def put(cluster: str, payload: object, at: int | None = None) -> None:
        nonlocal serial
        serial += 1
        clock[cluster] += rng.choice((0, 1_000, 10_000, 60_000, 120_000))
        late = 30_000 if rng.random() < 0.05 else 0
        issued = clock[cluster] - late if at is None else at
        frames.append(encode_command(Command(f"{cluster}-{serial}", cluster, issued, payload, "recorder")))  # type: ignore[arg-type]

    tenants = ("acme", "globex", "initech")
    for cluster in clusters:
        put(cluster, SetPolicy("fgd-plus", rng.choice((60_000, 300_000)), max_clock_jump_ms=6 * 3_600_000))
        for i in range(8):
            put(cluster, AddNode(f"{cluster}-n{i}", 64_000, 262_144, "H100", 8,
                                 {"topology/rack": f"r{i // 4}", "topology/block": "b0"},
                                 gpu_memory_mib=81_920))  # fmt: skip
        put(cluster, SetQuota("acme", "shared", {"*": 24}, weight=2))
        put(cluster, SetDisruptionBudget(f"{cluster}-b", tenant="globex", max_unavailable=2))
        put(cluster, SetQuota("globex", "shared", {"*": 16}, borrowing_limit_gpus=8))
    jobs: dict[str, list[str]] = {c: [] for c in clusters}
    for made in range(1, count + 1):
        cluster = rng.choice(clusters)
        roll = rng.random()
        job = f"{cluster}-j{made}"
        if roll < 0.35:
            deps = (rng.choice(jobs[cluster]),) if jobs[cluster] and rng.random() < 0.15 else ()
            put(cluster, SubmitPod(job, rng.choice(tenants), rng.choice((0, 0, 5, 10)), rng.choice((1, 1, 2, 4, 8)),
                                   1000, 4000, 16384, time_limit_ms=rng.choice((None, 60_000, 600_000)),
                                   depends_on=deps, dependency=rng.choice(("afterok", "afterany")),
                                   preemption=rng.choice(("lower_priority", "never")),
                                   movable=rng.random() < 0.3, gpu_memory_mib=rng.choice((0, 0, 20_000, 60_000)),
                                   retry=Retry(2, 60_000) if rng.random() < 0.2 else None))  # fmt: skip
            jobs[cluster].append(job)
        elif roll < 0.42:
            put(cluster, SubmitPod(job, rng.choice(tenants), 0, 1, rng.choice((250, 500)), 1000, 4096, movable=True))
            jobs[cluster].append(job)
        elif roll < 0.55:
            size = rng.choice((2, 3, 4))
            members = tuple(GangMember(f"{job}-{i}", 8, 1000, 8000, 32768) for i in range(size))
            put(cluster, SubmitGang(job, rng.choice(tenants), rng.choice((0, 5)), members,
                                    topology_required=rng.choice((None, "topology/rack")),
                                    timeout_ms=rng.choice((None, 600_000)),
                                    time_limit_ms=rng.choice((None, 900_000))))  # fmt: skip
            jobs[cluster].append(job)
        elif roll < 0.8 and jobs[cluster]:
            victim = jobs[cluster].pop(rng.randrange(len(jobs[cluster])))
            if rng.random() < 0.5:
                put(cluster, ReleaseGang(victim, rng.choice(("completed", "cancelled"))))
            put(cluster, Release(victim, rng.choice(("completed", "completed", "failed"))))
        elif roll < 0.85:
            put(cluster, Tick())
        elif roll < 0.87:
            put(cluster, Defragment(rng.choice((0, 2, 8))))
        elif roll < 0.88:
            put(cluster, MarkNodeFailed(f"{cluster}-n{rng.randrange(8)}", "xid"))
        elif roll < 0.885:
            put(cluster, DrainNode(f"{cluster}-n{rng.randrange(8)}", grace_ms=rng.choice((0, 60_000))))
        elif roll < 0.89:
            put(cluster, rng.choice((RecoverNode(f"{cluster}-n{rng.randrange(8)}"),
                                     UpdateNode(f"{cluster}-n{rng.randrange(8)}", {"topology/rack": "r9"}),
                                     RemoveDisruptionBudget(f"{cluster}-b"))))  # fmt: skip
        elif roll < 0.90:
            put(cluster, UncordonNode(f"{cluster}-n{rng.randrange(8)}"))
        elif roll < 0.91:
            put(cluster, rng.choice((RemoveQuota("globex"), SetQuota("initech", "shared", {"H100": 8}))))
        elif roll < 0.92:
            put(cluster, SubmitGang(job))  # rejected: no members
        elif roll < 0.93:
            frames.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
        elif roll < 0.94:
            put(cluster, Tick(), at=clock[cluster] + 48 * 3_600_000)  # refused: CLOCK_JUMP
        elif roll < 0.945:
            clock[cluster] += 12 * 3_600_000
            put(cluster, Tick(force=True), at=clock[cluster])  # a deliberate jump
        elif roll < 0.95:
            put(cluster, ResumeCluster("recorder"))  # refused: NOT_HALTED
        elif roll < 0.955:
            put(cluster, Tick(partition=True), at=max(clock.values()))  # the processor's partition-wide tick
        else:
            put(cluster, Tick())
    return frames


def main(out: Path) -> None:
    folder = PartitionFolder(0, Topics(), snapshot_every=500)
    with out.open("w") as file:
        for offset, value in enumerate(stream()):
            key = None if value is None else b"recorded"
            row = {"kind": "command", "offset": offset, "key": key and key.decode(),
                   "value": value and base64.b64encode(value).decode()}  # fmt: skip
            file.write(json.dumps(row) + "\n")
            outputs: list[OutputRecord] = []
            folder.fold(InputRecord(0, offset, key, value), outputs)
            for output in outputs:
                row = {"kind": "output", "offset": offset, "topic": output.topic,
                       "value": base64.b64encode(output.value).decode()}  # fmt: skip
                file.write(json.dumps(row) + "\n")
        row = {"kind": "snapshot", "value": base64.b64encode(folder.snapshot_record().value).decode()}
        file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
