"""while, call, conditional: partition the called computations with the shardings at the call.

A while loop's operand, body parameter, body root, condition parameter and result
all carry the loop's (tuple) sharding, so the body is partitioned once with it
and its root resharded back to it.  A call's callee is partitioned per call site
with its parameters' annotated shardings (or the operands' shardings when it has
none); a conditional's branches likewise, except that a reshard only one branch asks for
happens inside that branch (paid only when it runs), their roots resharded to the result's
sharding.
"""

from __future__ import annotations

from collections import Counter

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.partition_context import PValue, is_manual, local_shape, root_of


def _param_sharding(p: HandlerContext, comp: Computation, i: int, fallback: Sharding) -> Sharding:
    param = comp.parameters[i]
    if "sharding" in param.attributes:
        from hlo_passes.passes.spmd.spmd_partitioner import target_sharding

        return target_sharding(param)
    return fallback


@handles(Opcode.WHILE)
def while_(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    x = p.operand_as(instr, 0, target)
    body, _ = p.partition(instr.called_computation("body"), [target], target)
    cond, _ = p.partition(instr.called_computation("condition"), [target], Sharding.replicated())
    new = p.clone(instr, [x], local_shape(instr.shape, target), body=body, condition=cond)
    return PValue(new, target, instr.shape)


@handles(Opcode.CALL)
def call(p: HandlerContext, instr: Instruction) -> PValue:
    callee = instr.called_computation("to_apply")
    shardings = [_param_sharding(p, callee, i, p.operand(instr, i).sharding)
                 for i in range(len(instr.operands))]
    operands = [p.operand_as(instr, i, s) for i, s in enumerate(shardings)]
    root = p.target(root_of(callee)) if "sharding" in root_of(callee).attributes else p.target(instr)
    new_callee, root = p.partition(callee, shardings, root, shared=True)
    new = p.clone(instr, operands, local_shape(instr.shape, root), to_apply=new_callee)
    return PValue(new, root, instr.shape)


@handles(Opcode.CONDITIONAL)
def conditional(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    selector = p.operand_as(instr, 0, Sharding.replicated())
    key = "branch_computations" if "branch_computations" in instr.called else None
    branches = instr.branch_computations
    operands, params = [selector], []
    wanted = [_param_sharding(p, comp, 0, p.operand(instr, b + 1).sharding) for b, comp in enumerate(branches)]
    asks = Counter((instr.operands[b + 1], s) for b, s in enumerate(wanted))
    for b, comp in enumerate(branches):
        # A reshard only this branch asks for happens inside it, paid only when it runs (a
        # reshard before the conditional is paid whichever branch runs); one that several
        # branches ask for of the same operand is made once before, shared.  Manual operands
        # cross as annotated.
        own = p.operand(instr, b + 1).sharding
        s = wanted[b]
        if asks[(instr.operands[b + 1], s)] == 1 and not (is_manual(s) or is_manual(own)):
            s = own
        operands.append(p.operand_as(instr, b + 1, s))
        params.append(s)
    # Where every branch's result comes out in one sharding, the conditional returns it so and
    # is resharded once after it, as XLA's partition does, rather than each branch resharding
    # its own root (the same bytes when it runs, but a copy of the move in every branch).
    natural = [p.partition(comp, [s], None) for comp, s in zip(branches, params)]
    out = natural[0][1]
    if is_manual(target) or any(r != out for _, r in natural) or out.is_tuple != target.is_tuple:
        natural = [p.partition(comp, [s], target) for comp, s in zip(branches, params)]
        out = target
    new_branches = [comp for comp, _ in natural]
    called = ({key: tuple(new_branches)} if key else
              {"true_computation": new_branches[0], "false_computation": new_branches[1]})
    new = p.clone(instr, operands, local_shape(instr.shape, out), **called)
    return p.reshard(PValue(new, out, instr.shape), target)
