"""weight-update-sharding: shard the optimizer update of data-parallel training across
the replicas that all-reduce its gradients (Xu et al. 2020, "Automatic Cross-Replica
Sharding of Weight Update in Data-Parallel Training").

In data-parallel training every device all-reduces the gradient and then runs the same
weight update on the whole weight and the whole optimizer state.  When the reduced
gradient feeds only that update, each device can instead update 1/N of it:

    before                                   after (N devices, S elements, P = S padded to N·c)
    g  = all-reduce(dg)                      f  = pad(reshape(dg, [S]), [P])
    m' = b1*m + (1-b1)*g                     gs = reduce-scatter(f)                       [c]
    w' = w - lr * m' / (sqrt(v')+eps)        ms = dynamic-slice(pad(reshape(m)), i·c, c)  [c]
    ROOT (w', m', ...)                       m's = b1*ms + (1-b1)*gs ; w's = ...          [c]
                                             w' = reshape(slice(all-gather(w's), S))      full
                                             m' = reshape(slice(all-gather(m's), S))      full

(i is the device's position in its group.)  Reductions over the whole weight (global
norm clipping, LAMB/LARS trust ratios) reduce the shard, padding masked out, and
all-reduce the scalar.  With `keep-state-sharded` the optimizer state stays sharded
between steps: the state parameters take and the state outputs return each device's
tile (`sharding={devices=[N,1,...]<=[N]}` recorded on both), so no state is gathered.

The analysis (`analysis.py`) decides what is safe: anything it does not model leaves the
all-reduce as it is, with a "missed" remark saying why.

XLA's own modules after fusion (what `jax_hook` hands over before scheduling) are read too:
`fused.normalize` splits the summed variadic all-reduce into one all-reduce per gradient and
moves gradient transposes out of kLoop fusions; an elementwise kLoop fusion then counts as one
elementwise op and is rewritten into the same fusion on `[chunk]` (`%fused.shard`).  The
normalization is tried on a copy first: a module whose update cannot be sharded comes back
untouched.  Scheduled modules (`is_scheduled=true`) are declined: XLA CPU compiles no
standalone elementwise ops after its scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hlo_passes.ir.attributes import PaddingConfig
from hlo_passes.ir.builder import Builder, next_channel_id, reduction_computation
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Layout, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass
from hlo_passes.passes.weight_update_sharding.analysis import (REDUCTION_NAME, Component, Replication,
                                                               _is_degenerate_reduce, analyze_computation,
                                                               is_row_major_bitcast)
from hlo_passes.passes.weight_update_sharding.fused import normalize, shard_fused_computation
from hlo_passes.passes.collectives.common import reduction_of

S32 = PrimitiveType.S32


@register_pass
class WeightUpdateSharding(ModulePass):
    """Reduce-scatter gradients, update 1/N of each weight and optimizer state per device,
    all-gather the new weights (see the module docstring for a before/after)."""

    name = "weight-update-sharding"
    summary = "Shard the data-parallel weight update across the gradient all-reduce's devices"

    @dataclass(frozen=True)
    class Options:
        keep_state_sharded: bool = option(
            False, "optimizer state stays sharded: state parameters and outputs become per-device tiles")
        assume_replicated_parameters: bool = option(
            False, "take ENTRY parameters as identical on every device (data-parallel weights); "
                   "they are marked parameter_replication={true}")

    def run(self, module: Module) -> bool:
        if module.header_attr("is_scheduled", False):
            # XLA CPU's thunk emitter takes no standalone elementwise ops after scheduling (its
            # FusionWrapper has run), and the rewrite creates some: decline the whole module.
            if any(i.opcode is Opcode.ALL_REDUCE for i in module.all_instructions()):
                self.remark(None, "not sharded: the module is already scheduled (is_scheduled=true); "
                                  "run before scheduling (jax_hook stage='pre-scheduler')", kind="missed")
            return False
        if _in_fused_form(module):
            # XLA's post-fusion form (jax_hook): normalize a copy first, so that a module whose
            # update cannot be sharded comes back untouched, with the copy's remarks.
            trial = module.clone()
            normalize(trial, _update_computations(trial))
            probe = WeightUpdateSharding(self.options)
            if not probe._shard(trial):
                self.remarks.extend(probe.remarks)
                return False
            normalize(module, _update_computations(module))
        return self._shard(module)

    def _shard(self, module: Module) -> bool:
        changed = False
        for comp in _update_computations(module):
            plan = analyze_computation(comp, module,
                                       assume_replicated_parameters=self.options.assume_replicated_parameters)
            for instr, reason in plan.skipped:
                self.remark(instr, f"not sharded: {reason}", kind="missed")
            for component in plan.components:
                if component.declined is not None:
                    where, reason = component.declined
                    for stem in component.stems:
                        self.remark(stem.all_reduce, f"not sharded: {reason}", kind="missed")
                    continue
                rewriter = _Rewriter(module, comp, component, self)
                rewriter.apply()
                changed = True
        return changed


def _in_fused_form(module: Module) -> bool:
    """Has XLA combined the gradient all-reduces or fused their users (see `fused.normalize`)?"""
    for comp in _update_computations(module):
        for instr in comp.instructions:
            if instr.opcode is Opcode.ALL_REDUCE and instr.shape.is_tuple:
                return True
            if instr.opcode is Opcode.FUSION and any(o.opcode is Opcode.ALL_REDUCE for o in instr.operands):
                return True
    return False


def _update_computations(module: Module) -> list[Computation]:
    """The entry and the computations it calls (manual-region bodies), callers first."""
    order, seen = [], set()
    stack = [module.entry]
    while stack:
        comp = stack.pop()
        if comp in seen:
            continue
        seen.add(comp)
        order.append(comp)
        for instr in comp.instructions:
            if instr.opcode is Opcode.CALL:
                stack.extend(instr.called_computations())
    return order


class _Rewriter:
    """Rewrites one component (see the module docstring)."""

    def __init__(self, module: Module, comp: Computation, component: Component, owner: WeightUpdateSharding):
        self.module, self.comp, self.c = module, comp, component
        self.owner = owner
        self.n = component.group_size
        dims = component.dims
        self.size = component.size
        self.keep_state = self._can_keep_state() if owner.options.keep_state_sharded else False
        if self.keep_state:
            # Pad the leading dimension, then flatten: each device's chunk is its tile of the weight.
            self.tile = (-(-dims[0] // self.n),) + tuple(dims[1:])
            self.padded = math.prod(self.tile) * self.n
        else:
            self.tile = None
            self.padded = -(-self.size // self.n) * self.n  # flatten, then pad (the paper's formatting)
        self.chunk = self.padded // self.n
        first = component.stems[0].all_reduce
        self.groups = first.attr("replica_groups")
        self.has_channel = first.attr("channel_id") is not None
        self.global_ids = first.attr("use_global_device_ids")
        self.shard: dict[Instruction, Instruction] = {}
        self._index: Instruction | None = None
        self._offset: Instruction | None = None
        self._sliced: dict[Instruction, Instruction] = {}

    # ------------------------------------------------------------- helpers --
    def builder(self, like: Instruction | None = None) -> Builder:
        meta = like.attributes.get("metadata") if like is not None else None
        return Builder(self.comp, before=self.comp.root, metadata=meta)

    def flat(self, etype: PrimitiveType) -> ArrayShape:
        return ArrayShape(etype, (self.chunk,))

    def collective(self, b: Builder, opcode: Opcode, shape: ArrayShape, operand: Instruction,
                   reduction: Computation | None = None, dimension: int | None = None) -> Instruction:
        """A collective over the component's groups, spelled like its gradient all-reduces."""
        return b.op(opcode, shape, [operand], called={"to_apply": reduction} if reduction else None,
                    channel_id=next_channel_id(self.module) if self.has_channel else None,
                    replica_groups=self.groups, dimensions=(dimension,) if dimension is not None else None,
                    use_global_device_ids=self.global_ids)

    def reduction(self, kind: str, etype: PrimitiveType) -> Computation:
        """A shared reduction computation, placed before this computation (XLA's parser wants
        callees defined before their callers)."""
        red = reduction_computation(self.module, kind, etype)
        comps = self.module.computations
        if comps.index(red) > comps.index(self.comp):
            comps.remove(red)
            comps.insert(comps.index(self.comp), red)
        return red

    def index(self) -> Instruction:
        """This device's position in its group (s32)."""
        if self._index is None:
            b = self.builder()
            replicas, partitions = self.module.replica_count, self.module.num_partitions
            if replicas == 1:
                dev = b.convert(b.partition_id(), S32)
            elif partitions == 1:
                dev = b.convert(b.replica_id(), S32)
            else:
                dev = b.add(b.multiply(b.convert(b.replica_id(), S32), b.constant(partitions, S32)),
                            b.convert(b.partition_id(), S32))
            table = [0] * (replicas * partitions)
            for group in self.c.groups:
                for pos, d in enumerate(group):
                    table[d] = pos
            if table != list(range(len(table))):
                looked_up = b.dynamic_slice(b.constant_array(table), [dev], (1,))
                dev = b.reshape(looked_up, ArrayShape(S32, ()))
            self._index = dev
        return self._index

    def offset(self) -> Instruction:
        if self._offset is None:
            b = self.builder()
            index = self.index()
            self._offset = index if self.chunk == 1 else b.multiply(index, b.constant(self.chunk, S32))
        return self._offset

    def formatted(self, b: Builder, value: Instruction) -> Instruction:
        """`value` (canonical shape) flattened and zero-padded to [padded]."""
        etype = value.shape.element_type
        flat = value if value.shape.dims == (self.size,) else b.reshape(value, ArrayShape(etype, (self.size,)))
        if self.padded == self.size:
            return flat
        zero = b.constant(0, etype)
        return b.pad(flat, zero, PaddingConfig(((0, self.padded - self.size, 0),)))

    def shard_of(self, value: Instruction, etype_like: Instruction) -> Instruction:
        """The shard of an operand of a shard value."""
        if value in self.shard:
            return self.shard[value]
        if value.shape.rank == 0:
            return value
        if value.opcode is Opcode.BROADCAST and value.operands[0].shape.rank == 0:
            b = self.builder(value)
            return b.broadcast(value.operands[0], self.flat(value.shape.element_type), ())
        got = self._sliced.get(value)
        if got is None:
            b = self.builder(value)
            if value in self.state_params:
                got = b.reshape(value, self.flat(value.shape.element_type))
            else:
                got = b.dynamic_slice(self.formatted(b, value), [self.offset()], (self.chunk,))
            self._sliced[value] = got
        return got

    # ------------------------------------------------------------ rewrite --
    def apply(self) -> None:
        component = self.c
        self.state_params = self._state_params() if self.keep_state else set()
        for stem in component.stems:
            self._stem(stem)
        for instr in component.pulled + component.shard_values:  # pulled ops precede their users
            self._elementwise(instr)
        for instr in component.reductions:
            self._reduction(instr)
        self._exits()
        for param in component.assumed:
            if param.shape.is_array:
                param.set_attr("parameter_replication", (True,))
        kept = " (state kept sharded)" if self.keep_state else ""
        names = ", ".join(f"%{s.all_reduce.name}" for s in component.stems)
        self.owner.remark(component.stems[0].all_reduce,
                          f"sharded the update of {list(component.dims)} over {self.n} devices "
                          f"({names}; {self.chunk} elements per device){kept}", kind="applied")
        self._cleanup()
        self.comp.sort_topologically()

    def _stem(self, stem) -> None:
        ar = stem.all_reduce
        b = self.builder(ar)
        x = ar.operands[0]
        for op in stem.ops:
            if op.opcode is Opcode.TRANSPOSE:
                x = b.op(Opcode.TRANSPOSE, op.shape, [x], dimensions=op.attr("dimensions"))
            else:  # reshape, or a sum over size-1 dimensions
                assert op.opcode is Opcode.RESHAPE or is_row_major_bitcast(op) or _is_degenerate_reduce(op)
                x = b.reshape(x, op.shape)
        etype = x.shape.element_type
        reduction = self.reduction("add", etype)
        scattered = self.collective(b, Opcode.REDUCE_SCATTER, self.flat(etype), self.formatted(b, x),
                                    reduction, dimension=0)
        self.shard[stem.end] = scattered

    def _elementwise(self, instr: Instruction) -> None:
        operands = [self.shard_of(o, instr) for o in instr.operands]
        attrs = {k: v for k, v in instr.attributes.items() if k != "sharding"}
        called = dict(instr.called)
        if instr.opcode is Opcode.FUSION:  # an elementwise kLoop fusion: the same fusion on [chunk]
            called["calls"] = shard_fused_computation(self.module, instr.called["calls"], self.chunk)
            attrs.pop("backend_config", None)  # its loop partitioning counts the old dimensions
        new = Instruction(instr.opcode, self.flat(instr.shape.element_type), operands,
                          attributes=attrs, called=called)
        self.shard[instr] = self.comp.add(new, name_hint=instr.name, before=self.comp.root)

    def _reduction(self, instr: Instruction) -> None:
        data, init = instr.operands
        b = self.builder(instr)
        part = self.shard[data]
        etype = part.shape.element_type
        if self.padded > self.size:  # padding must not take part: fill it with the identity
            position = b.add(b.iota(ArrayShape(S32, (self.chunk,)), 0),
                             b.broadcast(self.offset(), ArrayShape(S32, (self.chunk,)), ()))
            real = b.compare(position, b.broadcast(b.constant(self.size, S32),
                                                   ArrayShape(S32, (self.chunk,)), ()), "LT")
            part = b.select(real, part, b.broadcast(init, self.flat(etype), ()))
        partial = b.reduce(part, init, (0,), instr.called["to_apply"])
        kind = reduction_of(instr)
        total = self.collective(b, Opcode.ALL_REDUCE, instr.shape, partial,
                                self.reduction(REDUCTION_NAME[kind.opcode],
                                                      kind.element_type))
        instr.replace_all_uses_with(total)

    def _exits(self) -> None:
        root = self.comp.root
        state_outputs = self._state_outputs() if self.keep_state else set()
        out_shardings: dict[int, Sharding] = {}
        for value in self.c.exits:
            b = self.builder(value)
            shard = self.shard[value]
            if value in state_outputs:
                out = b.reshape(shard, self.tile_shape(value.shape.element_type))
            else:
                full = ArrayShape(value.shape.element_type, (self.padded,))
                out = self.collective(b, Opcode.ALL_GATHER, full, shard, dimension=0)
                if self.padded > self.size:
                    out = b.slice(out, (0,), (self.size,))
                if out.shape.dims != value.shape.dims:
                    out = b.reshape(out, value.shape)
                else:
                    out.shape = value.shape  # an instruction made here: keep the output's layout
            if value is root:
                self.comp.root = out
                continue
            for tail in self.c.tails:
                if tail.operands[0] is value:
                    b = self.builder(tail)
                    if tail.opcode is Opcode.TRANSPOSE:
                        shaped = b.op(Opcode.TRANSPOSE, tail.shape, [out], dimensions=tail.attr("dimensions"))
                    else:
                        shaped = b.reshape(out, tail.shape)
                    for i, o in enumerate(root.operands):
                        if o is tail:
                            out_shardings[i] = Sharding.replicated()
                    root.replace_operand(tail, shaped)
            for i, o in enumerate(root.operands):
                if o is value:
                    out_shardings[i] = self.tile_sharding() if value in state_outputs else Sharding.replicated()
            root.replace_operand(value, out)
        if root.opcode is Opcode.TUPLE:
            root.shape = TupleShape(tuple(o.shape for o in root.operands))
        if self.keep_state and (self.state_params or state_outputs):
            self._record_root_shardings(out_shardings)

    # ------------------------------------------------------ optimizer state --
    def tile_shape(self, etype: PrimitiveType) -> ArrayShape:
        return ArrayShape(etype, self.tile, layout=Layout.default_for_rank(len(self.tile)))

    def tile_sharding(self) -> Sharding:
        grid = np.arange(self.n).reshape((self.n,) + (1,) * (len(self.c.dims) - 1))
        return Sharding.tiled(grid)

    def _can_keep_state(self) -> bool:
        """State can stay sharded only where its tiles are a sharding of the ENTRY signature:
        one group of all partitions in order, in the entry computation."""
        ok = (self.comp.is_entry and self.module.replica_count == 1
              and self.c.groups == (tuple(range(self.module.num_partitions)),)
              and self.comp.root.opcode is Opcode.TUPLE and len(self.c.dims) >= 1)
        if ok:
            root_sharding = self.comp.root.sharding if "sharding" in self.comp.root.attributes else None
            if root_sharding is None:
                replicated = Replication(self.module, self.c.groups, extra=set(self.c.reductions),
                                         assume_parameters=self.owner.options.assume_replicated_parameters)
                ok = all(o in self.c.exits or replicated(o) for o in self.comp.root.operands)
        if not ok:
            self.owner.remark(self.c.stems[0].all_reduce,
                              "optimizer state all-gathered: keeping it sharded needs one group of all "
                              "partitions in the entry computation and a known sharding for every output",
                              kind="missed")
        return ok

    def _state_params(self) -> set[Instruction]:
        """ENTRY parameters of the weight's shape read only by the sharded update."""
        inside = set(self.c.shard_values) | set(self.c.pulled)
        return {p for p in self.c.sliced
                if p.opcode is Opcode.PARAMETER and p.parent is self.comp and p.shape.is_array
                and all(u in inside for u in p.users)}

    def _state_outputs(self) -> set[Instruction]:
        """Exits that read no weight (only gradients and state): the new optimizer state."""
        reads_weight: dict[Instruction, bool] = {}
        inside = set(self.c.shard_values) | set(self.c.pulled)
        for instr in self.c.pulled + self.c.shard_values:
            reads_weight[instr] = any(
                reads_weight.get(o, False) if o in inside else
                (o in self.c.sliced and o not in self.state_params) for o in instr.operands)
        return {v for v in self.c.exits if not reads_weight.get(v, False)}

    def _record_root_shardings(self, out_shardings: dict[int, Sharding]) -> None:
        root = self.comp.root
        current = root.sharding if "sharding" in root.attributes else None
        elements = []
        for i in range(len(root.operands)):
            if i in out_shardings:
                elements.append(out_shardings[i])
            elif current is not None and current.is_tuple:
                elements.append(current.elements[i])
            else:
                elements.append(Sharding.replicated())
        root.sharding = Sharding.tuple_of(elements)
        for p in self.state_params:
            p.shape = self.tile_shape(p.shape.element_type)
            p.sharding = self.tile_sharding()

    # ------------------------------------------------------------ cleanup --
    def _cleanup(self) -> None:
        c = self.c
        dead = [*c.tails, *reversed(c.shard_values), *reversed(c.pulled), *c.reductions]
        for stem in c.stems:
            dead += [*reversed(stem.ops), stem.all_reduce]
        work = list(dead)
        while work:
            instr = work.pop(0)
            if instr.parent is not self.comp or instr.users or instr.is_root:
                continue
            if instr not in dead and (instr.opcode is Opcode.PARAMETER or instr.has_side_effect
                                      or instr.opcode.is_collective):
                continue
            operands = list(instr.operands)
            fused = instr.called.get("calls") if instr.opcode is Opcode.FUSION else None
            self.comp.remove(instr)
            work.extend(operands)
            if fused is not None and not any(fused in i.called_computations()
                                             for i in self.module.all_instructions()):
                self.module.remove_computation(fused)  # the fusion was its only caller
