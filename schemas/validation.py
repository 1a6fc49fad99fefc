"""The checks a command must pass that need no cluster state: one definition for the fold and for clients.

The fold runs them first in each handler (so a bad command is a ``CommandRejected``
with the same code and message everywhere); :class:`producers.publisher.CommandPublisher`
runs :func:`check_command` before sending, so a client hears about a bad argument
at once instead of from a rejection event. Checks that need the cluster (does the
node exist, does any node have this GPU model, is the pod id taken) stay in the fold.

Every function is pure and raises :class:`~schemas.codes.Rejected` with a
machine-readable code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from schemas.codes import Rejected, RejectionCode
from schemas.commands import (
    AFTER_OK,
    ANY_MODEL,
    BORROW_MODES,
    DEPENDENCY_TYPES,
    DISRUPT_ALL,
    DISRUPTION_MODES,
    GPU_MILLI,
    PREEMPT_LOWER,
    PREEMPTION_MODES,
    QUEUE_ORDERS,
    RECLAIM_MODES,
    WITHIN_TENANT_MODES,
    AddNode,
    Command,
    CordonNode,
    Defragment,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Quota,
    RecoverNode,
    Release,
    ReleaseGang,
    RemoveCohort,
    RemoveDisruptionBudget,
    RemoveNode,
    RemoveQuota,
    ResumeCluster,
    Retry,
    SetCohort,
    SetDisruptionBudget,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Taint,
    Tick,
    UncordonNode,
    UpdateNode,
)
from schemas.limits import (
    MAX_CPU_MILLI,
    MAX_GANG_TEXT,
    MAX_GPU_MODELS,
    MAX_GPUS_PER_NODE,
    MAX_ID_LENGTH,
    MAX_ISSUED_AT,
    MAX_LABELS,
    MAX_MEMORY_MIB,
    MAX_NODE_SELECTOR,
    MAX_REASON_LENGTH,
    MAX_SOURCE_LENGTH,
    MAX_TAINTS,
    MAX_TOLERATIONS,
    MAX_VALUE_LENGTH,
    show,
    spec_text,
)

POLICY_NAMES = (
    "best-fit",
    "best-fit-paper",
    "dot-product",
    "fgd",
    "fgd-pack",
    "fgd-plus",
    "first-fit",
    "gpu-clustering",
    "gpu-packing",
    "random",
    "spread",
)
"""The placement policies a ``SetPolicy`` may name (sorted); the fold registers exactly these."""
MAX_DURATION_MS = 10 * 366 * 24 * 3600 * 1000  # ten years: time limits, timeouts, reservation thresholds
MAX_GANG_MEMBERS = 1024
MAX_DEPENDENCIES = 64
MAX_QUOTA_GPUS = 10_000_000  # whole GPUs in one quota entry: more than any cluster has
MAX_QUOTA_MODELS = 64
MAX_WEIGHT = 1000
MAX_MOVES = 100_000  # one Defragment
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_OPERATORS = ("Equal", "Exists")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ID = re.compile(rf"\S{{1,{MAX_ID_LENGTH}}}")


def check_id(what: str, value: Any) -> None:
    if not isinstance(value, str) or not _ID.fullmatch(value) or not value.isprintable():
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"{what} must be 1-{MAX_ID_LENGTH} printable characters without spaces, got {show(value)}",
        )


def check_range(what: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise Rejected(RejectionCode.INVALID_RESOURCES, f"{what} must be between {low} and {high}, got {value!r}")


def check_model(value: Any) -> None:
    if not isinstance(value, str) or not _MODEL_NAME.fullmatch(value):
        raise Rejected(
            RejectionCode.UNKNOWN_GPU_MODEL,
            f"GPU model {show(value)} is not a valid model name (letters, digits, '.', '_', '-'; at most 64)",
        )


def check_count(what: str, items: Any, limit: int) -> None:
    """At most ``limit`` entries (checked before the entries themselves, so the work stays bounded)."""
    if len(items) > limit:
        raise Rejected(RejectionCode.TOO_LARGE, f"at most {limit} {what} allowed, got {len(items)}")


def check_length(what: str, value: Any, limit: int) -> None:
    """A string of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise Rejected(RejectionCode.INVALID_COMMAND, f"{what} must be a string, got {show(value)}")
    if len(value) > limit:
        raise Rejected(RejectionCode.TOO_LARGE, f"{what} must be at most {limit} characters, got {len(value)}")


