"""dot and convolution: pick a tiling of the whole iteration space, then compute locally.

The iteration space of a dot has the output dims (batch, lhs free, rhs free) and
the contracting dims.  Candidate space tilings come from the operands' current
shardings (each alone, and both merged), and from the result's sharding; for
each, the cost model (cost_model.py) prices resharding the operands to its
projections, the local matmul (FLOPs on each device's tile of the iteration
space), summing the partial results (contracting dims tiled) and resharding the
result to its sharding, in estimated seconds.  The cheapest wins.  Compute counts: a
tiling that gathers both operands moves fewer bytes at small batch but multiplies the
whole matrix on every device.  This covers, by cost alone:

* batch-parallel and matching non-contracting shardings: no communication;
* contracting dims sharded: local dot of partial sums + all-reduce (or a
  reduce-scatter when the result is sharded over those same devices);
* mismatched operands: the cheaper one is resharded.

Summing partials is priced as `sum_partials` emits it (a reduce-scatter where it lands in the
result's tiling), and an operand reshard that identical twin dots share (Q/K/V projections of
one activation) is priced at each twin's share, as the reshard cache makes it once.

Padding of uneven contracting tiles is zeroed in both operands first.
Convolutions (handlers/convolution.py) price their tilings the same way and share
`local_compute`, `partial_sum_cost` and `sum_partials`.
"""

from __future__ import annotations

import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.cost_model import CostModel, Estimate, cheapest
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import (DeviceGroups, PValue, groups_varying, local_shape, tile_map,
                                                       to_sharding)
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap


# Operand dim -> iteration-space dim; None: the operand dim must stay untiled.
DimMap = Mapping[int, int | None]


def project_tiling(space: TileMap, mapping: DimMap, rank: int) -> TileMap:
    """Operand tiling from a space tiling; mapping: operand dim -> space dim."""
    return space.remap(rank, {d: s for d, s in mapping.items() if s is not None})


def lift_tiling(tm: TileMap, mapping: DimMap, space_rank: int) -> TileMap:
    """Space tiling from an operand tiling (operand dims mapped to None are dropped)."""
    return tm.remap(space_rank, {s: d for d, s in mapping.items() if s is not None})


def partition_dot_like(p: HandlerContext, instr: Instruction, lhs_map: DimMap, rhs_map: DimMap, out_rank: int,
                       contracting: Sequence[int], untiled: Sequence[int]) -> PValue:
    """`lhs_map`/`rhs_map`: operand dim -> space dim (None: must stay untiled); space dims
    0..out_rank-1 are the output dims, `contracting` the summed ones, `untiled` never tiled."""
    lhs, rhs = instr.operands
    target = p.target(instr)
    # The choice depends on shardings, shapes and how many twin dots share each operand's
    # reshard only: kept per run (a model's layers repeat the same dots, and pricing six
    # candidate tilings is most of a dot's time).
    sharers = (_twin_dots(p, instr, 0), _twin_dots(p, instr, 1))
    key = (instr.opcode, su.exact(p.value(lhs).sharding), su.exact(p.value(rhs).sharding), su.exact(target),
           lhs.shape, rhs.shape, instr.shape, tuple(lhs_map.items()), tuple(rhs_map.items()), out_rank,
           tuple(contracting), tuple(untiled), sharers)
    tilings = p.ctx.dot_tilings
    if key in tilings:
        best = tilings[key]
    else:
        best = tilings[key] = _cheapest_space(p, instr, lhs_map, rhs_map, out_rank, contracting, untiled, sharers)
    if best is None:
        return replicate(p, instr, "no consistent tiling of the dot's iteration space")
    return _emit(p, instr, best, lhs_map, rhs_map, out_rank, contracting, target)


