"""An in-memory index of the replica's pods by state, tenant and node, for paged listings.

The fold keeps pods in one dict per cluster; listing "the running pods of tenant t" from it would
scan and sort every pod per request. The replica updates this index after each command, for the
pods the command's events name (``update``), so a listing is a bisection plus the page:
O(log n + limit), whatever the number of pods.

Entries are ``(cluster, pod_id)`` tuples in sorted lists:

- ``state`` ("running" | "pending") -> every pod in that state;
- ``(state, tenant)`` -> that tenant's pods in that state;
- ``node_id`` -> the running pods on nodes of that id (any cluster).

It also keeps the GPU milli each tenant runs now, per cluster (usage by tenant, O(1) to read).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedList

from processor.core.state import ClusterState, Pod

STATES = ("running", "pending")
Key = tuple[str, str]  # (cluster, pod_id)


def pod_row(cluster: str, pod_id: str, pod: Pod) -> dict[str, Any]:
    """The one shape of a pod the fold knows, for the CLI (``gpufold state pods``), the API (``/v1/pods``) and
    the dashboard: ``status`` is ``running`` (with its node and GPU shares) or ``pending``, the words of the
    projection's ``pods.status`` and of ``/v1/pods?state=``."""
    spec = pod.spec
    return {
        "cluster": cluster,
        "pod_id": pod_id,
        "status": "running" if pod.running else "pending",
        "tenant": spec.tenant,
        "priority": spec.priority,
        "node_id": pod.node_id,
        "gpus": [{"index": g.index, "milli": g.milli} for g in pod.gpus],
        "num_gpu": spec.num_gpu,
        "gpu_milli": spec.gpu_milli,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
        "gpu_models": list(spec.gpu_models),
        "submitted_at": spec.submitted_at,
        "started_at": pod.started_at,
        "gang_id": spec.gang_id,
    }


@dataclass(frozen=True, slots=True)
class Entry:
    state: str
    tenant: str
    node_id: str | None
    gpu_milli: int


def entry_of(pod: Pod) -> Entry:
    return Entry("running" if pod.running else "pending", pod.spec.tenant, pod.node_id, pod.spec.gpu_milli_total)


class PodIndex:
    __slots__ = ("_by_node", "_by_state", "_by_tenant", "_entries", "_tenant_milli")

    def __init__(self) -> None:
        self._entries: dict[Key, Entry] = {}
        self._by_state: dict[str, SortedList] = {state: SortedList() for state in STATES}
        self._by_tenant: dict[tuple[str, str], SortedList] = {}
        self._by_node: dict[str, SortedList] = {}
        self._tenant_milli: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------ maintenance

    def rebuild(self, clusters: Iterable[ClusterState]) -> None:
        """Index every pod of the clusters from scratch (after a restore). O(n log n)."""
        self.__init__()  # type: ignore[misc]
        for cluster in clusters:
            for pod_id, pod in cluster.pods.items():
                self._add((cluster.name, pod_id), entry_of(pod))

    def update(self, cluster: ClusterState, pod_id: str) -> None:
        """Bring one pod's entries in line with the state (added, moved, or gone). O(log n)."""
        key = (cluster.name, pod_id)
        pod = cluster.pods.get(pod_id)
        new = entry_of(pod) if pod is not None else None
        old = self._entries.get(key)
        if old == new:
            return
        if old is not None:
            self._remove(key, old)
        if new is not None:
            self._add(key, new)

    def _add(self, key: Key, entry: Entry) -> None:
        self._entries[key] = entry
        self._by_state[entry.state].add(key)
        tenant = self._by_tenant.get((entry.state, entry.tenant))
        if tenant is None:
            tenant = self._by_tenant[(entry.state, entry.tenant)] = SortedList()
        tenant.add(key)
        if entry.node_id is not None:
            node = self._by_node.get(entry.node_id)
            if node is None:
                node = self._by_node[entry.node_id] = SortedList()
            node.add(key)
            if entry.gpu_milli:
                usage = (key[0], entry.tenant)
                self._tenant_milli[usage] = self._tenant_milli.get(usage, 0) + entry.gpu_milli

    def _remove(self, key: Key, entry: Entry) -> None:
        del self._entries[key]
        self._by_state[entry.state].remove(key)
        tenant = self._by_tenant[(entry.state, entry.tenant)]
        tenant.remove(key)
        if not tenant:
            del self._by_tenant[(entry.state, entry.tenant)]
        if entry.node_id is not None:
            node = self._by_node[entry.node_id]
            node.remove(key)
            if not node:
                del self._by_node[entry.node_id]
            if entry.gpu_milli:
                usage = (key[0], entry.tenant)
                left = self._tenant_milli[usage] - entry.gpu_milli
                if left:
                    self._tenant_milli[usage] = left
                else:
                    del self._tenant_milli[usage]

    # ------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, cluster: str, pod_id: str) -> Entry | None:
        return self._entries.get((cluster, pod_id))

    def tenant_gpu_milli(self) -> dict[tuple[str, str], int]:
        """(cluster, tenant) -> GPU milli its running pods hold now."""
        return dict(self._tenant_milli)

    def tenant_counts(self, cluster: str) -> dict[tuple[str, str], int]:
        """(state, tenant) -> pods of the cluster. O(T log n) for T tenants."""
        counts = {}
        for key, sl in self._by_tenant.items():
            count = _count(sl, cluster)
            if count:
                counts[key] = count
        return counts

    def query(
        self,
        *,
        state: str | None = None,
        cluster: str | None = None,
        tenant: str | None = None,
        node_id: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> tuple[list[Key], int]:
        """One page of (cluster, pod_id), sorted, and the number of pods that match.

        The narrowest list answers: the node's (few pods), else the tenant's, else the state's;
        a cluster is a contiguous range of any list (entries sort by cluster first).
        """
        states = STATES if state is None else (state,)
        if node_id is not None:
            if "running" not in states:
                return [], 0
            base = self._by_node.get(node_id)
            keys = [] if base is None else list(_range(base, cluster))
            keys = [k for k in keys if tenant is None or self._entries[k].tenant == tenant]
            return keys[offset : offset + limit], len(keys)
        lists = [self._by_tenant.get((s, tenant)) if tenant is not None else self._by_state[s] for s in states]
        present = [sl for sl in lists if sl]
        total = sum(_count(sl, cluster) for sl in present)
        if len(present) == 1:
            page = _page(present[0], cluster, offset, limit)
        else:
            merged = heapq.merge(*(_range(sl, cluster) for sl in present))
            page = list(itertools.islice(merged, offset, offset + limit))
        return page, total


def _bounds(sl: SortedList, cluster: str | None) -> tuple[int, int]:
    if cluster is None:
        return 0, len(sl)
    # (cluster,) sorts before every (cluster, pod); (cluster + "\0",) after them (ids hold no NUL).
    return sl.bisect_left((cluster,)), sl.bisect_left((cluster + "\0",))


def _count(sl: SortedList, cluster: str | None) -> int:
    low, high = _bounds(sl, cluster)
    return high - low


def _range(sl: SortedList, cluster: str | None) -> Iterator[Key]:
    low, high = _bounds(sl, cluster)
    return sl.islice(low, high)  # type: ignore[no-any-return]


def _page(sl: SortedList, cluster: str | None, offset: int, limit: int) -> list[Key]:
    low, high = _bounds(sl, cluster)
    start = min(low + offset, high)
    return list(sl.islice(start, min(start + limit, high)))