def check_labels(what: str, labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        check_id(f"{what} key", key)
        if not isinstance(value, str) or len(value) > MAX_VALUE_LENGTH:
            raise Rejected(
                RejectionCode.INVALID_COMMAND,
                f"{what} {show(key)} value must be a string of at most {MAX_VALUE_LENGTH}",
            )


def check_envelope(command: Command) -> None:
    check_id("command_id", command.command_id)
    check_id("cluster", command.cluster)
    if not isinstance(command.issued_at, int) or isinstance(command.issued_at, bool) or command.issued_at < 0:
        raise Rejected(
            RejectionCode.INVALID_COMMAND, f"issued_at must be epoch milliseconds >= 0, got {show(command.issued_at)}"
        )
    if command.issued_at > MAX_ISSUED_AT:
        hint = " (microseconds? issued_at is epoch milliseconds)" if command.issued_at >= 10**14 else ""
        raise Rejected(
            RejectionCode.TIME_OUT_OF_RANGE,
            f"issued_at {command.issued_at} is after {MAX_ISSUED_AT} (2099-12-31T23:59:59.999Z), "
            f"the latest time accepted{hint}",
        )
    check_length("source", command.source, MAX_SOURCE_LENGTH)


def check_add_node(command: AddNode) -> None:
    check_id("node_id", command.node_id)
    check_range("gpu_count", command.gpu_count, 0, MAX_GPUS_PER_NODE)
    check_range("cpu_milli", command.cpu_milli, 1, MAX_CPU_MILLI)
    check_range("memory_mib", command.memory_mib, 1, MAX_MEMORY_MIB)
    if command.gpu_count > 0 or command.gpu_model:
        check_model(command.gpu_model)
    if command.gpu_memory_mib:
        check_range("gpu_memory_mib", command.gpu_memory_mib, 0, MAX_MEMORY_MIB)
    _check_labels_and_taints(command.labels, command.taints)


def _check_labels_and_taints(labels: dict[str, str], taints: tuple[Taint, ...]) -> None:
    check_count("labels", labels, MAX_LABELS)
    check_count("taints", taints, MAX_TAINTS)
    check_labels("label", labels)
    for taint in taints:
        check_id("taint key", taint.key)
        check_length("taint value", taint.value, MAX_VALUE_LENGTH)
        if taint.effect not in TAINT_EFFECTS:
            raise Rejected(
                RejectionCode.INVALID_COMMAND, f"taint effect must be one of {TAINT_EFFECTS}, got {show(taint.effect)}"
            )


def check_update_node(command: UpdateNode) -> None:
    """The node id, and the new labels and taints as AddNode checks them."""
    check_id("node_id", command.node_id)
    _check_labels_and_taints(
        command.labels if command.labels is not None else {}, command.taints if command.taints is not None else ()
    )


def check_drain_node(command: DrainNode) -> None:
    check_id("node_id", command.node_id)
    check_range("grace_ms", command.grace_ms, 0, MAX_DURATION_MS)
    if not isinstance(command.respect_budgets, bool):
        raise Rejected(RejectionCode.INVALID_COMMAND, "respect_budgets must be true or false")


def check_set_disruption_budget(command: SetDisruptionBudget) -> None:
    """The budget's id, its filters (ids, a label map as AddNode's labels) and 0 <= max_unavailable < 2^31."""
    check_id("budget_id", command.budget_id)
    if command.tenant is not None:
        check_id("tenant", command.tenant)
    if command.gang_id is not None:
        check_id("gang_id", command.gang_id)
    if command.label_selector is not None:
        check_count("label_selector", command.label_selector, MAX_LABELS)
        check_labels("label_selector", command.label_selector)
    check_range("max_unavailable", command.max_unavailable, 0, (1 << 31) - 1)


def check_node_ref(command: RemoveNode | CordonNode | UncordonNode | MarkNodeFailed | RecoverNode) -> None:
    check_id("node_id", command.node_id)


def check_mark_node_failed(command: MarkNodeFailed) -> None:
    check_id("node_id", command.node_id)
    check_length("reason", command.reason, MAX_REASON_LENGTH)


def check_pod_resources(what: str, pod: SubmitPod | GangMember) -> None:
    """The request of a pod or a gang member: GPUs, CPU, memory, models, selector, tolerations."""
    check_range("num_gpu", pod.num_gpu, 0, MAX_GPUS_PER_NODE)
    check_range("cpu_milli", pod.cpu_milli, 0, MAX_CPU_MILLI)
    check_range("memory_mib", pod.memory_mib, 0, MAX_MEMORY_MIB)
    if pod.num_gpu == 0:
        check_range("gpu_milli of a pod with num_gpu 0", pod.gpu_milli, 0, 0)
    elif pod.num_gpu == 1:
        check_range("gpu_milli", pod.gpu_milli, 1, GPU_MILLI)
    else:
        check_range("gpu_milli of a multi-GPU pod", pod.gpu_milli, GPU_MILLI, GPU_MILLI)
    if pod.num_gpu == 0 and pod.cpu_milli == 0 and pod.memory_mib == 0:
        raise Rejected(RejectionCode.INVALID_RESOURCES, f"{what} {pod.pod_id!r} requests no GPU, CPU or memory")
    check_count("GPU models", pod.gpu_models, MAX_GPU_MODELS)
    check_count("node_selector entries", pod.node_selector, MAX_NODE_SELECTOR)
    check_count("tolerations", pod.tolerations, MAX_TOLERATIONS)
    for model in pod.gpu_models:
        check_model(model)
    check_labels("node_selector", pod.node_selector)
    for toleration in pod.tolerations:
        check_length("toleration key", toleration.key, MAX_ID_LENGTH)
        check_length("toleration value", toleration.value, MAX_VALUE_LENGTH)
        if toleration.operator not in TOLERATION_OPERATORS:
            raise Rejected(
                RejectionCode.INVALID_COMMAND,
                f"toleration operator must be one of {TOLERATION_OPERATORS}, got {show(toleration.operator)}",
            )
        if toleration.effect and toleration.effect not in TAINT_EFFECTS:
            raise Rejected(
                RejectionCode.INVALID_COMMAND,
                f"toleration effect must be empty or one of {TAINT_EFFECTS}, got {show(toleration.effect)}",
            )


def check_duration(what: str, value: Any) -> None:
    """An optional duration in milliseconds: None, or 1 ms to ``MAX_DURATION_MS``."""
    if value is not None:
        check_range(what, value, 1, MAX_DURATION_MS)


def check_dependencies(own_ids: tuple[str, ...], depends_on: tuple[str, ...], dependency: Any) -> None:
    """``depends_on`` ids and the dependency type; depending on oneself is a cycle."""
    if dependency not in DEPENDENCY_TYPES:
        raise Rejected(
            RejectionCode.INVALID_COMMAND, f"dependency must be one of {DEPENDENCY_TYPES}, got {show(dependency)}"
        )
    if len(depends_on) > MAX_DEPENDENCIES:
        raise Rejected(
            RejectionCode.INVALID_COMMAND, f"depends_on lists {len(depends_on)} ids; at most {MAX_DEPENDENCIES}"
        )
    for dependency_id in depends_on:
        check_id("depends_on id", dependency_id)
        if dependency_id in own_ids:
            raise Rejected(
                RejectionCode.DEPENDENCY_CYCLE,
                f"{own_ids[0]!r} depends on {dependency_id!r}, which is itself: the cycle "
                f"{dependency_id} -> {dependency_id} could never start",
            )


def check_preemption(value: Any, modes: tuple[str, ...] = PREEMPTION_MODES) -> None:
    if value not in modes:
        raise Rejected(RejectionCode.INVALID_COMMAND, f"preemption must be one of {modes}, got {value!r}")


def check_submit_pod(command: SubmitPod, modes: tuple[str, ...] = PREEMPTION_MODES) -> None:
    """``modes``: the preemption modes the command's contract accepts."""
    check_id("pod_id", command.pod_id)
    check_id("tenant", command.tenant)
    check_range("priority", command.priority, -(1 << 31), (1 << 31) - 1)
    check_pod_resources("pod", command)
    if command.time_limit_ms is not None:
        check_duration("time_limit_ms", command.time_limit_ms)
    if command.depends_on or command.dependency != AFTER_OK:
        check_dependencies((command.pod_id,), command.depends_on, command.dependency)
    if command.preemption != PREEMPT_LOWER:
        check_preemption(command.preemption, modes)
    if command.movable is not False and not isinstance(command.movable, bool):
        raise Rejected(RejectionCode.INVALID_COMMAND, f"movable must be true or false, got {command.movable!r}")
    if command.retry is not None:
        check_retry(command.retry)
    if command.gpu_memory_mib:
        check_range("gpu_memory_mib", command.gpu_memory_mib, 0, MAX_MEMORY_MIB)
        if command.num_gpu == 0:
            raise Rejected(
                RejectionCode.INVALID_RESOURCES, f"pod {command.pod_id!r} asks for GPU memory but for no GPU"
            )


MAX_RETRIES = 1_000
"""At most this many retries per pod: each is an event and a timer, so a pod's retries stay bounded."""


def check_retry(retry: Retry) -> None:
    """A retry policy: 0 to ``MAX_RETRIES`` retries, backoffs of 1 ms to ``MAX_DURATION_MS`` (each timer it sets
    lies strictly after the failure, which keeps every command finite)."""
    check_range("retry.max_retries", retry.max_retries, 0, MAX_RETRIES)
    check_range("retry.backoff_ms", retry.backoff_ms, 1, MAX_DURATION_MS)
    check_range("retry.backoff_max_ms", retry.backoff_max_ms, 1, MAX_DURATION_MS)


def check_submit_gang(command: SubmitGang, modes: tuple[str, ...] = PREEMPTION_MODES) -> None:
    """``modes``: the preemption modes the command's contract accepts."""
    check_id("gang_id", command.gang_id)
    check_id("tenant", command.tenant)
    check_range("priority", command.priority, -(1 << 31), (1 << 31) - 1)
    if not 1 <= len(command.members) <= MAX_GANG_MEMBERS:
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"gang {command.gang_id!r} has {len(command.members)} members; a gang has 1 to {MAX_GANG_MEMBERS}",
        )
    seen: set[str] = set()
    for member in command.members:
        check_id("member pod_id", member.pod_id)
        if member.pod_id in seen or member.pod_id == command.gang_id:
            raise Rejected(
                RejectionCode.DUPLICATE_POD,
                f"gang {command.gang_id!r} lists member id {member.pod_id!r} twice (or as the gang's own id)",
            )
        seen.add(member.pod_id)
        check_pod_resources("member", member)
    text = sum(spec_text(m.pod_id, m.gpu_models, m.node_selector, m.tolerations) for m in command.members)
    if text > MAX_GANG_TEXT:
        raise Rejected(
            RejectionCode.TOO_LARGE,
            f"gang {command.gang_id!r}'s members hold {text} characters of ids, models, selectors and tolerations; "
            f"at most {MAX_GANG_TEXT} (every gang event carries them all)",
        )
    if command.min_members is not None and not 1 <= command.min_members <= len(command.members):
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"min_members must be between 1 and the {len(command.members)} members, got {command.min_members!r}",
        )
    if command.topology_required is not None and command.topology_preferred is not None:
        raise Rejected(RejectionCode.INVALID_COMMAND, "set topology_required or topology_preferred, not both")
    for what, key in (
        ("topology_required", command.topology_required),
        ("topology_preferred", command.topology_preferred),
    ):
        if key is not None:
            check_id(what, key)
    check_duration("timeout_ms", command.timeout_ms)
    check_duration("time_limit_ms", command.time_limit_ms)
    check_dependencies(
        (command.gang_id, *(member.pod_id for member in command.members)), command.depends_on, command.dependency
    )
    check_preemption(command.preemption, modes)
    if command.retry is not None:
        check_retry(command.retry)
    if command.disruption != DISRUPT_ALL and command.disruption not in DISRUPTION_MODES:
        raise Rejected(
            RejectionCode.INVALID_COMMAND, f"disruption must be one of {DISRUPTION_MODES}, got {command.disruption!r}"
        )
    if command.min_members_per_role or any(member.role is not None for member in command.members):
        check_roles(command)


