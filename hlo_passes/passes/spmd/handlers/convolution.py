"""convolution: a dot over the iteration space, with halo exchange for tiled spatial dims.

The iteration space is the output dims, the input feature (summed) and one
window dim per spatial dim (summed).  An input spatial dim is read through a
window, so it follows either the output spatial dim or the window dim:

* forward (output spatial tiled): device t computes its output rows and needs
  the input rows under their windows — its own tile plus halo rows from its
  neighbours (`halo.exchange`); the local convolution runs with the padding
  moved into the exchanged data.  Stride, padding, window and base dilation
  follow from the window (`halo.window_rows`), so this also covers the
  input-gradient convolution of a strided one (base dilation = stride) when
  the tiles line up with the dilation.

      x: f32[2,16,16,4] {devices=[1,4,1,1]}, 3x3 kernel, pad 1_1, result tiled the same
    ->  halo: one row each way by collective-permute, concatenate -> f32[2,6,16,4]
        f32[2,4,16,8] convolution(halo'd x, k), window={size=3x3 pad=0_0x1_1}

* kernel-gradient (window dim tiled, i.e. the "kernel" operand — an output
  gradient — tiled along its spatial dim): device t convolves the input rows
  its window tile reads with its part of the window, and the partial kernels
  are all-reduced like any contracting dim.

Candidate tilings are priced like dots (resharding, partial sums, result
resharding) plus the halo rows; the variants with spatial dims untiled (the
input all-gathered along them) stay in the race, so a halo wider than the
tile is not forced.  Grouped convolutions (depthwise ones and their kernel
gradients included) tile their output feature by whole groups: each device convolves its
groups of the input feature (feature groups) or input batch (batch groups) with its part of
the kernel, with the group count divided by the tiles.  A tiling that splits groups (6 groups
over 4 tiles) is merged into gcd(tiles, groups) coarser tiles (2 tiles of 3 groups), the other
devices of a tile holding copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.attributes import Window, WindowDimension
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.cost_model import Estimate, cheapest
from hlo_passes.passes.spmd import halo as halos
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.dot import (extend_compatible, lift_tiling, partial_sum_cost, project_tiling,
                                                  sum_partials)
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import PValue, local_shape, tile_map, tm_local_dims, to_sharding
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap


class _Space:
    """Dim bookkeeping of one convolution: space dims 0..R-1 are the output dims, R the input
    feature, R+1+j the window of spatial dim j."""

    def __init__(self, instr: Instruction):
        self.instr = instr
        labels = instr.conv_labels
        window = instr.window
        assert labels is not None and window is not None, f"{instr.name}: a convolution has dim_labels and a window"
        self.window = window
        self.labels = labels
        self.out_rank = r = instr.array_shape.rank
        self.rank = r + 1 + len(labels.input_spatial)
        self.out_spatial = list(labels.output_spatial)
        self.win = [r + 1 + j for j in range(len(labels.input_spatial))]
        self.contracting = [r] + self.win
        self.lhs_base: dict[int, int] = {labels.input_batch: labels.output_batch, labels.input_feature: r}
        self.rhs_map = {labels.kernel_output_feature: labels.output_feature, labels.kernel_input_feature: r}
        self.rhs_map |= {d: self.win[j] for j, d in enumerate(labels.kernel_spatial)}
        # Groups tie the output feature to the input feature (feature groups) or to the input
        # batch (batch groups, e.g. a depthwise kernel gradient), group-major: tiling the output
        # feature into t tiles with t dividing the group count gives every device whole groups
        # of both, and a local convolution with count/t groups.  The dims inside a group (the
        # kernel's input feature; the output batch of batch groups) stay untiled.
        self.groups = instr.feature_group_count * instr.batch_group_count
        fixed: set[int] = set()
        if instr.feature_group_count != 1:
            self.lhs_base[labels.input_feature] = labels.output_feature
            fixed.add(r)
        if instr.batch_group_count != 1:
            self.lhs_base[labels.input_batch] = labels.output_feature
            fixed.add(labels.output_batch)
        self.tileable = [d for d in range(self.rank) if d not in fixed]

    def groups_fit(self, space: TileMap) -> bool:
        """Does the output feature's tiling give every device whole groups?"""
        return self.groups == 1 or self.groups % space.dims[self.labels.output_feature] == 0

    def whole_groups(self, space: TileMap) -> TileMap | None:
        """`space` with the output feature's tiles merged into gcd(tiles, groups) coarser ones,
        when its tiles split groups (6 groups over 8 or 4 tiles: 2 tiles of 3 groups each, the
        other devices replicas); None when it fits already."""
        f = self.labels.output_feature
        t = space.dims[f]
        if self.groups_fit(space):
            return None
        g = math.gcd(t, self.groups)
        coords = space.coords.copy()
        coords[:, f] //= t // g
        coords.setflags(write=False)
        return TileMap(tuple(g if d == f else n for d, n in enumerate(space.dims)), coords, space.manual,
                       space.manual_size)

    def local_groups(self, space: TileMap) -> dict[str, int]:
        """The group counts of the local convolution."""
        t = space.dims[self.labels.output_feature]
        out: dict[str, int] = {}
        if self.instr.feature_group_count != 1:
            out["feature_group_count"] = self.instr.feature_group_count // t
        if self.instr.batch_group_count != 1:
            out["batch_group_count"] = self.instr.batch_group_count // t
        return out

    def lhs_map(self, space: TileMap) -> dict[int, int] | None:
        """Input dim -> space dim: a spatial dim follows its window dim where that is tiled."""
        m = dict(self.lhs_base)
        for j, d in enumerate(self.labels.input_spatial):
            o, w = self.out_spatial[j], self.win[j]
            if space.dims[o] > 1 and space.dims[w] > 1:
                return None
            m[d] = w if space.dims[w] > 1 else o
        return m

    def lhs_maps(self) -> tuple[dict[int, int], dict[int, int]]:
        """Both ways an input spatial tiling can be read: as output rows, as window rows."""
        spatial = self.labels.input_spatial
        fwd = dict(self.lhs_base) | {d: self.out_spatial[j] for j, d in enumerate(spatial)}
        grad = dict(self.lhs_base) | {d: self.win[j] for j, d in enumerate(spatial)}
        return fwd, grad

    def halos(self, space: TileMap) -> list[halos.Halo] | None:
        """The exchange of every tiled input spatial dim, or None when one cannot be done."""
        out: list[halos.Halo] = []
        lhs = self.instr.operands[0]
        for j, d in enumerate(self.labels.input_spatial):
            o, w = self.out_spatial[j], self.win[j]
            wd = self.window.dimensions[j]
            size, out_size = lhs.array_shape.dims[d], self.instr.array_shape.dims[o]
            if space.dims[o] > 1:
                t = space.dims[o]
                lo = -(-out_size // t)
                rows = halos.window_rows(wd, t, [i * lo for i in range(t)], lo, [0] * t, wd.size)
                active = [i * lo < out_size for i in range(t)]
            elif space.dims[w] > 1:
                t = space.dims[w]
                if wd.reversal:
                    return None  # a reversed window tile is another tile's kernel rows
                lw = -(-wd.size // t)
                rows = halos.window_rows(wd, t, [0] * t, out_size, [i * lw for i in range(t)], lw)
                active = [i * lw < wd.size for i in range(t)]
            else:
                continue
            if rows is None:
                return None
            out.append(halos.plan(d, size, t, rows, zero_padding=True, active=active))
        return out

    def untiled_spatial(self, space: TileMap) -> TileMap:
        keep = [d for d in range(self.rank) if d not in self.out_spatial and d not in self.win]
        return space.keep_dims(keep)


# FLOPs above the fewest that a tiling may spend recomputing halo rows (windows overlapping
# the neighbours' tiles) and still not count as replicating work (`cheapest`).
HALO_RECOMPUTE_TOLERANCE = 0.01


@handles(Opcode.CONVOLUTION)
def convolution(p: HandlerContext, instr: Instruction) -> PValue:
    sp = _Space(instr)
    lhs, rhs = instr.operands
    n, target = p.n, p.target(instr)
    cur_l = tile_map(p.value(lhs).sharding, lhs.array_shape.rank, n)
    cur_r = tile_map(p.value(rhs).sharding, rhs.array_shape.rank, n)
    fwd, grad = sp.lhs_maps()
    lifted_ls = [lift_tiling(cur_l, fwd, sp.rank), lift_tiling(cur_l, grad, sp.rank)]
    lifted_r = lift_tiling(cur_r, sp.rhs_map, sp.rank)
    lifted_o = tile_map(target, sp.out_rank, n).remap(sp.rank, {i: i for i in range(sp.out_rank)})
    candidates: list[TileMap | None] = []
    for lifted_l in lifted_ls:
        candidates += [lifted_l.merge(lifted_r), lifted_l, lifted_o.merge(lifted_l)]
    candidates += [lifted_r, lifted_o, lifted_o.merge(lifted_r)]
    candidates += [extend_compatible(c, lifted_o) for c in list(candidates) if c is not None]
    candidates += [sp.untiled_spatial(c) for c in candidates if c is not None]
    candidates += [sp.whole_groups(c) for c in candidates if c is not None]
    tileable = [c.keep_dims(sp.tileable) for c in candidates if c is not None]
    prices = ((space, _price(p, sp, space, target)) for space in tileable)
    found = cheapest(((space, priced) for space, priced in prices if priced is not None),
                     recompute_tolerance=HALO_RECOMPUTE_TOLERANCE)
    if found is None:
        return replicate(p, instr, "no consistent tiling of the convolution's iteration space")
    best = found[0]
    chosen_plan = _lhs_plan(p, sp, best)
    assert chosen_plan is not None  # (`_price` priced this tiling)
    chosen = chosen_plan.tm_x
    if any(cur_l.dims[d] > 1 and chosen.dims[d] == 1 for d in sp.labels.input_spatial):
        p.remark(instr, "replicated: spatially sharded convolution input gathered along its spatial "
                 "dims (halo exchange would move more)", kind="missed")
    return _emit(p, sp, best, target)


@dataclass(frozen=True)
class _LhsPlan:
    """How the input reaches a tiling's local convolution: resharded to `tm_x`, then each
    exchanged dim's window rows either exchanged with the neighbours (`in_place` False: `tm_x`
    is the space's projection `tm_l`) or cut from rows every device already holds (`in_place`
    True: `tm_x` is `tm_l` with those dims untiled).  `cost` prices the reshard and the
    windows."""

    tm_l: TileMap
    tm_x: TileMap
    exchanges: tuple[halos.Halo, ...]
    in_place: bool
    cost: Estimate


def _lhs_plan(p: HandlerContext, sp: _Space, space: TileMap) -> _LhsPlan | None:
    """The cheaper of exchanging halos and cutting windows in place (None when the tiling
    cannot read its input spatial dims one way).  Cutting in place wins where the input is
    replicated along the windowed dims (or gathering it costs less than the exchange): slicing
    it into tiles and then exchanging their edge rows would send each device rows it held."""
    lhs_map = sp.lhs_map(space)
    exchanges = sp.halos(space) if lhs_map is not None else None
    if lhs_map is None or exchanges is None:
        return None
    lhs = sp.instr.operands[0]
    n, model = p.n, p.ctx.cost_model
    src = p.value(lhs).sharding
    dims = tuple(lhs.array_shape.dims)
    esize = lhs.array_shape.element_type.byte_size
    tm_l = project_tiling(space, lhs_map, lhs.array_shape.rank)
    exchanged = cost(src, to_sharding(tm_l), lhs.shape, n, model)
    local = list(tm_local_dims(tm_l, dims))
    for h in exchanges:
        exchanged += model.transfer(h.bytes(halos.row_bytes(local, h.dim, esize)), h.permutes)
        local[h.dim] = h.rows.width
    best = _LhsPlan(tm_l, tm_l, tuple(exchanges), False, exchanged)
    if exchanges:
        windowed = {h.dim for h in exchanges}
        tm_x = tm_l.keep_dims([d for d in range(tm_l.rank) if d not in windowed])
        whole = to_sharding(tm_x)
        if whole is not None:
            window = list(tm_local_dims(tm_l, dims))
            for h in exchanges:
                window[h.dim] = h.rows.width
            in_place = cost(src, whole, lhs.shape, n, model) + model.local_copy(math.prod(window) * esize)
            if in_place < exchanged:
                best = _LhsPlan(tm_l, tm_x, tuple(exchanges), True, in_place)
    return best


def _price(p: HandlerContext, sp: _Space, space: TileMap, target: Sharding) -> Estimate | None:
    if space.to_sharding() is None or not sp.groups_fit(space):
        return None
    lhs_plan = _lhs_plan(p, sp, space)
    if lhs_plan is None:
        return None
    instr, n, model = sp.instr, p.n, p.ctx.cost_model
    rhs = instr.operands[1]
    c = lhs_plan.cost
    tm_r = project_tiling(space, sp.rhs_map, rhs.array_shape.rank)
    c += cost(p.value(rhs).sharding, to_sharding(tm_r), rhs.shape, n, model)
    c += model.compute(_local_flops(instr, space), sum(o.shape.byte_size() for o in instr.operands)
                       // max(1, space.num_tiles), instr.array_shape.element_type)
    return c + partial_sum_cost(instr, space, sp.out_rank, sp.contracting, target, n, model)


def _local_flops(instr: Instruction, space: TileMap) -> int:
    """A multiply-add per output element, kernel position and input feature of its group, on
    the busiest device: each space dim contributes ceil(extent / tiles) (halo rows aside).
    Dividing the total by the tile count instead made a tiling of a dim with fewer rows than
    tiles (a 1x1 kernel's window dim over 8 devices: one device computes everything, seven
    nothing) look 8x cheaper than it is, and the frugal-FLOPs rule of `cheapest` then chose it."""
    window = instr.window
    labels = instr.conv_labels
    features = instr.operands[0].array_shape.dims[labels.input_feature] if labels is not None else 1
    groups = instr.feature_group_count * instr.batch_group_count
    out_rank = instr.array_shape.rank
    extents = list(instr.array_shape.dims) + [max(1, features // groups)]
    extents += [w.size for w in window.dimensions] if window is not None else []
    tiles = list(space.dims) + [1] * (len(extents) - space.rank)
    assert space.rank <= len(extents) and out_rank < len(extents)
    return 2 * math.prod(-(-e // t) for e, t in zip(extents, tiles))


def _emit(p: HandlerContext, sp: _Space, space: TileMap, target: Sharding) -> PValue:
    em, instr = p.em, sp.instr
    lhs, rhs = instr.operands
    summed = [d for d in sp.contracting if space.dims[d] > 1]
    lhs_plan = _lhs_plan(p, sp, space)
    assert lhs_plan is not None  # (`_price` priced this tiling)
    tm_l = lhs_plan.tm_l
    x = p.operand_as(instr, 0, to_sharding(lhs_plan.tm_x))
    if sp.out_rank in summed:
        x = em.mask_padding(x, lhs_plan.tm_x, tuple(lhs.array_shape.dims), [sp.labels.input_feature], 0)
    window = list(sp.window.dimensions)
    for h in lhs_plan.exchanges:
        x = halos.window_in_place(em, x, tm_l, h) if lhs_plan.in_place else halos.exchange(em, x, tm_l, h, None)
        window[sp.labels.input_spatial.index(h.dim)] = h.rows.local
    tm_r = project_tiling(space, sp.rhs_map, rhs.array_shape.rank)
    y = p.operand_as(instr, 1, to_sharding(tm_r))
    pad_dims = [d for d, s in sp.rhs_map.items() if s in summed]
    if pad_dims:
        y = em.mask_padding(y, tm_r, tuple(rhs.array_shape.dims), pad_dims, 0)
    out_tm = space.remap(sp.out_rank, {i: i for i in range(sp.out_rank)})
    local = p.clone(instr, [x, y], local_shape(instr.shape, to_sharding(out_tm)))
    if "window" in instr.attributes or any(w != WindowDimension(1) for w in window):
        local.set_attr("window", Window(tuple(window)))
    for key, count in sp.local_groups(space).items():
        local.set_attr(key, count)
    return sum_partials(p, instr, local, space, sp.out_rank, sp.contracting, target)


__all__ = ["convolution"]
