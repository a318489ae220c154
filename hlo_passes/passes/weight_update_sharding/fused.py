"""XLA's own modules, as `jax.jit` hands them over after fusion, in the form the analysis reads.

By the time XLA's pre-scheduler hook runs, XLA has combined every gradient all-reduce into
one variadic (tuple) all-reduce, put the optimizer update into kLoop fusions, and moved the
transposes of transposed gradients (the `dot` of the backward pass produces `[out, in]`)
inside those fusions.  `normalize` undoes just enough of that, without changing what the
module computes:

    before                                           after
    ar = (f32[10,256], f32[256]) all-reduce(a, b)    ar.0 = f32[10,256] all-reduce(a)
    g = f32[10,256] get-tuple-element(ar), index=0   ar.1 = f32[256] all-reduce(b)
    m' = f32[256,10] fusion(g, m), kind=kLoop,       t = f32[256,10]{1,0} transpose(ar.0), dimensions={1,0}
         calls={ p0 → transpose → copy → ... }       m' = f32[256,10] fusion(t, m), calls={ p0 → copy → ... }

Each element of a summed variadic all-reduce read only through get-tuple-element becomes
its own all-reduce (a sum of a tuple is the tuple of the sums).  A scalar kLoop fusion that
reduces reduced gradients (XLA's fused global norm) is inlined, since the analysis models
reductions only outside fusions.  A transpose of a fusion parameter that holds a reduced
gradient moves out of the fusion (once per gradient and permutation, shared by every fusion
that reads it), also past elementwise ops between the parameter and the transpose (a clip
factor applied before it); reductions over all elements of that gradient then read the
transposed value, so the gradient's only user is the transpose.  The other fusions stay
fused: `elementwise_fusion` says which of them the analysis may treat like one elementwise op.
"""

from __future__ import annotations

from hlo_passes.ir.builder import next_channel_id
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Layout
from hlo_passes.ir.reduction import Reduction


def elementwise_fusion(instr: Instruction) -> bool:
    """A kLoop fusion that computes elementwise on operands of its own shape and scalars.

    Its fused computation may hold parameters (scalars or of the fusion's dimensions),
    scalar constants, broadcasts of scalars, and elementwise ops (copies included) of the
    fusion's dimensions or scalars; anything else (a transpose, a reduce, a broadcast along
    some dimensions, an iota) makes it no elementwise op."""
    if instr.opcode is not Opcode.FUSION or instr.fusion_kind != "kLoop" or not instr.shape.is_array:
        return False
    fused = instr.called.get("calls")
    if not isinstance(fused, Computation):
        return False
    dims = instr.shape.dims
    if any(not o.shape.is_array or o.shape.rank not in (0, len(dims)) or
           (o.shape.rank and o.shape.dims != dims) for o in instr.operands):
        return False
    for i in fused.instructions:
        if not i.shape.is_array or (i.shape.rank and i.shape.dims != dims):
            return False
        if i.opcode is Opcode.PARAMETER:
            continue
        if i.opcode is Opcode.CONSTANT:
            if i.shape.rank:
                return False
        elif i.opcode is Opcode.BROADCAST:
            if i.operands[0].shape.rank:
                return False
        elif not i.opcode.is_elementwise or i.has_side_effect or i.called:
            return False
    return True


def shard_fused_computation(module: Module, fused: Computation, chunk: int) -> Computation:
    """A copy of an elementwise fused computation computing on `[chunk]` instead of its dims."""
    new = module.clone_computation(fused, suffix="shard")
    for i in new.instructions:
        if i.shape.is_array and i.shape.rank:
            i.shape = ArrayShape(i.shape.element_type, (chunk,), layout=Layout((0,)))
    return new


# ------------------------------------------------------------- normalize --
def normalize(module: Module, computations: list[Computation]) -> bool:
    """Split summed variadic all-reduces and hoist gradient transposes out of kLoop fusions."""
    changed = False
    for comp in computations:
        changed |= split_variadic_all_reduces(module, comp)
        changed |= _inline_gradient_reductions(module, comp)
        changed |= _hoist_gradient_transposes(module, comp)
    return changed


