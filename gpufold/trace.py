"""The openb trace (Alibaba, 2023): load node and pod CSVs and turn them into fold commands.

The node list has columns ``sn,cpu_milli,memory_mib,gpu,model``; pod lists have
``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and optionally ``gpu_spec`` (allowed
models separated by ``|``) and ``creation_time``/``deletion_time`` (seconds). The
default node and pod lists are bundled in ``gpufold/data`` (see ATTRIBUTION.md there).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from schemas.commands import AddNode, Command, SubmitPod

DATA = resources.files("gpufold") / "data"
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: 1000 for whole GPUs, the share for a GPU-sharing pod, 0 for none
    gpu_models: tuple[str, ...] = ()
    creation_time: int | None = None
    deletion_time: int | None = None

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli


def default_path(name: str) -> Path:
    """The path of a bundled data file."""
    return Path(str(DATA / name))


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [column for column in required if column not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            return [(number, row) for number, row in enumerate(reader, start=2)]
    except OSError as error:
        raise TraceError(f"{path}: {error.strerror or error}") from error


def _int(path: Path, number: int, row: dict[str, str], column: str, default: int | None = None) -> int:
    value = (row.get(column) or "").strip()
    if not value:
        if default is not None:
            return default
        raise TraceError(f"{path}:{number}: column {column!r} is empty")
    try:
        return int(float(value))
    except ValueError as error:
        raise TraceError(f"{path}:{number}: column {column!r} is not a number: {value!r}") from error


def load_nodes(path: Path | str | None = None) -> list[TraceNode]:
    """The nodes of a node-list CSV, in file order."""
    path = Path(path) if path is not None else default_path(DEFAULT_NODES)
    nodes = []
    for number, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu")):
        gpu_count = _int(path, number, row, "gpu", 0)
        nodes.append(
            TraceNode(
                row["sn"].strip(),
                _int(path, number, row, "cpu_milli"),
                _int(path, number, row, "memory_mib"),
                gpu_count,
                (row.get("model") or "").strip() if gpu_count else "",
            )
        )
    return nodes


def load_pods(path: Path | str | None = None) -> list[TracePod]:
    """The pods of a pod-list CSV, in file order."""
    path = Path(path) if path is not None else default_path(DEFAULT_PODS)
    pods = []
    for number, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        spec = (row.get("gpu_spec") or "").strip()
        created = (row.get("creation_time") or "").strip()
        deleted = (row.get("deletion_time") or "").strip()
        num_gpu = _int(path, number, row, "num_gpu", 0)
        pods.append(
            TracePod(
                row["name"].strip(),
                _int(path, number, row, "cpu_milli", 0),
                _int(path, number, row, "memory_mib", 0),
                num_gpu,
                _int(path, number, row, "gpu_milli", 0) if num_gpu else 0,
                tuple(model for model in spec.split("|") if model) if spec else (),
                _int(path, number, row, "creation_time") if created else None,
                _int(path, number, row, "deletion_time") if deleted else None,
            )
        )
    return pods


def add_node(node: TraceNode, node_id: str, cluster: str, issued_at: int = 0, command_id: str = "") -> Command:
    """The AddNode command for a trace node, under the given node id."""
    payload = AddNode(node_id, node.cpu_milli, node.memory_mib, node.gpu_model, node.gpu_count)
    return Command(command_id or f"add-{node_id}", cluster, issued_at, payload, "openb-trace")


def submit_pod(pod: TracePod, pod_id: str, cluster: str, issued_at: int = 0, command_id: str = "") -> Command:
    """The SubmitPod command for a trace pod, under the given pod id."""
    payload = SubmitPod(
        pod_id,
        num_gpu=pod.num_gpu,
        gpu_milli=pod.gpu_milli,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_models=pod.gpu_models,
    )
    return Command(command_id or f"submit-{pod_id}", cluster, issued_at, payload, "openb-trace")
