"""top-k (the `topk` op and XLA's `TopK` custom-call) along a sharded last dimension.

Each device holds a slice of the candidates; the k largest of the whole row are among the
union of every device's k largest.  So, as GSPMD does it:

1. every device takes the top k of its own slice (padding of an uneven last tile masked to the
   value that never wins), and turns the local positions into global ones (+ its offset);
2. the t × k candidate values and positions are all-gathered along the last dim;
3. a stable sort of the candidates (values descending, positions riding along) and a slice
   of the first k give the answer on every device — ties keep the lower position first, as
   top-k does, because the gathered candidates are in position order.

        %t = (f32[16,4], s32[16,4]) topk(f32[16,1024] %x {devices=[1,8]}), k=4, largest=true
      -> local topk of f32[16,128], +128·d, all-gather -> [16,32], sort, slice [16,4]

A last dim that is not tiled is local (the other dims keep their tiling); k larger than a
device's slice is computed on the gathered row.
"""

from __future__ import annotations

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd.handlers import HandlerContext, handles, handles_custom_call
from hlo_passes.passes.spmd.handlers.slicing import local_except
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.spmd.partition_context import PValue, groups_varying, tile_map, tm_local_dims, to_sharding


@handles(Opcode.TOPK)
@handles_custom_call("TopK")
def topk(p: HandlerContext, instr: Instruction) -> PValue:
    x = instr.operands[0]
    last = x.array_shape.rank - 1
    values, indices = instr.shape.leaves()  # (values, indices): two arrays
    k = values.dims[last]
    largest = instr.opcode is Opcode.CUSTOM_CALL or bool(instr.attr("largest", True))
    cur = tile_map(p.value(x).sharding, x.array_shape.rank, p.n)
    t = cur.dims[last]
    size = x.array_shape.dims[last]
    if t == 1 or k > size // t or x.array_shape.element_type.is_complex:
        return local_except(p, instr, [last])
    em, b = p.em, p.em.b()
    op_sharding = to_sharding(cur)
    xl = p.operand_as(instr, 0, op_sharding)
    etype = x.array_shape.element_type
    never = Reduction(Opcode.MAXIMUM if largest else Opcode.MINIMUM, etype).identity
    xl = em.mask_padding(xl, cur, tuple(x.array_shape.dims), [last], never)
    local_dims = tm_local_dims(cur, tuple(x.array_shape.dims))
    out_dims = tuple(local_dims[:last]) + (k,)
    pair = TupleShape((ArrayShape(etype, out_dims), ArrayShape(indices.element_type, out_dims)))
    local = p.clone(instr, [xl], pair)
    vals = b.get_tuple_element(local, 0)
    groups = groups_varying(cur, [last])
    vals = em.all_gather(vals, last, groups)
    limits = out_dims
    if not _positions_read(instr):
        # Only the values are read (`jax.lax.top_k(x)[0]`): the positions are neither offset,
        # gathered nor sorted along (half the bytes; XLA's plan).  The result's positions are a
        # zero placeholder nothing reads.
        comparator = _comparator(p.ctx.module, etype, None, largest)
        sorted_values = b.op(Opcode.SORT, vals.shape, [vals], dimensions=(last,), called={"to_apply": comparator})
        unread = b.broadcast(b.constant(0, indices.element_type), ArrayShape(indices.element_type, out_dims))
        top = [b.slice(sorted_values, [0] * len(limits), list(limits)), unread]
    else:
        pos = b.get_tuple_element(local, 1)
        offsets = em.device_scalar(cur.coords[:, last] * local_dims[last],
                                   indices.element_type)
        pos = b.add(pos, b.broadcast(offsets, pos.array_shape))
        pos = em.all_gather(pos, last, groups)
        comparator = _comparator(p.ctx.module, etype, indices.element_type, largest)
        sorted_ = b.op(Opcode.SORT, TupleShape((vals.shape, pos.shape)), [vals, pos], dimensions=(last,),
                       is_stable=True, called={"to_apply": comparator})
        top = [b.slice(b.get_tuple_element(sorted_, i), [0] * len(limits), list(limits)) for i in range(2)]
    result_tm = cur.keep_dims(list(range(last)))
    out = to_sharding(result_tm)
    value = PValue(b.tuple(top), Sharding.tuple_of([out, out]), instr.shape)
    return p.reshard(value, p.target(instr))


def _positions_read(instr: Instruction) -> bool:
    """Does anything read the top-k's positions (element 1): a user other than a
    get-tuple-element of the values, or the computation's result?"""
    return instr.is_root or any(u.opcode is not Opcode.GET_TUPLE_ELEMENT or u.attr("index") != 0
                                for u in instr.users)


def _comparator(module: Module, value_type: PrimitiveType, index_type: PrimitiveType | None,
                largest: bool) -> Computation:
    """`compare(a, b)` GT (largest) or LT, the positions riding along (a stable sort keeps the
    lower position first among equal values); of the values alone when `index_type` is None."""
    name = f"topk.{value_type.value}.{'gt' if largest else 'lt'}.{'values.' if index_type is None else ''}comparator"
    for comp in module.computations:
        if comp.name == name:
            return comp
    comp = Computation(name)
    params: list[Instruction] = []
    kinds = [("a", value_type), ("b", value_type)] + ([("i", index_type), ("j", index_type)] if index_type else [])
    for i, (pname, etype) in enumerate(kinds):
        params.append(comp.add(Instruction(Opcode.PARAMETER, ArrayShape(etype, ()), name=pname,
                                           parameter_number=i)))
    root = Instruction(Opcode.COMPARE, ArrayShape(PrimitiveType.PRED, ()), params[:2], name="better")
    root.set_attr("direction", "GT" if largest else "LT")
    comp.root = comp.add(root)
    module.add_computation(comp, before=module.entry)
    return comp


__all__ = ["topk"]
