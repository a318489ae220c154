"""What kind of program a module is, read from its content as XLA would read the file.

The same header (`num_partitions=8`) sits on three different kinds of file:

* **global** — one logical program over global arrays; `sharding=` annotations tell a
  partitioner how to split it.  JAX's lowering, XLA's `before_optimizations` dump and every
  pass dump before `spmd-partitioning` are global, whatever `num_partitions` says: XLA's
  partitioner will turn them into per-device code.
* **per-device** — what an SPMD partitioner wrote: every device runs this text on its own
  shard (per-device shapes), talking to the others through collectives with channel ids and
  `partition-id`.  XLA's `after_spmd-partitioning` dump, every later pass dump, the
  `after_optimizations` dump, and `spmd-partition`'s output.
* **replica** — a cross-replica program (`replica_count=N`, one partition): every replica runs
  it on its own inputs and talks to the others through cross-replica collectives.

The evidence, strongest first (`read_program`):

1. An ENTRY named `*_spmd` makes it per-device: XLA's partitioner and ours name the entry of
   the program they write so.
2. Pre-partitioning artifacts make a module global: `Sharding` custom-calls (outside the
   reducers of collectives, where JAX's lowering leaves some and partitioners copy them),
   `SPMDFullToShardShape`/`SPMDShardToFullShape`, Shardy's `xla.sdy.*` custom-calls or
   module attributes.  A partitioner removes all of them.
3. SPMD artifacts outside manual regions make it per-device (replica when it has one
   partition and several replicas): `partition-id`/`replica-id` or a collective.  With
   several partitions, `replica-id` and collectives without a channel id act across replicas
   only, mean the same before and after partitioning, and are no evidence.  Inside a
   manual region (a shard_map body: values that carry a
   manual sharding, or flow from `SPMDFullToShardShape` / `xla.sdy.GlobalToLocalShape` to its
   inverse, and the computations they call) the same ops belong to a global program.
4. Otherwise the module is global: without collectives every device would compute the same
   function of its inputs, which is what running it once on global arrays computes.

`num_partitions`/`replica_count` only give the device count.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind


class ProgramKind(enum.Enum):
    GLOBAL = "global"
    PER_DEVICE = "per-device"
    REPLICA = "replica"

    @property
    def is_per_device(self) -> bool:
        """Each device runs the text on its own inputs (per-device or replica)."""
        return self is not ProgramKind.GLOBAL


@dataclass(frozen=True)
class ProgramReading:
    """The kind of a module, its device count and the evidence for the kind."""

    kind: ProgramKind
    num_devices: int
    evidence: str
    overridden: bool = False

    def describe(self) -> str:
        how = "as asked" if self.overridden else self.evidence
        return f"{self.kind.value} program on {self.num_devices} device{'s' * (self.num_devices != 1)} ({how})"


# Custom-calls that exist only before partitioning.
GLOBAL_ONLY_TARGETS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                                 "ShardBarrierFrom", "ShardBarrierTo"})
MANUAL_ENTRY_TARGETS = frozenset({"SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape"})
MANUAL_EXIT_TARGETS = frozenset({"SPMDShardToFullShape", "xla.sdy.LocalToGlobalShape"})
_DEVICE_IDS = (Opcode.PARTITION_ID, Opcode.REPLICA_ID)


def _is_manual(sharding: Sharding | None) -> bool:
    if sharding is None:
        return False
    if sharding.kind is ShardingKind.TUPLE:
        return any(_is_manual(e) for e in sharding.elements)
    return sharding.kind is ShardingKind.MANUAL or any(k is SubgroupKind.MANUAL for k in sharding.subgroups)


def _sharding(instr: Instruction) -> Sharding | None:
    return instr.sharding if "sharding" in instr.attributes else None


def manual_instructions(module: Module) -> set[Instruction]:
    """Instructions that run inside manual (shard_map) regions, and everything in the
    computations they call."""
    manual: set[Instruction] = set()
    manual_comps: set[Computation] = set()
    for comp in module.computation_post_order()[::-1]:  # callers first
        inside_comp = comp in manual_comps
        for instr in comp.post_order():
            target = instr.custom_call_target
            if target in MANUAL_EXIT_TARGETS:
                continue
            inside = (inside_comp or _is_manual(_sharding(instr)) or target in MANUAL_ENTRY_TARGETS
                      or any(op in manual and op.custom_call_target not in MANUAL_EXIT_TARGETS
                             for op in instr.operands))
            if inside:
                manual.add(instr)
                manual_comps.update(instr.called_computations())
    return manual


def _reducers(module: Module) -> set[Computation]:
    """Computations applied elementwise by reductions, collectives, sorts, scatters, ... (every
    `to_apply` but a call's): JAX's GSPMD lowering leaves `Sharding` annotations in psum
    reducers, and partitioners copy reducers unchanged."""
    found: set[Computation] = set()
    for instr in module.all_instructions():
        if instr.opcode is not Opcode.CALL:
            for key, callee in instr.called.items():
                if key in ("to_apply", "comparator", "select", "scatter") and isinstance(callee, Computation):
                    found.add(callee)
    return found


def global_artifacts(module: Module) -> str | None:
    """The first thing that exists only before partitioning, described; None if none."""
    attributes = module.header_attr("frontend_attributes")
    if attributes is not None and any(k.startswith("xla.sdy.") for k, _ in attributes.entries):
        return "Shardy module attributes (xla.sdy.*)"
    reducers = _reducers(module)
    for instr in module.all_instructions():
        if instr.parent in reducers:
            continue
        target = instr.custom_call_target
        if target in GLOBAL_ONLY_TARGETS or (target or "").startswith("xla.sdy."):
            return f"custom-call {target} ({instr.name})"
    return None


def _crosses_replicas_only(instr: Instruction) -> bool:
    """`replica-id`, or a collective without a channel id: in a module of several partitions
    these act across replicas, never partitions, and mean the same in the global program as
    in each device's (a partitioner leaves them be; with one replica a channel-less
    all-reduce is a copy).  An async `*-done` carries no channel id: its start is the
    evidence."""
    return instr.opcode is Opcode.REPLICA_ID or (instr.opcode.is_collective and instr.channel_id is None)


def spmd_artifacts(module: Module) -> str | None:
    """The first SPMD artifact outside manual regions, described; None if none.  With several
    partitions, ops that act across replicas only are no evidence (`_crosses_replicas_only`)."""
    manual: set[Instruction] | None = None
    partitioned = module.num_partitions > 1
    for instr in module.all_instructions():
        if not (instr.opcode.is_collective or instr.opcode in _DEVICE_IDS):
            continue
        if partitioned and _crosses_replicas_only(instr):
            continue
        if manual is None:
            manual = manual_instructions(module)
        if instr not in manual:
            return f"{instr.opcode.value} {instr.name} outside any manual region"
    return None


def sharding_device_count(module: Module) -> int:
    """1 + the highest device any sharding names (1 when none does)."""
    best = 1
    for instr in module.all_instructions():
        s = _sharding(instr)
        if s is None:
            continue
        for leaf in (s.elements if s.is_tuple else (s,)):
            if leaf.kind is ShardingKind.TILED and leaf.tile_assignment is not None and leaf.num_devices:
                best = max(best, int(leaf.tile_assignment.max()) + 1)
            elif leaf.kind is ShardingKind.MAXIMAL and leaf.device is not None:
                best = max(best, leaf.device + 1)
    return best


def read_program(module: Module, as_kind: ProgramKind | None = None) -> ProgramReading:
    """The kind of `module` and its device count (see the module docstring); `as_kind`
    overrides the kind (the device count is still read from the module)."""
    partitions, replicas = module.num_partitions, module.replica_count
    devices = max(partitions * replicas, sharding_device_count(module))
    if as_kind is not None:
        return ProgramReading(as_kind, devices, "", overridden=True)
    entry = module.entry
    if entry is not None and entry.name.endswith("_spmd"):
        return ProgramReading(ProgramKind.PER_DEVICE, devices, f"ENTRY {entry.name} (named by an SPMD partitioner)")
    before = global_artifacts(module)
    if before is not None:
        return ProgramReading(ProgramKind.GLOBAL, devices, before)
    after = spmd_artifacts(module)
    if after is not None:
        if partitions == 1 and replicas > 1:
            return ProgramReading(ProgramKind.REPLICA, replicas, after)
        return ProgramReading(ProgramKind.PER_DEVICE, devices, after)
    return ProgramReading(ProgramKind.GLOBAL, devices, "no collectives or partition ids outside manual regions")


__all__ = ["ProgramKind", "ProgramReading", "global_artifacts", "manual_instructions", "read_program",
           "sharding_device_count", "spmd_artifacts"]
