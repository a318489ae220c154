"""A module XLA already compiled (fused, laid out, scheduled), as a program XLA can compile again.

XLA prints modules at every stage of its pipeline: `.compile().as_text()` (fused, laid out,
scheduled), the `--xla_dump_to` files after layout assignment, the modules the jax_hook
receives.  Fed back to XLA as they are, they do not compile: the StableHLO import misreads
bitcasts and their layouts ("layout minor_to_major field contains 3 elements, but shape has 2
dimensions"), the CPU backend wants a backend config on every fusion, layout assignment refuses
bitcasts, and some CHECK-fail and abort the process ("Check failed: input_shape.has_layout()").

`make_fresh_program` rewrites such a module into the program it stands for, an unoptimized
module that computes the same values, so XLA can fuse, lay out and schedule it again:

* every fusion (kLoop, kInput, kOutput, kCustom such as `__ynn_fusion`) becomes a `call` of
  its fused computation, without kind and backend config (XLA inlines calls and fuses again);
* a bitcast becomes its logical equivalent, read from the layouts on both sides: a reshape
  when both are row-major, otherwise transpose into physical (major-to-minor) order → reshape →
  transpose out of it, plus a bitcast-convert when the element type changes;
* asynchronous pairs become the synchronous op: `all-reduce-start`/`-done` → `all-reduce`
  (likewise all-gather, collective-permute), `copy-start`/`copy-done` → `copy`,
  `async-start`/`async-update`/`async-done` → a `call` of the wrapped computation;
* then every layout is dropped (and `entry_computation_layout`, `is_scheduled`): with
  bitcasts gone a layout changes no value, and XLA lays the program out again.

    %b = f32[6,4]{1,0} bitcast(f32[4,6]{0,1} %x)     →  %b = f32[6,4] transpose(f32[4,6] %x), dimensions={1,0}
    %f = f32[8] fusion(%x), kind=kLoop, calls=%fc    →  %f = f32[8] call(%x), to_apply=%fc

What cannot be expressed this way (send/recv, tiled layouts, a bitcast between element types of
different widths, an async op whose start is read by anything but its done) raises
`NotRecompilable` naming the instruction; `verify` reports it as a VerificationError.
"""

from __future__ import annotations

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.printer import print_module


class NotRecompilable(ValueError):
    """The module holds something that has no equivalent in a fresh program."""


# The synchronous op of each asynchronous start (its done carries the result shape).
_ASYNC_PAIRS = {
    Opcode.ALL_REDUCE_START: (Opcode.ALL_REDUCE_DONE, Opcode.ALL_REDUCE),
    Opcode.ALL_GATHER_START: (Opcode.ALL_GATHER_DONE, Opcode.ALL_GATHER),
    Opcode.COLLECTIVE_PERMUTE_START: (Opcode.COLLECTIVE_PERMUTE_DONE, Opcode.COLLECTIVE_PERMUTE),
    Opcode.COPY_START: (Opcode.COPY_DONE, Opcode.COPY),
}
_REFUSED = {Opcode.SEND, Opcode.SEND_DONE, Opcode.RECV, Opcode.RECV_DONE}
# Attributes that only describe how XLA scheduled or emitted an op.
_EMITTER_ATTRS = ("backend_config", "cross_program_prefetch_index", "async_execution_thread")


def needs_fresh_program(module: Module) -> bool:
    """Is `module` past XLA's fusion, layout assignment or scheduling (so it must be rewritten
    before XLA compiles it again)?"""
    if module.header_attr("is_scheduled", False):
        return True
    for instr in module.all_instructions():
        if instr.opcode in (Opcode.FUSION, Opcode.BITCAST, Opcode.ASYNC_START) or instr.opcode in _ASYNC_PAIRS:
            return True
        if any(not _default_layout(leaf) for leaf in instr.shape.leaves()):
            return True
    return False


def make_fresh_program(module: Module) -> bool:
    """Rewrite `module` in place into a program XLA compiles from scratch (see the module
    docstring); return whether anything changed.  Raises NotRecompilable."""
    for instr in module.all_instructions():
        if instr.opcode in _REFUSED:
            raise NotRecompilable(f"{instr.name}: a {instr.opcode.value} cannot run in a recompiled program")
    changed = False
    for comp in module.computations:
        for instr in list(comp.instructions):
            if instr.parent is None:  # an async start already folded into its done
                continue
            if instr.opcode is Opcode.FUSION:
                _fusion_as_call(instr)
            elif instr.opcode is Opcode.BITCAST:
                _bitcast_as_logical(instr)
            elif instr.opcode in _ASYNC_PAIRS or instr.opcode is Opcode.ASYNC_START:
                _async_as_sync(instr)
            else:
                continue
            changed = True
    for instr in module.all_instructions():
        stripped = _without_layouts(instr.shape)
        if stripped != instr.shape:
            instr.shape = stripped
            changed = True
    for key in ("is_scheduled", "entry_computation_layout"):
        if key in module.attributes:
            del module.attributes[key]
            changed = True
    return changed


def as_fresh_program(text: str) -> str:
    """`make_fresh_program` on HLO text; the text itself when nothing needs rewriting."""
    module = parse_module(text, "<xla module>")
    if not needs_fresh_program(module):
        return text
    make_fresh_program(module)
    return print_module(module)


