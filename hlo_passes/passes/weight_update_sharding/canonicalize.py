"""The gradient reductions and update regions in the one form the analysis reads.

Partitioners and JAX spell the same data-parallel step in several ways; before the analysis
each is rewritten into plain summed all-reduces of one gradient each, with the update around
them in the same computation:

* a summed variadic all-reduce (a combiner's, or XLA's fused form) becomes one all-reduce per
  element: the sum of a tuple is the tuple of the sums (`fused.split_variadic_all_reduces`);
* a reduce-scatter followed by an all-gather over the same groups and dimension (a partitioner
  that reduces a gradient as a pair) is the all-reduce it computes:

      rs = f32[32,16] reduce-scatter(dw), dimensions={0}   ag = f32[256,16] all-gather(rs), dimensions={0}
        →  ag' = f32[256,16] all-reduce(dw)

* a `call` that reads a reduced gradient (or a value computed from one) is inlined where it is:
  `jnp.linalg.norm` and `jnp.where` lower to calls, and a norm inside one is a whole-tensor
  reduction the analysis shards.  So is a call of elementwise ops and reductions that reads a
  value the update reads besides the gradient (the weight), or an elementwise expression of one:
  LAMB's and Adafactor's ‖w‖ (`optax.safe_norm`: a norm, a `where` on it, a norm again) is a
  whole-tensor reduction of the weight the analysis can shard too;
* a chain of reshapes and identity broadcasts that reads a value computed from a reduced gradient
  is one reshape, and one that ends where it began is that value (`jnp.mean(..., keepdims=True)`
  and Optax's factored moments go [16] → [16,1] → [16]): `fold_size_one_reshapes`;
* a summed all-reduce of a value that is already identical on every device of its groups (JAX's
  `pmean` of a gradient that an earlier collective has reduced) is that value times the group
  size, and needs no communication at all (`simplify_replicated_all_reduces`; never sharded).

Each step preserves what the module computes.
"""

from __future__ import annotations

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.cleanup.call_inliner import inline_call
from hlo_passes.passes.weight_update_sharding.fused import split_variadic_all_reduces
from hlo_passes.passes.collectives.all_reduce_simplifier import ReplicatedAllReduces
from hlo_passes.passes.collectives.replication import device_groups


def canonicalize(module: Module, computations: list[Computation]) -> bool:
    """Split variadic all-reduces, join reduce-scatter + all-gather pairs, inline calls on gradients."""
    changed = False
    for comp in computations:
        changed |= split_variadic_all_reduces(module, comp)
        changed |= join_scatter_gather_pairs(module, comp)
        changed |= inline_gradient_calls(module, comp)
        changed |= fold_size_one_reshapes(comp)
    return changed


def _summed(instr: Instruction) -> bool:
    kind = Reduction.of_instruction(instr)
    return kind is not None and kind.opcode is Opcode.ADD


def join_scatter_gather_pairs(module: Module, comp: Computation) -> bool:
    changed = False
    for ag in comp.instructions:
        if ag.opcode is not Opcode.ALL_GATHER or not ag.shape.is_array or len(ag.operands) != 1:
            continue
        rs = ag.operands[0]
        if (rs.opcode is not Opcode.REDUCE_SCATTER or len(rs.operands) != 1 or len(rs.users) != 1
                or not _summed(rs) or rs.dimensions != ag.dimensions or rs.control_successors
                or ag.control_predecessors or rs.operands[0].shape.dims != ag.shape.dims
                or device_groups(rs, module) != device_groups(ag, module)
                or rs.use_global_device_ids != ag.use_global_device_ids
                or (rs.channel_id is None) != (ag.channel_id is None)):
            continue
        attrs = {k: v for k, v in rs.attributes.items() if k not in ("dimensions", "sharding")}
        new = Instruction(Opcode.ALL_REDUCE, ag.shape, [rs.operands[0]], attributes=attrs, called=dict(rs.called))
        if rs.channel_id is not None:
            new.set_attr("channel_id", module.new_channel_id())
        new = comp.add(new, name_hint=ag.name, before=ag)
        comp.replace(ag, new)
        comp.remove(rs)
        changed = True
    return changed


# What a call may compute for the analysis to read it inlined beside the weight: elementwise
# ops, reductions and the shape ops around them (`jnp.linalg.norm`, `jnp.where`), never a dot,
# a convolution or a custom-call of the forward pass that happens to read the weight.
_LIGHT_OPCODES = frozenset({Opcode.PARAMETER, Opcode.CONSTANT, Opcode.BROADCAST, Opcode.RESHAPE, Opcode.BITCAST,
                            Opcode.REDUCE, Opcode.IOTA, Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT, Opcode.CALL})


