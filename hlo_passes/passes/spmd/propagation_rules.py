"""Per-opcode sharding propagation rules for `sharding-propagation`.

A rule says how shardings cross one op, in both directions:

    forward(instr, operand_leaves, ctx)            -> result leaves, or None for "nothing to say"
    backward(instr, operand_index, result_leaves, ctx) -> that operand's leaves, or None

"Leaves" are the shardings of the leaves of a (possibly tuple) shape, flattened like
HLO tuple shardings; an array has one leaf, and a leaf may be None (unknown).  Rules
move tile coordinates with `TileMap` (see tile_map.py), so partial replication falls
out naturally: a dot's contracting dims, a reduce's reduced dims or a slice's cut dims
are dropped and their devices become replicas.

Opcodes without a rule propagate nothing; what stays unknown ends up replicated.
Control flow (while, call, conditional) links computations and lives in the pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_TERNARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.ir.shape import ArrayShape, Shape
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.spmd.tile_map import TileMap, reshape_tile_map

Leaves = list[Optional[Sharding]]


# ------------------------------------------------------------------ context --
@dataclass
class RuleContext:
    """What rules may read besides their arguments: the device count and current shardings."""

    num_devices: int
    current: Callable[[Instruction], Leaves]

    def tile_map(self, sharding: Sharding | None, rank: int) -> TileMap | None:
        if sharding is None:
            return None
        return TileMap.from_sharding(sharding, self.num_devices, rank)


def num_leaves(shape: Shape) -> int:
    return len(shape.leaves())


def leaf_offset(shape: Shape, index: int) -> tuple[int, int]:
    """(first leaf, leaf count) of tuple element `index` of `shape`."""
    start = sum(num_leaves(e) for e in shape.elements[:index])
    return start, num_leaves(shape.elements[index])


def specificity(sharding: Sharding | None) -> int:
    """How much a sharding says: unknown < replicated < more tiles < manual / maximal."""
    if sharding is None:
        return -1
    if sharding.kind is ShardingKind.TILED:
        norm = sharding.normalized()
        return max(1, _tiles(norm)) if norm.kind is ShardingKind.TILED else specificity(norm)
    if sharding.kind in (ShardingKind.MANUAL, ShardingKind.MAXIMAL):
        return 1 << 30
    return 1


def _tiles(sharding: Sharding) -> int:
    n = 1
    for t in sharding.data_tile_dims:
        n *= t
    return n


def _opaque(sharding: Sharding | None) -> bool:
    """Shardings that cross every op unchanged: fully manual and maximal."""
    return sharding is not None and sharding.kind in (ShardingKind.MANUAL, ShardingKind.MAXIMAL)


def combine(candidates: list[Sharding | None], rank: int, ctx: RuleContext) -> Sharding | None:
    """The most tiled candidate, refined by every other one it merges with."""
    present = [c for c in candidates if c is not None]
    if not present:
        return None
    for c in present:
        if _opaque(c):
            return c
    maps = [m for m in (ctx.tile_map(c, rank) for c in present) if m is not None]
    if not maps:
        return None
    maps.sort(key=lambda m: -m.num_tiles)
    best = maps[0]
    for other in maps[1:]:
        merged = best.merge(other)
        if merged is not None:
            best = merged
    return best.to_sharding()


def _through(sharding: Sharding | None, in_rank: int, out_rank: int, source: dict[int, int],
             ctx: RuleContext) -> Sharding | None:
    """Move `sharding` from an array of rank `in_rank` to one of `out_rank`: out dim i takes in dim source[i]."""
    if _opaque(sharding):
        return sharding
    tm = ctx.tile_map(sharding, in_rank)
    return None if tm is None else tm.remap(out_rank, source).to_sharding()


def _rank(instr: Instruction) -> int:
    return instr.shape.rank if isinstance(instr.shape, ArrayShape) else -1


def _same_dims(a: Shape, b: Shape) -> bool:
    return isinstance(a, ArrayShape) and isinstance(b, ArrayShape) and a.dims == b.dims


# -------------------------------------------------------------------- rules --
class Rule:
    def forward(self, instr: Instruction, operands: list[Leaves], ctx: RuleContext) -> Leaves | None:
        return None

    def backward(self, instr: Instruction, index: int, result: Leaves, ctx: RuleContext) -> Leaves | None:
        return None


class ArrayRule(Rule):
    """A rule between array operands and an array result, dimension by dimension."""

    def forward(self, instr, operands, ctx):
        if not isinstance(instr.shape, ArrayShape):
            return None
        cands = [self.to_result(instr, i, leaves[0], ctx) for i, leaves in enumerate(operands)
                 if len(leaves) == 1 and isinstance(instr.operands[i].shape, ArrayShape)]
        out = combine(cands, instr.shape.rank, ctx)
        return None if out is None else [out]

    def backward(self, instr, index, result, ctx):
        if not isinstance(instr.shape, ArrayShape) or not isinstance(instr.operands[index].shape, ArrayShape):
            return None
        out = self.to_operand(instr, index, result[0], ctx)
        return None if out is None else [out]

    def to_result(self, instr, index, sharding, ctx) -> Sharding | None:
        """Dims of the result that operand `index` determines: {result dim: operand dim}."""
        m = self.dim_map(instr, index)
        return None if m is None else _through(sharding, instr.operands[index].shape.rank, instr.shape.rank, m, ctx)

    def to_operand(self, instr, index, sharding, ctx) -> Sharding | None:
        m = self.dim_map(instr, index)
        if m is None:
            return None
        inverse = {src: out for out, src in m.items()}
        return _through(sharding, instr.shape.rank, instr.operands[index].shape.rank, inverse, ctx)

    def dim_map(self, instr: Instruction, index: int) -> dict[int, int] | None:
        return None


class Elementwise(ArrayRule):
    """Same shape in and out: every dimension carries over.  Scalar operands (select's
    predicate, clamp's bounds) say nothing and are told nothing."""

    def dim_map(self, instr, index):
        if not _same_dims(instr.operands[index].shape, instr.shape):
            return None
        return {d: d for d in range(instr.shape.rank)}


class BitcastConvert(ArrayRule):
    """Same shape, or — when the element width changes — one minor dim more or less (the
    ratio of the widths): the dims both shapes share carry over, the minor one stays whole."""

    def dim_map(self, instr, index):
        shared = min(instr.shape.rank, instr.operands[0].shape.rank)
        if instr.shape.dims[:shared] != instr.operands[0].shape.dims[:shared]:
            return None
        return {d: d for d in range(shared)}


class KeepDims(ArrayRule):
    """Same rank in and out; only the dims `kept(instr, index)` carry their tiling."""

    def __init__(self, kept: Callable[[Instruction, int], list[int] | None]):
        self.kept = kept

    def dim_map(self, instr, index):
        dims = self.kept(instr, index)
        return None if dims is None else {d: d for d in dims}


class Broadcast(ArrayRule):
    def dim_map(self, instr, index):
        return {out: i for i, out in enumerate(instr.dimensions)}


class Transpose(ArrayRule):
    def dim_map(self, instr, index):
        return {i: p for i, p in enumerate(instr.dimensions)}


class Reshape(ArrayRule):
    def to_result(self, instr, index, sharding, ctx):
        return self._move(sharding, instr.operands[0].shape, instr.shape, ctx)

    def to_operand(self, instr, index, sharding, ctx):
        return self._move(sharding, instr.shape, instr.operands[0].shape, ctx)

    @staticmethod
    def _move(sharding, src: ArrayShape, dst: ArrayShape, ctx):
        if _opaque(sharding):
            return sharding
        tm = ctx.tile_map(sharding, src.rank)
        if tm is None or src.element_count != dst.element_count:
            return None
        return reshape_tile_map(tm, src.dims, dst.dims).to_sharding()


class Dot(ArrayRule):
    """Result dims: batch, lhs free, rhs free.  Contracting dims of an operand are dropped
    (their devices hold partial sums, i.e. replicas of the result)."""

    def dim_map(self, instr, index):
        lhs, rhs = instr.operands[0].shape, instr.operands[1].shape
        dd = instr.dot_dimensions
        lb, rb, lc, rc = dd.lhs_batch, dd.rhs_batch, dd.lhs_contracting, dd.rhs_contracting
        lfree = [d for d in range(lhs.rank) if d not in lb and d not in lc]
        rfree = [d for d in range(rhs.rank) if d not in rb and d not in rc]
        if index == 0:
            m = {k: d for k, d in enumerate(lb)}
            m.update({len(lb) + k: d for k, d in enumerate(lfree)})
        else:
            m = {k: d for k, d in enumerate(rb)}
            m.update({len(lb) + len(lfree) + k: d for k, d in enumerate(rfree)})
        return m

    def backward(self, instr, index, result, ctx):
        """The operand's batch and free dims from the result, its contracting dims from the
        other operand (so both sides of a contraction agree and no operand is resharded)."""
        own = super().backward(instr, index, result, ctx)
        other = 1 - index
        other_leaves = ctx.current(instr.operands[other])
        dd = instr.dot_dimensions
        this_c = dd.lhs_contracting if index == 0 else dd.rhs_contracting
        other_c = dd.lhs_contracting if other == 0 else dd.rhs_contracting
        contracting = None
        if other_leaves and other_leaves[0] is not None:
            contracting = _through(other_leaves[0], instr.operands[other].shape.rank,
                                   instr.operands[index].shape.rank, dict(zip(this_c, other_c)), ctx)
        out = combine([own[0] if own else None, contracting], instr.operands[index].shape.rank, ctx)
        return None if out is None else [out]


class Convolution(ArrayRule):
    """Input batch and spatial dims <-> output batch and spatial dims; kernel output feature
    <-> output feature.  Grouped convolutions only carry the batch dim."""

    def dim_map(self, instr, index):
        labels = instr.conv_labels
        if labels is None:
            return None
        grouped = instr.attr("feature_group_count", 1) != 1 or instr.attr("batch_group_count", 1) != 1
        if index == 0:
            m = {labels.output_batch: labels.input_batch}
            if not grouped:
                m.update(dict(zip(labels.output_spatial, labels.input_spatial)))
            return m
        if grouped:
            return {}
        return {labels.output_feature: labels.kernel_output_feature}


class Reduce(Rule):
    """Reduced dims are dropped; inputs may be variadic (tuple result)."""

    @staticmethod
    def _kept(instr) -> list[int]:
        reduced = instr.dimensions
        return [d for d in range(instr.operands[0].shape.rank) if d not in reduced]

    def forward(self, instr, operands, ctx):
        n = len(instr.operands) // 2
        kept = self._kept(instr)
        rank = instr.operands[0].shape.rank
        cands = [_through(leaves[0], rank, len(kept), dict(enumerate(kept)), ctx)
                 for leaves in operands[:n] if leaves and leaves[0] is not None]
        out = combine(cands, len(kept), ctx)
        return None if out is None else [out] * n

    def backward(self, instr, index, result, ctx):
        n = len(instr.operands) // 2
        if index >= n:
            return [Sharding.replicated()]
        kept = self._kept(instr)
        rank = instr.operands[0].shape.rank
        best = combine(list(result), len(kept), ctx)
        out = _through(best, len(kept), rank, {d: k for k, d in enumerate(kept)}, ctx)
        return None if out is None else [out]


class Tuple(Rule):
    def forward(self, instr, operands, ctx):
        return [s for leaves in operands for s in leaves]

    def backward(self, instr, index, result, ctx):
        start, count = leaf_offset(instr.shape, index)
        return list(result[start:start + count])


class GetTupleElement(Rule):
    def forward(self, instr, operands, ctx):
        start, count = leaf_offset(instr.operands[0].shape, instr.attr("index"))
        return list(operands[0][start:start + count])

    def backward(self, instr, index, result, ctx):
        shape = instr.operands[0].shape
        start, count = leaf_offset(shape, instr.attr("index"))
        leaves: Leaves = [None] * num_leaves(shape)
        leaves[start:start + count] = result
        return leaves


class LeafPassThrough(Rule):
    """Result leaf i is operand leaf i (opt-barrier; while's operand and result)."""

    def forward(self, instr, operands, ctx):
        return [s for leaves in operands for s in leaves]

    def backward(self, instr, index, result, ctx):
        start = sum(num_leaves(o.shape) for o in instr.operands[:index])
        return list(result[start:start + num_leaves(instr.operands[index].shape)])


class Sort(Rule):
    """All operands and results share a shape; the sorted dimension loses its tiling."""

    def _kept_map(self, instr):
        dim = (instr.dimensions or (0,))[0]
        return {d: d for d in range(instr.operands[0].shape.rank) if d != dim}

    def forward(self, instr, operands, ctx):
        rank = instr.operands[0].shape.rank
        m = self._kept_map(instr)
        out = combine([_through(l[0], rank, rank, m, ctx) for l in operands if l], rank, ctx)
        return None if out is None else [out] * num_leaves(instr.shape)

    def backward(self, instr, index, result, ctx):
        rank = instr.operands[0].shape.rank
        out = combine([_through(s, rank, rank, self._kept_map(instr), ctx) for s in result], rank, ctx)
        return None if out is None else [out]


class Gather(ArrayRule):
    """Operand dims taken whole (passthrough) -> their offset dims; index batch dims -> batch dims."""

    def dim_map(self, instr, index):
        operand, indices = instr.operands[0].shape, instr.operands[1].shape
        gd = instr.gather_dimensions
        offset_dims = gd.offset_dims
        collapsed = gd.collapsed_slice_dims
        batching = gd.operand_batching_dims
        sizes = gd.slice_sizes
        out_rank = instr.shape.rank
        if index == 0:
            window = [d for d in range(operand.rank) if d not in collapsed and d not in batching]
            return {offset_dims[k]: d for k, d in enumerate(window)
                    if k < len(offset_dims) and sizes[d] == operand.dims[d]}
        ivd = instr.attr("index_vector_dim", indices.rank)
        index_batch = [d for d in range(indices.rank) if d != ivd]
        out_batch = [d for d in range(out_rank) if d not in offset_dims]
        return dict(zip(out_batch, index_batch))


class Scatter(Rule):
    """Result i ~ input i on the dims the updates cover whole; update window dims <-> those dims;
    update scatter dims <-> index batch dims are not carried (they address data)."""

    def _split(self, instr):
        n = (len(instr.operands) - 1) // 2
        return n, instr.operands[:n], instr.operands[n], instr.operands[n + 1:]

    def _window_map(self, instr) -> dict[int, int]:
        """{operand dim: update dim} for operand dims the updates span in full."""
        n, inputs, _, updates = self._split(instr)
        operand, update = inputs[0].shape, updates[0].shape
        sd = instr.scatter_dimensions
        inserted, batching, uwd = sd.inserted_window_dims, sd.input_batching_dims, sd.update_window_dims
        window = [d for d in range(operand.rank) if d not in inserted and d not in batching]
        return {d: uwd[k] for k, d in enumerate(window)
                if k < len(uwd) and update.dims[uwd[k]] == operand.dims[d]}

    def forward(self, instr, operands, ctx):
        n, inputs, _, updates = self._split(instr)
        rank = inputs[0].shape.rank
        wm = self._window_map(instr)
        cands = [_through(l[0], rank, rank, {d: d for d in wm}, ctx) for l in operands[:n] if l]
        cands += [_through(l[0], updates[0].shape.rank, rank, wm, ctx) for l in operands[n + 1:] if l]
        out = combine(cands, rank, ctx)
        return None if out is None else [out] * n

    def backward(self, instr, index, result, ctx):
        n, inputs, _, updates = self._split(instr)
        rank = inputs[0].shape.rank
        best = combine(list(result), rank, ctx)
        wm = self._window_map(instr)
        if index < n:
            out = _through(best, rank, rank, {d: d for d in wm}, ctx)
        elif index == n:
            return None
        else:
            out = _through(best, rank, updates[0].shape.rank, {u: d for d, u in wm.items()}, ctx)
        return None if out is None else [out]


class ShardingAnnotation(Elementwise):
    """custom-call "Sharding": fixed itself; tells its operand what it wants."""


# ----------------------------------------------------------- kept-dim rules --
def _slice_kept(instr, index):
    if index != 0:
        return None
    spec = instr.attr("slice")
    dims = instr.operands[0].shape.dims
    return [d for d in range(len(dims))
            if spec.starts[d] == 0 and spec.limits[d] == dims[d] and spec.strides[d] == 1]


def _pad_kept(instr, index):
    if index != 0:
        return None
    cfg = instr.attr("padding")
    return [d for d, (lo, hi, interior) in enumerate(cfg.dimensions) if lo == hi == interior == 0]


def _concat_kept(instr, index):
    dim = (instr.dimensions or (0,))[0]
    return [d for d in range(instr.shape.rank) if d != dim]


def _reverse_kept(instr, index):
    rev = instr.dimensions
    return [d for d in range(instr.shape.rank) if d not in rev]


def _dynamic_slice_kept(instr, index):
    if index != 0:
        return None
    sizes = instr.attr("dynamic_slice_sizes", ())
    dims = instr.operands[0].shape.dims
    return [d for d in range(len(dims)) if sizes[d] == dims[d]]


def _dus_kept(instr, index):
    if index > 1:
        return None
    update = instr.operands[1].shape.dims
    dims = instr.shape.dims
    return [d for d in range(len(dims)) if update[d] == dims[d]]


def _windowed_dims_kept(instr) -> list[int]:
    """The dims of a windowed op's operand that carry a tiling through it: every dim with a
    trivial window, and windowed dims without base dilation whose window spans at most half
    the dim.  Those the partitioner runs locally after a halo exchange (handlers/
    reduce_window.py), and the halo moves less than a gather for any tile count; a window as
    wide as the dim (JAX's cumsum on the CPU is a reduce-window of the dim's full size) would
    make it gather the dim, compute, and slice the result again for nothing."""
    operand = instr.operands[0].shape
    kept = []
    for d, w in enumerate(instr.window.dimensions):
        extent = (w.size - 1) * w.rhs_dilation + 1
        if w.lhs_dilation == 1 and (w.size == 1 or 2 * extent <= operand.dims[d]):
            kept.append(d)
    return kept


def _reduce_window_kept(instr, index):
    """The inputs (not the init values) tile like the result, on `_windowed_dims_kept`."""
    if index >= len(instr.operands) // 2:
        return None
    return _windowed_dims_kept(instr)


def _select_and_scatter_kept(instr, index):
    """The operand (index 0) and the source (index 1, shaped like the windowed result of
    the forward reduce-window) tile like the result; the init value (index 2) is a scalar."""
    if index >= 2:
        return None
    return _windowed_dims_kept(instr)


# --------------------------------------------------------------- the table --
ELEMENTWISE = Elementwise()

RULES: dict[Opcode, Rule] = {
    **{op: ELEMENTWISE for op in ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY},
    Opcode.MAP: ELEMENTWISE,
    Opcode.BITCAST_CONVERT: BitcastConvert(),
    Opcode.ALL_REDUCE: ELEMENTWISE,
    Opcode.COLLECTIVE_PERMUTE: ELEMENTWISE,
    Opcode.BROADCAST: Broadcast(),
    Opcode.TRANSPOSE: Transpose(),
    Opcode.RESHAPE: Reshape(),
    Opcode.BITCAST: Reshape(),
    Opcode.DOT: Dot(),
    Opcode.CONVOLUTION: Convolution(),
    Opcode.REDUCE: Reduce(),
    Opcode.TUPLE: Tuple(),
    Opcode.GET_TUPLE_ELEMENT: GetTupleElement(),
    Opcode.OPTIMIZATION_BARRIER: LeafPassThrough(),
    Opcode.SORT: Sort(),
    Opcode.GATHER: Gather(),
    Opcode.SCATTER: Scatter(),
    Opcode.SLICE: KeepDims(_slice_kept),
    Opcode.PAD: KeepDims(_pad_kept),
    Opcode.DYNAMIC_SLICE: KeepDims(_dynamic_slice_kept),
    Opcode.DYNAMIC_UPDATE_SLICE: KeepDims(_dus_kept),
    Opcode.CONCATENATE: KeepDims(_concat_kept),
    Opcode.REVERSE: KeepDims(_reverse_kept),
    Opcode.REDUCE_WINDOW: KeepDims(_reduce_window_kept),
    Opcode.SELECT_AND_SCATTER: KeepDims(_select_and_scatter_kept),
}

# custom-call targets with a rule; other custom-calls propagate nothing.
CUSTOM_CALL_RULES: dict[str, Rule] = {
    "Sharding": ShardingAnnotation(),
}

NO_RULE = Rule()


def rule_for(instr: Instruction) -> Rule:
    if instr.opcode is Opcode.CUSTOM_CALL:
        return CUSTOM_CALL_RULES.get(instr.custom_call_target or "", NO_RULE)
    return RULES.get(instr.opcode, NO_RULE)