def _inline_gradient_reductions(module: Module, comp: Computation) -> bool:
    """A scalar kLoop fusion that reduces reduced gradients (XLA's fused global norm) is inlined:
    the analysis models reductions of gradients only outside fusions."""
    changed = False
    for fusion in comp.instructions:
        if (fusion.opcode is not Opcode.FUSION or fusion.fusion_kind != "kLoop" or not fusion.shape.is_array
                or fusion.shape.rank != 0 or not any(_is_reduced_gradient(o) for o in fusion.operands)):
            continue
        fused = fusion.called.get("calls")
        if not isinstance(fused, Computation) or not any(i.opcode is Opcode.REDUCE for i in fused.instructions):
            continue
        mapping: dict[Instruction, Instruction] = {}
        for instr in fused.post_order():
            if instr.opcode is Opcode.PARAMETER:
                mapping[instr] = fusion.operands[instr.parameter_number]
                continue
            attrs = dict(instr.attributes)
            if "metadata" not in attrs and "metadata" in fusion.attributes:
                attrs["metadata"] = fusion.attributes["metadata"]
            copy = Instruction(instr.opcode, instr.shape, [mapping[o] for o in instr.operands],
                               attributes=attrs, called=dict(instr.called), literal=instr.literal)
            mapping[instr] = comp.add(copy, name_hint=instr.name, before=fusion)
        comp.replace(fusion, mapping[fused.root])
        if not any(fused in i.called_computations() for i in module.all_instructions()):
            module.remove_computation(fused)
        changed = True
    return changed


def split_variadic_all_reduces(module: Module, comp: Computation) -> bool:
    changed = False
    for ar in comp.instructions:
        if (ar.opcode is not Opcode.ALL_REDUCE or not ar.shape.is_tuple or ar.is_root
                or Reduction.of_instruction(ar) is None or ar.control_predecessors or ar.control_successors
                or not all(u.opcode is Opcode.GET_TUPLE_ELEMENT for u in ar.users)):
            continue
        parts = []
        for k, (operand, shape) in enumerate(zip(ar.operands, ar.shape.elements)):
            attrs = dict(ar.attributes)
            new = Instruction(Opcode.ALL_REDUCE, shape, [operand], attributes=attrs, called=dict(ar.called))
            if ar.channel_id is not None:
                new.set_attr("channel_id", next_channel_id(module))
            parts.append(comp.add(new, name_hint=f"{ar.name}.{k}", before=ar))
        for gte in list(ar.users):
            gte.replace_all_uses_with(parts[gte.tuple_index])
            comp.remove(gte)
        comp.remove(ar)
        changed = True
    return changed


def _is_reduced_gradient(instr: Instruction) -> bool:
    return (instr.opcode is Opcode.ALL_REDUCE and instr.shape.is_array and len(instr.operands) == 1
            and Reduction.of_instruction(instr) is not None)


def _hoist_gradient_transposes(module: Module, comp: Computation) -> bool:
    """`fusion(g, ...)` whose parameter for g is only transposed inside: the transpose moves out."""
    callers: dict[Computation, int] = {}
    for instr in module.all_instructions():
        for callee in instr.called_computations():
            callers[callee] = callers.get(callee, 0) + 1
    hoisted: dict[tuple[Instruction, tuple[int, ...]], Instruction] = {}
    changed = False
    for fusion in comp.instructions:
        if fusion.opcode is not Opcode.FUSION or fusion.fusion_kind != "kLoop":
            continue
        fused = fusion.called.get("calls")
        if not isinstance(fused, Computation) or callers.get(fused) != 1:
            continue
        for k, operand in enumerate(fusion.operands):
            if not _is_reduced_gradient(operand):
                continue
            param = fused.parameters[k]
            found = _transposed_region(param)
            if found is None:
                continue
            region, transposes = found
            perm = transposes[0].dimensions
            outer = hoisted.get((operand, perm))
            if outer is None:
                inner = transposes[0]
                shape = ArrayShape(inner.shape.element_type, inner.shape.dims,
                                   layout=Layout.default_for_rank(inner.shape.rank))
                outer = Instruction(Opcode.TRANSPOSE, shape, [operand], attributes=dict(inner.attributes))
                outer = comp.add(outer, name_hint=inner.name, before=fusion)
                hoisted[(operand, perm)] = outer
            fusion.set_operand(k, outer)
            # the parameter and the elementwise ops before the transposes now hold transposed
            # values, in row-major layout; the transposes go
            for x in [param, *region]:
                x.shape = ArrayShape(x.shape.element_type, outer.shape.dims, layout=outer.shape.layout)
            for x in region:
                for j, o in enumerate(x.operands):
                    if o.opcode is Opcode.BROADCAST and o.shape.rank:
                        b = Instruction(Opcode.BROADCAST, ArrayShape(o.shape.element_type, outer.shape.dims,
                                                                     layout=outer.shape.layout),
                                        [o.operands[0]], attributes=dict(o.attributes))
                        x.set_operand(j, fused.add(b, name_hint=o.name, before=x))
            for inner in transposes:
                inner.replace_all_uses_with(inner.operands[0])
                fused.remove(inner)
            for x in fused.instructions:  # broadcasts left without users
                if x.opcode is Opcode.BROADCAST and not x.users and not x.is_root:
                    fused.remove(x)
            fused.sort_topologically()
            changed = True
    for (gradient, _), outer in hoisted.items():
        for user in list(gradient.users):
            if user is not outer:
                _retarget_reduction(comp, user, gradient, outer)
    if changed:
        comp.sort_topologically()
    return changed