def _light(callee: Computation) -> bool:
    """Only elementwise ops, reductions and shape ops, in it and in the calls it makes."""
    for instr in callee.instructions:
        if instr.opcode is Opcode.CALL:
            if not _light(instr.called["to_apply"]):
                return False
        elif not (instr.opcode.is_elementwise or instr.opcode in _LIGHT_OPCODES):
            return False
    return True


def _inlinable(instr: Instruction) -> bool:
    return (instr.opcode is Opcode.CALL and not instr.control_predecessors and not instr.control_successors
            and not instr.has_side_effect)


def inline_gradient_calls(module: Module, comp: Computation) -> bool:
    """Inline the calls that read values computed from a summed all-reduce of this computation,
    and the light calls (`_light`) that read an array the update reads besides the gradient or
    an elementwise expression of one (until none is left: a callee's own calls are inlined next
    round)."""
    changed = False
    while True:
        reached: set[Instruction] = set()
        calls = []
        for instr in comp.post_order():
            if instr.opcode is Opcode.ALL_REDUCE and _summed(instr):
                reached.add(instr)
            elif any(o in reached for o in instr.operands):
                reached.add(instr)
                if _inlinable(instr):
                    calls.append(instr)
        # The update's other inputs (the weight) and elementwise expressions of them.
        near = {o for r in reached for o in r.operands
                if o not in reached and o.shape.is_array and o.shape.rank > 0}
        for instr in comp.post_order():
            if instr in reached or instr in near or not any(o in near for o in instr.operands):
                continue
            if _inlinable(instr) and _light(instr.called["to_apply"]):
                calls.append(instr)
                near.add(instr)
            elif instr.opcode.is_elementwise and instr.shape.is_array and instr.shape.rank > 0:
                near.add(instr)
        if not calls:
            return changed
        for call in calls:
            # The callee stays (as call-inliner leaves it, for dce): removing it would release
            # instruction names that parsed modules reuse across computations.
            inline_call(call)
        changed = True


def _same_value_shape(a: Instruction, b: Instruction) -> bool:
    """The same dims and layout (a reshape between them moves nothing)."""
    x, y = a.shape, b.shape
    return (x.is_array and y.is_array and x.element_type == y.element_type and x.dims == y.dims
            and (x.layout is None or y.layout is None or x.layout == y.layout))


def fold_size_one_reshapes(comp: Computation) -> bool:
    """In the forward closure of the summed all-reduces: an identity broadcast (same shape, dims
    in order) is its operand, a reshape of a reshape reshapes the first operand, and a reshape
    back to its operand's shape is that operand.  The ROOT's operands keep their instructions."""
    changed = False
    reached: set[Instruction] = set()
    for instr in comp.post_order():
        if instr.opcode is Opcode.ALL_REDUCE and _summed(instr):
            reached.add(instr)
            continue
        if not any(o in reached for o in instr.operands):
            continue
        reached.add(instr)
        if instr.is_root or any(u.is_root for u in instr.users) or instr.control_predecessors \
                or instr.control_successors or len(instr.operands) != 1:
            continue
        x = instr.operands[0]
        if instr.opcode is Opcode.RESHAPE and x.opcode is Opcode.RESHAPE:
            instr.replace_operand(x, x.operands[0])
            if not x.users and not x.is_root and not x.control_successors:
                comp.remove(x)
            x = instr.operands[0]
            changed = True
        identity_broadcast = (instr.opcode is Opcode.BROADCAST and instr.shape.is_array
                              and instr.dimensions == tuple(range(instr.shape.rank)))
        if (identity_broadcast or instr.opcode is Opcode.RESHAPE) and _same_value_shape(instr, x):
            instr.replace_all_uses_with(x)
            comp.remove(instr)
            changed = True
    return changed


def simplify_replicated_all_reduces(module: Module, comp: Computation) -> list[tuple[Instruction, str]]:
    """Summed all-reduces of values provably identical on every device of their groups become a
    multiply by the group size (`all-reduce-simplifier`'s fold; no assumption about parameters:
    a batch is not a weight).  Returns (replacement, name of the all-reduce it replaced) pairs."""
    done = []
    replicated = ReplicatedAllReduces(module)
    for ar in comp.post_order():
        name = ar.name
        scaled = replicated.fold(ar, sums_only=True)
        if scaled is not None:
            done.append((scaled, name))
    return done