def check_roles(command: SubmitGang) -> None:
    """``min_members_per_role`` (contract v4, Volcano's ``minTaskMember``): each role it names is some member's
    ``role``, its minimum is 0 to that role's member count, and the minimums sum to at most ``min_members``
    (default: every member), so that some set of members meets them all. INVALID_COMMAND otherwise."""
    members: dict[str, int] = {}
    for member in command.members:
        if member.role is not None:
            check_id("member role", member.role)
            members[member.role] = members.get(member.role, 0) + 1
    total = 0
    for role in sorted(command.min_members_per_role):
        minimum = command.min_members_per_role[role]
        if role not in members:
            raise Rejected(
                RejectionCode.INVALID_COMMAND,
                f"min_members_per_role names role {role!r}, which no member of gang {command.gang_id!r} has; "
                f"its members' roles: {sorted(members)}",
            )
        if not 0 <= minimum <= members[role]:
            raise Rejected(
                RejectionCode.INVALID_COMMAND,
                f"min_members_per_role[{role!r}] must be between 0 and the {members[role]} member(s) of role "
                f"{role!r} in gang {command.gang_id!r}, got {minimum!r}",
            )
        total += minimum
    wanted = command.min_members if command.min_members is not None else len(command.members)
    if total > wanted:
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"min_members_per_role of gang {command.gang_id!r} sum to {total}, more than its min_members {wanted}: "
            "raise min_members to at least their sum",
        )


