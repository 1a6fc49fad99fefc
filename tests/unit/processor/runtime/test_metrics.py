"""The processor's Prometheus metrics read the fold state and the folder's rejection counts."""

from __future__ import annotations

from logs.port import InputRecord, OutputRecord
from processor.runtime.loop import PartitionFolder
from processor.runtime.metrics import ProcessorMetrics
from schemas.commands import AddNode, Command, SubmitPod
from schemas.fastcodec import encode_command
from schemas.topics import Topics


def _records(commands: list[Command]) -> list[InputRecord]:
    return [InputRecord(0, offset, c.cluster.encode(), encode_command(c)) for offset, c in enumerate(commands)]


def test_metrics_reflect_state_and_rejections() -> None:
    """Gauges show queue length and GPUs per model; rejections are counted by code, once."""
    commands = [
        Command("c0", "lab", 1, AddNode("n1", 8000, 16384, "A100", 2)),
        Command("c1", "lab", 2, SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)),
        Command("c2", "lab", 3, SubmitPod("p2", num_gpu=2, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)),
        Command("c3", "lab", 4, SubmitPod("p3", num_gpu=1, gpu_milli=1000, cpu_milli=-5, memory_mib=1024)),
        Command("c3", "lab", 5, SubmitPod("p4", num_gpu=1, gpu_milli=1000, cpu_milli=1, memory_mib=1)),
    ]
    folder = PartitionFolder(0, Topics(), snapshot_every=0)
    out: list[OutputRecord] = []
    for record in _records(commands):
        folder.fold(record, out)
    metrics = ProcessorMetrics()
    metrics.observe_batch(len(commands), folder.rejected, 0)
    metrics.refresh([folder.state], lag={0: 7})
    sample = metrics.registry.get_sample_value
    assert sample("gpufold_processor_commands_total") == 5
    assert sample("gpufold_processor_rejected_total", {"code": "INVALID_RESOURCES"}) == 1
    assert sample("gpufold_processor_rejected_total", {"code": "DUPLICATE_COMMAND"}) == 1
    assert sample("gpufold_processor_pending_pods", {"cluster": "lab"}) == 1  # p2 needs 2 GPUs, 1 is free
    assert sample("gpufold_processor_gpus_allocated", {"cluster": "lab", "gpu_model": "A100"}) == 1.0
    assert sample("gpufold_processor_gpus_total", {"cluster": "lab", "gpu_model": "A100"}) == 2.0
    assert sample("gpufold_processor_consumer_lag", {"partition": "0"}) == 7
    fragmentation = sample("gpufold_processor_fragmentation_ratio", {"cluster": "lab"})
    assert fragmentation is not None and 0.0 <= fragmentation <= 1.0


def test_recovery_refold_does_not_count_rejections_twice() -> None:
    """Re-folding already-published commands on restore leaves the rejection counts as they were."""
    bad = Command("c1", "lab", 1, SubmitPod("p", num_gpu=1, gpu_milli=1000, cpu_milli=-1, memory_mib=1))
    folder = PartitionFolder(0, Topics(), snapshot_every=0)
    folder.fold_silently(_records([bad]))
    assert folder.rejected == {}