def _cheapest_space(p: HandlerContext, instr: Instruction, lhs_map: DimMap, rhs_map: DimMap, out_rank: int,
                    contracting: Sequence[int], untiled: Sequence[int], sharers: tuple[int, int]) -> TileMap | None:
    """The iteration-space tiling of least estimated cost among the operands', the result's and
    their merges (None when none is consistent); `sharers`: how many twin dots share each
    operand's reshard (`_twin_dots`)."""
    lhs, rhs = instr.operands
    space_rank = out_rank + len(contracting)
    target = p.target(instr)
    n = p.n
    cur_l = tile_map(p.value(lhs).sharding, lhs.array_shape.rank, n)
    cur_r = tile_map(p.value(rhs).sharding, rhs.array_shape.rank, n)
    out_t = tile_map(target, out_rank, n)
    keep = [d for d in range(space_rank) if d not in untiled]
    lifted_l = lift_tiling(cur_l, lhs_map, space_rank).keep_dims(keep)
    lifted_r = lift_tiling(cur_r, rhs_map, space_rank).keep_dims(keep)
    lifted_o = out_t.remap(space_rank, {i: i for i in range(out_rank) if i not in untiled})
    candidates = [lifted_l.merge(lifted_r), lifted_l, lifted_r, lifted_o,
                  lifted_o.merge(lifted_l), lifted_o.merge(lifted_r)]
    candidates += [extend_compatible(c, lifted_o) for c in candidates[:3] if c is not None]
    model = p.ctx.cost_model
    sizes = space_sizes(instr, lhs_map, rhs_map, space_rank)
    priced: list[tuple[TileMap, Estimate]] = []
    for space in candidates:
        if space is None or space.to_sharding() is None:
            continue
        tm_l = project_tiling(space, lhs_map, lhs.array_shape.rank)
        tm_r = project_tiling(space, rhs_map, rhs.array_shape.rank)
        c = (cost(p.value(lhs).sharding, to_sharding(tm_l), lhs.shape, n, model).shared_by(sharers[0])
             + cost(p.value(rhs).sharding, to_sharding(tm_r), rhs.shape, n, model).shared_by(sharers[1]))
        c += local_compute(instr, space, sizes, model)
        c += partial_sum_cost(instr, space, out_rank, contracting, target, n, model)
        priced.append((space, c))
    chosen = cheapest(priced)
    return chosen[0] if chosen is not None else None


def extend_compatible(space: TileMap, donor: TileMap) -> TileMap | None:
    """`space` with each of `donor`'s tiled dims that `space` leaves untiled and can take
    (on devices where `space` replicates), one dim at a time; None when no dim could be added
    (the candidate would repeat `space`).

    A whole-map merge fails as soon as one dim conflicts: operands tiled on their contracting
    dim over the devices that tile the result's rows, and replicated over the devices that tile
    its columns, merge with the result's tiling in no way, yet the columns alone fit.  Tiling
    them is free (a slice of a replicated operand) and turns the all-reduce of the whole
    partial product into a reduce-scatter of a column tile straight into the result's tiling,
    where XLA's partition all-reduces the whole columns' tile and slices."""
    grown = space
    for d in range(donor.rank):
        if donor.dims[d] == 1 or grown.dims[d] != 1:
            continue
        merged = grown.merge(donor.keep_dims([d]))
        if merged is not None:
            grown = merged
    return grown if grown is not space else None


def _twin_dots(p: HandlerContext, instr: Instruction, i: int) -> int:
    """How many dots (`instr` among them) take operand `i` of `instr` in that position with
    everything else their choice depends on the same: dot dimensions, shapes, the other
    operand's and the result's shardings.  Twins choose the same tiling, so the reshard of the
    operand they share is made once (the reshard cache) and each pays its share: Q, K and V
    projections of one activation gather it once and do not each reduce-scatter their own
    partial product."""
    op, other = instr.operands[i], instr.operands[1 - i]
    target, other_sharding = p.target(instr), p.target(other)
    return sum(1 for u in op.users
               if u is instr or (u.opcode is Opcode.DOT and u.operands[i] is op
                                 and u.dot_dimensions == instr.dot_dimensions and u.shape == instr.shape
                                 and u.operands[1 - i].shape == other.shape
                                 and p.target(u.operands[1 - i]) == other_sharding
                                 and p.target(u) == target))


def space_sizes(instr: Instruction, lhs_map: DimMap, rhs_map: DimMap, space_rank: int) -> list[int]:
    """The extent of each iteration-space dim (output dims first, then the summed ones)."""
    sizes = [1] * space_rank
    for operand, mapping in zip(instr.operands, (lhs_map, rhs_map)):
        for d, s in mapping.items():
            if s is not None:
                sizes[s] = operand.array_shape.dims[d]
    return sizes