def check_release_gang(command: ReleaseGang) -> None:
    check_id("gang_id", command.gang_id)


def check_tick(command: Tick) -> None:
    """A tick carries nothing but its envelope's time."""


def check_release(command: Release) -> None:
    check_id("pod_id", command.pod_id)
    check_length("reason", command.reason, MAX_REASON_LENGTH)


def check_resume_cluster(command: ResumeCluster) -> None:
    check_length("reason", command.reason, MAX_REASON_LENGTH)


def check_set_policy(command: SetPolicy) -> None:
    nothing_else = (
        command.reserve_after_ms is None
        and not command.queue_order
        and command.default_quota is None
        and command.max_clock_jump_ms is None
    )
    if (command.policy or nothing_else) and command.policy not in POLICY_NAMES:
        raise Rejected(
            RejectionCode.UNKNOWN_POLICY, f"unknown policy {show(command.policy)}; known: {list(POLICY_NAMES)}"
        )
    if command.reserve_after_ms is not None:
        check_range("reserve_after_ms (negative: no reservations)", command.reserve_after_ms, -1, MAX_DURATION_MS)
    if command.max_clock_jump_ms is not None:
        check_range("max_clock_jump_ms (0: no limit)", command.max_clock_jump_ms, 0, MAX_DURATION_MS)
    if command.queue_order and command.queue_order not in QUEUE_ORDERS:
        raise Rejected(
            RejectionCode.INVALID_COMMAND, f"queue_order must be one of {QUEUE_ORDERS}, got {show(command.queue_order)}"
        )
    if command.default_quota is not None:
        check_quota("default_quota", command.default_quota)
        if command.default_quota.cohort is not None:
            raise Rejected(
                RejectionCode.INVALID_COMMAND,
                "the default quota has no cohort: each tenant on it has its own; give a tenant a cohort with SetQuota",
            )


