"""The rewrite of one component (see the pass's docstring for a before/after).

    gradient all-reduce          →  reduce-scatter of the formatted gradient        [chunk]
    elementwise update ops       →  the same ops on [chunk] (kLoop fusions: the same fusion on [chunk])
    whole-tensor reductions      →  the reduction of the chunk, padding masked, + a scalar all-reduce
      (of the gradient, or of the weight: the chunk the update reads anyway)
    reductions over some dims S  →  on the tile (tiled on dim k): if k ∉ S, the factor's own tile;
      (factors)                     if k ∈ S, a partial result (padding masked) all-reduced, the
                                    factor then held whole and computed alike on every device
    factor broadcast back        →  a broadcast of its tile (or of the whole factor) onto the tile
    new weights                  →  all-gather of the chunks, unformatted
    new optimizer state          →  all-gathered too, or kept as the device's tile (`keep-state-sharded`);
                                    a factor held whole is returned as it is

For an 8x4 gradient tiled on dimension 0 (a row per device), Adafactor's row mean is a reduce
of the device's [1,4] tile over its columns, `f32[1]`, and its column mean a reduce over the
row, `f32[4]`, all-reduced into the mean of all eight rows.

Everything the update reads besides the gradient is cut to the chunk (`dynamic-slice` of its
formatted value at this device's offset) or, for state kept sharded, read from the tile the
parameter now holds.  `ComponentRewriter.apply` returns what it changed; with a `price` it also
prices what it removed (as it ran before the rewrite), for the pass to compare with the price of
what it added.
"""

from __future__ import annotations

from typing import Callable

from hlo_passes.ir.builder import Builder, reduction_computation
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape, interned
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.spmd.cost_model import ZERO, Estimate
from hlo_passes.passes.weight_update_sharding.analysis import (REDUCTION_NAME, Component, _is_degenerate_reduce,
                                                               is_row_major_bitcast)
from hlo_passes.passes.weight_update_sharding.formatting import Formatting
from hlo_passes.passes.weight_update_sharding.fused import shard_fused_computation
from hlo_passes.passes.collectives.replication import Replication
from hlo_passes.passes.weight_update_sharding.state import Signature, refined_sharding

S32 = PrimitiveType.S32
Remark = Callable[[Instruction | None, str, str], None]
# Prices a region: its instructions, their users as they were, and the values it returned.
RegionPrice = Callable[[list[Instruction], Callable[[Instruction], tuple[Instruction, ...]],
                        frozenset[Instruction]], Estimate]


class DeviceIndex:
    """This device's position in its group (s32), built once per computation and groups."""

    def __init__(self, module: Module, comp: Computation):
        self.module, self.comp = module, comp
        self._built: dict[tuple, Instruction] = {}

    def position(self, groups: tuple[tuple[int, ...], ...]) -> Instruction:
        found = self._built.get(groups)
        if found is not None and found.parent is self.comp:
            return found
        b = Builder(self.comp, before=self.comp.root)
        replicas, partitions = self.module.replica_count, self.module.num_partitions
        if replicas == 1:
            dev = b.convert(b.partition_id(), S32)
        elif partitions == 1:
            dev = b.convert(b.replica_id(), S32)
        else:
            dev = b.add(b.multiply(b.convert(b.replica_id(), S32), b.constant(partitions, S32)),
                        b.convert(b.partition_id(), S32))
        table = [0] * (replicas * partitions)
        for group in groups:
            for pos, d in enumerate(group):
                table[d] = pos
        if table != list(range(len(table))):
            looked_up = b.dynamic_slice(b.constant_array(table), [dev], (1,))
            dev = b.reshape(looked_up, ArrayShape(S32, ()))
        self._built[groups] = dev
        return dev


def _replace_root_operand(root: Instruction, old: Instruction, new: Instruction, sharding: Sharding | None,
                          out_shardings: dict[int, Sharding]) -> None:
    """`old` becomes `new` where the ROOT reads it (only there: `replace_operand` would list the
    ROOT as a user of `new` even where `old` is not an operand)."""
    if not any(o is old for o in root.operands):
        return
    for i, o in enumerate(root.operands):
        if o is old and sharding is not None:
            out_shardings[i] = sharding
    root.replace_operand(old, new)


def place_before(module: Module, callee: Computation, comp: Computation) -> Computation:
    """XLA's parser wants callees defined before their callers."""
    comps = module.computations
    if comps.index(callee) > comps.index(comp):
        comps.remove(callee)
        comps.insert(comps.index(comp), callee)
    return callee


