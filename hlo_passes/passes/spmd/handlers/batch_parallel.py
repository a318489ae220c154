"""Ops that solve one independent problem per batch index: cholesky, triangular-solve, fft and
the LAPACK custom-calls JAX marks batch-partitionable (`batch_dims.py` says which dims).

A tiling of the batch dims is local: each device factors, solves or transforms its own
matrices, and every operand and result keeps the same batch tiling with its core dims whole.

    %c = f32[16,32,32] cholesky(f32[16,32,32] %x {devices=[8,1,1]}), lower=true
  -> %c = f32[2,32,32] cholesky(f32[2,32,32] %x)                  (no communication)

A tiled core dim cannot stay tiled.  The batch tiling is chosen by price (cost_model.py) among:
the batch tiling of each operand and of each result's target (core dims gathered), the same with
a core dim's tiling moved onto a batch dim that has none, or folded into a tiled batch dim's
tiles as their minor part on a 2-D mesh (an all-to-all there and, when the result wants it,
back — every device still solves its share, as XLA does for a cholesky whose matrix rows are
sharded), and none (the op computed whole):

    %c = f32[16,32,32] cholesky(%x {devices=[1,8,1]}), sharding={devices=[1,8,1]}
  -> all-to-all to {devices=[8,1,1]}, f32[2,32,32] cholesky, all-to-all back

Uneven batch tiles are padded; the padding's problems are solved too and thrown away.
"""

from __future__ import annotations

import math

from hlo_passes.ir.attributes import ShapeList
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.batch_dims import BATCH_PARTITIONABLE_TARGETS, num_batch_dims, result_leaves
from hlo_passes.passes.spmd.cost_model import ZERO, Estimate, cheapest
from hlo_passes.passes.spmd.handlers import HandlerContext, handles, handles_custom_call, structural
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import PValue, is_fully_manual, local_shape, tile_map, to_sharding
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap


@handles(Opcode.CHOLESKY, Opcode.TRIANGULAR_SOLVE, Opcode.FFT)
@handles_custom_call(*sorted(BATCH_PARTITIONABLE_TARGETS))
def batch_parallel(p: HandlerContext, instr: Instruction) -> PValue:
    if is_fully_manual(p.target(instr)):  # per-device code of a manual region (a custom-call
        return structural.manual(p, instr)  # handler is asked there too: see handler_for)
    k = num_batch_dims(instr)
    if k is None:
        return replicate(p, instr, "custom-call without a usable num_batch_dims frontend attribute")
    results = result_leaves(instr)
    targets = _leaf_shardings(p.target(instr), instr.shape)
    batch = _cheapest_batch_tiling(p, instr, k, results, targets)
    operands = [p.operand_as(instr, i, _extended(batch, op.array_shape.rank)) for i, op in enumerate(instr.operands)]
    out_leaves = [_extended(batch, s.rank) for s in results]
    out = Sharding.tuple_of(out_leaves) if instr.shape.is_tuple else out_leaves[0]
    new = p.clone(instr, operands, local_shape(instr.shape, out))
    constraints = instr.operand_layout_constraints
    if constraints is not None:  # the same layouts, of the local shapes
        new.set_attr("operand_layout_constraints", ShapeList(tuple(
            _array(c).with_dims(x.array_shape.dims) for c, x in zip(constraints, operands))))
    return p.reshard(PValue(new, out, instr.shape), p.target(instr))