def _transposed_region(param: Instruction) -> tuple[list[Instruction], list[Instruction]] | None:
    """Elementwise ops from `param` up to transposes that all permute the same way, such that
    the transposes can move before `param` (elementwise ops commute with a transpose): the ops
    read only `param`, each other, scalars and broadcasts of scalars, and are read only by each
    other and the transposes.  None when there is no such region with at least one transpose."""
    dims = param.shape.dims
    region: list[Instruction] = []
    transposes: list[Instruction] = []
    work, seen = list(param.users), {param}
    while work:
        x = work.pop()
        if x in seen:
            continue
        seen.add(x)
        if x.opcode is Opcode.TRANSPOSE:
            transposes.append(x)
            continue
        if not (x.opcode.is_elementwise and x.shape.is_array and x.shape.dims == dims and not x.is_root):
            return None
        region.append(x)
        work.extend(x.users)
    inside = {param, *region}
    for x in region:
        for o in x.operands:
            if o not in inside and o.shape.rank and not (o.opcode is Opcode.BROADCAST
                                                         and o.operands[0].shape.rank == 0):
                return None
    for t in transposes:
        if t.operands[0] not in inside:
            return None
    if not transposes or len({t.dimensions for t in transposes}) != 1:
        return None
    order = {x: i for i, x in enumerate(param.parent.post_order())}
    return sorted(region, key=order.__getitem__), transposes


def _retarget_reduction(comp: Computation, start: Instruction, gradient: Instruction,
                        transposed: Instruction) -> None:
    """Elementwise ops of `gradient` that end in reductions over all its dimensions compute the
    same reductions on `transposed` (a sum over every element does not depend on their order;
    float rounding may).  Then the gradient has one user, the transpose, which the analysis reads
    as a layout op; otherwise nothing changes."""
    dims = gradient.shape.dims
    chain: list[Instruction] = []
    work, seen = [start], set()
    while work:
        x = work.pop()
        if x in seen:
            continue
        seen.add(x)
        if x.opcode is Opcode.REDUCE:
            if (len(x.operands) != 2 or x.operands[0] not in seen or x.shape.rank != 0
                    or sorted(x.dimensions) != list(range(len(dims)))):
                return
            continue
        if not (x.opcode.is_elementwise and x.shape.is_array and x.shape.dims == dims and not x.is_root):
            return
        for o in x.operands:
            if o is gradient or o in seen or o.shape.rank == 0:
                continue
            if o.opcode is Opcode.BROADCAST and o.operands[0].shape.rank == 0:
                continue
            if o.opcode.is_elementwise and o.shape.dims == dims:  # another op of the chain
                work.append(o)
                continue
            return
        chain.append(x)
        work.extend(x.users)
    shape_of = transposed.shape
    for x in chain:
        for k, o in enumerate(x.operands):
            if o is gradient:
                x.set_operand(k, transposed)
            elif o.opcode is Opcode.BROADCAST and o.shape.rank:
                b = Instruction(Opcode.BROADCAST, ArrayShape(o.shape.element_type, shape_of.dims,
                                                             layout=shape_of.layout),
                                [o.operands[0]], attributes=dict(o.attributes))
                x.set_operand(k, comp.add(b, name_hint=o.name, before=x))
        x.shape = ArrayShape(x.shape.element_type, shape_of.dims, layout=shape_of.layout)
