"""Is a value identical on every device of each of a collective's groups?

XLA's HloReplicationAnalysis, asked about groups rather than the whole module.  Two passes ask:
`all-reduce-simplifier` (an all-reduce of a value its group already shares needs no
communication: it is the value, or the value times the group size for a sum) and
`weight-update-sharding`, which cuts the update of a weight into one piece per device of the
gradient's all-reduce group; that is correct only when everything the update reads besides the
gradient (the weight, its optimizer state, the step counter, the learning rate) is the same on
every device of that group.  On a 2-D mesh that is a question about the *group*, not the
module: a Megatron weight tiled over `model` and replicated over `data`

    w = f32[256,64] parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
    g = f32[256,64] all-reduce(dw), replica_groups={{0,4},{1,5},{2,6},{3,7}}

differs between devices 0 and 1 but is the same on 0 and 4, which is all the rewrite needs.
And a partitioned program computes "which tile is mine" from `partition-id`
(`dynamic-slice(constant({0,256,512,768,0,256,512,768}), partition-id)`): such small integer
expressions are evaluated for every device (`collectives.device_values`) and compared within
each group.

`Replication(module, groups)(instr)` says yes for: constants and iotas; all-reduces and
all-gathers whose groups contain ours; ENTRY parameters declared replicated
(`parameter_replication={true}` over replicas, a replicated `sharding=` over partitions), tiled
over devices that each group sees as one tile, or (under `assume_parameters`) any ENTRY parameter whose sharding does not
say otherwise; parameters of a computation called by one `call` whose operand is; expressions
of device ids that evaluate alike on each group's devices; and any deterministic op of such
values.  `extra` holds values known to be replicated for other reasons (the scalar reductions
the rewrite all-reduces)."""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.collectives.common import callers_of, participant_groups
from hlo_passes.passes.collectives.device_values import DeviceEvaluator, NotDeviceConstant

Groups = tuple[tuple[int, ...], ...]

# Ops whose result may differ from device to device even when their operands agree.
DEVICE_DEPENDENT = frozenset({
    Opcode.REPLICA_ID, Opcode.PARTITION_ID, Opcode.RNG, Opcode.RNG_BIT_GENERATOR,
    Opcode.RNG_GET_AND_UPDATE_STATE, Opcode.CUSTOM_CALL, Opcode.INFEED, Opcode.RECV, Opcode.RECV_DONE,
    Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL, Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START,
    Opcode.COLLECTIVE_PERMUTE_DONE, Opcode.ALL_REDUCE_START, Opcode.ALL_REDUCE_DONE,
    Opcode.ALL_GATHER_START, Opcode.ALL_GATHER_DONE, Opcode.ASYNC_START, Opcode.ASYNC_DONE,
})


def device_groups(instr: Instruction, module: Module) -> Groups | None:
    groups = participant_groups(instr, module)
    return tuple(tuple(g) for g in groups) if groups else None


def groups_within(ours: Groups, theirs: Groups | None) -> bool:
    """Is each of our groups inside one of theirs?"""
    return theirs is not None and all(any(set(g) <= set(t) for t in theirs) for g in ours)


def uniform_over_groups(sharding: Sharding, groups: Groups, num_partitions: int) -> bool:
    """Does every device of each group hold the same tile under `sharding` (devices are
    partitions)?"""
    if sharding.is_tuple:
        return False
    s = sharding.normalized()
    if s.kind is ShardingKind.REPLICATED:
        return True
    if s.kind is not ShardingKind.TILED or s.num_devices != num_partitions:
        return False
    if any(k.value != "replicated" for k in s.subgroups):
        return False  # manual subgroups: the value is per device
    try:
        return all(len({s.tile_index(d) for d in g}) == 1 for g in groups)
    except KeyError:
        return False


