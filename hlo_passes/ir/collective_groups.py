"""Who takes part in a collective: XLA's reading of `replica_groups` under each group mode.

A collective's groups mean different device sets depending on whether it has a channel id and
`use_global_device_ids` (XLA's CollectiveOpGroupMode): replica ids, partition ids, or global
device ids.  Passes that combine or create collectives and the runtime that runs per-device
programs both need the same reading, so it lives here, in the IR's vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode


@dataclass(frozen=True)
class GroupMode:
    """How a collective's replica_groups are read (XLA's CollectiveOpGroupMode)."""

    has_channel: bool
    use_global_device_ids: bool

    @property
    def name(self) -> str:
        if not self.has_channel:
            return "cross-replica"
        return "flattened-id" if self.use_global_device_ids else "cross-replica-and-partition"


def group_mode(instr: Instruction) -> GroupMode:
    return GroupMode(instr.channel_id is not None, bool(instr.attr("use_global_device_ids", False)))


def participant_groups(instr: Instruction, module: Module) -> list[tuple[int, ...]] | None:
    """The device groups (global ids, replica-major) a collective reduces over, or None when the
    mode cannot be spelled out (a cross-replica-and-partition collective over several partitions
    is read as such, with the partitions of each replica group joined)."""
    replicas, partitions = module.replica_count, module.num_partitions
    groups = instr.replica_groups.groups
    mode = group_mode(instr)
    if mode.use_global_device_ids:
        return [tuple(g) for g in groups] if groups else [tuple(range(replicas * partitions))]
    if mode.has_channel and instr.opcode in (Opcode.ALL_TO_ALL, Opcode.RAGGED_ALL_TO_ALL):
        # XLA reads an all-to-all with a channel as cross-partition: groups of partition ids
        partition_sets = [tuple(g) for g in groups] if groups else [tuple(range(partitions))]
        return [tuple(r * partitions + p for p in g) for r in range(replicas) for g in partition_sets]
    replica_sets = [tuple(g) for g in groups] if groups else [tuple(range(replicas))]
    if not mode.has_channel:
        # one group per (replica group, partition)
        return [tuple(r * partitions + p for r in g) for p in range(partitions) for g in replica_sets]
    return [tuple(r * partitions + p for r in g for p in range(partitions)) for g in replica_sets]