def _cheapest_batch_tiling(p: HandlerContext, instr: Instruction, k: int, results: list[ArrayShape],
                           targets: list[Sharding]) -> TileMap:
    """The rank-k tiling of the batch dims the op runs with (see the module docstring)."""
    n, model = p.n, p.ctx.cost_model
    sizes = instr.operands[0].array_shape.dims[:k]
    sources = [(op.array_shape, p.value(op).sharding) for op in instr.operands] + list(zip(results, targets))
    candidates: dict[tuple[tuple[int, ...], bytes, bytes], TileMap] = {}

    def consider(tm: TileMap) -> None:
        if tm.to_sharding() is not None:
            candidates.setdefault((tm.dims, tm.coords.tobytes(), tm.manual.tobytes()), tm)

    for shape, sharding in sources:
        tm = tile_map(sharding, shape.rank, n)
        base = tm.remap(k, {d: d for d in range(k)})
        consider(base)
        for f in range(k, shape.rank):  # a core dim's tiling moved onto a batch dim
            t = tm.dims[f]
            for g in range(k):
                if t > 1 and base.dims[g] == 1 and sizes[g] >= t:
                    consider(tm.remap(k, {d: d for d in range(k) if d != g} | {g: f}))
                elif t > 1 and base.dims[g] > 1 and sizes[g] >= base.dims[g] * t:
                    # the batch dim is tiled already (a 2-D mesh): the core dim's tiles become
                    # its minor tiles
                    consider(tm.keep_dims([*range(k), f]).fold(g, f).remap(k, {d: d for d in range(k)}))
        consider(tm.remap(k, {}))  # none: the op computed whole (per manual group)
    priced: list[tuple[TileMap, Estimate]] = []
    for cand in candidates.values():
        c = ZERO
        for op in instr.operands:
            c += p.move_cost(op, _extended(cand, op.array_shape.rank))
        c += _compute(p, instr, k, cand)
        for shape, target in zip(results, targets):
            c += cost(_extended(cand, shape.rank), target, shape, n, model)
        priced.append((cand, c))
    chosen = cheapest(priced)
    assert chosen is not None  # (the untiled candidate is always there)
    return chosen[0]


def _compute(p: HandlerContext, instr: Instruction, k: int, batch: TileMap) -> Estimate:
    """The local op's time: its FLOPs and bytes scaled to the batch entries of one tile."""
    sizes = instr.operands[0].array_shape.dims[:k]
    whole = math.prod(sizes)
    local = math.prod(-(-s // t) for s, t in zip(sizes, batch.dims))
    share = local / whole if whole else 1.0
    touched = sum(op.shape.byte_size() for op in instr.operands) + instr.shape.byte_size()
    etype = instr.operands[0].array_shape.element_type
    return p.ctx.cost_model.compute(int(_flops(instr, k) * share), int(touched * share), etype)


def _flops(instr: Instruction, k: int) -> int:
    """Rough FLOPs of the whole op, enough to rank tilings: cholesky m³/3 per matrix, a
    triangular solve m² per right-hand side, an FFT 5·N·log2(N) per transform, a LAPACK call
    n³ per problem (n its operand's largest core dim)."""
    x = instr.operands[0].array_shape
    count = math.prod(x.dims[:k])
    if instr.opcode is Opcode.CHOLESKY:
        return count * x.dims[-1] ** 3 // 3
    if instr.opcode is Opcode.TRIANGULAR_SOLVE:
        b = instr.operands[1].array_shape
        return math.prod(b.dims) * x.dims[-1]
    if instr.opcode is Opcode.FFT:
        fft_length: tuple[int, ...] = instr.attr("fft_length") or (1,)
        n = math.prod(fft_length)
        return 5 * count * n * max(1, math.ceil(math.log2(max(2, n))))
    core = max(x.dims[k:], default=1)
    return count * core ** 3


def _extended(batch: TileMap, rank: int) -> Sharding:
    """The batch tiling on the leading dims of a rank-`rank` value, its other dims whole."""
    return to_sharding(batch.remap(rank, {d: d for d in range(batch.rank)}))


def _array(shape: Shape) -> ArrayShape:
    if not isinstance(shape, ArrayShape):
        raise TypeError(f"expected an array shape, got {shape.to_hlo()}")
    return shape


def _leaf_shardings(s: Sharding, shape: Shape) -> list[Sharding]:
    return [s.subsharding(shape, i) for i in range(len(shape.elements))] if isinstance(shape, TupleShape) else [s]


__all__ = ["batch_parallel"]