def _check_optional_amount(what: str, value: Any, high: int) -> None:
    if value is not None:
        check_range(what, value, 0, high)


def check_quota(what: str, quota: Quota) -> None:
    """Amounts are whole and non-negative, and bounded; model keys are model names or '*'; weight 1-1000."""
    if quota.cohort is not None:
        check_id(f"{what} cohort", quota.cohort)
    if len(quota.nominal_gpus) > MAX_QUOTA_MODELS:
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"{what} nominal_gpus names {len(quota.nominal_gpus)} models; at most {MAX_QUOTA_MODELS}",
        )
    for model, gpus in quota.nominal_gpus.items():
        if model != ANY_MODEL:
            check_model(model)
        check_range(f"{what} nominal_gpus[{model!r}] (whole GPUs)", gpus, 0, MAX_QUOTA_GPUS)
    _check_optional_amount(f"{what} nominal_cpu_milli", quota.nominal_cpu_milli, MAX_CPU_MILLI * 1000)
    _check_optional_amount(f"{what} nominal_memory_mib", quota.nominal_memory_mib, MAX_MEMORY_MIB * 1000)
    _check_optional_amount(f"{what} borrowing_limit_gpus", quota.borrowing_limit_gpus, MAX_QUOTA_GPUS)
    _check_optional_amount(f"{what} lending_limit_gpus", quota.lending_limit_gpus, MAX_QUOTA_GPUS)
    check_range(f"{what} weight", quota.weight, 0, MAX_WEIGHT)  # 0 (contract v4): only what no one else wants
    policy = quota.preemption
    if policy is not None:
        for name, value, modes in (
            ("within_tenant", policy.within_tenant, WITHIN_TENANT_MODES),
            ("reclaim_within_cohort", policy.reclaim_within_cohort, RECLAIM_MODES),
            ("borrow_within_cohort", policy.borrow_within_cohort, BORROW_MODES),
        ):
            if value not in modes:
                raise Rejected(
                    RejectionCode.INVALID_COMMAND, f"{what} preemption.{name} must be one of {modes}, got {value!r}"
                )
        limit = policy.borrow_max_victim_priority
        if limit is not None:
            check_range(f"{what} preemption.borrow_max_victim_priority", limit, -(2**31), 2**31 - 1)
    if quota.cohort is None and (quota.borrowing_limit_gpus is not None or quota.lending_limit_gpus is not None):
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"{what} sets a borrowing or lending limit without a cohort: there is no one to borrow from or lend to",
        )


