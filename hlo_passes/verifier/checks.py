"""The structural checks: graph, names, roots, parameters, callees, operand counts, shapes,
shardings against shapes.

`verify_module` collects every problem; `instruction_problem` is the per-instruction
part (operand count, then the shape rule) that the parser also runs.
"""

from __future__ import annotations

from typing import Callable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Shape
from hlo_passes.printer import print_instruction
from hlo_passes.verifier.collectives import COLLECTIVE_RULES
from hlo_passes.verifier.errors import VerifierError
from hlo_passes.verifier.shape_rules import (OPERAND_COUNTS, SHAPE_RULES, ShapeProblem, operand_count_problem,
                                             same_shape, text)

RULES: dict[Opcode, Callable[[Instruction], Shape | None]] = {**SHAPE_RULES, **COLLECTIVE_RULES}

CONTEXT_LINES = 2


def _checker(opcode: Opcode) -> Callable[[Instruction], str | None]:
    """Operand count, then the shape rule, for one opcode (built once per opcode)."""
    bounds = OPERAND_COUNTS.get(opcode)
    rule = RULES.get(opcode)
    low, high = bounds if bounds is not None else (0, None)
    even = opcode in (Opcode.REDUCE, Opcode.REDUCE_WINDOW)
    odd = opcode is Opcode.SCATTER

    def check(instr: Instruction) -> str | None:
        n = len(instr.operands)
        if n < low or (high is not None and n > high) or (even and n % 2) or (odd and not n % 2):
            return operand_count_problem(instr)
        if rule is None:
            return None
        try:
            expected = rule(instr)
        except ShapeProblem as e:
            return str(e)
        except (AttributeError, TypeError, ValueError, IndexError) as e:
            # An attribute that does not read as its key requires (reader errors are ValueErrors).
            return f"cannot check its shape: {e}"
        if expected is None or same_shape(expected, instr.shape):
            return None
        return f"shape should be {text(expected)} (from its operands), got {text(instr.shape)}"

    return check


_CHECKERS: dict[Opcode, Callable[[Instruction], str | None]] = {
    op: _checker(op) for op in set(RULES) | set(OPERAND_COUNTS)}


def instruction_problem(instr: Instruction) -> str | None:
    """Operand count, then shape against the opcode's rule; None when both are fine."""
    check = _CHECKERS.get(instr.opcode)
    return None if check is None else check(instr)


def first_semantic_problem(module: Module) -> tuple[Instruction, str] | None:
    """The first instruction (in text order) whose operand count or shape is wrong.

    The parser runs this on every module: one table look-up per instruction."""
    checkers = _CHECKERS
    for comp in module.computations:
        for instr in comp.instructions:
            check = checkers.get(instr.opcode)
            if check is not None:
                problem = check(instr)
                if problem is not None:
                    return instr, problem
    return None


def verify_module(module: Module) -> list[VerifierError]:
    errors: list[VerifierError] = []
    comps = set(map(id, module.computations))
    if module.entry is None or id(module.entry) not in comps:
        errors.append(VerifierError("the module has no entry computation among its computations"))
    seen_comp_names: set[str] = set()
    for comp in module.computations:
        if comp.name in seen_comp_names:
            errors.append(VerifierError(f"computation name {comp.name} is used twice",
                                        computation=comp.name, span=comp.span))
        seen_comp_names.add(comp.name)
        # XLA's parser accepts a name reused in another computation (it renames one), so
        # names must be unique within a computation; a pass's new names come from
        # module.names and are unique module-wide.
        seen_names: set[str] = set()
        for instr in comp.instructions:
            if instr.name in seen_names:
                errors.append(_error(instr, f"name is used twice in {comp.name}"))
            seen_names.add(instr.name)
        errors.extend(_computation_errors(comp, comps))
    errors.extend(channel_errors(module))
    return errors


_SEND_RECV = {Opcode.SEND: Opcode.SEND_DONE, Opcode.RECV: Opcode.RECV_DONE}


def channel_errors(module: Module) -> list[VerifierError]:
    """Channel ids, as XLA's verifier always checks them (hlo_verifier.cc, VerifyChannels):
    a channel of send/recv is used by no other kind of instruction; a send (recv) has one
    user, and when that is a send-done (recv-done) it carries the same channel id.

    XLA checks that collectives sharing a channel id share an opcode only under its
    verify_unique_channel_ids option; XLA's own dumps share ids across all-reduce and
    all-to-all (golden/corpus/pmap_collectives), so that is not checked here."""
    errors: list[VerifierError] = []
    by_channel: dict[int, list[Instruction]] = {}
    for instr in module.all_instructions():
        channel = instr.channel_id
        if channel is None:
            continue
        by_channel.setdefault(channel, []).append(instr)
        done = _SEND_RECV.get(instr.opcode)
        if done is None or (instr.is_root and not instr.parent.is_entry):  # wrapped in an async call
            continue
        if len(instr.users) != 1:
            errors.append(_error(instr, f"a {instr.opcode.value} needs exactly one user (its "
                                        f"{done.value}), has {len(instr.users)}"))
        elif (user := next(iter(instr.users))).opcode is done and user.channel_id != channel:
            errors.append(_error(user, f"channel_id={user.attr('channel_id')} differs from channel_id="
                                       f"{channel} of its {instr.opcode.value} {instr.name}"))
    for channel, instrs in by_channel.items():
        kinds = [i.opcode in _SEND_RECV or i.opcode in _SEND_RECV.values() for i in instrs]
        if not any(kinds):
            continue
        first = instrs[kinds.index(True)]
        for other, is_send_recv in zip(instrs, kinds):
            if not is_send_recv:
                errors.append(_error(other, f"channel_id={channel} is also used by {first.opcode.value} "
                                            f"{first.name}: instructions of different kinds may not "
                                            f"share a channel"))
                break
    return errors