def local_compute(instr: Instruction, space: TileMap, sizes: list[int], model: CostModel,
                  flops_per_point: int = 2) -> Estimate:
    """The local kernel of a space tiling: `flops_per_point` FLOPs per point of each device's
    tile of the iteration space (a multiply-add for a dot), bounded by the bytes it touches."""
    local = [-(-size // t) for size, t in zip(sizes, space.dims)]
    points = math.prod(local)
    total_points = max(1, math.prod(sizes))
    touched = sum(op.shape.byte_size() for op in instr.operands) + instr.shape.byte_size()
    return model.compute(flops_per_point * points, touched * points // total_points,
                         instr.array_shape.element_type)


def _emit(p: HandlerContext, instr: Instruction, space: TileMap, lhs_map: DimMap, rhs_map: DimMap, out_rank: int,
          contracting: Sequence[int], target: Sharding) -> PValue:
    em = p.em
    ops: list[Instruction] = []
    summed = [d for d in contracting if space.dims[d] > 1]
    for i, mapping in ((0, lhs_map), (1, rhs_map)):
        op = instr.operands[i]
        tm = project_tiling(space, mapping, op.array_shape.rank)
        x = p.operand_as(instr, i, to_sharding(tm))
        pad_dims = [d for d, s in mapping.items() if s in summed]
        ops.append(em.mask_padding(x, tm, tuple(op.array_shape.dims), pad_dims, 0) if pad_dims else x)
    out_tm = space.remap(out_rank, {i: i for i in range(out_rank)})
    local = p.clone(instr, ops, local_shape(instr.shape, to_sharding(out_tm)))
    return sum_partials(p, instr, local, space, out_rank, contracting, target)


def partial_sum_cost(instr: Instruction, space: TileMap, out_rank: int, contracting: Sequence[int],
                     target: Sharding, n: int, model: CostModel) -> Estimate:
    """What summing the partial results (contracting dims tiled in `space`) and resharding the
    result to `target` cost per device, priced as `sum_partials` emits it: a reduce-scatter
    straight into the target's tiling where one does both, else an all-reduce over the summing
    groups and a reshard.

    Pricing the reduce-scatter as an all-reduce (twice its wire bytes) made a row-parallel
    matmul whose result is tiled over the summing devices look dearer than gathering the
    activation and all-to-all'ing the weight to column-parallel (issue 11)."""
    out_tm = space.remap(out_rank, {i: i for i in range(out_rank)})
    summed = [d for d in contracting if space.dims[d] > 1]
    if not summed:
        return cost(to_sharding(out_tm), target, instr.shape, n, model)
    g = math.prod(space.dims[d] for d in summed)
    local = instr.shape.byte_size() // max(1, math.prod(space.dims[:out_rank]))
    groups = groups_varying(space, summed)
    scatter = _reduce_scatter_dims(space, out_tm, summed, groups, target, out_rank, n)
    esize = max(1, instr.array_shape.element_type.byte_size)
    if scatter is not None:
        dims, t_tm = scatter
        # untiled in `out_tm`: sum_partials pads each to a multiple of its tile count
        sizes = [instr.array_shape.dims[k] for k in dims]
        whole = math.prod(sizes)
        padded = (local // whole * math.prod(-(-a // t_tm.dims[k]) * t_tm.dims[k] for k, a in zip(dims, sizes))
                  if whole else local)
        return (model.collective("reduce-scatter", padded, g) + _summing(padded // esize, g)
                + cost(to_sharding(t_tm), target, instr.shape, n, model))
    return (model.collective("all-reduce", local, g) + _summing(local // esize, g)
            + cost(to_sharding(out_tm), target, instr.shape, n, model))


def _summing(elements: int, g: int) -> Estimate:
    """The additions a reduce-scatter or all-reduce of `elements` over g devices makes on each
    device ((g - 1) / g of them, each summing g partials): FLOPs only, which the tie-breaker
    reads.  Where a partial sum and gathering an operand take the same time and bytes (a 2-way
    contracting dim beside a 2-way result dim of the same size), the gather computes the same
    local product and adds nothing, as XLA's partition of such a dot does."""
    return Estimate(flops=elements * (g - 1) // g)


def sum_partials(p: HandlerContext, instr: Instruction, local: Instruction, space: TileMap, out_rank: int,
                 contracting: Sequence[int], target: Sharding) -> PValue:
    """The local result `local` of a space tiling: partial sums over the tiled contracting dims
    are all-reduced (or reduce-scattered straight into `target`), then resharded to `target`."""
    em = p.em
    summed = [d for d in contracting if space.dims[d] > 1]
    out_tm = space.remap(out_rank, {i: i for i in range(out_rank)})
    if not summed:
        return p.reshard(PValue(local, to_sharding(out_tm), instr.shape), target)
    groups = groups_varying(space, summed)
    scatter = _reduce_scatter_dims(space, out_tm, summed, groups, target, out_rank, p.n)
    if scatter is not None:
        dims, t_tm = scatter
        full = tuple(local.array_shape.dims)
        padded = tuple(-(-a // t_tm.dims[k]) * t_tm.dims[k] if k in dims else a for k, a in enumerate(full))
        x = em.pad_to(local, padded)
        if len(dims) == 1:
            x = em.reduce_scatter(x, dims[0], groups, Opcode.ADD)
        else:
            x = _reduce_scatter_merged(p, x, dims, [t_tm.dims[k] for k in dims], groups)
        return p.reshard(PValue(x, to_sharding(t_tm), instr.shape), target)
    x = em.all_reduce(local, groups, Opcode.ADD)
    return p.reshard(PValue(x, to_sharding(out_tm), instr.shape), target)


def _reduce_scatter_merged(p: HandlerContext, x: Instruction, dims: tuple[int, ...], tiles: list[int],
                           groups: DeviceGroups) -> Instruction:
    """One reduce-scatter of `x` into tiles of several dims (`dims`, major first, `tiles[i]`
    tiles each; their sizes multiples of those): each dim split into (tile, rows), the tile
    parts moved to the front and merged into one dim of g = prod(tiles) that the collective
    scatters, its result reshaped to the local tile."""
    b = p.em.b()
    shape = x.array_shape
    split: list[int] = []
    tile_axes: list[int] = []
    rest_axes: list[int] = []
    for k, a in enumerate(shape.dims):
        if k in dims:
            t = tiles[dims.index(k)]
            tile_axes.append(len(split))
            split += [t, a // t]
        else:
            split.append(a)
        rest_axes.append(len(split) - 1)
    order = [tile_axes[[k for k in sorted(dims)].index(k)] for k in dims] + rest_axes
    y = b.transpose(b.reshape(x, shape.with_dims(tuple(split))), order)
    rest = [split[a] for a in rest_axes]
    y = b.reshape(y, shape.with_dims((math.prod(tiles), *rest)))
    y = p.em.reduce_scatter(y, 0, groups, Opcode.ADD)
    return b.reshape(y, shape.with_dims(tuple(rest)))


def _reduce_scatter_dims(space: TileMap, out_tm: TileMap, summed: list[int], groups: DeviceGroups,
                         target: Sharding, out_rank: int, n: int) -> tuple[tuple[int, ...], TileMap] | None:
    """(dims, result tiling) when the target tiles output dims untiled in `out_tm` exactly over
    the summing groups (position in the group = the tile coordinates, the first dim major): a
    reduce-scatter does both.  One dim first; else two or three dims at once (a result tiled
    2x2 over the four devices of each partial sum, where an all-reduce and a slice would move
    twice the bytes)."""
    if target.is_tuple:
        return None
    t = tile_map(target, out_rank, n)
    g = len(groups[0])
    free = [k for k in range(out_rank) if out_tm.dims[k] == 1 and 1 < t.dims[k] <= g]
    for size in (1, 2, 3):
        for dims in itertools.permutations(free, size):
            if math.prod(t.dims[k] for k in dims) != g:
                continue
            if any(t.dims[j] != out_tm.dims[j] for j in range(out_rank) if j not in dims):
                continue
            if _scatters_along(groups, t, out_tm, dims, out_rank):
                return dims, t
    return None


def _scatters_along(groups: DeviceGroups, t: TileMap, out_tm: TileMap, dims: tuple[int, ...], out_rank: int) -> bool:
    """Each device's position in its group is its tile coordinates of `dims` under `t` (mixed
    radix, the first dim major), and its other coordinates are those of `out_tm` (checked on
    whole arrays)."""
    position = np.zeros(t.coords.shape[0], np.int64)
    for k in dims:
        position = position * t.dims[k] + t.coords[:, k]
    others = [j for j in range(out_rank) if j not in dims]
    if not isinstance(groups, np.ndarray):
        return all(int(position[dev]) == pos and all(
                       t.coords[dev, j] == out_tm.coords[dev, j] for j in others)
                   for grp in groups for pos, dev in enumerate(grp))
    if not np.array_equal(position[groups], np.broadcast_to(np.arange(groups.shape[1]), groups.shape)):
        return False
    return np.array_equal(t.coords[groups][..., others], out_tm.coords[groups][..., others])


@handles(Opcode.DOT)
def dot(p: HandlerContext, instr: Instruction) -> PValue:
    dd = instr.dot_dimensions
    lb, rb, lc, rc = dd.lhs_batch, dd.rhs_batch, dd.lhs_contracting, dd.rhs_contracting
    lhs, rhs = instr.operands
    lf = [d for d in range(lhs.array_shape.rank) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.array_shape.rank) if d not in rb and d not in rc]
    nb, out_rank = len(lb), len(lb) + len(lf) + len(rf)
    lhs_map = {d: k for k, d in enumerate(lb)} | {d: nb + k for k, d in enumerate(lf)} | {
        d: out_rank + k for k, d in enumerate(lc)}
    rhs_map = {d: k for k, d in enumerate(rb)} | {d: nb + len(lf) + k for k, d in enumerate(rf)} | {
        d: out_rank + k for k, d in enumerate(rc)}
    contracting = list(range(out_rank, out_rank + len(lc)))
    return partition_dot_like(p, instr, lhs_map, rhs_map, out_rank, contracting, [])


__all__ = ["dot", "extend_compatible", "lift_tiling", "local_compute", "partial_sum_cost", "partition_dot_like", "project_tiling",
           "space_sizes", "sum_partials"]