def check_set_quota(command: SetQuota) -> None:
    check_id("tenant", command.tenant)
    check_quota("quota", command.quota())


def check_remove_quota(command: RemoveQuota) -> None:
    check_id("tenant", command.tenant)


def check_set_cohort(command: SetCohort) -> None:
    """Names are ids, amounts whole, non-negative and bounded (as a quota's); a cohort is not its own parent."""
    check_id("cohort", command.cohort)
    if command.parent is not None:
        check_id("parent", command.parent)
        if command.parent == command.cohort:
            raise Rejected(RejectionCode.COHORT_CYCLE, f"cohort {command.cohort!r} cannot be its own parent")
    if command.parent is None and (command.borrowing_limit_gpus is not None or command.lending_limit_gpus is not None):
        raise Rejected(
            RejectionCode.INVALID_COMMAND,
            f"cohort {command.cohort!r} sets a borrowing or lending limit without a parent: a root borrows from and "
            "lends to no one",
        )
    check_quota(
        f"cohort {command.cohort!r}",
        Quota(
            command.parent,
            command.nominal_gpus,
            command.nominal_cpu_milli,
            command.nominal_memory_mib,
            command.borrowing_limit_gpus,
            command.lending_limit_gpus,
        ),
    )


def check_defragment(command: Defragment) -> None:
    check_range("max_moves", command.max_moves, 0, MAX_MOVES)
    if command.target is not None:
        check_id("target", command.target)


PAYLOAD_CHECKS: dict[type, Callable[[Any], None]] = {
    AddNode: check_add_node,
    RemoveNode: check_node_ref,
    CordonNode: check_node_ref,
    UncordonNode: check_node_ref,
    DrainNode: check_drain_node,
    MarkNodeFailed: check_mark_node_failed,
    SubmitPod: check_submit_pod,
    Release: check_release,
    SetPolicy: check_set_policy,
    SubmitGang: check_submit_gang,
    ReleaseGang: check_release_gang,
    Tick: check_tick,
    SetQuota: check_set_quota,
    RemoveQuota: check_remove_quota,
    Defragment: check_defragment,
    ResumeCluster: check_resume_cluster,
    RecoverNode: check_node_ref,
    UpdateNode: check_update_node,
    SetDisruptionBudget: check_set_disruption_budget,
    RemoveDisruptionBudget: lambda command: check_id("budget_id", command.budget_id),
    SetCohort: check_set_cohort,
    RemoveCohort: lambda command: check_id("cohort", command.cohort),
}


def check_command(command: Command) -> None:
    """Every stateless check of an envelope and its payload, in the order the fold makes them."""
    check_envelope(command)
    check = PAYLOAD_CHECKS.get(type(command.payload))
    if check is None:
        raise Rejected(RejectionCode.INVALID_COMMAND, f"unknown command type {type(command.payload).__name__}")
    check(command.payload)
