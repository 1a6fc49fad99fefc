"""Read-only views of fold states for people and scripts: nodes, pods, utilization, summary, hash.

These are the seed's ``listNodes``/``listPods``/``getUtilization`` over the
partition states of a log (each cluster lives in exactly one partition). Every
list is sorted (cluster, then id) so output is stable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from processor.core.snapshot import state_hash
from processor.core.state import ClusterState, PartitionState
from processor.runtime.pod_index import pod_row
from schemas.commands import GPU_MILLI

States = Mapping[int, PartitionState]


def _clusters(states: States, cluster: str | None = None) -> list[ClusterState]:
    found = [c for state in states.values() for c in state.clusters.values() if cluster in (None, c.name)]
    return sorted(found, key=lambda c: c.name)


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def list_nodes(states: States, cluster: str | None = None) -> list[dict[str, Any]]:
    """Every node with its capacity, what is allocated and its status."""
    rows = []
    for c in _clusters(states, cluster):
        for node_id in sorted(c.nodes):
            node = c.nodes[node_id]
            status = "failed" if node.failed else "cordoned" if node.cordoned else "ready"
            rows.append(
                {
                    "cluster": c.name,
                    "node_id": node_id,
                    "gpu_model": node.gpu_model,
                    "gpu_count": node.gpu_count,
                    "gpu_milli_allocated": node.gpu_milli_allocated,
                    "gpu_free": list(node.gpu_free),
                    "cpu_milli": node.cpu_milli,
                    "cpu_milli_allocated": node.cpu_milli - node.cpu_free,
                    "memory_mib": node.memory_mib,
                    "memory_mib_allocated": node.memory_mib - node.memory_free,
                    "pods": len(node.pods),
                    "status": status,
                }
            )
    return rows


def list_pods(states: States, cluster: str | None = None) -> list[dict[str, Any]]:
    """Every pod the fold knows, running (with its node and GPUs) or pending (``pod_index.pod_row``'s shape)."""
    return [pod_row(c.name, pod_id, c.pods[pod_id]) for c in _clusters(states, cluster) for pod_id in sorted(c.pods)]


def utilization(states: States, cluster: str | None = None) -> list[dict[str, Any]]:
    """GPU utilization per (cluster, GPU model) over nodes that have not failed; CPU-only nodes are skipped."""
    rows = []
    for c in _clusters(states, cluster):
        per_model: dict[str, dict[str, int]] = {}
        for node in c.nodes.values():
            if not node.gpu_count:
                continue
            row = per_model.setdefault(node.gpu_model, {"nodes": 0, "gpus": 0, "capacity": 0, "allocated": 0})
            row["nodes"] += 1
            row["gpus"] += node.gpu_count
            if not node.failed:
                row["capacity"] += node.gpu_count * GPU_MILLI
                row["allocated"] += node.gpu_milli_allocated
        for model in sorted(per_model):
            row = per_model[model]
            rows.append(
                {
                    "cluster": c.name,
                    "gpu_model": model,
                    "nodes": row["nodes"],
                    "gpus": row["gpus"],
                    "gpu_milli_capacity": row["capacity"],
                    "gpu_milli_allocated": row["allocated"],
                    "utilization_pct": _pct(row["allocated"], row["capacity"]),
                }
            )
    return rows


def combined_hash(states: States) -> str:
    """One hash for a log's whole state: each partition's ``state_hash``, in partition order, hashed.

    With one partition it is that partition's hash, so it matches ``state_hash`` of the state.
    """
    hashes = [state_hash(states[p]) for p in sorted(states)]
    if len(hashes) == 1:
        return hashes[0]
    return hashlib.sha256(
        "\n".join(f"{p}:{h}" for p, h in zip(sorted(states), hashes, strict=True)).encode()
    ).hexdigest()


def summary(states: States, cluster: str | None = None) -> dict[str, Any]:
    """Clusters with node and pod counts and GPU utilization, plus each partition's position and hash."""
    clusters = []
    for c in _clusters(states, cluster):
        running = sum(1 for pod in c.pods.values() if pod.running)
        clusters.append(
            {
                "cluster": c.name,
                "policy": c.policy,
                "nodes": len(c.nodes),
                "nodes_cordoned": sum(1 for n in c.nodes.values() if n.cordoned and not n.failed),
                "nodes_failed": sum(1 for n in c.nodes.values() if n.failed),
                "pods_running": running,
                "pods_queued": len(c.pods) - running,
                # Gangs waiting (queued, or for their dependencies) hold no pod yet: counted apart.
                "gangs_running": sum(1 for g in c.gangs.values() if g.placed),
                "gangs_waiting": sum(1 for g in c.gangs.values() if not g.placed),
                "gpu_milli_capacity": c.gpu_milli_capacity,
                "gpu_milli_allocated": c.gpu_milli_allocated,
                "gpu_utilization_pct": _pct(c.gpu_milli_allocated, c.gpu_milli_capacity),
            }
        )
    return {
        "partitions": [
            {
                "partition": p,
                "next_offset": states[p].next_offset,
                "events": states[p].sequence,
                "state_hash": state_hash(states[p]),
            }
            for p in sorted(states)
        ],
        "clusters": clusters,
        "state_hash": combined_hash(states),
    }


# ------------------------------------------------------------ text


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain left-aligned text table (numbers right-aligned)."""
    cells = [[str(h) for h in header]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(_is_number(row[i]) for row in rows) and bool(rows) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [cell.rjust(w) if num else cell.ljust(w) for cell, w, num in zip(row, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def render_summary(data: dict[str, Any]) -> str:
    lines = []
    if data["clusters"]:
        rows = [
            [
                c["cluster"],
                c["policy"],
                c["nodes"],
                c["nodes_cordoned"],
                c["nodes_failed"],
                c["pods_running"],
                c["pods_queued"],
                f"{c['gangs_running']}/{c['gangs_waiting']}",
                f"{c['gpu_milli_allocated'] / 1000:g}/{c['gpu_milli_capacity'] / 1000:g}",
                f"{c['gpu_utilization_pct']:.1f}%",
            ]
            for c in data["clusters"]
        ]
        header = [
            "CLUSTER",
            "POLICY",
            "NODES",
            "CORDONED",
            "FAILED",
            "RUNNING",
            "QUEUED",
            "GANGS RUN/WAIT",
            "GPUS USED",
            "GPU UTIL",
        ]
        lines.append(table(rows, header))
    else:
        lines.append("no clusters yet")
    for p in data["partitions"]:
        lines.append(
            f"partition {p['partition']}: next offset {p['next_offset']}, {p['events']} events, "
            f"state_hash {p['state_hash']}"
        )
    lines.append(f"state_hash {data['state_hash']}")
    return "\n".join(lines)


def render_nodes(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            [
                r["cluster"],
                r["node_id"],
                r["gpu_model"] or "-",
                r["gpu_count"],
                f"{r['gpu_milli_allocated'] / 1000:g}",
                f"{r['cpu_milli_allocated']}/{r['cpu_milli']}",
                f"{r['memory_mib_allocated']}/{r['memory_mib']}",
                r["pods"],
                r["status"],
            ]
            for r in rows
        ],
        ["CLUSTER", "NODE", "MODEL", "GPUS", "GPUS USED", "CPU MILLI", "MEMORY MIB", "PODS", "STATUS"],
    )


def render_pods(rows: list[dict[str, Any]]) -> str:
    def gpus(r: dict[str, Any]) -> str:
        if r["status"] == "pending":
            return f"{r['num_gpu']}x{r['gpu_milli']}" if r["num_gpu"] else "-"
        return ",".join(f"{g['index']}:{g['milli']}" for g in r["gpus"]) or "-"

    return table(
        [
            [
                r["cluster"],
                r["pod_id"],
                r["status"],
                r["node_id"] or "-",
                gpus(r),
                r["cpu_milli"],
                r["memory_mib"],
                r["priority"],
                r["tenant"],
            ]
            for r in rows
        ],
        ["CLUSTER", "POD", "STATUS", "NODE", "GPUS (IDX:MILLI)", "CPU MILLI", "MEMORY MIB", "PRIORITY", "TENANT"],
    )


def render_utilization(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            [
                r["cluster"],
                r["gpu_model"],
                r["nodes"],
                r["gpus"],
                f"{r['gpu_milli_allocated'] / 1000:g}",
                f"{r['gpu_milli_capacity'] / 1000:g}",
                f"{r['utilization_pct']:.1f}%",
            ]
            for r in rows
        ],
        ["CLUSTER", "GPU MODEL", "NODES", "GPUS", "GPUS USED", "GPUS USABLE", "UTIL"],
    )
