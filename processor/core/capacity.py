"""The capacity index: schedulable nodes grouped by free-capacity signature.

Nodes with equal :class:`~processor.core.resources.Signature` are interchangeable, so
a placement looks at groups, not nodes: ``feasible(shape)`` visits the groups of
the allowed GPU models only and returns those that fit. Within a group the node
with the smallest id is the one used (ties break on node id).

Complexity: ``add``/``remove``/``update`` are O(log g) (g = nodes in the group,
a sorted list); ``feasible`` is O(S_m), S_m = distinct signatures among the
schedulable nodes of the allowed models. S_m is bounded by how many distinct
node types and free-capacity states exist, not by the number of nodes: 100,000
identical idle nodes are one group.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

from processor.core.resources import (
    NodeClass,
    PodShape,
    Signature,
    class_admits,
    first_misfit,
    gpu_fits,
    gpu_memory_fits,
)
from schemas.codes import QueueReasonCode
from schemas.commands import GPU_MILLI

ADMITS_CACHE_SIZE = 65_536


def _headroom(signature: Signature) -> tuple[int, int]:
    """(whole free GPUs, largest free share): all a GPU request is checked against."""
    free = signature.gpu_free  # sorted descending
    return (sum(1 for milli in free if milli >= GPU_MILLI), free[0] if free else 0)


class NodeGroup:
    """The schedulable nodes that share one signature, kept sorted by id."""

    __slots__ = ("_first", "node_ids", "signature", "size")

    def __init__(self, signature: Signature) -> None:
        self.signature = signature
        self.node_ids: SortedList = SortedList()
        self.size = 0  # len(node_ids), kept as a plain attribute for the counting loops
        self._first = ""

    def __copy__(self) -> NodeGroup:
        """A shallow copy (a what-if fork's): compiled, ``copy.copy`` cannot make one without calling ``__init__``."""
        twin = NodeGroup(self.signature)
        twin.node_ids, twin.size, twin._first = self.node_ids, self.size, self._first
        return twin

    def first(self) -> str:
        """The node used when this group is chosen: the smallest id. O(1)."""
        return self._first

    def add(self, node_id: str) -> None:
        self.node_ids.add(node_id)
        self.size += 1
        if not self._first or node_id < self._first:
            self._first = node_id

    def discard(self, node_id: str) -> None:
        self.node_ids.remove(node_id)
        self.size -= 1
        if node_id == self._first:
            self._first = self.node_ids[0] if self.node_ids else ""

    def __len__(self) -> int:
        return self.size


class DomainFree:
    """Free capacity of the schedulable nodes that share one label value (a topology domain)."""

    __slots__ = ("cpu", "gpu_milli", "memory", "nodes", "whole_gpus")

    def __init__(self) -> None:
        self.nodes = 0
        self.whole_gpus = 0  # fully idle GPUs
        self.gpu_milli = 0  # idle GPU milli, shares included
        self.cpu = 0
        self.memory = 0

    def add(self, signature: Signature, sign: int) -> None:
        self.nodes += sign
        self.whole_gpus += sign * sum(1 for milli in signature.gpu_free if milli >= GPU_MILLI)
        self.gpu_milli += sign * sum(signature.gpu_free)
        self.cpu += sign * signature.cpu_free
        self.memory += sign * signature.memory_free


class CapacityIndex:
    """Groups of schedulable nodes, by GPU model then signature; and free capacity per label value.

    Every label of a node is a potential topology domain (``topology/rack=r7``): the
    index keeps, per label key and value, the signature groups of its nodes and the
    sum of their free capacity, updated on each node change in O(labels), so a gang
    looks at the domains of one key and the groups of one domain, never at every node.
    """

    __slots__ = ("_admits", "_buckets", "_by_model", "_domain_free", "_domain_groups", "_gpu_free", "_signature_of")

    def __init__(self) -> None:
        self._by_model: dict[str, dict[Signature, NodeGroup]] = {}
        # Idle GPU milli of the schedulable nodes, per GPU model and in all (key ""): O(1) reads for
        # policies that weigh a model's remaining supply.
        self._gpu_free: dict[str, int] = {"": 0}
        # The same groups bucketed by GPU headroom (whole free GPUs, largest free share), so
        # a pod's scan skips every group whose GPUs cannot hold it without looking at them.
        self._buckets: dict[str, dict[tuple[int, int], dict[Signature, NodeGroup]]] = {}
        self._signature_of: dict[str, Signature] = {}
        # (node class, selector, tolerations) -> admits; classes are few, so this stays small.
        self._admits: dict[tuple[NodeClass, tuple[tuple[str, str], ...], tuple[object, ...]], bool] = {}
        # label key -> value -> the groups of nodes with that label value / their summed free capacity.
        self._domain_groups: dict[str, dict[str, dict[Signature, NodeGroup]]] = {}
        self._domain_free: dict[str, dict[str, DomainFree]] = {}

    def add(self, node_id: str, signature: Signature) -> None:
        """Make a node schedulable under a signature. O(log g)."""
        groups = self._by_model.setdefault(signature.gpu_model, {})
        group = groups.get(signature)
        if group is None:
            group = groups[signature] = NodeGroup(signature)
            buckets = self._buckets.setdefault(signature.gpu_model, {})
            buckets.setdefault(_headroom(signature), {})[signature] = group
            for key, value in signature.node_class[0]:
                self._domain_groups.setdefault(key, {}).setdefault(value, {})[signature] = group
        group.add(node_id)
        self._signature_of[node_id] = signature
        free = sum(signature.gpu_free)
        self._gpu_free[signature.gpu_model] = self._gpu_free.get(signature.gpu_model, 0) + free
        self._gpu_free[""] += free
        for key, value in signature.node_class[0]:
            domains = self._domain_free.setdefault(key, {})
            domain = domains.get(value)
            if domain is None:
                domain = domains[value] = DomainFree()
            domain.add(signature, +1)

    def remove(self, node_id: str) -> None:
        """Take a node out of the index (no-op if absent). O(log g)."""
        signature = self._signature_of.pop(node_id, None)
        if signature is None:
            return
        free = sum(signature.gpu_free)
        self._gpu_free[signature.gpu_model] -= free
        self._gpu_free[""] -= free
        for key, value in signature.node_class[0]:
            domains = self._domain_free[key]
            domain = domains[value]
            domain.add(signature, -1)
            if not domain.nodes:
                del domains[value]
                if not domains:
                    del self._domain_free[key]
        groups = self._by_model[signature.gpu_model]
        group = groups[signature]
        group.discard(node_id)
        if not group.node_ids:
            del groups[signature]
            for key, value in signature.node_class[0]:
                by_value = self._domain_groups[key]
                del by_value[value][signature]
                if not by_value[value]:
                    del by_value[value]
                    if not by_value:
                        del self._domain_groups[key]
            buckets = self._buckets[signature.gpu_model]
            headroom = _headroom(signature)
            del buckets[headroom][signature]
            if not buckets[headroom]:
                del buckets[headroom]
            if not groups:
                del self._by_model[signature.gpu_model]
                del self._buckets[signature.gpu_model]

    def update(self, node_id: str, signature: Signature) -> None:
        """Move a schedulable node to its new signature. O(log g)."""
        if self._signature_of.get(node_id) == signature:
            return
        self.remove(node_id)
        self.add(node_id, signature)

    def domains(self, key: str) -> dict[str, DomainFree]:
        """The values of a label key among schedulable nodes, with their free capacity (unordered)."""
        return self._domain_free.get(key, {})

    def feasible_in(self, shape: PodShape, key: str | None, value: str | None) -> list[NodeGroup]:
        """:meth:`feasible` restricted to the nodes labelled ``key=value`` (all nodes if ``key`` is None).

        O(S_d) for the S_d signatures of the domain."""
        if key is None:
            return self.feasible(shape)
        groups = self._domain_groups.get(key, {}).get(value or "", {})
        fits = self.fits
        return [group for signature, group in groups.items() if fits(signature, shape)]

    def gpu_free(self, model: str = "") -> int:
        """Idle GPU milli on schedulable nodes of ``model`` (default: every model). O(1)."""
        return self._gpu_free.get(model, 0)

    def signature_of(self, node_id: str) -> Signature | None:
        return self._signature_of.get(node_id)

    def __contains__(self, node_id: str) -> bool:
        return node_id in self._signature_of

    def __len__(self) -> int:
        return len(self._signature_of)

    def groups(self) -> Iterator[NodeGroup]:
        """Every group, in a deterministic order (model, then signature). O(S log S)."""
        for model in sorted(self._by_model):
            groups = self._by_model[model]
            for signature in sorted(groups):
                yield groups[signature]

    def admits(self, node_class: NodeClass, shape: PodShape) -> bool:
        key = (node_class, shape.node_selector, shape.tolerations)
        result = self._admits.get(key)
        if result is None:
            if len(self._admits) >= ADMITS_CACHE_SIZE:
                self._admits.clear()  # a cache only: bounded, and results never depend on it
            result = self._admits[key] = class_admits(node_class, shape)
        return result

    def fits(self, signature: Signature, shape: PodShape) -> bool:
        """Whether nodes of this signature can take the shape. O(1) amortised."""
        if shape.gpu_models and signature.gpu_model not in shape.gpu_models:
            return False
        return (
            signature.cpu_free >= shape.cpu_milli
            and signature.memory_free >= shape.memory_mib
            and gpu_fits(signature.gpu_free, shape.num_gpu, shape.gpu_milli)
            and (
                not shape.gpu_memory_mib
                or gpu_memory_fits(signature.gpu_memory, shape.num_gpu, shape.gpu_milli, shape.gpu_memory_mib)
            )
            and self.admits(signature.node_class, shape)
        )

    def feasible(self, shape: PodShape) -> list[NodeGroup]:
        """The groups whose nodes can take the shape, in insertion order. O(S_m).

        This is the hottest loop of the fold: groups are visited by GPU headroom
        bucket, and a bucket whose whole free GPUs (or largest free share) cannot
        hold the pod is skipped whole; within a bucket only CPU, memory and the
        taint/selector class are checked.
        """
        models = shape.gpu_models or tuple(self._by_model)
        num_gpu, gpu_milli = shape.num_gpu, shape.gpu_milli
        cpu, memory = shape.cpu_milli, shape.memory_mib
        whole = gpu_milli >= GPU_MILLI
        # A pod with no selector and no tolerations fits any untainted node class.
        plain = not shape.node_selector and not shape.tolerations
        gpu_memory = shape.gpu_memory_mib  # checked only for a pod that asks for GPU memory
        admits = self.admits
        found: list[NodeGroup] = []
        append = found.append
        for model in models:
            buckets = self._buckets.get(model)
            if not buckets:
                continue
            for (free_whole, largest), groups in buckets.items():
                if num_gpu and ((free_whole < num_gpu) if whole else (largest < gpu_milli)):
                    continue
                for signature, group in groups.items():
                    _, node_class, _, _, _, cpu_free, memory_free, pairs = signature
                    if cpu_free < cpu or memory_free < memory:
                        continue
                    if gpu_memory and pairs and not gpu_memory_fits(pairs, num_gpu, gpu_milli, gpu_memory):
                        continue
                    if (plain and not node_class[1]) or admits(node_class, shape):
                        append(group)
        return found

    def misfit_counts(self, shape: PodShape) -> dict[str, int]:
        """Schedulable nodes by the first check they fail for the shape (``first_misfit``'s order). O(S).

        Counting needs no order, so groups are visited unsorted; a whole model that
        is not allowed is counted without looking at its signatures. This runs for
        every pod that is queued, so for the common pod (no selector, no
        tolerations) on an untainted node the checks are inlined and the GPU check
        is answered once per headroom bucket, as in :meth:`feasible`; any other
        class goes through :func:`first_misfit`.
        """
        counts: dict[str, int] = {}
        allowed = shape.gpu_models
        num_gpu, gpu_milli = shape.num_gpu, shape.gpu_milli
        cpu, memory = shape.cpu_milli, shape.memory_mib
        whole = gpu_milli >= GPU_MILLI
        gpu_code = QueueReasonCode.INSUFFICIENT_GPU_SHARE if shape.is_share else QueueReasonCode.INSUFFICIENT_GPU
        plain = not shape.node_selector and not shape.tolerations and not shape.gpu_memory_mib
        for model, buckets in self._buckets.items():
            if allowed and model not in allowed:
                nodes = sum(group.size for groups in buckets.values() for group in groups.values())
                counts[QueueReasonCode.GPU_MODEL_MISMATCH] = counts.get(QueueReasonCode.GPU_MODEL_MISMATCH, 0) + nodes
                continue
            for (free_whole, largest), groups in buckets.items():
                gpu_short = num_gpu > 0 and ((free_whole < num_gpu) if whole else (largest < gpu_milli))
                for signature, group in groups.items():
                    code: str | None
                    if not plain or signature.node_class[1]:
                        code = first_misfit(signature, shape)
                    elif gpu_short:
                        code = gpu_code
                    elif signature.cpu_free < cpu:
                        code = QueueReasonCode.INSUFFICIENT_CPU
                    elif signature.memory_free < memory:
                        code = QueueReasonCode.INSUFFICIENT_MEMORY
                    else:
                        continue
                    if code is not None:
                        counts[code] = counts.get(code, 0) + group.size
        return counts

    def rebuilt(self, schedulable: dict[str, Signature]) -> CapacityIndex:
        """A fresh index from node signatures, for checking the incremental one."""
        index = CapacityIndex()
        for node_id in sorted(schedulable):
            index.add(node_id, schedulable[node_id])
        return index

    def content(self) -> dict[Signature, list[str]]:
        """The index as plain data (signature -> sorted node ids), for equality checks."""
        return {group.signature: list(group.node_ids) for group in self.groups()}

    def gpu_free_content(self) -> dict[str, int]:
        """The per-model idle GPU milli as plain data (models with none left out), for equality checks."""
        return {model: free for model, free in sorted(self._gpu_free.items()) if free}