def _computation_errors(comp: Computation, module_comps: set[int]) -> list[VerifierError]:
    errors = []
    if comp.root is None:
        errors.append(VerifierError("has no root", computation=comp.name, span=comp.span))
    elif comp.root not in comp:
        errors.append(VerifierError(f"root {comp.root.name} is not an instruction of the computation",
                                    computation=comp.name, span=comp.span))
    for i, p in enumerate(comp.parameters):
        if p is None:
            errors.append(VerifierError(f"has no parameter({i}) (parameters are numbered 0..n-1)",
                                        computation=comp.name, span=comp.span))
        elif p.parameter_number != i or p not in comp or p.opcode is not Opcode.PARAMETER:
            errors.append(_error(p, f"is registered as parameter {i} but is parameter("
                                    f"{p.parameter_number}) of {p.parent.name if p.parent else 'nothing'}"))
    registered = set(map(id, comp.parameters))
    for instr in comp.instructions:
        if instr.opcode is Opcode.PARAMETER and id(instr) not in registered:
            errors.append(_error(instr, "is a parameter the computation does not list"))
        problem = _graph_problem(instr, comp) or _callee_problem(instr, module_comps)
        if problem is None:
            problem = instruction_problem(instr)
        if problem is None and "sharding" in instr.attributes:
            problem = _sharding_problem(instr)
        if problem is not None:
            errors.append(_error(instr, problem))
    return errors


def _sharding_problem(instr: Instruction) -> str | None:
    """A sharding that does not fit the instruction's shape (XLA's verifier validates every
    instruction's sharding against its shape)."""
    sharding = instr.sharding
    problem = sharding.problem_with(instr.shape) if sharding is not None else None
    return None if problem is None else f"invalid sharding: {problem}"


def _graph_problem(instr: Instruction, comp: Computation) -> str | None:
    if instr.parent is not comp:
        return f"is listed in {comp.name} but its parent is {getattr(instr.parent, 'name', None)}"
    for op in instr.operands:
        if op.parent is not comp or op not in comp:
            where = op.parent.name if op.parent is not None else "no computation"
            return f"operand {op.name} is in {where}, not in {comp.name}"
        if instr not in op.users:
            return f"operand {op.name} does not list it as a user"
    for user in instr.users:
        if instr not in user.operands:
            return f"lists {user.name} as a user, but {user.name} does not use it"
        if user.parent is not comp or user not in comp:
            return f"user {user.name} is not in {comp.name}"
    for pred in instr.control_predecessors:
        if pred.parent is not comp or instr not in pred.control_successors:
            return f"control predecessor {pred.name} is not consistent"
    for succ in instr.control_successors:
        if instr not in succ.control_predecessors:
            return f"control successor {succ.name} does not list it as a predecessor"
    return None


def _callee_problem(instr: Instruction, module_comps: set[int]) -> str | None:
    for callee in instr.called_computations():
        if id(callee) not in module_comps:
            return f"calls computation {callee.name}, which is not in the module"
    return None


def _error(instr: Instruction, message: str) -> VerifierError:
    comp = instr.parent
    return VerifierError(message, instruction=instr.name, computation=comp.name if comp else "",
                         context=context_lines(instr), span=instr.span)


def context_lines(instr: Instruction, around: int = CONTEXT_LINES) -> tuple[str, ...]:
    """The printed instruction with `around` lines either side, the offending one marked `>`."""
    comp = instr.parent
    if comp is None or instr not in comp:
        return ("  > " + _safe_print(print_instruction, instr),)
    order = comp.instructions
    i = order.index(instr)
    lines = []
    for j in range(max(0, i - around), min(len(order), i + around + 1)):
        mark = ">" if j == i else " "
        lines.append(f"  {mark} {_safe_print(print_instruction, order[j])}")
    return tuple(lines)


def _safe_print(printer, instr: Instruction) -> str:
    try:
        return printer(instr)
    except Exception:  # noqa: BLE001 - a broken instruction must still be reported
        return f"{instr.name} = {instr.opcode.value}(...)"