class Replication:
    """Is a value identical on every device of each group in `groups`? (see the module docstring)"""

    def __init__(self, module: Module, groups: Groups, *, assume_parameters: bool = False,
                 parameter_replication_covers_partitions: bool = False,
                 extra: set[Instruction] | None = None,
                 callers: dict[Computation, list[Instruction]] | None = None):
        """`parameter_replication={true}` speaks of replicas; XLA's analysis reads it only when
        the devices are replicas (one partition) and reads `sharding=` for partitions.
        `parameter_replication_covers_partitions` also takes it as the user's word for the
        partitions of a partitioned module (weight-update sharding asks users to say so)."""
        self.module = module
        self.parameter_replication_covers_partitions = parameter_replication_covers_partitions
        self.groups = groups
        self.assume_parameters = assume_parameters
        self.extra = extra if extra is not None else set()
        self.assumed: set[Instruction] = set()  # ENTRY parameters taken as replicated by assumption
        self._memo: dict[Instruction, bool] = {}
        self._callers = callers if callers is not None else callers_of(module)  # the module's, now
        self._evaluators: dict[int, DeviceEvaluator] = {}
        self._dependent_callees: dict[Computation, bool] = {}

    def __call__(self, instr: Instruction) -> bool:
        stack = [instr]
        while stack:  # operands first, without recursion (long chains)
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                continue
            pending = [o for o in self._inputs(top) if o not in self._memo]
            if pending:
                stack.extend(pending)
                continue
            self._memo[top] = self._decide(top)
            stack.pop()
        return self._memo[instr]

    def _inputs(self, instr: Instruction) -> list[Instruction]:
        if instr in self.extra or instr.opcode in (Opcode.ALL_REDUCE, Opcode.ALL_GATHER):
            return []
        if instr.opcode is Opcode.PARAMETER:
            caller = self._caller_operand(instr)
            return [caller] if caller is not None else []
        return list(instr.operands)

    def _caller_operand(self, param: Instruction) -> Instruction | None:
        comp = param.parent
        if comp is None or comp.is_entry:
            return None
        sites = self._callers.get(comp, [])
        if len(sites) == 1 and sites[0].opcode is Opcode.CALL:
            return sites[0].operands[param.parameter_number]
        return None

    def _decide(self, instr: Instruction) -> bool:
        if instr in self.extra:
            return True
        op = instr.opcode
        if op in (Opcode.CONSTANT, Opcode.IOTA):
            return True
        if op in (Opcode.ALL_REDUCE, Opcode.ALL_GATHER):
            return groups_within(self.groups, device_groups(instr, self.module))
        if op is Opcode.PARAMETER:
            caller = self._caller_operand(instr)
            if caller is not None:
                return self._memo[caller]
            return self._parameter(instr)
        if op not in DEVICE_DEPENDENT and not instr.has_side_effect and \
                not any(self._device_dependent(c) for c in instr.called_computations()) and \
                all(self._memo[o] for o in instr.operands):
            return True
        return self._evaluates_alike(instr)

    def _parameter(self, param: Instruction) -> bool:
        if "parameter_replication" in param.attributes and (
                self.module.num_partitions == 1 or self.parameter_replication_covers_partitions):
            flags = param.parameter_replication
            if flags and all(flags):
                return True
        sharding = param.sharding if "sharding" in param.attributes else None
        if sharding is not None and self.module.replica_count == 1 and \
                uniform_over_groups(sharding, self.groups, self.module.num_partitions):
            return True
        tiled = sharding is not None and sharding.is_tiled
        if param.parent is not None and param.parent.is_entry and self.assume_parameters and not tiled:
            self.assumed.add(param)
            return True
        return False

    def _device_dependent(self, comp: Computation) -> bool:
        known = self._dependent_callees.get(comp)
        if known is None:
            known = any(i.opcode in DEVICE_DEPENDENT or i.opcode.is_collective or i.has_side_effect
                        or any(self._device_dependent(c) for c in i.called_computations())
                        for i in comp.instructions)
            self._dependent_callees[comp] = known
        return known

    def _evaluates_alike(self, instr: Instruction) -> bool:
        """A small expression of device ids: evaluated on every device, equal within each group."""
        if not instr.shape.is_array or instr.shape.element_count > 4096:
            return False
        partitions = self.module.num_partitions
        try:
            for group in self.groups:
                values = [self._evaluator(d, partitions)(instr) for d in group]
                # bit for bit: -0.0 and 0.0 compare equal and differ (1 / x); and never a NaN
                # (XLA:CPU's collectives do not propagate one as HLO's max does)
                if any(values[0].shape != v.shape or values[0].tobytes() != v.tobytes() for v in values[1:]) \
                        or (values[0].dtype.kind not in "biu" and bool(np.isnan(values[0]).any())):
                    return False
        except NotDeviceConstant:
            return False
        return True

    def _evaluator(self, device: int, partitions: int) -> DeviceEvaluator:
        ev = self._evaluators.get(device)
        if ev is None:
            ev = self._evaluators[device] = DeviceEvaluator(device // partitions, device % partitions)
        return ev
