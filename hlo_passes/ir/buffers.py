"""Buffers after XLA's copy insertion: which uses write an operand's buffer in place, and which
values a rewrite must therefore keep apart.

XLA runs copy insertion late in its pipeline, before scheduling.  From then on a module goes
to buffer assignment as it is, and buffer identity is part of its meaning:

* an op that updates an operand in place (a while loop's state, dynamic-update-slice, scatter,
  a fusion rooted in one of them, a custom-call with `output_to_operand_aliasing`, an async
  start holding its operands, a call or conditional whose body may write its parameter) shares
  that operand's buffer with its result, unconditionally (XLA's alias analysis);
* every output of the entry has a buffer of its own;
* a `copy` exists to give a value a buffer of its own: copy insertion put it there so that two
  in-place updates, or an update and a later read, do not meet.

So on such a module (`Module.copies_inserted`: what the jax.jit hook hands passes at the
pre- and post-scheduler stages) merging two equal values, or replacing a value by another,
can make two loops count with one counter, or two scatters write one array: a wrong program,
which no later XLA pass repairs.  Passes consult `shares_in_place_buffer` before merging, and
the hook compares `in_place_sharing` before and after every pass as a safety net.
Bitcasts, tuples and get-tuple-elements pass a buffer on (they alias, they do not copy).
"""

from __future__ import annotations


from typing import TYPE_CHECKING

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode

if TYPE_CHECKING:
    from hlo_passes.ir.module import Module

# Results that are an operand's buffer (or hold it): followed when asking who reads a buffer.
ALIASING = frozenset({Opcode.BITCAST, Opcode.GET_TUPLE_ELEMENT, Opcode.TUPLE})
_UPDATES_IN_PLACE = frozenset({Opcode.DYNAMIC_UPDATE_SLICE, Opcode.SCATTER})


