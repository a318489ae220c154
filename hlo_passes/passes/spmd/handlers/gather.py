"""gather in the passthrough case: operand dims that are neither indexed nor collapsed
(sliced whole, `slice_sizes[d] == dim`) keep their tiling into the matching output offset
dim, so each device gathers from its own columns with replicated indices.

    %g = f32[4,8] gather(f32[16,8] %x {devices=[1,8]}, s32[4,1] %idx), offset_dims={1},
         collapsed_slice_dims={0}, start_index_map={0}, slice_sizes={1,8}
  becomes  %g = f32[4,1] gather(f32[16,1] %x, %idx), ..., slice_sizes={1,1}   ({devices=[1,8]})

Anything else (sharded indexed dims, batching dims) is replicated.
"""

from __future__ import annotations

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.handlers import handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import PValue, local_shape, tile_map, to_sharding


@handles(Opcode.GATHER)
def gather(p, instr) -> PValue:
    operand = instr.operands[0]
    if instr.attr("operand_batching_dims"):
        return replicate(p, instr, "gather with batching dims")
    dims = operand.shape.dims
    sizes = instr.attr("slice_sizes")
    collapsed = set(instr.attr("collapsed_slice_dims") or ())
    indexed = set(instr.attr("start_index_map") or ())
    offset_dims = instr.attr("offset_dims") or ()
    kept = [d for d in range(len(dims)) if d not in collapsed]
    passthrough = {d: offset_dims[k] for k, d in enumerate(kept) if sizes[d] == dims[d] and d not in indexed}
    op_tm = tile_map(p.value(operand).sharding, len(dims), p.n).keep_dims(list(passthrough))
    if op_tm.num_tiles == 1:
        return replicate(p, instr, "gather operand not sharded on a passthrough dim")
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    idx = p.operand_as(instr, 1, Sharding.replicated())
    out = to_sharding(op_tm.remap(instr.shape.rank, {o: d for d, o in passthrough.items()}))
    new = p.clone(instr, [x, idx], local_shape(instr.shape, out))
    new.set_attr("slice_sizes", tuple(x.shape.dims[d] if d in passthrough else s for d, s in enumerate(sizes)))
    return p.reshard(PValue(new, out, instr.shape), p.target(instr))