# ----------------------------------------------------------------- fusions --
def _fusion_as_call(fusion: Instruction) -> None:
    """A fusion computes what a call of its fused computation computes."""
    fusion.opcode = Opcode.CALL
    fusion.called = {"to_apply": fusion.called["calls"]}
    for key in ("kind", "output_to_operand_aliasing", *_EMITTER_ATTRS):
        fusion.remove_attr(key)


# ---------------------------------------------------------------- bitcasts --
def _bitcast_as_logical(bitcast: Instruction) -> None:
    """Replace a bitcast by the logical ops that move the same bytes (see `bitcast_plan`)."""
    operand = bitcast.operands[0]
    try:
        steps = bitcast_plan(operand.shape, bitcast.shape)
    except NotRecompilable as e:
        raise NotRecompilable(f"{bitcast.name}: {e}") from None
    b = Builder(bitcast.parent, before=bitcast, metadata=bitcast.attributes.get("metadata"))
    x = operand
    for kind, arg in steps:
        if kind == "transpose":
            x = b.transpose(x, arg)
        elif kind == "reshape":
            x = b.reshape(x, ArrayShape(x.shape.element_type, arg))
        else:  # bitcast-convert
            x = b.op(Opcode.BITCAST_CONVERT, ArrayShape(arg, x.shape.dims), [x])
    if x is operand:  # same logical shape and type: the bitcast only renamed the value
        x = b.op(Opcode.COPY, operand.shape, [operand])
    x.shape = _without_layouts(bitcast.shape)
    bitcast.parent.replace(bitcast, x)


def bitcast_plan(source: Shape, target: Shape) -> list[tuple[str, object]]:
    """The logical steps of `target bitcast(source)`: ("transpose", dimensions),
    ("reshape", dims), ("bitcast-convert", element type), identities left out.

    A bitcast reinterprets the buffer: the source's elements in physical order (major to
    minor by its layout) fill the target in its physical order.
    """
    if not (isinstance(source, ArrayShape) and isinstance(target, ArrayShape)):
        raise NotRecompilable("a bitcast of tuples has no logical equivalent")
    for shape in (source, target):
        if any(shape.dynamic) or any(shape.unbounded):
            raise NotRecompilable(f"a bitcast of the dynamic shape {shape.to_hlo()} has no logical equivalent")
        if shape.layout is not None and ("T(" in shape.layout.extras or "E(" in shape.layout.extras):
            raise NotRecompilable(f"a bitcast of the tiled layout {shape.to_hlo()} has no logical equivalent")
    if source.element_type.byte_size != target.element_type.byte_size or \
            source.element_count != target.element_count:
        raise NotRecompilable(f"bitcast from {source.to_hlo()} to {target.to_hlo()} changes the byte size "
                              "of its elements or their count")
    into = _major_to_minor(source)
    out_of = _major_to_minor(target)
    steps: list[tuple[str, object]] = []
    physical = tuple(source.dims[d] for d in into)
    if into != tuple(range(source.rank)):
        steps.append(("transpose", into))
    target_physical = tuple(target.dims[d] for d in out_of)
    if target_physical != physical:
        steps.append(("reshape", target_physical))
    if out_of != tuple(range(target.rank)):
        steps.append(("transpose", tuple(out_of.index(d) for d in range(target.rank))))
    if target.element_type is not source.element_type:
        steps.append(("bitcast-convert", target.element_type))
    return steps


def _major_to_minor(shape: ArrayShape) -> tuple[int, ...]:
    if shape.layout is None:
        return tuple(range(shape.rank))
    return tuple(reversed(shape.layout.minor_to_major))


def _default_layout(shape: ArrayShape) -> bool:
    return shape.layout is None or (shape.layout.minor_to_major == tuple(range(shape.rank - 1, -1, -1))
                                    and not shape.layout.extras)


def _without_layouts(shape: Shape) -> Shape:
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(_without_layouts(e) for e in shape.elements))
    return shape.without_layout() if shape.layout is not None else shape


# ------------------------------------------------------------------- async --
def _async_as_sync(start: Instruction) -> None:
    """`x-start` … `x-done` → `x` in place of the done (attributes and operands of the start)."""
    done_opcode, sync = _ASYNC_PAIRS.get(start.opcode, (Opcode.ASYNC_DONE, Opcode.CALL))
    chain, done = [start], start
    while True:
        users = list(done.users)
        if len(users) != 1 or users[0].opcode not in (done_opcode, Opcode.ASYNC_UPDATE):
            raise NotRecompilable(f"{done.name}: read by {', '.join(u.name for u in users) or 'nothing'}, "
                                  f"not only by its {done_opcode.value}")
        done = users[0]
        chain.append(done)
        if done.opcode is done_opcode:
            break
    attrs = {k: v for k, v in start.attributes.items() if k not in _EMITTER_ATTRS}
    called = dict(start.called)
    if start.opcode is Opcode.ASYNC_START:
        called = {"to_apply": start.called["calls"]}
    elif sync is Opcode.COPY:
        attrs = {k: v for k, v in attrs.items() if k == "metadata"}
    sync_op = Instruction(sync, done.shape, start.operands, name=done.name, attributes=attrs, called=called)
    comp = start.parent
    for instr in reversed(chain):  # each is unused once the one after it is gone
        comp.replace(instr, sync_op)
    names = comp.module.names if comp.module is not None else None
    if names is not None and sync_op.name != done.name:  # the result keeps the done's name
        names.release(sync_op.name)
        if names.reserve(done.name):
            sync_op.name = done.name
        else:
            names.reserve(sync_op.name)
