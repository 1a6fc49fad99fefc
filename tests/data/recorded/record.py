"""How ``contract-v1.jsonl`` was recorded: a log written with the contract of v1, kept to replay after every change.

Run once, on the commit that introduced the recorded log (the contract of
``schemas/history/v1``). **Never rerun it to make the test pass**: the file is
the evidence that logs written by older releases still decode and fold to the
same decisions. A later contract version records a new file beside it.

    .venv/bin/python tests/data/recorded/record.py tests/data/recorded/contract-v1.jsonl

Each line is one record (JSON): ``{"kind": "command", "offset", "key", "value"}`` with the
frame in base64 (some are garbage bytes, which dead-letter), then every output the
processor published for it (``{"kind": "output", "offset", "topic", "value"}``), and
last ``{"kind": "snapshot", "value"}``: the partition's final snapshot frame.
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
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
)
from schemas.fastcodec import encode_command
from schemas.topics import Topics

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CLUSTERS = ("lab", "prod")
MODELS = ("A100", "H100", "T4")


def stream(seed: int = 20261201, count: int = 1600) -> list[bytes | None]:
    """Frames of a mixed stream over two clusters: every command type, rejections, garbage."""
    rng = random.Random(seed)
    frames: list[bytes | None] = []
    t = START_MS
    ids = 0
    nodes: dict[str, list[str]] = {c: [] for c in CLUSTERS}
    pods: dict[str, list[str]] = {c: [] for c in CLUSTERS}
    made = 0

    def put(cluster: str, payload: object, *, reuse_id: str | None = None, back: int = 0) -> None:
        nonlocal t, ids
        ids += 1
        t += rng.choice((0, 500, 1_000, 60_000))
        command_id = reuse_id or f"{cluster}-{ids}"
        frames.append(encode_command(Command(command_id, cluster, t - back, payload, "recorder")))  # type: ignore[arg-type]

    for cluster in CLUSTERS:
        for i in range(12):
            node = f"{cluster}-n{i:02d}"
            model = MODELS[i % 3]
            labels = {"topology/rack": f"r{i // 4}", "zone": f"z{i % 2}"}
            taints = (Taint("dedicated", "ml"),) if i == 11 else ()
            put(cluster, AddNode(node, 64_000, 262_144, model, 8 if model != "T4" else 4, labels, taints))
            nodes[cluster].append(node)
    for _ in range(count):
        cluster = rng.choice(CLUSTERS)
        roll = rng.random()
        if roll < 0.42:
            made += 1
            num_gpu, milli = rng.choice(((1, 1000), (1, 500), (1, 250), (2, 1000), (4, 1000), (8, 1000), (0, 0)))
            models = rng.choice(((), (), ("A100",), ("H100", "A100"), ("T4",)))
            selector = rng.choice(({}, {}, {"zone": "z1"}, {"topology/rack": "r0"}))
            tolerations = rng.choice(((), (), (Toleration("dedicated", "Equal", "ml"),)))
            pod = f"{cluster}-p{made}"
            put(
                cluster,
                SubmitPod(
                    pod,
                    rng.choice(("acme", "globex", "default")),
                    rng.choice((0, 0, 10, 100)),
                    num_gpu,
                    milli,
                    rng.choice((1_000, 4_000, 16_000)),
                    rng.choice((1_024, 16_384, 65_536)),
                    models,
                    selector,
                    tolerations,
                ),
            )
            pods[cluster].append(pod)
        elif roll < 0.75 and pods[cluster]:
            pod = pods[cluster].pop(rng.randrange(len(pods[cluster])))
            put(cluster, Release(pod, rng.choice(("completed", "cancelled"))))
        elif roll < 0.78:
            put(cluster, CordonNode(rng.choice(nodes[cluster])))
        elif roll < 0.81:
            put(cluster, UncordonNode(rng.choice(nodes[cluster])))
        elif roll < 0.83:
            put(cluster, DrainNode(rng.choice(nodes[cluster])))
        elif roll < 0.84:
            put(cluster, MarkNodeFailed(rng.choice(nodes[cluster]), "xid 79"))
        elif roll < 0.85:
            node = rng.choice(nodes[cluster])
            put(cluster, RemoveNode(node, force=rng.random() < 0.5))
        elif roll < 0.87:
            made += 1
            node = f"{cluster}-extra{made}"
            put(cluster, AddNode(node, 32_000, 131_072, rng.choice(MODELS), 4, {"topology/rack": "r9"}))
            nodes[cluster].append(node)
        elif roll < 0.88:
            put(cluster, SetPolicy(rng.choice(("fgd-plus", "best-fit", "spread", "nope"))))
        elif roll < 0.90:
            put(cluster, Release("never-submitted"))  # UNKNOWN_POD
        elif roll < 0.91:
            put(cluster, SubmitPod("bad", num_gpu=2, gpu_milli=500))  # INVALID_RESOURCES
        elif roll < 0.92:
            put(cluster, SetPolicy("best-fit"), reuse_id=f"{cluster}-1")  # DUPLICATE_COMMAND
        elif roll < 0.93:
            put(cluster, Release(rng.choice(pods[cluster]) if pods[cluster] else "x"), back=3_600_000)  # late
        elif roll < 0.94:
            frames.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))  # garbage
        elif roll < 0.945:
            frames.append(None)  # a tombstone
    return frames


def main(out: Path) -> None:
    topics = Topics()
    folder = PartitionFolder(0, topics, snapshot_every=500)
    with out.open("w") as file:
        for offset, value in enumerate(stream()):
            key = None if value is None else b"recorded"
            file.write(
                json.dumps(
                    {
                        "kind": "command",
                        "offset": offset,
                        "key": key and key.decode(),
                        "value": value and base64.b64encode(value).decode(),
                    }
                )
                + "\n"
            )
            outputs: list[OutputRecord] = []
            folder.fold(InputRecord(0, offset, key, value), outputs)
            for output in outputs:
                file.write(
                    json.dumps(
                        {
                            "kind": "output",
                            "offset": offset,
                            "topic": output.topic,
                            "value": base64.b64encode(output.value).decode(),
                        }
                    )
                    + "\n"
                )
        file.write(
            json.dumps({"kind": "snapshot", "value": base64.b64encode(folder.snapshot_record().value).decode()}) + "\n"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
