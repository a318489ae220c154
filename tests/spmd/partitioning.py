"""What the partitioner tests share: partition a module on n devices, optionally checked against
XLA's run of the original with no op left to the replicating fallback, and count collectives."""

from __future__ import annotations

from collections import Counter

from hlo_passes import parse_module, print_module
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent


def partition(text: str, n: int = 8):
    """(module, printed output, remarks) of spmd-partition on `text` for n devices."""
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=n)
    p.run(module)
    return module, print_module(module), p.remarks


def partition_verified(text: str, n: int = 8):
    """(module, printed output), asserting that it computes what `text` computes on n devices
    and that no op fell back to replication (a `missed` remark)."""
    module, out, remarks = partition(text, n)
    report = verify_equivalent(text, out, num_devices=n)
    assert report.ok, report.format() + "\n" + out
    assert not [r for r in remarks if r.kind == "missed"], remarks
    return module, out


def collectives(module) -> Counter[str]:
    """How many of each collective opcode the module holds."""
    return Counter(i.opcode.value for i in module.all_instructions() if i.opcode.is_collective)