class ComponentRewriter:
    def __init__(self, module: Module, comp: Computation, component: Component, fmt: Formatting, *,
                 keep_state: bool, assume_parameters: bool, index: DeviceIndex, remark: Remark,
                 price: RegionPrice | None = None):
        self.module, self.comp, self.c, self.fmt = module, comp, component, fmt
        self.keep_state = keep_state
        self.assume_parameters = assume_parameters
        self.devices = index
        self.remark = remark
        self.price = price
        self.removed_cost: Estimate = ZERO
        self.n = component.group_size
        first = component.stems[0].all_reduce
        self.groups = first.attr("replica_groups")
        self.has_channel = first.channel_id is not None
        self.global_ids = first.attr("use_global_device_ids")
        self.shard: dict[Instruction, Instruction] = {}
        self._sliced: dict[tuple[Instruction, Formatting], Instruction] = {}
        self._offsets: dict[int, Instruction] = {}  # by chunk size
        self._masks: dict[Formatting, Instruction] = {}
        self._tiles: dict[Instruction, Instruction] = {}  # main chunk -> it as a tile
        self.state_params: dict[Instruction, Sharding] = {}  # kept-sharded parameter -> its new sharding
        self.kept_outputs: list[Instruction] = []
        self.gathered_state: list[Instruction] = []  # optimizer state returned whole (all-gathered)
        self.weights: set[Instruction] = set()
        self.signature: Signature | None = None
        self.gathered: list[Instruction] = []  # the all-gathers made (the pass may pack them)
        self.scattered: list[Instruction] = []  # the reduce-scatters made
        self.reduced: list[Instruction] = []  # the scalar all-reduces of whole-tensor reductions

    # ------------------------------------------------------------- helpers --
    def builder(self, like: Instruction | None = None) -> Builder:
        meta = like.attributes.get("metadata") if like is not None else None
        return Builder(self.comp, before=self.comp.root, metadata=meta)

    def flat(self, etype: PrimitiveType, fmt: Formatting | None = None) -> ArrayShape:
        """[chunk] of `etype`: one shared object per shape (a new one per call was 3 MiB of the
        pass's trial on the partitioned 96-layer step)."""
        return interned(ArrayShape(etype, ((fmt or self.fmt).chunk,)))

    def factor_format(self, reduced: tuple[int, ...]) -> Formatting | None:
        """How a value reduced over the gradient's dims `reduced` lives on a device: the main
        formatting (nothing reduced), its own tiling of the reduced shape when the tile dim was
        kept, or None (held whole: reduced over the tile dim, so all-reduced)."""
        if not reduced:
            return self.fmt
        k = self.fmt.tile_dim
        assert k is not None, "factors need a tiled formatting (the pass chooses one)"
        if k in reduced:
            return None
        kept = tuple(d for i, d in enumerate(self.fmt.dims) if i not in reduced)
        return Formatting(self.n, kept, k - sum(1 for r in reduced if r < k))

    def collective(self, b: Builder, opcode: Opcode, shape: ArrayShape, operand: Instruction,
                   reduction: Computation | None = None, dimension: int | None = None) -> Instruction:
        """A collective over the component's groups, spelled like its gradient all-reduces."""
        return b.op(opcode, shape, [operand], called={"to_apply": reduction} if reduction else None,
                    channel_id=self.module.new_channel_id() if self.has_channel else None,
                    replica_groups=self.groups, dimensions=(dimension,) if dimension is not None else None,
                    use_global_device_ids=self.global_ids)

    def reduction(self, kind: str, etype: PrimitiveType) -> Computation:
        return place_before(self.module, reduction_computation(self.module, kind, etype), self.comp)

    def offset(self, fmt: Formatting | None = None) -> Instruction:
        """Where this device's chunk of `fmt` (default: the main formatting) starts."""
        chunk = (fmt or self.fmt).chunk
        found = self._offsets.get(chunk)
        if found is None or found.parent is not self.comp:
            index = self.devices.position(self.c.groups)
            if chunk == 1:
                found = index
            else:
                b = self.builder()
                found = b.multiply(index, b.constant(chunk, S32))
            self._offsets[chunk] = found
        return found

    def real_mask(self, fmt: Formatting | None = None) -> Instruction:
        """pred[chunk]: which elements of this device's chunk of `fmt` are real (not padding)."""
        fmt = fmt or self.fmt
        found = self._masks.get(fmt)
        if found is None or found.parent is not self.comp:
            b, chunk = self.builder(), fmt.chunk
            position = b.add(b.iota(ArrayShape(S32, (chunk,)), 0),
                             b.broadcast(self.offset(fmt), ArrayShape(S32, (chunk,)), ()))
            found = b.compare(position, b.broadcast(b.constant(fmt.size, S32), ArrayShape(S32, (chunk,)), ()),
                              "LT")
            self._masks[fmt] = found
        return found

    def shard_of(self, value: Instruction, reduced: tuple[int, ...] = ()) -> Instruction:
        """The chunk of an operand of a shard value (of a factor reduced over `reduced`: the
        chunk of its formatting, or the whole value where the factor is held whole)."""
        if value in self.shard:
            return self.shard[value]
        fmt = self.factor_format(reduced)
        if value.shape.rank == 0 or fmt is None:
            return value
        if value.opcode is Opcode.BROADCAST and value.operands[0].shape.rank == 0:
            b = self.builder(value)
            return b.broadcast(value.operands[0], self.flat(value.shape.element_type, fmt), ())
        got = self._sliced.get((value, fmt))
        if got is None:
            b = self.builder(value)
            if value in self.state_params:
                got = self.fmt.from_tile(b, value)
            else:
                got = b.dynamic_slice(fmt.format(b, value), [self.offset(fmt)], (fmt.chunk,))
            self._sliced[(value, fmt)] = got
        return got

    # ------------------------------------------------------------ rewrite --
    def apply(self) -> None:
        c = self.c
        self.weights = self.weight_exits()  # before anything here reads the inputs
        if self.price is not None:  # the removed region is priced as it ran: its users before
            # Pricing reads the users of the region's own ops only (never of parameters or the
            # ROOT tuple, which are no kernel work).  Only the region and what it reads can gain
            # or lose users here (an exit loses the ROOT, which reads its replacement instead);
            # everything else keeps its users, read when priced.  Per rewrite this costs the
            # region, not the computation (the ROOT tuple of a training step has thousands of
            # operands, the ENTRY thousands of parameters).
            touched = [*(i for stem in c.stems for i in (stem.all_reduce, *stem.ops)), *c.shard_values,
                       *c.reductions, *c.exits, *c.tails, *c.pulled, *c.sliced]
            self._users_before = {i: tuple(i.users) for x in touched for i in (x, *x.operands)}
            self._root_before = self.comp.root
        if self.keep_state:
            self._choose_state_params()
        for stem in c.stems:
            self._stem(stem)
        for instr in c.pulled + c.shard_values:  # pulled ops precede their users
            self._elementwise(instr)
        for instr in c.reductions:
            self._reduction(instr)
        self._exits()
        for param in c.assumed:
            if param.shape.is_array:
                param.set_attr("parameter_replication", (True,))
        self._cleanup()

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
        scattered = self.collective(b, Opcode.REDUCE_SCATTER, self.flat(etype), self.fmt.format(b, x),
                                    self.reduction("add", etype), dimension=0)
        self.scattered.append(scattered)
        self.shard[stem.end] = scattered

    def _elementwise(self, instr: Instruction) -> None:
        if instr in self.c.reshapes:  # the same elements in the same order: the same chunk
            self.shard[instr] = self.shard_of(instr.operands[0])
            return
        if instr.opcode is Opcode.REDUCE:
            self._partial_reduction(instr)
            return
        if instr.opcode is Opcode.BROADCAST:
            self._broadcast_factor(instr)
            return
        reduced = self.c.reduced.get(instr, ())
        fmt = self.factor_format(reduced)
        operands = [self.shard_of(o, reduced) for o in instr.operands]
        attrs = {k: v for k, v in instr.attributes.items() if k != "sharding"}
        called = dict(instr.called)
        if fmt is None:  # a factor held whole: the same op, on whole values
            shape = instr.shape
        else:
            shape = self.flat(instr.shape.element_type, fmt)
            if instr.opcode is Opcode.FUSION:  # an elementwise kLoop fusion: the same fusion on [chunk]
                called["calls"] = shard_fused_computation(self.module, instr.called["calls"], fmt.chunk)
                attrs.pop("backend_config", None)  # its loop partitioning counts the old dimensions
        new = Instruction(instr.opcode, shape, operands, attributes=attrs, called=called)
        self.shard[instr] = self.comp.add(new, name_hint=instr.name, before=self.comp.root)

    def _tile(self, b: Builder, chunk: Instruction) -> Instruction:
        """A main [chunk] as the device's tile, the tile dim first: [c_k, other dims...] (one
        reshape for the row and the column reductions of the same value)."""
        found = self._tiles.get(chunk)
        if found is None or found.parent is not self.comp:
            moved = tuple(self.fmt.tile_dims()[p] for p in self.fmt.perm)
            found = self._tiles[chunk] = b.reshape(chunk, ArrayShape(chunk.shape.element_type, moved))
        return found

    def _partial_reduction(self, instr: Instruction) -> None:
        """A reduce over some of the gradient's dims S (Adafactor's row or column mean) on the
        device's tile: a factor tile when the tile dim is kept, else a partial result (padding
        rows masked with the identity) all-reduced into the whole factor."""
        data, init = instr.operands
        reduced = self.c.reduced[instr]
        b = self.builder(instr)
        part = self.shard[data]
        fmt, perm = self.fmt, self.fmt.perm
        whole = self.factor_format(reduced) is None
        if whole and fmt.padded > fmt.size:
            part = b.select(self.real_mask(), part, b.broadcast(init, part.shape, ()))
        tile = self._tile(b, part)
        out = b.reduce(tile, init, sorted(perm.index(d) for d in reduced), instr.called["to_apply"])
        if whole:  # the remaining dims, in their order (the tile dim was reduced away)
            kind = Reduction.of_instruction(instr)
            out = self.collective(b, Opcode.ALL_REDUCE, out.shape, out,
                                  self.reduction(REDUCTION_NAME[kind.opcode], kind.element_type))
            self.reduced.append(out)
        else:  # [c_k, kept dims...]: the factor's own tiling, flattened
            flat = self.flat(instr.shape.element_type, self.factor_format(reduced))
            if out.shape.dims != flat.dims:
                out = b.reshape(out, flat)
        self.shard[instr] = out

    def _broadcast_factor(self, instr: Instruction) -> None:
        """A factor broadcast back over the dims it was reduced over, on the device's tile."""
        source = instr.operands[0]
        reduced = self.c.reduced[source]
        b = self.builder(instr)
        moved = tuple(self.fmt.tile_dims()[p] for p in self.fmt.perm)
        kept = [i for i, p in enumerate(self.fmt.perm) if p not in reduced]
        x = self.shard[source]
        etype = instr.shape.element_type
        if self.factor_format(reduced) is not None and x.shape.rank != len(kept):  # its tile, the tile dim first
            x = b.reshape(x, ArrayShape(etype, tuple(moved[i] for i in kept)))
        tile = b.broadcast(x, ArrayShape(etype, moved), kept)
        self.shard[instr] = b.reshape(tile, self.flat(etype))

    def _reduction(self, instr: Instruction) -> None:
        data, init = instr.operands
        b = self.builder(instr)
        part = self.shard_of(data)  # a shard value, a pulled expression or a sliced weight
        fmt = self.factor_format(self.c.reduced.get(data, ()))
        if fmt is None:  # of a factor held whole: reduced whole, as before
            whole = b.op(Opcode.REDUCE, instr.shape, [part, init], dimensions=tuple(range(part.shape.rank)),
                         called={"to_apply": instr.called["to_apply"]})
            instr.replace_all_uses_with(whole)
            return
        etype = part.shape.element_type
        if fmt.padded > fmt.size:  # padding must not take part: fill it with the identity
            part = b.select(self.real_mask(fmt), part, b.broadcast(init, self.flat(etype, fmt), ()))
        partial = b.reduce(part, init, (0,), instr.called["to_apply"])
        kind = Reduction.of_instruction(instr)
        total = self.collective(b, Opcode.ALL_REDUCE, instr.shape, partial,
                                self.reduction(REDUCTION_NAME[kind.opcode], kind.element_type))
        self.reduced.append(total)
        instr.replace_all_uses_with(total)

    def _exits(self) -> None:
        root = self.comp.root
        kept = self._kept_outputs() if self.keep_state else {}
        whole = {v for v in self.c.exits if self.factor_format(self.c.reduced.get(v, ())) is None}
        self.gathered_state = [v for v in self.c.exits if v not in kept and v not in self.weights and v not in whole]
        out_shardings: dict[int, Sharding] = {}
        for value in self.c.exits:
            b = self.builder(value)
            chunk = self.shard[value]
            fmt = self.factor_format(self.c.reduced.get(value, ()))
            if value in kept:
                out = self.fmt.to_tile(b, chunk, self._tile_dims(value.shape.dims))
                self.kept_outputs.append(out)
            elif fmt is None:  # a factor held whole: every device has all of it
                out = chunk
            else:
                full = ArrayShape(value.shape.element_type, (fmt.padded,))
                gathered = self.collective(b, Opcode.ALL_GATHER, full, chunk, dimension=0)
                self.gathered.append(gathered)
                out = fmt.unformat(b, gathered, value.shape)
                out.shape = value.shape  # made here (same dims): keep the output's layout
            if value is root:
                self.comp.root = out
                continue
            for tail in self.c.tails:
                if tail.operands[0] is value:
                    b = self.builder(tail)
                    if value in kept:  # a reshape that only changes the layout: the same tile
                        shaped = b.reshape(out, ArrayShape(out.shape.element_type, out.shape.dims, layout=tail.shape.layout))
                    elif tail.opcode is Opcode.TRANSPOSE:
                        shaped = b.op(Opcode.TRANSPOSE, tail.shape, [out], dimensions=tail.attr("dimensions"))
                    else:
                        shaped = b.reshape(out, tail.shape)
                    _replace_root_operand(root, tail, shaped, kept.get(value), out_shardings)
            _replace_root_operand(root, value, out, kept.get(value), out_shardings)
        if root.opcode is Opcode.TUPLE:
            root.shape = TupleShape(tuple(o.shape for o in root.operands))
        if kept:
            self._record_shardings(out_shardings)

    # ------------------------------------------------------ optimizer state --
    def _tile_dim(self, dims: tuple[int, ...]) -> int | None:
        if self.fmt.is_tiled:
            return self.fmt.tile_dim if tuple(dims) == self.fmt.dims else None
        return self.fmt.flat_tile_dim(tuple(dims))

    def _tile_dims(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        k = self._tile_dim(dims)
        return tuple(-(-d // self.n) if i == k else d for i, d in enumerate(dims))

    def _refined(self, sharding: Sharding | None, dims: tuple[int, ...]) -> Sharding | None:
        k = self._tile_dim(dims)
        if k is None:
            return None
        return refined_sharding(sharding, len(dims), k, dims[k], self.c.groups, self.module.num_partitions)

    def can_keep_state(self) -> str | None:
        """Why state cannot stay sharded here (None: it can)."""
        if self.signature is None:
            self.signature = Signature(self.module, self.comp)
        return self.signature.why

    def _choose_state_params(self) -> None:
        """Parameters read only by the update, standing for ENTRY parameters read only here,
        whose tiles the refined sharding describes: from now on they take their tile."""
        if self.can_keep_state() is not None:
            return
        inside = set(self.c.shard_values) | set(self.c.pulled) | set(self.c.reductions)
        for p in self.c.sliced:
            if (p.opcode is not Opcode.PARAMETER or p.parent is not self.comp or not p.shape.is_array
                    or not all(u in inside for u in p.users)):
                continue
            outer = self.signature.entry_parameter(p)
            if outer is None:
                continue
            new = self._refined(outer.sharding if outer.has_attr("sharding") else None, p.shape.dims)
            if new is None:
                continue
            self.state_params[p] = new
            tile = self._tile_dims(p.shape.dims)
            for x in {p, outer}:
                x.shape = ArrayShape(x.shape.element_type, tile, layout=x.shape.layout)
            outer.sharding = new

    def _kept_outputs(self) -> dict[Instruction, Sharding]:
        """Optimizer-state exits, returned as tiles, with their new sharding.  An exit that leaves
        through a reshape to another shape or a transpose is gathered: its tile would be a tile of
        another shape."""
        why = self.can_keep_state()
        if why is not None:
            self.remark(self.c.stems[0].all_reduce, f"optimizer state all-gathered: {why}", "missed")
            return {}
        sig = self.signature
        root = self.comp.root
        holder = sig.holder
        current = holder.sharding if holder.has_attr("sharding") else None
        if current is None:
            replicated = Replication(self.module, self.c.groups, extra=set(self.c.reductions),
                                     assume_parameters=self.assume_parameters,
                                     parameter_replication_covers_partitions=True)
            if not all(o in self.c.exits or replicated(o) for o in root.operands):
                self.remark(self.c.stems[0].all_reduce, "optimizer state all-gathered: the program's result "
                            "has no sharding and not every output is provably replicated", "missed")
                return {}
        tails: dict[Instruction, list[Instruction]] = {}
        for t in self.c.tails:
            tails.setdefault(t.operands[0], []).append(t)
        kept: dict[Instruction, Sharding] = {}
        for value in self.c.exits:
            if value in self.weights or value.is_root:
                continue
            if any(t.opcode is Opcode.TRANSPOSE or t.shape.dims != value.shape.dims for t in tails.get(value, ())):
                continue  # its tile would be a tile of another shape: gathered
            outs = {value, *tails.get(value, ())}
            positions = [i for j, o in enumerate(root.operands) if o in outs for i in sig.output_positions(j)]
            if not positions:
                continue
            olds = {current.elements[i] if current is not None and current.is_tuple else None for i in positions}
            if len(olds) != 1:
                continue
            new = self._refined(olds.pop(), value.shape.dims)
            if new is not None:
                kept[value] = new
        return kept

    def weight_exits(self) -> set[Instruction]:
        """Exits computed from a weight: from a parameter (or a slice of one) that something
        outside the update reads too (the forward pass reads the weight; only the update reads
        its optimizer state).  The other exits are optimizer state.  Other values the update
        reads (BatchNorm's 1/sigma, which scales the gradient of its scale) say neither."""
        inside = set(self.c.shard_values) | set(self.c.pulled) | set(self.c.reductions)
        slicing = (Opcode.DYNAMIC_SLICE, Opcode.SLICE, Opcode.RESHAPE, Opcode.BITCAST, Opcode.COPY)

        def shared(value: Instruction) -> bool:
            chain, x = [value], value
            while x.opcode in slicing:
                x = x.operands[0]
                chain.append(x)
            if x.opcode is not Opcode.PARAMETER or x in self.state_params:
                return False
            members = set(chain)
            return any(u not in inside and u not in members for y in chain for u in y.users)

        reads: dict[Instruction, bool] = {}
        for instr in self.c.pulled + self.c.shard_values:
            reads[instr] = any(reads.get(o, False) if o in inside else (o in self.c.sliced and shared(o))
                               for o in instr.operands)
        return {v for v in self.c.exits if reads.get(v, False)}

    def _record_shardings(self, out_shardings: dict[int, Sharding]) -> None:
        """`out_shardings`: by position in the update's result; recorded on the program's result."""
        sig = self.signature
        holder = sig.holder
        current = holder.sharding if holder.has_attr("sharding") else None
        by_output = {i: sharding for j, sharding in out_shardings.items() for i in sig.output_positions(j)}
        elements = []
        for i in range(sig.output_count()):
            if i in by_output:
                elements.append(by_output[i])
            elif current is not None and current.is_tuple:
                elements.append(current.elements[i])
            else:
                elements.append(Sharding.replicated())
        sig.update_shapes()
        holder.sharding = Sharding.tuple_of(elements)

    # ------------------------------------------------------------ cleanup --
    def _cleanup(self) -> None:
        c = self.c
        dead = [*c.tails, *reversed(c.shard_values), *reversed(c.pulled), *c.reductions]
        for stem in c.stems:
            dead += [*reversed(stem.ops), stem.all_reduce]
        dead_set = set(dead)
        order: list[Instruction] = []  # what dies, users before operands
        gone: set[Instruction] = set()
        work = list(dead)
        while work:
            instr = work.pop(0)
            if (instr in gone or instr.parent is not self.comp or instr.is_root or instr.control_successors
                    or any(u not in gone for u in instr.users)):  # (what others wait on stays, as dce keeps it)
                continue
            if instr not in dead_set and (instr.opcode is Opcode.PARAMETER or instr.has_side_effect
                                          or instr.opcode.is_collective):
                continue
            gone.add(instr)
            order.append(instr)
            work.extend(instr.operands)
        if self.price is not None:
            before = self._users_before
            self.removed_cost = self.price(order, lambda i: before.get(i, tuple(i.users)),
                                           frozenset({self._root_before}))
        for instr in order:
            fused = instr.called.get("calls") if instr.opcode is Opcode.FUSION else None
            self.comp.remove(instr)
            if fused is not None and not any(fused in i.called_computations()
                                             for i in self.module.all_instructions()):
                self.module.remove_computation(fused)  # the fusion was its only caller
