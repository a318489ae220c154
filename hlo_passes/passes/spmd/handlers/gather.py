"""gather in the passthrough case: operand dims that are neither indexed nor collapsed
(sliced whole, `slice_sizes[d] == dim`) keep their tiling into the matching output offset
dim, so each device gathers from its own columns with replicated indices.

    %g = f32[4,8] gather(f32[16,8] %x {devices=[1,8]}, s32[4,1] %idx), offset_dims={1},
         collapsed_slice_dims={0}, start_index_map={0}, slice_sizes={1,8}
  becomes  %g = f32[4,1] gather(f32[16,1] %x, %idx), ..., slice_sizes={1,1}   ({devices=[1,8]})

Otherwise, when the result (or the indices) are tiled along the indices' batch dims,
the gather is index-parallel: each device gathers its own rows of indices from the
whole operand (tiled only on its batching dims, like the matching index dims).

    %g = f32[16,8,16] gather(f32[10,16] %embed, s32[16,8,1] %ids {devices=[8,1,1]}),
         offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2
  becomes  %g = f32[2,8,16] gather(f32[10,16] %embed, s32[2,8,1] %ids)   ({devices=[8,1,1]})

scatter mirrors both: operand passthrough dims (covered whole by the update windows,
addressed by no index) tiled like the result scatter locally with all the indices;
otherwise updates and indices tiled along the index batch dims scatter locally, and
where those dims are not batching dims every device scatters its updates into the
reducer's identity (one device of each group into the operand) and the partial results are
all-reduced (reducers that are one binary op: add, max, ...; a variadic scatter's reducer must
be one such op per output, each output all-reduced with its own), unless gathering the updates
and indices moves less.  Variadic scatters take every path; one whose reducer pairs its outputs
(an argmax) is replicated where it would need partial sums.  Anything else is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.spmd.partition_context import (PValue, groups_varying, local_shape,
                                                       reducer_opcodes, tile_map, tm_local_dims, to_sharding)
from hlo_passes.passes.spmd.cost_model import ZERO, Estimate
from hlo_passes.passes.spmd.handlers.dot import partial_sum_cost, sum_partials
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import Int64Array, TileMap


def _index_batch_tiling(p: HandlerContext, instr: Instruction, indices: Instruction, like: Sharding, out_rank: int,
                        out_batch: list[int], operand: Instruction | None = None,
                        batching: dict[int, int] | None = None) -> tuple[TileMap, list[int]] | None:
    """The tiling of the indices' batch dims (all but index_vector_dim) that the op runs with:
    the first of `_index_batch_tilings`, or None when none is tiled there."""
    found = _index_batch_tilings(p, instr, indices, like, out_rank, out_batch, operand, batching)
    return found[0] if found else None


def _index_batch_tilings(p: HandlerContext, instr: Instruction, indices: Instruction, like: Sharding, out_rank: int,
                         out_batch: list[int], operand: Instruction | None = None,
                         batching: dict[int, int] | None = None) -> list[tuple[TileMap, list[int]]]:
    """Tilings of the indices' batch dims (all but index_vector_dim) an op could run with, in
    order of preference: `like`'s tiling of the matching dims (`out_batch` of a rank-`out_rank`
    array: the gather's result, the scatter's updates) if it has one, the indices' own, and
    `operand`'s tiling of its explicit batching dims (`batching`: operand dim -> index dim; a
    take-along-axis whose logits are tiled by batch while its labels are whole: each device
    takes its rows of the labels, a local slice).  Each is (indices TileMap, index batch dims);
    those that tile nothing are left out."""
    ivd = instr.attr("index_vector_dim")
    batch = [d for d in range(indices.array_shape.rank) if d != ivd]
    if len(batch) != len(out_batch):
        return []
    found: list[tuple[TileMap, list[int]]] = []

    def add(tm: TileMap) -> None:
        if tm.num_tiles > 1 and all(to_sharding(tm) != to_sharding(other) for other, _ in found):
            found.append((tm, batch))

    if not like.is_tuple:
        out_tm = tile_map(like, out_rank, p.n).keep_dims(out_batch)
        if out_tm.num_tiles > 1:
            add(out_tm.remap(indices.array_shape.rank, dict(zip(batch, out_batch))))
    add(tile_map(p.value(indices).sharding, indices.array_shape.rank, p.n).keep_dims(batch))
    if operand is not None and batching:
        op_tm = tile_map(p.value(operand).sharding, operand.array_shape.rank, p.n)
        add(op_tm.remap(indices.array_shape.rank, {i: o for o, i in batching.items()}))
    return found


@dataclass(frozen=True)
class _GatherPlan:
    """Tilings a gather runs locally with: operand, indices and result (a device gathers its
    indices' rows from its operand tile into its result tile)."""

    operand: TileMap
    indices: TileMap
    result: TileMap

    def price(self, p: HandlerContext, instr: Instruction) -> Estimate:
        """What moving the operands to these tilings and the result to its target costs."""
        model, n = p.ctx.cost_model, p.n
        operand, indices = instr.operands
        return (p.move_cost(operand, to_sharding(self.operand)) + p.move_cost(indices, to_sharding(self.indices))
                + cost(to_sharding(self.result), p.target(instr), instr.shape, n, model))


def _index_parallel_plans(p: HandlerContext, instr: Instruction) -> list[_GatherPlan]:
    """The index-parallel tilings, one per candidate tiling of the indices' batch dims (as the
    result's, the indices' own or the operand's batching dims: `_index_batch_tilings`; a
    batched gather whose operand lies by batch and whose result is wanted by index gathers
    where the operand lies and moves the result, rather than gathering the operand): the
    operand's batching dims alike, its passthrough dims where `_with_passthrough_tiling`
    keeps them."""
    operand, indices = instr.operands
    offset_dims = set(instr.gather_dimensions.offset_dims)
    out_batch = [d for d in range(instr.array_shape.rank) if d not in offset_dims]
    op_batching = instr.gather_dimensions.operand_batching_dims
    idx_batching = instr.gather_dimensions.start_indices_batching_dims
    passthrough = _gather_passthrough(instr)
    plans = []
    for idx_tm, batch in _index_batch_tilings(p, instr, indices, p.target(instr), instr.array_shape.rank,
                                              out_batch, operand, dict(zip(op_batching, idx_batching))):
        pos = {d: k for k, d in enumerate(batch)}
        out_tm = idx_tm.remap(instr.array_shape.rank, {out_batch[pos[d]]: d for d in batch})
        to_out = {o: out_batch[pos[i]] for o, i in zip(op_batching, idx_batching)} | passthrough

        def operand_tiling(out: TileMap, to_out: dict[int, int] = to_out) -> TileMap:
            """The operand's batching dims follow the output's matching batch dims, its
            passthrough dims the offset dims they become."""
            return out.remap(operand.array_shape.rank, to_out)

        out_tm = _with_passthrough_tiling(p, instr, out_tm, passthrough, operand_tiling)
        plans.append(_GatherPlan(operand_tiling(out_tm), out_tm.remap(indices.array_shape.rank,
                                                                      {d: out_batch[pos[d]] for d in batch}), out_tm))
    return plans


def _passthrough_plan(p: HandlerContext, instr: Instruction) -> _GatherPlan | None:
    """The operand's own tiling of its passthrough dims, the indices whole on every device;
    None when the operand tiles no passthrough dim."""
    operand, indices = instr.operands
    passthrough = _gather_passthrough(instr)
    op_tm = tile_map(p.value(operand).sharding, operand.array_shape.rank, p.n).keep_dims(list(passthrough))
    if op_tm.num_tiles == 1:
        return None
    return _GatherPlan(op_tm, TileMap.replicated(indices.array_shape.rank, p.n),
                       op_tm.remap(instr.array_shape.rank, {o: d for d, o in passthrough.items()}))


def _emit_gather(p: HandlerContext, instr: Instruction, plan: _GatherPlan) -> PValue:
    """The local gather of `plan`: slice sizes of tiled passthrough dims cut to the tile."""
    passthrough = _gather_passthrough(instr)
    x = p.operand_as(instr, 0, to_sharding(plan.operand))
    idx = p.operand_as(instr, 1, to_sharding(plan.indices))
    out = to_sharding(plan.result)
    new = p.clone(instr, [x, idx], local_shape(instr.shape, out))
    if any(plan.operand.dims[d] > 1 for d in passthrough):
        new.set_attr("slice_sizes", tuple(x.array_shape.dims[d] if d in passthrough else s
                                          for d, s in enumerate(instr.gather_dimensions.slice_sizes)))
    return p.reshard(PValue(new, out, instr.shape), p.target(instr))


def _with_passthrough_tiling(p: HandlerContext, instr: Instruction, out_tm: TileMap, passthrough: dict[int, int],
                             operand_tiling: Callable[[TileMap], TileMap]) -> TileMap:
    """An index-parallel gather's output tiling (`out_tm`, over its batch dims) also split along
    the offset dims of passthrough operand dims (`passthrough`: operand dim -> offset dim) where
    the devices the batch tiling leaves over can take them: the result's tiling of those dims,
    or the operand's.  Each device then gathers its rows of indices from its own columns: no
    operand columns gathered, no result sliced afterwards (XLA partitions batch and passthrough
    dims together).  Of the candidates (none, the result's, the operand's) the cost model picks
    the one moving the least: the operand to `operand_tiling(candidate)`, the result to its
    target."""
    if not passthrough:
        return out_tm
    operand = instr.operands[0]
    out_rank = instr.array_shape.rank
    target = p.target(instr)
    sources: list[TileMap] = []
    if not target.is_tuple:
        sources.append(tile_map(target, out_rank, p.n).keep_dims(list(passthrough.values())))
    sources.append(tile_map(p.value(operand).sharding, operand.array_shape.rank, p.n).remap(
        out_rank, {o: d for d, o in passthrough.items()}))
    candidates = [out_tm]
    for extra in sources:
        merged = out_tm.merge(extra) if extra.num_tiles > 1 else None
        if merged is not None and merged.num_tiles > out_tm.num_tiles:
            candidates.append(merged)
    if len(candidates) == 1:
        return out_tm
    model = p.ctx.cost_model

    def moving(out: TileMap) -> Estimate:
        return (cost(p.value(operand).sharding, to_sharding(operand_tiling(out)), operand.shape, p.n, model)
                + cost(to_sharding(out), target, instr.shape, p.n, model))

    best = candidates[0]
    for candidate in candidates[1:]:
        if moving(candidate) < moving(best):
            best = candidate
    return best


def _index_offsets(p: HandlerContext, indices: Instruction, ivd: int,
                   components: Sequence[Int64Array | None]) -> Instruction:
    """An array shaped like `indices` holding, along the index vector dim, each component's
    per-device value (`components[k]` is a device table for component k, or None for 0)."""
    em, b = p.em, p.em.b()
    etype = indices.array_shape.element_type
    rank = indices.array_shape.rank
    if ivd == rank:  # one implicit component
        value = em.device_scalar(components[0]) if components[0] is not None else b.constant(0)
        if etype is not PrimitiveType.S32:
            value = b.convert(value, etype)
        return b.broadcast(value, indices.array_shape)
    shape = indices.array_shape
    piece_shape = shape.with_dims(tuple(1 if d == ivd else n for d, n in enumerate(shape.dims)))
    pieces: list[Instruction] = []
    for table in components:
        value = em.device_scalar(table) if table is not None else b.constant(0)
        if etype is not PrimitiveType.S32:
            value = b.convert(value, etype)
        pieces.append(b.broadcast(value, piece_shape))
    return b.concatenate(pieces, ivd) if len(pieces) > 1 else pieces[0]


def _component(b: Builder, idx: Instruction, ivd: int, k: int) -> Instruction:
    """Component k of every index vector: an array of the indices' batch shape."""
    shape = idx.array_shape
    if ivd == shape.rank:
        return idx
    part = b.slice(idx, [k if d == ivd else 0 for d in range(shape.rank)],
                   [k + 1 if d == ivd else n for d, n in enumerate(shape.dims)])
    batch = tuple(n for d, n in enumerate(shape.dims) if d != ivd)
    return b.reshape(part, shape.with_dims(batch))


def _sharded_index_dims(p: HandlerContext, instr: Instruction, operand: Instruction, index_map: Sequence[int],
                        slice_sizes_one: Callable[[int], bool],
                        like: Sharding | None = None) -> tuple[TileMap, list[int]] | None:
    """A tiling of the operand on the dims the indices address (only where a window takes one
    element there) — `like`'s (the result's, for a scatter) if it has one, else the operand's
    own: (that tiling, those dims), or None when neither tiles such a dim."""
    for source in ([like] if like is not None and not like.is_tuple else []) + [p.value(operand).sharding]:
        cur = tile_map(source, operand.array_shape.rank, p.n)
        dims = [d for d in index_map if slice_sizes_one(d) and cur.dims[d] > 1]
        if dims:
            return cur.keep_dims(dims), dims
    return None


def _gather_passthrough(instr: Instruction) -> dict[int, int]:
    """Operand dims a gather's slices cover whole and no index addresses (passthrough dims), each
    with the output offset dim it becomes."""
    dims = instr.operands[0].array_shape.dims
    gd = instr.gather_dimensions
    kept = [d for d in range(len(dims)) if d not in gd.collapsed_slice_dims and d not in gd.operand_batching_dims]
    return {d: gd.offset_dims[k] for k, d in enumerate(kept)
            if gd.slice_sizes[d] == dims[d] and d not in gd.start_index_map}


@dataclass(frozen=True)
class _RowsPlan:
    """A gather from an operand tiled along dims its indices address (`_sharded_rows_plan`):
    one iteration space of the output dims and those index dims (`summed`, after the output's),
    and the operand's and indices' tilings in it."""

    space: TileMap
    operand: TileMap
    indices: TileMap
    index_dims: tuple[int, ...]  # the operand dims addressed by indices and tiled
    summed: tuple[int, ...]  # their space dims

    def price(self, p: HandlerContext, instr: Instruction) -> Estimate:
        """Moving the operands to the plan's tilings, summing the partial results and moving
        the sum to the result's target."""
        model, n = p.ctx.cost_model, p.n
        operand, indices = instr.operands
        return (p.move_cost(operand, to_sharding(self.operand)) + p.move_cost(indices, to_sharding(self.indices))
                + partial_sum_cost(instr, self.space, instr.array_shape.rank, self.summed, p.target(instr), n,
                                   model))


def _sharded_rows_plan(p: HandlerContext, instr: Instruction) -> _RowsPlan | None:
    """The plan for a gather whose operand is tiled along dims its indices address (an
    embedding table sharded by vocabulary, `take_along_axis` over a sharded dim), None when it
    is not.  The indices keep a tiling of their batch dims over the other devices (a
    data-parallel batch of token ids), and explicit batching dims (take-along-axis) carry the
    operand's tiling to the indices."""
    operand, indices = instr.operands
    gd = instr.gather_dimensions
    found = _sharded_index_dims(p, instr, operand, gd.start_index_map, lambda d: gd.slice_sizes[d] == 1)
    if found is None:
        return None
    index_dims = found[1]
    out_rank = instr.array_shape.rank
    out_batch = [d for d in range(out_rank) if d not in set(gd.offset_dims)]
    idx_batch = [d for d in range(indices.array_shape.rank) if d != gd.index_vector_dim]
    extra = {out_rank + j: d for j, d in enumerate(index_dims)}
    batching = {out_batch[idx_batch.index(i)]: o
                for o, i in zip(gd.operand_batching_dims, gd.start_indices_batching_dims)}
    passthrough = {o: d for d, o in _gather_passthrough(instr).items()}
    op_cur = tile_map(p.value(operand).sharding, operand.array_shape.rank, p.n)
    space = op_cur.remap(out_rank + len(index_dims), extra | batching | passthrough)
    idx_cur = tile_map(p.value(indices).sharding, indices.array_shape.rank, p.n)
    if len(idx_batch) == len(out_batch):
        lifted = idx_cur.remap(out_rank + len(index_dims), dict(zip(out_batch, idx_batch)))
        merged = space.merge(lifted) if lifted.num_tiles > 1 else None
        if merged is not None:
            space = merged
    op_tm = space.remap(operand.array_shape.rank, {d: s for s, d in (extra | batching | passthrough).items()})
    idx_tm = space.remap(indices.array_shape.rank, dict(zip(idx_batch, out_batch)))
    return _RowsPlan(space, op_tm, idx_tm, tuple(index_dims), tuple(extra))


def _gather_from_sharded_rows(p: HandlerContext, instr: Instruction, plan: _RowsPlan) -> PValue:
    """`plan` as GSPMD does it: every device gathers with its indices shifted into its own
    rows, zeroes the results whose index lies in another device's rows (a gather clamps
    out-of-range indices), and the partial results are summed over the devices of those dims —
    each element comes from exactly one device — by a reduce-scatter where the sum lands in
    the result's tiling (`sum_partials`), else an all-reduce.  The operand's tiling of
    passthrough dims stays (a [vocab, embed] table tiled both ways: each device gathers its
    columns of its rows), like its batching dims'."""
    operand, indices = instr.operands
    gd = instr.gather_dimensions
    em, b = p.em, p.em.b()
    out_rank = instr.array_shape.rank
    out_batch = [d for d in range(out_rank) if d not in set(gd.offset_dims)]
    passthrough = set(_gather_passthrough(instr))
    op_tm, index_dims = plan.operand, plan.index_dims
    out_tm = plan.space.remap(out_rank, {d: d for d in range(out_rank)})
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    idx = p.operand_as(instr, 1, to_sharding(plan.indices))
    local = tm_local_dims(op_tm, tuple(operand.array_shape.dims))
    ivd = gd.index_vector_dim
    # A gather clamps each start so that its slice fits the operand; clamp to the whole
    # operand's bounds first, or an index past the end would be found on no device (or in the
    # last device's padding) instead of giving the last row.
    n = p.n
    lows = [np.zeros(n, np.int64) for _ in gd.start_index_map]
    highs = [np.full(n, operand.array_shape.dims[d] - gd.slice_sizes[d], np.int64) for d in gd.start_index_map]
    idx = b.op(Opcode.CLAMP, idx.shape, [_index_offsets(p, idx, ivd, lows), idx,
                                         _index_offsets(p, idx, ivd, highs)])
    tables = [op_tm.coords[:, d] * local[d] if d in index_dims else None
              for d in gd.start_index_map]
    shifted = b.subtract(idx, _index_offsets(p, idx, ivd, tables))
    valid: Instruction | None = None
    for k, d in enumerate(gd.start_index_map):
        if d not in index_dims:
            continue
        c = _component(b, shifted, ivd, k)
        zero = b.broadcast(b.constant(0, c.array_shape.element_type), c.array_shape)
        limit = b.broadcast(b.constant(local[d], c.array_shape.element_type), c.array_shape)
        inside = b.op(Opcode.AND, c.array_shape.with_element_type(PrimitiveType.PRED),
                      [b.compare(c, zero, "GE"), b.compare(c, limit, "LT")])
        valid = inside if valid is None else b.op(Opcode.AND, inside.shape, [valid, inside])
    out = to_sharding(out_tm)
    result = p.clone(instr, [x, shifted], local_shape(instr.shape, out))
    if any(op_tm.dims[d] > 1 for d in passthrough):
        result.set_attr("slice_sizes", tuple(x.array_shape.dims[d] if d in passthrough else s
                                             for d, s in enumerate(gd.slice_sizes)))
    assert valid is not None  # (the indices address a tiled dim: `_sharded_rows_plan`)
    mask = b.broadcast(valid, result.array_shape.with_element_type(PrimitiveType.PRED), out_batch)
    result = b.select(mask, result, b.broadcast(b.constant(0, instr.array_shape.element_type), result.array_shape))
    # each element is found on one device, zero (false) on the others
    if instr.array_shape.element_type is PrimitiveType.PRED:
        summed = em.all_reduce(result, groups_varying(plan.space, list(plan.summed)), Opcode.OR)
        return p.reshard(PValue(summed, out, instr.shape), p.target(instr))
    return sum_partials(p, instr, result, plan.space, out_rank, plan.summed, p.target(instr))


@handles(Opcode.GATHER)
def gather(p: HandlerContext, instr: Instruction) -> PValue:
    """Of the plans that apply, the cheapest by the cost model: the operand tiled where the
    indices address it (`_gather_from_sharded_rows`: partial results summed), the passthrough
    plan (the operand's passthrough tiling, the indices whole) and the index-parallel ones
    (the indices' batch tiling, with passthrough tiling beside it where the devices allow: then
    neither the indices nor the operand move).  The last two gather an operand tiled where the
    indices address it first: cheaper than summing partial results when the table is smaller
    than the result (a [8,8,16] table looked up 16 times: 4 KB gathered against 8 KB summed)."""
    rows = _sharded_rows_plan(p, instr)
    passthrough = _passthrough_plan(p, instr)
    plans: list[_RowsPlan | _GatherPlan] = [rows] if rows is not None else []
    plans += ([passthrough] if passthrough is not None else []) + _index_parallel_plans(p, instr)
    if not plans:
        return replicate(p, instr, "gather with neither a passthrough dim of the operand nor an index batch dim "
                                   "tiled")
    # by exposed time (`Estimate` order): no plan replicates the gather's work, so `cheapest`'s
    # guard against replicating work does not apply (the partial sums' additions would trip it)
    best, best_price = plans[0], plans[0].price(p, instr)
    for plan in plans[1:]:
        price = plan.price(p, instr)
        if price < best_price:
            best, best_price = plan, price
    if isinstance(best, _RowsPlan):
        return _gather_from_sharded_rows(p, instr, best)
    return _emit_gather(p, instr, best)


def _scatter_into_sharded_rows(p: HandlerContext, instr: Instruction) -> PValue | None:
    """A scatter whose operands are tiled along dims its indices address (where an update
    window covers one element: the gradient of an embedding sharded by vocabulary, of a
    take-along-axis over a sharded dim): every device scatters its updates with the indices
    shifted into its own rows; those that fall in another device's rows are out of bounds, and
    a scatter skips them.  Explicit batching dims keep the operand's tiling on both sides, and
    the indices' other batch dims may stay tiled over the remaining devices (a data-parallel
    batch): then each device scatters its part of the batch into identity-filled rows, the
    parts are summed over those devices and combined with the operand.  The operand's tiling
    of passthrough dims stays, the updates tiled alike (the gradient of a table tiled both by
    vocabulary and by embedding)."""
    sd = instr.scatter_dimensions
    n = (len(instr.operands) - 1) // 2
    inputs, indices, updates = instr.operands[:n], instr.operands[n], instr.operands[n + 1:]
    target = p.target(instr)
    like = target.element(0) if target.is_tuple else target
    found = _sharded_index_dims(p, instr, inputs[0], sd.scatter_dims_to_operand_dims,
                                lambda d: d in sd.inserted_window_dims, like=like)
    if found is None:
        return None
    index_dims = found[1]
    op_rank, ivd = inputs[0].array_shape.rank, sd.index_vector_dim
    op_batching, idx_batching = list(sd.input_batching_dims), list(sd.scatter_indices_batching_dims)
    idx_batch = [d for d in range(indices.array_shape.rank) if d != ivd]
    window = set(sd.update_window_dims)
    upd_scatter = [d for d in range(updates[0].array_shape.rank) if d not in window]
    if len(upd_scatter) != len(idx_batch):
        return None
    partial_idx = [d for d in idx_batch if d not in idx_batching]
    # One iteration space: the operand's dims, then the indices' non-batching batch dims.
    source = like if not like.is_tuple and tile_map(like, op_rank, p.n).keep_dims(index_dims).num_tiles > 1 \
        else p.value(inputs[0]).sharding
    passthrough = _scatter_passthrough_dims(instr)
    space = tile_map(source, op_rank, p.n).keep_dims(index_dims + op_batching + list(passthrough)).remap(
        op_rank + len(partial_idx), {d: d for d in range(op_rank)})
    idx_own = tile_map(p.value(indices).sharding, indices.array_shape.rank, p.n)
    lifted = idx_own.remap(op_rank + len(partial_idx), {op_rank + j: d for j, d in enumerate(partial_idx)})
    if lifted.num_tiles > 1:
        merged = space.merge(lifted)
        if merged is not None:
            space = merged
    partial = [op_rank + j for j in range(len(partial_idx)) if space.dims[op_rank + j] > 1]
    opcodes = reducer_opcodes(instr.called_computation("to_apply"), n)
    if partial and opcodes is None:
        space = space.keep_dims(range(op_rank))
        partial = []
    to_space = dict(zip(idx_batching, op_batching)) | {d: op_rank + j for j, d in enumerate(partial_idx)}
    op_tm = space.remap(op_rank, {d: d for d in range(op_rank)})
    idx_tm = space.remap(indices.array_shape.rank, to_space)
    upd_tm = space.remap(updates[0].array_shape.rank, {upd_scatter[idx_batch.index(d)]: s for d, s in to_space.items()}
                         | {u: d for d, u in passthrough.items()})
    if not (op_batching or partial):  # the plain form: every device reads all the updates
        model = p.ctx.cost_model
        moving = sum((cost(p.value(op).sharding, Sharding.replicated(), op.shape, p.n, model)
                      for op in instr.operands[n:]), ZERO)
        # the other way (index-parallel with partial sums) all-reduces the whole result
        summing = model.collective("all-reduce", instr.shape.byte_size(), op_tm.num_tiles)
        if summing < moving:
            return None
    b = p.em.b()
    out = to_sharding(op_tm)
    xs = [p.operand_as(instr, i, out) for i in range(n)]
    idx = p.operand_as(instr, n, to_sharding(idx_tm))
    upds = [p.operand_as(instr, n + 1 + i, to_sharding(upd_tm)) for i in range(n)]
    local = tm_local_dims(op_tm, tuple(inputs[0].array_shape.dims))
    tables = [op_tm.coords[:, d] * local[d] if d in index_dims else None
              for d in sd.scatter_dims_to_operand_dims]
    shifted = b.subtract(idx, _index_offsets(p, idx, ivd, tables))
    result_sharding = Sharding.tuple_of([out] * n) if instr.shape.is_tuple else out
    if not partial:
        new = p.clone(instr, [*xs, shifted, *upds], local_shape(instr.shape, result_sharding))
        return p.reshard(PValue(new, result_sharding, instr.shape), target)
    assert opcodes is not None  # (partial sums only with known per-output reducers)
    partial_upd = [upd_scatter[idx_batch.index(partial_idx[s - op_rank])] for s in partial]
    return _scatter_partial_sums(p, instr, xs, shifted, upds, upd_tm, partial_upd, opcodes, out, space, partial)


@handles(Opcode.SCATTER)
def scatter(p: HandlerContext, instr: Instruction) -> PValue:
    n = (len(instr.operands) - 1) // 2
    inputs, indices, updates = instr.operands[:n], instr.operands[n], instr.operands[n + 1:]
    rows = _scatter_into_sharded_rows(p, instr)
    if rows is not None:
        return rows
    passthrough = _scatter_passthrough(p, instr, inputs[0], updates[0])
    if passthrough is not None:
        return passthrough
    window = set(instr.scatter_dimensions.update_window_dims)
    upd_scatter = [d for d in range(updates[0].array_shape.rank) if d not in window]
    sd = instr.scatter_dimensions
    found = _index_batch_tiling(p, instr, indices, p.value(updates[0]).sharding, updates[0].array_shape.rank,
                                upd_scatter, inputs[0], dict(zip(sd.input_batching_dims, sd.scatter_indices_batching_dims)))
    if found is None:
        return replicate(p, instr, "scatter with neither passthrough dims nor index batch dims tiled")
    idx_tm, batch = found
    pos = {d: k for k, d in enumerate(batch)}
    op_batching, idx_batching = sd.input_batching_dims, sd.scatter_indices_batching_dims
    partial = [d for d in batch if idx_tm.dims[d] > 1 and d not in idx_batching]
    opcodes = reducer_opcodes(instr.called_computation("to_apply"), n)
    if partial and opcodes is None:
        return replicate(p, instr, "scatter over tiled indices with a reducer that is not one all-reducible "
                                   "binary op per output")
    op_tm = idx_tm.remap(inputs[0].array_shape.rank, dict(zip(op_batching, idx_batching)))
    upd_tm = idx_tm.remap(updates[0].array_shape.rank, {upd_scatter[pos[d]]: d for d in batch})
    out = to_sharding(op_tm)
    if partial and _gathering_is_cheaper(p, instr, idx_tm, upd_tm, out, partial, [upd_scatter[pos[d]] for d in partial]):
        # The result's partial sums would move more than the updates and indices do: gather
        # those over the non-batching dims instead and scatter them all locally (XLA's
        # partitioner does this for a variadic scatter, and for a single one always sums).
        p.remark(instr, "scatter over tiled indices: updates gathered (cheaper than all-reducing the result)")
        idx_tm = idx_tm.keep_dims([d for d in batch if d not in partial])
        upd_tm = upd_tm.keep_dims([upd_scatter[pos[d]] for d in batch if d not in partial])
        partial = []
    xs = [p.operand_as(instr, i, out) for i in range(n)]
    idx = p.operand_as(instr, n, to_sharding(idx_tm))
    upds = [p.operand_as(instr, n + 1 + i, to_sharding(upd_tm)) for i in range(n)]
    result_sharding = Sharding.tuple_of([out] * n) if instr.shape.is_tuple else out
    if not partial:  # every tiled index dim is a batching dim: independent local scatters
        new = p.clone(instr, [*xs, idx, *upds], local_shape(instr.shape, result_sharding))
        return p.reshard(PValue(new, result_sharding, instr.shape), p.target(instr))
    assert opcodes is not None  # (partial sums only with known per-output reducers)
    return _scatter_partial_sums(p, instr, xs, idx, upds, upd_tm, [upd_scatter[pos[d]] for d in partial], opcodes,
                                 out, idx_tm, partial)


def _gathering_is_cheaper(p: HandlerContext, instr: Instruction, idx_tm: TileMap, upd_tm: TileMap, out: Sharding,
                          partial: Sequence[int], upd_partial: Sequence[int]) -> bool:
    """Whether gathering the indices and updates over their `partial` (index) / `upd_partial`
    (update) dims costs less than the partial-sum form: its all-reduce of every output's local
    result over those dims' devices (both move the indices and updates from where they are;
    the operands go to `out` either way)."""
    group = int(np.prod([idx_tm.dims[d] for d in partial]))
    summing = _scatter_price(p, instr, idx_tm, upd_tm, out, group)
    kept = [d for d in range(idx_tm.rank) if d not in partial]
    gathering = _scatter_price(p, instr, idx_tm.keep_dims(kept),
                               upd_tm.keep_dims([d for d in range(upd_tm.rank) if d not in upd_partial]), out, 1)
    return bool(gathering < summing)


def _scatter_price(p: HandlerContext, instr: Instruction, idx_to: TileMap, upd_to: TileMap, out: Sharding,
                   group: int) -> Estimate:
    """What a scatter plan moves: its indices and updates from where they lie to `idx_to` and
    `upd_to`, and (over `group` devices, when more than one) an all-reduce of each output's
    local result in `out`."""
    n = (len(instr.operands) - 1) // 2
    model = p.ctx.cost_model
    indices = instr.operands[n]
    total = cost(p.value(indices).sharding, to_sharding(idx_to), indices.shape, p.n, model)
    for u in instr.operands[n + 1:]:
        total = total + cost(p.value(u).sharding, to_sharding(upd_to), u.shape, p.n, model)
    for x in instr.operands[:n]:
        total = total + model.collective("all-reduce", local_shape(x.shape, out).byte_size(), group)
    return total


def _scatter_partial_sums(p: HandlerContext, instr: Instruction, xs: Sequence[Instruction], idx: Instruction,
                          upds: Sequence[Instruction], upd_tm: TileMap, upd_dims: Sequence[int],
                          opcodes: Sequence[Opcode], out: Sharding, space: TileMap, partial: Sequence[int]) -> PValue:
    """A scatter whose updates (and indices) are split along index batch dims that are not
    batching dims (`upd_dims` of the updates; `partial`, dims of the tiling `space`, say which
    devices share the sum): each device scatters its updates, the first device of each group
    into the operands and the others into the reducers' identities, and output i's partial
    results are all-reduced with its own opcode — `opcodes[i]` is output i's reduction, so a
    variadic scatter (a sum and a max, a sum of values and of counts) is that many single
    scatters sharing the indices.  XLA's partitioner does this for single-operand scatters only
    (PartitionScatterIndexPassthroughDimensions) and replicates variadic ones.  Selecting the
    operand on one device keeps every scatter input distinct: XLA:CPU fails to compile a
    variadic scatter that reads one array twice (two identical identity fills, once CSE'd).
    Padded (don't-care) updates of uneven index tiles are set to the identity: they must add
    nothing."""
    em, b = p.em, p.em.b()
    n = len(xs)
    global_dims = tuple(instr.operands[n + 1].array_shape.dims)
    lead_table = np.all(space.coords[:, list(partial)] == 0, axis=1).astype(np.int64)
    lead = b.compare(em.device_scalar(lead_table), b.constant(0), "NE")
    bases: list[Instruction] = []
    masked: list[Instruction] = []
    for x, upd, opcode in zip(xs, upds, opcodes):
        etype = x.array_shape.element_type
        fill = Reduction(opcode, etype).identity
        masked.append(em.mask_padding(upd, upd_tm, global_dims, upd_dims, fill))
        dims = tuple(x.array_shape.dims)
        keep = b.broadcast(lead, ArrayShape(PrimitiveType.PRED, dims))
        bases.append(b.select(keep, x, em.broadcast_scalar(fill, etype, dims)))
    result_sharding = Sharding.tuple_of([out] * n) if instr.shape.is_tuple else out
    scattered = p.clone(instr, [*bases, idx, *masked], local_shape(instr.shape, result_sharding))
    parts = [scattered] if n == 1 else [b.get_tuple_element(scattered, i) for i in range(n)]
    groups = groups_varying(space, list(partial))
    summed = [em.all_reduce(part, groups, opcode) for part, opcode in zip(parts, opcodes)]
    value = summed[0] if n == 1 else b.tuple(summed)
    return p.reshard(PValue(value, result_sharding, instr.shape), p.target(instr))


def _scatter_passthrough_dims(instr: Instruction) -> dict[int, int]:
    """Operand dims the updates' windows cover whole and no index addresses (passthrough dims),
    each with the update window dim that covers it."""
    sd = instr.scatter_dimensions
    n = (len(instr.operands) - 1) // 2
    operand, updates = instr.operands[0], instr.operands[n + 1]
    window_operand = [d for d in range(operand.array_shape.rank)
                      if d not in sd.inserted_window_dims and d not in sd.input_batching_dims]
    indexed = set(sd.scatter_dims_to_operand_dims)
    return {d: sd.update_window_dims[k] for k, d in enumerate(window_operand)
            if k < len(sd.update_window_dims) and d not in indexed
            and updates.array_shape.dims[sd.update_window_dims[k]] == operand.array_shape.dims[d]}


def _scatter_passthrough(p: HandlerContext, instr: Instruction, operand: Instruction,
                         updates: Instruction) -> PValue | None:
    """Operand dims the updates' windows cover whole and no index addresses (passthrough dims)
    tiled like the result: every device scatters into its own slice of them with all the
    indices — no communication (variadic scatters too).  Explicit batching dims tiled alike
    stay tiled with them (each device scatters its batch rows' indices and updates into its
    batch rows: still no communication, where tiling passthrough dims alone would gather the
    batch).  None when the result tiles no passthrough dim."""
    n = (len(instr.operands) - 1) // 2
    sd = instr.scatter_dimensions
    to_update = _scatter_passthrough_dims(instr)
    if not to_update:
        return None
    target = p.target(instr)
    first = target.element(0) if target.is_tuple else target
    rank = operand.array_shape.rank
    tm = tile_map(first, rank, p.n)
    if tm.keep_dims(list(to_update)).num_tiles == 1:
        tm = tile_map(p.value(operand).sharding, rank, p.n)
    if tm.keep_dims(list(to_update)).num_tiles == 1:
        return None
    tm = tm.keep_dims(list(to_update) + list(sd.input_batching_dims))
    out = to_sharding(tm)
    window = set(sd.update_window_dims)
    upd_scatter = [d for d in range(updates.array_shape.rank) if d not in window]
    idx_batch = [d for d in range(instr.operands[n].array_shape.rank) if d != sd.index_vector_dim]
    idx_to_op = dict(zip(sd.scatter_indices_batching_dims, sd.input_batching_dims))
    upd_from = {u: d for d, u in to_update.items()}
    if len(upd_scatter) == len(idx_batch):
        upd_from |= {upd_scatter[k]: idx_to_op[i] for k, i in enumerate(idx_batch) if i in idx_to_op}
    upd_tm = tm.remap(updates.array_shape.rank, upd_from)
    summed = None if sd.input_batching_dims else _passthrough_with_partial_sums(p, instr, tm, to_update, upd_tm,
                                                                                upd_scatter, idx_batch, out)
    if summed is not None:
        return summed
    xs = [p.operand_as(instr, i, out) for i in range(n)]
    idx = p.operand_as(instr, n, to_sharding(tm.remap(instr.operands[n].array_shape.rank, idx_to_op)))
    upds = [p.operand_as(instr, n + 1 + i, to_sharding(upd_tm)) for i in range(n)]
    result_sharding = Sharding.tuple_of([out] * n) if instr.shape.is_tuple else out
    new = p.clone(instr, [*xs, idx, *upds], local_shape(instr.shape, result_sharding))
    return p.reshard(PValue(new, result_sharding, instr.shape), target)


def _passthrough_with_partial_sums(p: HandlerContext, instr: Instruction, tm: TileMap, to_update: dict[int, int],
                                   upd_tm: TileMap, upd_scatter: list[int], idx_batch: list[int],
                                   out: Sharding) -> PValue | None:
    """The passthrough plan where the updates are also tiled along their scatter dims, over the
    devices that hold the same passthrough tile: each device scatters the updates it holds (with
    the indices of its rows, a local slice of indices computed in place) and the partial results
    are added over those devices (`_scatter_partial_sums`), where the plain passthrough plan
    gathers every update and index to every device.  A relative-position bias gradient (updates
    tiled over the sequence and the heads, the bucket ids built from iotas, the table over the
    heads) gathered [64,64,4] of updates and ids: 2-38x XLA's wire bytes, which sums the small
    table as here.  None unless the reducer is one all-reducible op per output, the updates'
    own tiling keeps the passthrough tiles on the same devices, and the cost model prices it
    below the plain plan."""
    n = (len(instr.operands) - 1) // 2
    indices, updates = instr.operands[n], instr.operands[n + 1:]
    if len(upd_scatter) != len(idx_batch):
        return None
    opcodes = reducer_opcodes(instr.called_computation("to_apply"), n)
    own = p.value(updates[0]).sharding
    if opcodes is None or own.is_tuple or own.kind.value != "tiled":
        return None
    rank = updates[0].array_shape.rank
    own_tm = tile_map(own, rank, p.n)
    window_dims = list(to_update.values())
    partial = [d for d in upd_scatter if own_tm.dims[d] > 1]
    if not partial:
        return None
    combined = own_tm.keep_dims(window_dims + partial)
    if combined.keep_dims(window_dims).dims != upd_tm.dims or not np.array_equal(
            combined.coords[:, window_dims], upd_tm.coords[:, window_dims]):
        return None
    if any(to_sharding(tile_map(p.value(u).sharding, rank, p.n).keep_dims(window_dims + partial))
           != to_sharding(combined) for u in updates[1:]):
        return None
    idx_tm = combined.remap(indices.array_shape.rank, {i: upd_scatter[k] for k, i in enumerate(idx_batch)})
    group = int(np.prod([combined.dims[d] for d in partial]))
    summing = _scatter_price(p, instr, idx_tm, combined, out, group)
    if not summing < _scatter_price(p, instr, tm.remap(indices.array_shape.rank, {}), upd_tm, out, 1):
        return None
    xs = [p.operand_as(instr, i, out) for i in range(n)]
    idx = p.operand_as(instr, n, to_sharding(idx_tm))
    upds = [p.operand_as(instr, n + 1 + i, to_sharding(combined)) for i in range(n)]
    return _scatter_partial_sums(p, instr, xs, idx, upds, combined, partial, opcodes, out, combined, partial)
