"""Ops that are local on every dimension they do not slice, pad, join or sort:
slice, pad, concatenate, dynamic-slice, dynamic-update-slice, reverse, sort (and
reduce-window on the dims handlers/reduce_window.py does not exchange halos for).

The result's sharding with those dimensions untiled is used for the operands
(so a sharding along them is all-gathered first), the op runs locally, and the
result is resharded (usually a local slice) to its own sharding.

    %s = f32[16,4] slice(f32[16,8] %a), slice={[0:16], [0:4]}, sharding={devices=[4,1]<=[4]}
  is local on dim 0: %s = f32[4,4] slice(f32[4,8] %a), slice={[0:4], [0:4]}
"""

from __future__ import annotations

from hlo_passes.ir.attributes import PaddingConfig, SliceSpec
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.handlers import handles
from hlo_passes.passes.spmd.partition_context import PValue, local_shape, tile_map, to_sharding


def local_except(p, instr, fixed) -> PValue:
    """Run `instr` locally with every dim in `fixed` untiled in operands and result."""
    target = p.target(instr)
    first = instr.shape.elements[0] if instr.shape.is_tuple else instr.shape
    first_target = target.element(0) if target.is_tuple else target
    tm = tile_map(first_target, first.rank, p.n)
    s = to_sharding(tm.keep_dims([d for d in range(first.rank) if d not in fixed]))
    operands = []
    for i, op in enumerate(instr.operands):
        want = s if op.shape.is_array and op.shape.rank == first.rank else Sharding.replicated()
        operands.append(p.operand_as(instr, i, want))
    out = Sharding.tuple_of([s] * len(instr.shape.elements)) if instr.shape.is_tuple else s
    new = p.clone(instr, operands, local_shape(instr.shape, out))
    if instr.opcode is Opcode.SLICE:
        spec = instr.attr("slice")
        dims = new.operands[0].shape.dims
        limits = tuple(l if d in fixed else dims[d] for d, l in enumerate(spec.limits))
        new.set_attr("slice", SliceSpec(spec.starts, limits, spec.strides))
    elif instr.opcode is Opcode.DYNAMIC_SLICE:
        new.set_attr("dynamic_slice_sizes", tuple(new.shape.dims))
    return p.reshard(PValue(new, out, instr.shape), target)


@handles(Opcode.SLICE)
def slice_(p, instr) -> PValue:
    spec = instr.attr("slice")
    dims = instr.operands[0].shape.dims
    fixed = [d for d in range(len(dims))
             if (spec.starts[d], spec.limits[d], spec.strides[d]) != (0, dims[d], 1)]
    return local_except(p, instr, fixed)


@handles(Opcode.PAD)
def pad(p, instr) -> PValue:
    cfg: PaddingConfig = instr.attr("padding")
    return local_except(p, instr, [d for d, c in enumerate(cfg.dimensions) if c != (0, 0, 0)])


@handles(Opcode.CONCATENATE)
def concatenate(p, instr) -> PValue:
    return local_except(p, instr, list(instr.attr("dimensions")))


@handles(Opcode.REVERSE)
def reverse(p, instr) -> PValue:
    return local_except(p, instr, list(instr.attr("dimensions")))


@handles(Opcode.SORT)
def sort(p, instr) -> PValue:
    return local_except(p, instr, list(instr.attr("dimensions")))


@handles(Opcode.DYNAMIC_SLICE)
def dynamic_slice(p, instr) -> PValue:
    sizes = instr.attr("dynamic_slice_sizes")
    dims = instr.operands[0].shape.dims
    return local_except(p, instr, [d for d in range(len(dims)) if sizes[d] != dims[d]])


@handles(Opcode.DYNAMIC_UPDATE_SLICE)
def dynamic_update_slice(p, instr) -> PValue:
    dims, upd = instr.shape.dims, instr.operands[1].shape.dims
    return local_except(p, instr, [d for d in range(len(dims)) if upd[d] != dims[d]])