def _updated_operands(instr: Instruction) -> range:
    """The operands a dynamic-update-slice or scatter writes into."""
    if instr.opcode is Opcode.SCATTER:
        return range((len(instr.operands) - 1) // 2)
    return range(1)


def _fused_in_place_parameters(instr: Instruction) -> set[int]:
    """The parameters of a fusion's computation that reach, through aliasing ops, an operand a
    dynamic-update-slice or scatter inside writes into."""
    found: set[int] = set()
    for body in instr.called_computations():
        for inner in body.instructions:
            if inner.opcode not in _UPDATES_IN_PLACE:
                continue
            for k in _updated_operands(inner):
                source = inner.operands[k]
                while source.opcode in (Opcode.BITCAST, Opcode.GET_TUPLE_ELEMENT) and source.operands:
                    source = source.operands[0]
                if source.opcode is Opcode.PARAMETER and source.parameter_number is not None:
                    found.add(source.parameter_number)
    return found


def in_place_operands(instr: Instruction) -> frozenset[int]:
    """The operand positions whose buffer `instr` may write in place (or hold until a later
    done), after copy insertion."""
    op = instr.opcode
    everything = frozenset(range(len(instr.operands)))
    if op is Opcode.WHILE:
        return frozenset({0})
    if op in (Opcode.CONDITIONAL, Opcode.CALL) or op.value.endswith("-start"):
        return everything
    found: set[int] = set()
    if op in _UPDATES_IN_PLACE:
        found.update(_updated_operands(instr))
    if op is Opcode.FUSION:
        found.update(_fused_in_place_parameters(instr))
    aliasing = instr.attr("output_to_operand_aliasing")
    if aliasing is not None:
        found.update(aliasing.operands)
    return frozenset(k for k in found if k < len(instr.operands))


def buffer_uses(value: Instruction) -> set[tuple[Instruction, int]]:
    """(reader, operand position) for every use of `value`'s buffer, through aliasing ops; an
    ENTRY root reached this way is a use at position -1 (an output buffer)."""
    uses: set[tuple[Instruction, int]] = set()
    pending, seen = [value], {id(value)}
    while pending:
        v = pending.pop()
        if v.is_root and v.parent is not None and v.parent.is_entry:
            uses.add((v, -1))
        for user in v.users:
            if user.opcode in ALIASING:
                if id(user) not in seen:
                    seen.add(id(user))
                    pending.append(user)
                continue
            for k, operand in enumerate(user.operands):
                if operand is v:
                    uses.add((user, k))
    return uses


def shares_in_place_buffer(value: Instruction) -> bool:
    """Is `value`'s buffer written in place by some use, or an output of the entry, so that
    after copy insertion it must not be merged with another value?"""
    return value.opcode is Opcode.COPY or any(k < 0 or k in in_place_operands(user)
                                              for user, k in buffer_uses(value))


def buffer_definer(value: Instruction) -> Instruction:
    """The instruction whose buffer `value` is (through bitcasts and get-tuple-elements of
    tuples)."""
    while True:
        if value.opcode is Opcode.BITCAST and value.operands:
            value = value.operands[0]
        elif value.opcode is Opcode.GET_TUPLE_ELEMENT and value.operands[0].opcode is Opcode.TUPLE:
            value = value.operands[0].operands[value.tuple_index]
        else:
            return value


def leaf_definers(value: Instruction) -> list[Instruction]:
    """The definers of every array buffer `value` holds: a tuple's elements, each traced
    through bitcasts and get-tuple-elements of tuples (a loop's state is usually a tuple of
    buffers, each its own)."""
    found, pending = [], [value]
    while pending:
        definer = buffer_definer(pending.pop())
        if definer.opcode is Opcode.TUPLE:
            pending.extend(reversed(definer.operands))
        else:
            found.append(definer)
    return found


def loop_state_origin(definer: Instruction) -> Instruction:
    """The definer of the buffer a loop's state element starts in: a while's result shares its
    operand's buffer element by element (its body writes the state in place), so an element
    read from a loop is, buffer-wise, what was passed in, through any number of loops."""
    while True:
        if definer.opcode is Opcode.WHILE:
            definer = buffer_definer(definer.operands[0])
        elif definer.opcode is Opcode.GET_TUPLE_ELEMENT and definer.operands[0].opcode is Opcode.WHILE:
            state = buffer_definer(definer.operands[0].operands[0])
            if state.opcode is not Opcode.TUPLE:
                return definer
            definer = buffer_definer(state.operands[definer.tuple_index])
        else:
            return definer


def _read_only(definer: Instruction) -> bool:
    """Is `definer`'s buffer an entry parameter's or a constant's (never the program's to write
    or to hand out as an output)?"""
    return definer.opcode is Opcode.CONSTANT or (definer.opcode is Opcode.PARAMETER and definer.parent is not None
                                                 and definer.parent.is_entry)


SharingKey = tuple[str, int, str]
_READ_ONLY = "<read-only>"  # among a key's readers: the buffer is an entry parameter's or a constant's


def _readers(definer: Instruction) -> frozenset[str]:
    names = {f"{u.name}#{k}" for u, k in buffer_uses(definer)}
    if _read_only(definer):
        names.add(_READ_ONLY)
    return frozenset(names)


def in_place_sharing(module: "Module") -> dict[SharingKey, frozenset[str]]:
    """For every in-place use (user name, operand position, the name of the buffer's definer)
    outside fused computations (a fusion's in-place parameters count at the fusion), and for
    every entry output (position -1), the names of all the buffer's readers.  A rewrite that
    keeps each of its keys' reader sets within the original's (or uses a buffer that only
    that use reads) shares nothing copy insertion kept apart."""
    fused = module.fused_computations()
    sharing: dict[SharingKey, frozenset[str]] = {}
    for comp in module.computations:
        if comp in fused:
            continue
        for instr in comp.instructions:
            positions = set(in_place_operands(instr))
            if instr.is_root and comp.is_entry:
                for definer in leaf_definers(instr):
                    key = (f"{comp.name}/ROOT", -1, definer.name)
                    readers = _readers(definer)
                    if _read_only(loop_state_origin(definer)):  # an output a loop passed a parameter through to
                        readers |= {_READ_ONLY}
                    # two outputs with one definer: the key repeats; record it as shared
                    sharing[key] = readers | ({"<twice>"} if key in sharing else frozenset())
            for k in positions:
                for definer in leaf_definers(instr.operands[k]):
                    sharing[(instr.name, k, definer.name)] = _readers(definer)
    return sharing


def new_sharing(before: dict[SharingKey, frozenset[str]], after: dict[SharingKey, frozenset[str]],
                ) -> list[str]:
    """What `after` shares that `before` kept apart, described (empty when nothing): an
    in-place use whose buffer gained readers, or a new in-place use of a buffer something else
    also reads (or that is a parameter's or a constant's)."""
    problems = []
    for key, readers in after.items():
        user, k, definer = key
        old = before.get(key, frozenset())
        if k < 0:  # an output: reading it is harmless, sharing it with another output or an input is not
            if "<twice>" in readers - old:
                problems.append(f"{definer} is now returned twice by the entry")
            elif _READ_ONLY in readers - old:
                problems.append(f"{definer}'s buffer (an entry parameter's or a constant's, perhaps through a "
                                "loop's state) is now returned by the entry")
        elif key in before:
            if not readers <= old:
                problems.append(f"{definer} is written in place by {user} and now also read by "
                                f"{', '.join(sorted(readers - old))}")
        elif _READ_ONLY in readers:
            problems.append(f"{definer} (an entry parameter or a constant) is now written in place by {user}")
        elif len(readers) > 1:
            problems.append(f"{definer} is written in place by {user} and also read by "
                            f"{', '.join(sorted(r for r in readers if not r.startswith(user + '#')))}")
        # (a new in-place use of a buffer only it reads is a fresh buffer: nothing shared)
    return problems


__all__ = ["ALIASING", "buffer_definer", "buffer_uses", "in_place_operands", "in_place_sharing", "leaf_definers",
           "loop_state_origin", "new_sharing", "shares_in_place_buffer"]
