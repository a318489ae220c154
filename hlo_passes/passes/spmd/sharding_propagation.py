"""sharding-propagation: give instructions shardings, starting from the user's, as GSPMD does.

JAX annotates parameters, `with_sharding_constraint`s (custom-call "Sharding"), results and
shard_map boundaries; the SPMD partitioner needs the rest.  This pass follows XLA's
ShardingPropagation so that what we partition is what `jax.jit` partitions:

    %a = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
    %b = f32[8,4] parameter(1), sharding={replicated}
    %d = f32[16,4] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    %t = f32[4,16] transpose(%d), dimensions={1,0}
  becomes
    %d = ... dot(...), ..., sharding={devices=[4,1]<=[4]}
    %t = ... transpose(%d), ..., sharding={devices=[1,4]<=[4]}

The algorithm (XLA's, in our words):

1. Annotations.  A `Sharding` custom-call gives its sharding to an unsharded operand (which
   is then fixed too); one with `unspecified_dims` only fixes the other dims.  `shard_as N` /
   `shard_like N` put values in groups; `ShardBarrierFrom/To` custom-calls stop propagation
   forward / backward and disappear afterwards.  Shardings present in the input are fixed
   ("provided"); so are the entry parameters and root unless the module allows propagation
   to them.
2. Four rounds of growing aggressiveness (0: only pass-through ops such as elementwise,
   reshape, transpose, tuple, while; 1: every op, and compatible partial shardings merge;
   2: broadcasts backward; 3: broadcasts forward).  Each round repeats, per computation
   (callees first), shard groups → forward in post order → backward in reverse post order,
   until nothing changes (XLA's post order, and a value's users in its order: see
   xla_post_order).  A value only takes a sharding that improves on its current one
   (propagation_rules.PropagationContext.improve): more tiles, compatible with what it has.
   A while, its body parameter and root and its condition parameter share one sharding; so do
   a conditional and its branch roots, a call and its body root.
3. `shard_as` groups settle on one common sharding, a last round runs at level 3, barriers go.
4. Entry parameters and root leaves that propagation may not change get back their input
   sharding (or none); those it may change become replicated when their sharding does not
   divide their shape evenly (XLA's divisibility rule).

What stays without a sharding keeps none (the partitioner replicates it), as in XLA.

Entry parameters and the root receive propagated shardings only when the module allows it:
by the pass options, else by the module's `allow_spmd_sharding_propagation_to_parameters` /
`_to_output` header values (one value for all, or one per parameter / root tuple element);
without them, not (XLA's default).  A JAX `.lower().as_text()` module does not record what
JAX passes to the compiler: give `propagate-to-parameters` / `propagate-to-output` then.

Where we differ from XLA on purpose: the `Sharding` custom-calls stay custom-calls (option
`keep-sharding-custom-calls`; XLA turns them into copies), an annotation on an op XLA's import
drops or rewrites stays (XLA loses it with the op), and XLA's CSE-prevention mode is not
offered; propagation_rules.wide_window_dims and the partially manual refinement say why they
differ where they do.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from dataclasses import dataclass, replace
from typing import Callable, Collection, Iterable, Literal, NamedTuple, Sequence, cast

import numpy as np

from hlo_passes._gc import collector_paused
from hlo_passes.ir.attributes import Attr
from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape, leaf_range
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind
from hlo_passes.passes.spmd.call_sites import CallSiteCopies
from hlo_passes.passes.manager import PassFailed
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.partition_context import pair_on_other_tiles, root_of
from hlo_passes.passes.spmd.tile_map import TileMap
from hlo_passes.passes.spmd.propagation_rules import (BARRIER_FROM, BARRIER_TO, FULL_TO_SHARD, SHARD_TO_FULL,
                                                      SHARDING, forward_rule, has_side_effect, is_custom_call,
                                                      propagation_level, supports_spatial_partitioning, user_rule)
from hlo_passes.parse.shardy_import import SDY_PREFIX, import_shardy

_CONTROL_FLOW = (Opcode.WHILE, Opcode.CALL, Opcode.CONDITIONAL)
_LOOKAHEAD_LEVEL = 1 << 62  # XLA looks ahead at "every op passes" (INT64_MAX)
_ANY_LEVEL = 1 << 62  # the top of a range of levels with no upper bound
_LEVELS = 4  # the rounds' levels: 0 to 3
# An evaluation that changed nothing (see _Walk._evaluate), as one int (there is one per
# instruction and direction): the clock's tick when it ran (_State), shifted left by _LEVELS over
# the mask of the levels at which it would run alike (bit L for level L).  Nearly every
# evaluation (97% on a transformer step) reads exactly the instruction and its neighbours in its
# direction (its operands, or its users) and nothing else: the int is all its entry needs, the
# graph giving the neighbours.  One that read others is a _Reads.
_Settled = int


class _Reads(tuple[_Settled, *tuple[Instruction, ...]]):
    """The settled entry of an evaluation that read other than its neighbourhood: its tick and
    levels (as a neighbourhood entry's int), then the instructions whose shardings it read."""

    __slots__ = ()


# What an evaluation that changed something leaves in place of its settled entry: no level.
# Overwritten rather than removed, because a dict that entries keep leaving and coming back to
# grows to twice the size of one that keeps them (the two tables were 5% of the walk).
_UNSETTLED: _Settled = 0
# The tick of a sharding that has not changed since the walk began (see _State.changed), for as
# many instructions as a `map` over them asks.
_NEVER = itertools.repeat(0)
# The neighbours `_from_operands` and `_from_users` read (see _Settled), as a settled entry needs
# them: the order does not matter there, so the users unsorted (`_Walk._users` sorts).
_OPERANDS = operator.attrgetter("operands")
_USERS = operator.attrgetter("users")


class _State(dict[Instruction, Sharding]):
    """The walk's shardings, with a clock that ticks whenever one changes: `changed[instr]` is the
    tick of `instr`'s last change (none: not since the walk began).  An evaluation whose reads
    all last changed no later than its tick would read the very objects it read then (a write of
    the object already held is no change), which is all its settled entry needs (see
    _Walk._evaluate): comparing ticks spares keeping, and comparing, the shardings it read."""

    __slots__ = ("clock", "changed")

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0
        self.changed: dict[Instruction, int] = {}

    def __setitem__(self, instr: Instruction, s: Sharding) -> None:
        if self.get(instr) is not s:
            self._tick(instr)
        super().__setitem__(instr, s)

    def pop(self, instr: Instruction, default: Sharding | None = None) -> Sharding | None:  # type: ignore[override]
        if instr in self:
            self._tick(instr)
        return super().pop(instr, default)

    def _tick(self, instr: Instruction) -> None:
        self.clock += 1
        self.changed[instr] = self.clock


class PropagationError(PassFailed):
    """An input propagation cannot work on (the message names the instruction): a bad
    annotation, or annotations that disagree with the device count.  The command line reports
    it as an input error (`error: FILE: ...`, exit 2), never with a traceback."""

    def __init__(self, message: str):
        super().__init__("input", message)


def _written_by_shardy(module: Module) -> bool:
    """Are the module's shardings in the named-mesh form (`{mesh['x'=4], [{'x'}, {}]}`)?
    XLA prints that form for a program JAX lowered for Shardy, which XLA's Shardy pipeline
    propagates: Shardy's rules apply (its conflicts, top-k, grouped convolutions, uneven
    outputs), as for the Shardy custom-calls and attributes `import_shardy` reads."""
    for instr in module.all_instructions():
        s = instr.sharding
        if s is not None and any(e.named_mesh for e in (s.elements if s.is_tuple else (s,))):
            return True
    return False


@register_pass
class ShardingPropagation(ModulePass):
    """See the module docstring."""

    name = "sharding-propagation"
    summary = "Give instructions shardings, propagated from the user's annotations as GSPMD does"

    @dataclass(frozen=True)
    class Options:
        propagate_to_parameters: bool | None = option(
            None, "entry parameters without a sharding may receive one (default: the module's "
                  "allow_spmd_sharding_propagation_to_parameters, else no)")
        propagate_to_output: bool | None = option(
            None, "the entry root may receive a sharding (default: the module's "
                  "allow_spmd_sharding_propagation_to_output, else no)")
        keep_sharding_custom_calls: bool = option(
            True, "keep custom-call \"Sharding\" annotations (else they become copies, as XLA does)")
        propagate_metadata: bool = option(
            False, "propagated shardings carry the op metadata of the sharding they came from "
                   "(XLA's propagate_metadata)")
        num_partitions: int = option(
            0, "the device count every annotation must use (0: the module's num_partitions, else the "
               "largest annotation's)")

    def run(self, module: Module) -> bool:
        changed = import_shardy(module)
        shardy_form = changed or _written_by_shardy(module)
        if changed:
            self.remark(None, "rewrote Shardy attributes to HLO shardings", "applied")
        if module.entry is None:
            return changed
        refuse_unusable_shardings(module)
        _refuse_exploding_inlining(module)
        _check_device_count(module, self.options.num_partitions or module.num_partitions)
        changed |= _detach_shard_alike(module)
        sites = CallSiteCopies.flatten(module)
        with collector_paused():  # the walk makes many small objects and no cycles but the copy
            flat = _Flat(module)
            walk = _Walk(flat.module, self._allowed(module, "parameters"), self._allowed(module, "output"), self,
                         shardy_form=shardy_form)
            state = walk.run()
            boundary = walk.output_boundary
            del walk  # its tables and caches (most of its memory) freed before the shardings are written
            changed |= flat.transfer(state, self)
            if boundary is not None:
                changed |= _output_boundary(module, boundary, self)
            if flat.module is not module:
                flat.module.discard()  # the copy's cycles broken: freed with the walk, not left to the collector
        for body, extra in sites.merge_back():
            changed = True
            self.remark(None, f"{body.name}: its call sites disagree on its shardings; {extra + 1} bodies, one per "
                              "sharding (as XLA, which inlines every call)", "applied")
        changed |= _remove_barriers(module)
        if not self.options.keep_sharding_custom_calls:
            changed |= _sharding_calls_to_copies(module)
        return changed

    def _allowed(self, module: Module, what: str) -> list[bool]:
        """XLA's allow_spmd_sharding_propagation_to_{what} vector: one flag for all, or one per
        entry parameter / root tuple element."""
        flag = self.options.propagate_to_parameters if what == "parameters" else self.options.propagate_to_output
        if flag is not None:
            return [bool(flag)]
        values = module.header_attr(f"allow_spmd_sharding_propagation_to_{what}")
        if values is None:
            return [False]
        values = [bool(v) for v in (values if isinstance(values, (tuple, list)) else [values])]
        return values or [False]


def is_fully_sharded(module: Module) -> bool:
    """Every instruction of every computation the partitioner walks has a sharding, and no
    Shardy-only annotation is left."""
    for comp in propagated_computations(module):
        for instr in comp.instructions:
            if instr.sharding is None or instr.sharding.kind is ShardingKind.UNKNOWN:
                return False
            if (instr.custom_call_target or "").startswith(SDY_PREFIX):
                return False
    return True


# Propagation sees the module with every call inlined, as XLA's does; a module whose calls
# fan out (a body calling its callee twice, thirty levels deep) would inline to billions.
MAX_INLINED_INSTRUCTIONS = 2_000_000


def _refuse_exploding_inlining(module: Module) -> None:
    """An input error, before anything is copied, when inlining every call would make more
    than MAX_INLINED_INSTRUCTIONS (sizes counted per computation, callees first: linear)."""
    inlined: dict[int, int] = {}
    for comp in propagated_computations(module):  # callees first
        inlined[id(comp)] = sum(inlined.get(id(i.called["to_apply"]), 1) if i.opcode is Opcode.CALL else 1
                                for i in comp.instructions)
    total = sum(inlined.values())
    if total > MAX_INLINED_INSTRUCTIONS:
        raise PropagationError(f"inlining every call (as XLA does before propagating shardings) would make "
                               f"{total:,} instructions (limit {MAX_INLINED_INSTRUCTIONS:,}): its calls fan out; "
                               "call each body from fewer sites")


def propagated_computations(module: Module) -> list[Computation]:
    """The entry and, transitively, the bodies of while / call / conditional (callees first)."""
    keep = module.reachable_computations(through=lambda instr: instr.opcode in _CONTROL_FLOW)
    return [c for c in module.computation_post_order() if id(c) in keep]


def xla_post_order(comp: Computation) -> list[Instruction]:
    """The order XLA's MakeInstructionPostOrder visits `comp` in, which decides which of two
    competing shardings reaches a value first: depth first from each instruction no one uses
    (the root, unused parameters and side effects), in stored order, operands in order and
    control predecessors before them.  (Computation.post_order starts from every instruction
    in stored order instead: a value defined early but read late comes first there.)"""
    order: list[Instruction] = []
    state: dict[Instruction, int] = {}
    for start in comp.instructions:
        if start.users or start in state:
            continue
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                if state.get(node) != 2:
                    state[node] = 2
                    order.append(node)
                continue
            if state.get(node):
                continue
            state[node] = 1
            stack.append((node, True))
            for op in reversed(node.operands):
                if op.parent is comp and not state.get(op):
                    stack.append((op, False))
            for op in node.control_predecessors or ():
                if op.parent is comp and not state.get(op):
                    stack.append((op, False))
    if len(order) != len(comp.instructions):  # a cycle through control edges: keep every instruction
        order += [i for i in comp.post_order() if i not in state]
    return order


_UNSPECIFIED = re.compile(r"unspecified_dims\s*=\s*\[([^\]]*)\]")


def unspecified_dims(instr: Instruction) -> list[int] | None:
    """The dims a `Sharding` / manual-conversion custom-call leaves to propagation
    (`backend_config="unspecified_dims=[0,2]"`), sorted; None when it names none."""
    config = instr.attr("backend_config")
    if not isinstance(config, str):
        return None
    m = _UNSPECIFIED.search(config)
    if m is None:
        return None
    dims = sorted(int(x) for x in m.group(1).replace(" ", "").split(",") if x)
    return dims or None


class _Flat:
    """The module as XLA's pipeline hands it to propagation: calls inlined (CallInliner), every
    conditional returning a tuple (ConditionalCanonicalizer) and taking its branch operands in
    tuples, and the rewrites XLA's import of HLO text makes (see _fold_tuples, _single_result,
    _import_rewrites).  All change where shardings flow: a call body's values belong to its
    caller's graph (propagation reaches them in the caller's order and crosses the call both
    ways), and a branch's result is linked to the conditional only through the tuple wrapping
    it.

    The walk runs on a copy so built; `transfer` writes its shardings back onto the module,
    which keeps its calls: a call takes its inlined result's sharding, a call body's
    parameter its argument's, and a body inlined at several call sites the first site's (a
    remark names bodies whose sites disagree)."""

    def __init__(self, module: Module):
        self.original = module
        # The instructions of the module's propagated computations in the order `transfer` visits
        # them, and beside each its instructions in the walk: the one itself (most), a tuple of
        # several (a body inlined at several sites; a 1-tuple each was 3% of the walk's peak on
        # gpt96), or () for none.  Two lists rather than a dict from the one to the other: 16
        # bytes an instruction where the dict took about 60, and it is alive through the walk
        # (1.2 MiB of spmd-partition's peak on the 24-layer GPT step).  The walk changes only
        # the copy, so the module's instructions and their order are the same at `transfer`.
        self.originals: list[Instruction] = []
        self.copies: list[Instruction | tuple[Instruction, ...]] = []
        # Tuples the import removes as dead once their elements are read directly (an inlined
        # call's ROOT tuple, typically): the call and its callee's ROOT take the tuple of
        # their elements' shardings, as they would were the tuple still there.
        self.dead_tuples: dict[Instruction, list[Instruction]] = {}
        # Elements read from an inlined call's result: XLA's CallInliner leaves them reading the
        # callee's ROOT tuple (the import folded tuples before; nothing folds these).
        self.call_results: set[Instruction] = set()
        comps = propagated_computations(module)
        needed = any(_reshaped_by_import(i) for c in comps for i in c.instructions)
        if not needed:
            self.module = module
            return
        self.module = module.clone()
        # A clone keeps the order of computations and of their instructions.
        self.origin: dict[Instruction, Instruction] = {
            i: o for c, copy in zip(module.computations, self.module.computations)
            for o, i in zip(c.instructions, copy.instructions)}
        self.replaced: dict[Instruction, Instruction] = {}
        # Originals an instruction of the walk also stands for: an inlined callee's ROOT stands
        # for the call it replaced, and keeps standing for it when the computation holding it
        # is inlined in turn (callees are inlined first).
        self.aliases: dict[Instruction, list[Instruction]] = {}
        values: dict[Instruction, list[Instruction]] = {}
        for comp in propagated_computations(self.module):
            self._inline_calls(comp, values)
        for comp in propagated_computations(self.module):
            self._canonicalize_conditionals(comp)
            self._import_rewrites(comp, values)
        for comp in propagated_computations(self.module):
            self._fold_tuples(comp, values)
            if comp is self.module.entry:
                self._single_result(comp, values)
            self._tuple_root(comp)
        # The bodies of the inlined calls are called no more: freed now rather than walked past
        # (on a step whose calls the flattening copied per site, a third of the copy's instructions).
        for comp in self.module.remove_unreachable_computations():
            comp.discard()
        for flat_instr, orig in self.origin.items():
            if flat_instr.parent is not None and flat_instr.parent.module is self.module:
                values.setdefault(orig, []).append(flat_instr)
        for flat_instr, origs in self.aliases.items():
            for orig in origs:
                values.setdefault(orig, []).append(flat_instr)
        for comp in comps:
            for orig in comp.instructions:
                vs = values.get(orig, ())
                live = tuple(r for r in (self._resolve(v) for v in vs) if r.parent is not None or r in self.dead_tuples)
                self.originals.append(orig)
                self.copies.append(live if len(live) != 1 else live[0])
        # Tables of the building only: freed before the walk, whose tables come on top of these.
        self.origin.clear()
        self.aliases.clear()

    def _resolve(self, instr: Instruction) -> Instruction:
        while instr in self.replaced:
            instr = self.replaced[instr]
        return instr

    def _inline_calls(self, comp: Computation, values: dict[Instruction, list[Instruction]]) -> None:
        work = [i for i in comp.post_order() if i.opcode is Opcode.CALL]
        while work:
            call = work.pop(0)
            callee = call.called_computations()[0]
            mapping: dict[Instruction, Instruction] = {}
            for instr in callee.post_order():
                if instr.opcode is Opcode.PARAMETER:
                    assert instr.parameter_number is not None
                    value = call.operands[instr.parameter_number]
                    mapping[instr] = value
                    if instr in self.origin:
                        values.setdefault(self.origin[instr], []).append(value)
                    continue
                copy = Instruction(instr.opcode, instr.shape, [mapping[o] for o in instr.operands], name=instr.name,
                                   attributes=instr.shared_attributes(), called=dict(instr.called),
                                   literal=instr.literal)
                comp.add(copy, name_hint=instr.name, before=call)
                if instr in self.origin:
                    self.origin[copy] = self.origin[instr]
                if instr in self.aliases:
                    self.aliases[copy] = list(self.aliases[instr])
                mapping[instr] = copy
                if copy.opcode is Opcode.CALL:
                    work.append(copy)
            root = mapping[root_of(callee)]
            if "sharding" in call.attributes and "sharding" not in root.attributes:
                root.sharding = call.sharding  # XLA's ReplaceInstruction keeps the old sharding
            stands_for = ([self.origin.pop(call)] if call in self.origin else []) + self.aliases.pop(call, [])
            if stands_for:
                self.aliases.setdefault(root, []).extend(stands_for)
            self.replaced[call] = root
            was_root = comp.root is call
            self.call_results.update(u for u in call.users if u.opcode is Opcode.GET_TUPLE_ELEMENT)
            call.replace_all_uses_with(root)
            if was_root:
                comp.root = root
            # Control edges order nothing shardings depend on: the call's are dropped with it
            # (from both ends: `remove` drops its predecessors' edges to it).
            for succ in list(call.control_successors or ()):
                cast("list[Instruction]", succ.control_predecessors).remove(call)  # both hold the edge: lists
                cast("list[Instruction]", call.control_successors).remove(succ)
            comp.remove(call)

    def _fold_tuples(self, comp: Computation, values: dict[Instruction, list[Instruction]]) -> None:
        """What the HLO -> StableHLO -> HLO import that XLA's compile of HLO text goes through
        does to tuples: an element read from a tuple built in the same computation is the
        element itself, and values nothing uses disappear (with their annotations)."""
        for instr in comp.post_order():
            if (instr.opcode is Opcode.GET_TUPLE_ELEMENT and instr.operands[0].opcode is Opcode.TUPLE
                    and instr.parent is comp and instr not in self.call_results):
                value = instr.operands[0].operands[instr.attr("index")]
                was_root = comp.root is instr
                if was_root and comp.is_entry and "sharding" in instr.attributes:
                    # The entry's result sharding is the function's result attribute in the
                    # import, not the folded op's: it stays, on the value now returned (one
                    # annotated with a sharding of its own, or a parameter, keeps the read).
                    if "sharding" in value.attributes or value.opcode is Opcode.PARAMETER:
                        continue
                    value.sharding = instr.sharding
                instr.replace_all_uses_with(value)
                if was_root:
                    comp.root = value
                self.replaced[instr] = value
                orig = self.origin.pop(instr, None)
                if orig is not None:
                    values.setdefault(orig, []).append(instr)
        dead = True
        while dead:
            dead = False
            for instr in list(comp.instructions):
                if (instr.users or comp.root is instr or instr.opcode is Opcode.PARAMETER or instr.has_side_effect
                        or instr.control_successors):
                    continue
                self.origin.pop(instr, None)
                if instr.opcode is Opcode.TUPLE:
                    self.dead_tuples[instr] = list(instr.operands)
                comp.remove(instr)
                dead = True

    def _single_result(self, comp: Computation, values: dict[Instruction, list[Instruction]]) -> None:
        """The import returns an entry whose result is an unannotated one-element tuple as the
        element itself (a function of one result): the element is then the root, which
        propagation may only shard as the output flag allows.  (An annotated one keeps a root
        of its own that holds the annotation.)"""
        root = root_of(comp)
        if root.opcode is not Opcode.TUPLE or len(root.operands) != 1 or "sharding" in root.attributes:
            return
        comp.root = root.operands[0]
        orig = self.origin.pop(root, None)
        if orig is not None:
            values.setdefault(orig, []).append(root)
        self.dead_tuples[root] = list(root.operands)
        comp.remove(root)

    def _tuple_root(self, comp: Computation) -> None:
        """The import also returns a tuple-shaped result as a `tuple` of its elements: the op
        that made the value is then an ordinary instruction that may take a sharding, and the
        computation's result is the new tuple (whose sharding the original root gets back)."""
        root = root_of(comp)
        if not isinstance(root.shape, TupleShape) or root.opcode is Opcode.TUPLE:
            return
        b = Builder(comp)
        parts = [b.get_tuple_element(root, i) for i in range(len(root.shape.elements))]
        comp.root = b.tuple(parts)
        orig = self.origin.pop(root, None)
        if orig is not None:
            self.origin[comp.root] = orig
            if "sharding" in root.attributes:
                comp.root.sharding = root.sharding

    def _canonicalize_conditionals(self, comp: Computation) -> None:
        for instr in list(comp.instructions):
            if instr.opcode is Opcode.CONDITIONAL:
                self._tuple_branch_operands(instr)
            if instr.opcode is not Opcode.CONDITIONAL or instr.shape.is_tuple:
                continue
            for branch in instr.called_computations():
                branch.root = Builder(branch).tuple([root_of(branch)])
            users = list(instr.users)
            was_root = comp.root is instr
            shape = instr.shape
            instr.shape = TupleShape((shape,))
            gte = Builder(comp).get_tuple_element(instr, 0)
            for user in users:
                user.replace_operand(instr, gte)
            if was_root:
                comp.root = gte
            s = instr.sharding if "sharding" in instr.attributes else None
            if s is not None and s.kind is not ShardingKind.TUPLE:
                gte.sharding = s
                if s.kind is ShardingKind.UNKNOWN:  # only a shard group: the element joins it
                    del instr.attributes["sharding"]
                else:
                    instr.sharding = su.single(instr.shape, _without_group(s))  # the group is the element's
            orig = self.origin.pop(instr, None)
            if orig is not None:
                self.origin[gte] = orig

    def _import_rewrites(self, comp: Computation, values: dict[Instruction, list[Instruction]]) -> None:
        """Ops the import (its MLIR canonicalization) drops or writes in another form, which
        propagation treats otherwise: an identity transpose and a reverse of size-1 dims go
        (their users read the operand, and they take its sharding back; an annotated one stays,
        as the user's annotation must); a broadcast of a broadcast is one broadcast of the
        inner operand; a transpose that keeps
        the order of the dims longer than 1 is a reshape; a dynamic-slice at constant offsets is
        a slice (offsets clamped)."""
        for instr in list(comp.instructions):
            b = Builder(comp, before=instr)
            if _is_no_op(instr) and comp.root is not instr and "sharding" not in instr.attributes:
                instr.replace_all_uses_with(instr.operands[0])
                self.replaced[instr] = instr.operands[0]
                orig = self.origin.pop(instr, None)
                if orig is not None:
                    values.setdefault(orig, []).append(instr)
                comp.remove(instr)
                continue
            if instr.opcode is Opcode.TRANSPOSE and _moves_only_unit_dims(instr):
                new = b.reshape(instr.operands[0], instr.array_shape)
            elif instr.opcode is Opcode.BROADCAST and instr.operands[0].opcode is Opcode.BROADCAST:
                inner = instr.operands[0]
                new = b.broadcast(inner.operands[0], instr.array_shape,
                                  [instr.dimensions[d] for d in inner.dimensions])
            elif instr.opcode is Opcode.DYNAMIC_SLICE and (starts := _constant_offsets(instr)) is not None:
                new = b.slice(instr.operands[0], starts, [st + d for st, d in zip(starts, instr.array_shape.dims)])
            else:
                continue
            if "sharding" in instr.attributes:
                new.sharding = instr.sharding
            comp.replace(instr, new)
            self.replaced[instr] = new
            orig = self.origin.pop(instr, None)
            if orig is not None:
                self.origin[new] = orig

    def _tuple_branch_operands(self, cond: Instruction) -> None:
        """The import passes each branch the values it reads as one tuple (a branch region
        captures them; the export gathers them into a tuple operand and a tuple parameter): an
        array operand is wrapped in a tuple of its own, and the branch reads it back with a
        get-tuple-element.  The tuple is an ordinary user of the operand, so the operand takes
        the sharding the conditional gives that tuple (when shapes allow, its own)."""
        comp = cond.parent
        assert comp is not None
        for i, branch in enumerate(cond.called_computations()):
            operand = cond.operands[i + 1]
            if operand.shape.is_tuple:
                continue
            cond.set_operand(i + 1, Builder(comp, before=cond).tuple([operand]))
            param = branch.parameters[0]
            users = list(param.users)
            was_root = branch.root is param
            param.shape = TupleShape((param.shape,))
            element = Builder(branch).get_tuple_element(param, 0)
            for user in users:
                user.replace_operand(param, element)
            if was_root:
                branch.root = element
            orig = self.origin.pop(param, None)
            if orig is not None:
                self.origin[element] = orig
            s = param.sharding if "sharding" in param.attributes else None
            if s is not None and s.kind is not ShardingKind.TUPLE:
                element.sharding = s
                param.sharding = su.single(param.shape, _without_group(s))

    def transfer(self, state: dict[Instruction, Sharding], owner: ModulePass) -> bool:
        """Write the walk's shardings onto the module (see the class docstring).  Instructions
        given the same sharding object share one attribute slot (slots are immutable values):
        a big module's twenty thousand shardings are a few hundred objects, and a slot each
        was 7% of the memory the module holds."""
        changed = False
        slots: dict[int, Attr] = {}  # by id of the sharding: objects, not equal values (metadata differs)
        pairs: Iterable[tuple[Instruction, Instruction | tuple[Instruction, ...]]] = (
            zip(self.originals, self.copies) if self.module is not self.original else
            ((instr, instr) for comp in propagated_computations(self.original) for instr in comp.instructions))
        for instr, twins in pairs:
            if type(twins) is not tuple:
                twins = (cast(Instruction, twins),)
            elif not twins:
                continue
            found = [f for f in (self._state_of(t, state) for t in twins) if f is not None]
            new = found[0] if found else None
            if any(f != new for f in found[1:]):
                owner.remark(instr, "inlined at several call sites that disagree on its sharding: "
                                    "the first site's is kept", "missed")
            if new is not None and instr.shape.is_tuple != (new.kind is ShardingKind.TUPLE):
                new = su.single(instr.shape, new) if instr.shape.is_tuple else None
            old = instr.sharding if "sharding" in instr.attributes else None
            if new is None:
                if old is not None:
                    instr.sharding = None
                    changed = True
                continue
            if old is not None and old.kind is not ShardingKind.UNKNOWN and old.shard_group is None and (
                    su.canon(old) == new or (instr.shape.is_tuple and old.kind is not ShardingKind.TUPLE
                                             and su.single(instr.shape, su.canon(old)) == new)) and (
                    not owner.options.propagate_metadata or _metadata_of(old) == _metadata_of(new)):
                continue
            slot = slots.get(id(new))
            if slot is None:
                slot = slots[id(new)] = Attr(value=new)
            instr.set_attr_slot("sharding", slot)
            changed = True
        return changed


    def _state_of(self, instr: Instruction, state: dict[Instruction, Sharding]) -> Sharding | None:
        """The walk's sharding of `instr`, or for a tuple the import removed, the tuple of its
        elements' shardings (None unless every element has one)."""
        if instr in state:
            return state[instr]
        elements = self.dead_tuples.get(instr)
        if elements is None:
            return None
        leaves: list[Sharding] = []
        for e in elements:
            s = self._state_of(self._resolve(e), state)
            if s is None:
                return None
            leaves.extend(su.leaves_of(s, e.shape))
        return su.tuple_sharding(leaves)


class _Walk:
    """One run of the algorithm (see the module docstring); implements PropagationContext."""

    def __init__(self, module: Module, params_allowed: list[bool], output_allowed: list[bool], owner: ModulePass,
                 *, shardy_form: bool = False):
        self.module = module
        self.owner = owner
        assert module.entry is not None, "propagation walks a module with an entry computation"
        self.entry = module.entry
        self.comps = propagated_computations(module)
        self.params_allowed = params_allowed
        self.output_allowed = output_allowed
        self.allow_params = any(params_allowed)
        self.allow_output = any(output_allowed)
        # JAX's Shardy form: the rules follow Shardy's where they differ from XLA's GSPMD ones
        # (conflicting proposals, sort, top-k, grouped convolutions, uneven outputs)
        self.shardy_form = shardy_form
        # Shardy form: the output's even sharding, applied at a boundary after the root (the
        # root keeps its own) rather than to the root (`_output_boundary`)
        self.output_boundary: Sharding | None = None
        self.propagate_metadata = owner.options.propagate_metadata
        self.state = _State()
        self.provided: set[Instruction] = set()
        self.unspecified: dict[Instruction, list[int]] = {}
        self.group_of: dict[Instruction, tuple[str, int]] = {}
        self.groups: dict[tuple[str, int], list[Instruction]] = {}
        self.caller: dict[Computation | None, Instruction] = {}  # (a parentless instruction has no caller)
        self.level = 0  # the round's aggressiveness (rules read `aggressiveness`)
        self._forced_level: int | None = None  # what rules see instead, during a lookahead
        self._overlay: dict[Instruction, Sharding] | None = None
        self._remarked: set[tuple[str, str]] = set()
        self._operand_indices: dict[Instruction, dict[Instruction, list[int]]] = {}
        self.orders: dict[Computation, list[Instruction]] = {}  # each computation's post order
        self.position: dict[Instruction, int] = {}  # the place in XLA's post order (see `_users`)
        self._ordered_users: dict[Instruction, tuple[Instruction, ...]] = {}  # see `_users`
        # What the graph alone decides, per instruction, kept for the walk (the graph is fixed):
        # see _GraphFacts; and the manual conversions.
        self._facts: dict[Instruction, _GraphFacts] = {}
        self._conversions: set[Instruction] = set()
        # Evaluations that changed nothing, with what they read (see `_evaluate`); and, while an
        # evaluation runs, what it has read so far and the levels it would answer alike at.
        self._settled_ops: dict[Instruction, _Settled | _Reads] = {}
        self._settled_users: dict[Instruction, _Settled | _Reads] = {}
        self._reads: set[Instruction] | None = None
        self._levels_alike = (0, _ANY_LEVEL)
        self._wrote = False

    # ------------------------------------------------------ context (rules) --
    # Every read of a sharding and of the level goes through these, so that an evaluation's
    # inputs are known (see `_evaluate`).
    @property
    def aggressiveness(self) -> int:
        if self._forced_level is not None:
            return self._forced_level
        if self._reads is not None:  # a rule compares the level itself: it may answer otherwise at any other
            self._levels_alike = (self.level, self.level)
        return self.level

    def _at_least(self, level: int) -> bool:
        """Is the round's level at least `level` (noted for the evaluation running)?"""
        if self._forced_level is not None:
            return self._forced_level >= level
        yes = self.level >= level
        if self._reads is not None:
            lo, hi = self._levels_alike
            if yes:
                if level > lo:
                    self._levels_alike = (level, hi)
            elif level <= hi:
                self._levels_alike = (lo, level - 1)
        return yes

    @property
    def may_combine(self) -> bool:
        return self._at_least(1)

    def sharding(self, instr: Instruction) -> Sharding | None:
        if self._overlay is not None and instr in self._overlay:
            return self._overlay[instr]
        reads = self._reads
        if reads is not None and instr not in reads:
            reads.add(instr)
        return self.state.get(instr)

    def set_sharding(self, instr: Instruction, s: Sharding) -> None:
        if instr.shape.is_tuple and s.kind is not ShardingKind.TUPLE:
            s = su.single(instr.shape, s)
        if self._overlay is not None:
            self._overlay[instr] = s
        else:
            self.state[instr] = s
            self._wrote = True

    def clear_sharding(self, instr: Instruction) -> None:
        self.state.pop(instr, None)
        self._wrote = True

    def non_root_users(self, instr: Instruction) -> int:
        parent = instr.parent
        assert parent is not None
        root = parent.root
        return sum(1 for u in instr.users if u is not root)

    def remark(self, instr: Instruction, message: str) -> None:
        key = (instr.name, message)
        if key not in self._remarked:
            self._remarked.add(key)
            self.owner.remark(instr, message, "note")

    def caller_of(self, instr: Instruction) -> Instruction | None:
        return self.caller.get(instr.parent)

    def operand_indices(self, user: Instruction, operand: Instruction) -> list[int]:
        """The operand positions at which `user` reads `operand`, ascending.  Kept per user (the
        graph does not change during the walk): a big step's root tuple has thousands of
        operands, each of which asks it once per sweep."""
        table = self._operand_indices.get(user)
        if table is None:
            table = self._operand_indices[user] = {}
            for i, o in enumerate(user.operands):
                table.setdefault(o, []).append(i)
        return table[operand]

    def improved(self, s: Sharding, instr: Instruction, *, aggressive: bool = False) -> Sharding | None:
        if instr.shape.is_tuple and s.kind is not ShardingKind.TUPLE:
            s = su.single(instr.shape, s)
        elif not instr.shape.is_tuple and s.kind is ShardingKind.TUPLE:
            return None
        return self._improved(s, self.sharding(instr), instr.shape, aggressive)

    def _improved(self, s: Sharding, cur: Sharding | None, shape: Shape, aggressive: bool) -> Sharding | None:
        """XLA's ReturnImprovedSharding: `s` if it says more than `cur` without contradicting it
        (unless `aggressive`: an op with one user may take any sharding with more tiles)."""
        if not self.propagate_metadata:
            s = _strip(s)
        if s is cur or (cur is not None and s.kind is cur.kind and s.kind is not ShardingKind.TUPLE
                        and s.tile_dims == cur.tile_dims and s.subgroups == cur.subgroups and s == cur):
            # The common case by far (a value offered the very sharding object it holds, as
            # elementwise chains pass theirs on, or one of the same form: same kind, tile dims,
            # subgroup kinds and so, being equal, the same devices): nothing below can accept it
            # (a sharding is neither strictly better nor more specific than itself, and merges
            # with itself to no more tiles), so say so without the merge.  Not mere equality:
            # two equal shardings of different forms (a non-normalised tiling) may differ below.
            return None
        if cur is not None and _strictly_better(s, cur):
            return s
        if not su.is_spatially_partitioned(s):
            return None
        if cur is None:
            return s
        if su.is_manual(s):
            return None
        tiles = su.num_tiles(s) if s.kind is not ShardingKind.TUPLE else 1
        better, merged = su.merge(cur, s, self.may_combine)
        if better and (not aggressive and isinstance(shape, ArrayShape) and not su.is_tile_maximal(cur)
                       and su.num_tiles(merged) == tiles and not su.is_subtiling(shape, merged, cur)):
            better = False
        if not better:
            return self._merged_prefix(cur, s, shape) if self.shardy_form else None
        return merged

    def _merged_prefix(self, cur: Sharding, s: Sharding, shape: Shape) -> Sharding | None:
        """Shardy form: where `s` contradicts `cur`, the most of `s` that does not — `s` with
        some dims tiled coarser (the major part of their tiling kept, as Shardy keeps a prefix
        of a dim's axes) — merged into `cur`, if that tiles more than `cur` does.  An einsum
        whose result is tiled over the experts by its operands and wanted tiled over (data,
        experts) on another dim by its user takes the data part there: each device computes its
        half of the groups, where GSPMD's merge, all or nothing, computed them all (2x XLA
        Shardy's FLOPs)."""
        if (not isinstance(shape, ArrayShape) or s.kind is not ShardingKind.TILED or cur.kind is not ShardingKind.TILED
                or su.is_manual(s) or su.is_manual(cur) or s.num_devices != cur.num_devices):
            return None
        rank = shape.rank
        tm = TileMap.from_sharding(s, s.num_devices, rank)
        if tm is None:
            return None
        base = su.num_tiles(cur)
        best: Sharding | None = None
        for coarse in itertools.islice(tm.coarsenings(), 1, None):  # (the first is `tm` itself)
            candidate = coarse.to_sharding()
            if candidate is None or su.is_tile_maximal(candidate):
                continue
            merged = su.merge_if_compatible(cur, max(base, su.num_tiles(candidate)) + 1, candidate)
            if merged is not None and su.num_tiles(merged) > base and su.evenly_partitions(shape, merged) and (
                    best is None or su.num_tiles(merged) > su.num_tiles(best)):
                best = merged
        return best

    def improve(self, s: Sharding, instr: Instruction, *, aggressive: bool = False) -> bool:
        new = self.improved(s, instr, aggressive=aggressive)
        if new is None:
            return False
        self.set_sharding(instr, new)
        return True

    def improve_sub(self, s: Sharding, instr: Instruction, index: int, *, aggressive: bool = False) -> bool:
        if not isinstance(instr.shape, TupleShape):
            return self.improve(s, instr, aggressive=aggressive)
        cur = self.sharding(instr)
        sub_shape = instr.shape.elements[index]
        cur_sub = su.sub_sharding(instr.shape, cur, index) if cur is not None else None
        if sub_shape.is_tuple and s.kind is not ShardingKind.TUPLE:
            s = su.single(sub_shape, s)
        new_sub = self._improved(s, cur_sub, sub_shape, aggressive)
        if new_sub is None:
            return False
        leaves = su.leaves_of(cur, instr.shape) if cur is not None else [su.replicated()] * len(instr.shape.leaves())
        start, count = leaf_range(instr.shape, index)
        leaves[start:start + count] = su.leaves_of(new_sub, sub_shape)
        self.set_sharding(instr, su.tuple_sharding(leaves))
        return True

    def _graph_facts(self, instr: Instruction) -> "_GraphFacts":
        """What the graph alone decides about `instr` (see _GraphFacts), kept per instruction."""
        facts = self._facts.get(instr)
        if facts is None:
            in_called = instr.parent in self.caller
            facts = self._facts[instr] = _graph_facts(
                propagation_level(instr),
                supports_spatial_partitioning(instr, in_called=in_called, allow_output=self.allow_output,
                                              allow_parameters=False, shardy_form=self.shardy_form),
                supports_spatial_partitioning(instr, in_called=in_called, allow_output=False,
                                              allow_parameters=self.allow_params, shardy_form=self.shardy_form))
        return facts

    def _threshold(self, instr: Instruction) -> int:
        """propagation_rules.propagation_level, kept per instruction."""
        return self._graph_facts(instr).level

    def _passes(self, instr: Instruction) -> bool:
        """propagation_rules.passes_at_level at the round's level."""
        threshold = self._graph_facts(instr).level
        return threshold == 0 or self._at_least(threshold)  # every level is at least 0

    def sharding_from_user(self, instr: Instruction, user: Instruction, level: int | None = None) -> Sharding | None:
        """XLA's GetShardingFromUser: what `user` asks of its operand `instr`."""
        if level is None:  # at the round's level: nothing to set and restore
            if not self._passes(user) or not su.is_spatially_partitioned(self.sharding(user)):
                return None
            return user_rule(user)(self, instr, user)
        if level < self._threshold(user):
            return None
        if not su.is_spatially_partitioned(self.sharding(user)):
            return None
        saved = self._forced_level
        self._forced_level = level
        try:
            return user_rule(user)(self, instr, user)
        finally:
            self._forced_level = saved

    def lookahead_user_sharding(self, instr: Instruction) -> Sharding | None:
        """The sharding the first sharded user down a chain of single users asks of `instr`
        (XLA's LookaheadUserSharding, used to break a tie between a dot's operands)."""
        if len(instr.users) != 1:
            return None
        chain = [instr, next(iter(instr.users))]
        while self.sharding(chain[-1]) is None:
            users = chain[-1].users
            if len(users) != 1:
                return None
            chain.append(next(iter(users)))
        outer = self._overlay
        self._overlay = dict(outer or {})
        try:
            found = None
            for i in range(len(chain) - 1, 0, -1):
                found = self.sharding_from_user(chain[i - 1], chain[i], _LOOKAHEAD_LEVEL)
                if found is not None and i != 1:
                    self.set_sharding(chain[i - 1], found)
                    continue
                break
            return found
        finally:
            self._overlay = outer

    # ----------------------------------------------------------------- run --
    def _users(self, instr: Instruction) -> Sequence[Instruction]:
        """`instr`'s users in the order XLA lists them, which decides between users that offer
        incompatible shardings at the same level: XLA's import builds the module in post order
        (xla_post_order), so a user comes in the order of its place there.  Kept for the
        instructions with several users only: most have one, which needs no sorting, and a
        table entry and a list for each of them was a tenth of the walk's memory."""
        users = instr.users
        if len(users) < 2:
            return tuple(users)
        ordered = self._ordered_users.get(instr)
        if ordered is None:
            ordered = self._ordered_users[instr] = tuple(sorted(users, key=lambda u: self.position.get(u, 0)))
        return ordered

    def run(self) -> dict[Instruction, Sharding]:
        """Propagate; returns the shardings found (`state`)."""
        # Propagation sets shardings only; the graph, so each post order and user order, is fixed.
        self.orders = {comp: xla_post_order(comp) for comp in self.comps}
        self.position = {i: k for order in self.orders.values() for k, i in enumerate(order)}
        self._load()
        self._process_annotations()
        self._link_computations()
        self._fix_provided()
        self._ordered_users.clear()
        # Every user order the walk will ask for, sorted now: the positions (a table over the
        # whole module, with an int object for most entries: 3% of the walk's peak on gpt96)
        # are freed before the rounds instead of being kept for the few that need sorting.
        for order in self.orders.values():
            for instr in order:
                self._users(instr)
        self.position = {}
        self._conversions = {i for order in self.orders.values() for i in order
                             if is_custom_call(i, FULL_TO_SHARD, SHARD_TO_FULL)}
        for level in range(3):
            self._to_fixed_point(level, shard_groups=True)
        before = dict(self.state)
        sweeps = self._to_fixed_point(3, shard_groups=True)
        self._align_shard_as()
        self._relay_barrier_from()
        if not (sweeps == 1 and _same_objects(self.state, before)):
            # Skipped when it would repeat the level-3 round's only sweep: that round changed
            # nothing, and nothing has changed since, so every rule would see what it saw then
            # (rules read only the shardings, the level and the fixed graph) and answer no again.
            self._to_fixed_point(3, shard_groups=False)
        self._relay_barrier_from()
        self._restore_entry()
        return self.state

    def _load(self) -> None:
        for comp in self.comps:
            for instr in comp.instructions:
                s = instr.sharding if "sharding" in instr.attributes else None
                if s is None:
                    continue
                s = su.canon(s)
                if instr.shape.is_tuple and s.kind is not ShardingKind.TUPLE:
                    s = su.single(instr.shape, s)
                _check_devices(instr, s)
                if self.propagate_metadata:
                    md = instr.metadata
                    if md is not None and md.fields:
                        s = _with_default_metadata(s, md.to_hlo())
                else:
                    s = _strip(s)
                self.state[instr] = s

    def _process_annotations(self) -> None:
        """XLA's ProcessShardingInstruction: Sharding custom-calls give their sharding to
        unsharded operands; shard groups are collected (and removed from the shardings)."""
        for comp in self.comps:
            for instr in reversed(self.orders[comp]):
                if instr.parent is None:
                    continue
                s = self.state.get(instr)
                if is_custom_call(instr, SHARDING):
                    if s is None:
                        raise PropagationError(f"{instr.name}: a Sharding custom-call needs a sharding attribute")
                    operand = instr.operands[0]
                    self._join_group(instr)
                    dims = unspecified_dims(instr)
                    if dims:
                        self.unspecified[instr] = dims
                    elif operand not in self.state:
                        self.state[operand] = _without_group(self.state[instr])
                else:
                    self._join_group(instr)
        entry = self.entry
        root = root_of(entry)
        self.saved_root: list[Sharding] = []
        if self.allow_output and root.shape.is_tuple and root in self.state:
            self.saved_root = list(su.leaves_of(self.state[root], root.shape))
        self.saved_params: dict[int, Sharding] = {}
        if self.allow_params:
            for i, p in enumerate(entry.parameters):
                if p is not None and p in self.state:
                    self.saved_params[i] = self.state[p]

    def _join_group(self, instr: Instruction) -> None:
        s = self.state.get(instr)
        group = _shard_group(s) if s is not None else None
        if group is None or s is None:
            return
        members = self.groups.setdefault(group, [])
        if members and tuple(members[0].shape.dims if isinstance(members[0].shape, ArrayShape) else ()) != tuple(
                instr.shape.dims if isinstance(instr.shape, ArrayShape) else ()):
            raise PropagationError(f"{instr.name}: its shape {instr.shape.to_hlo(False)} differs from the other "
                                   f"members of {group[0]} group {group[1]} ({members[0].shape.to_hlo(False)})")
        members.append(instr)
        self.group_of[instr] = group
        self.state[instr] = _without_group(s)

    def _related(self, instr: Instruction) -> list[Instruction]:
        """Instructions that must share `instr`'s sharding (a while with its body's parameter and
        root and its condition's parameter; a conditional with its branch roots; a call with its
        body root)."""
        if instr.opcode is Opcode.WHILE:
            body, cond = instr.called_computation("body"), instr.called_computation("condition")
            return [instr, root_of(body), body.parameters[0], cond.parameters[0]]
        if instr.opcode is Opcode.CONDITIONAL:
            return [instr] + [root_of(c) for c in instr.called_computations()]
        if instr.opcode is Opcode.CALL:
            return [instr, root_of(instr.called_computations()[0])]
        if instr.opcode is Opcode.PARAMETER:
            # a branch's or callee's parameter and the operand passed to it
            caller = self.caller.get(instr.parent)
            if caller is not None and caller.opcode is Opcode.CONDITIONAL:
                for i, branch in enumerate(caller.called_computations()):
                    if branch is instr.parent:
                        return [instr, caller.operands[i + 1]]
            if caller is not None and caller.opcode is Opcode.CALL:
                assert instr.parameter_number is not None
                return [instr, caller.operands[instr.parameter_number]]
        return []

    def _link_computations(self) -> None:
        for comp in self.comps:
            for instr in comp.instructions:
                if instr.opcode not in _CONTROL_FLOW:
                    continue
                related = self._related(instr)
                sharded = next((r for r in related if r in self.state), None)
                if sharded is not None:
                    for r in related:
                        self.state[r] = self.state[sharded]
                if instr.opcode is Opcode.WHILE:
                    self.caller[instr.called_computation("body")] = instr
                    self.caller[instr.called_computation("condition")] = instr
                else:
                    for c in instr.called_computations():
                        self.caller[c] = instr

    def _fix_provided(self) -> None:
        entry = self.entry
        params = set(p for p in entry.parameters if p is not None)
        for instr, s in self.state.items():
            if instr is not entry.root and instr not in params and s.kind is not ShardingKind.UNKNOWN:
                self.provided.add(instr)
        root = root_of(entry)
        if not self.allow_output and (root not in self.state or self.state[root].kind is not ShardingKind.UNKNOWN):
            self.provided.add(root)
        if not self.allow_params:
            for p in params:
                if p in self.state and self.state[p].kind is not ShardingKind.UNKNOWN:
                    self.provided.add(p)
        for instr, s in list(self.state.items()):
            if _has_unknown(s):
                self.state[instr] = _unknown_to_replicated(s)

    # ------------------------------------------------------------- rounds --
    def _to_fixed_point(self, level: int, *, shard_groups: bool) -> int:
        """Sweep (groups, forward, backward, per computation) until a sweep changes nothing;
        returns the number of sweeps, the last one included."""
        self.level = level
        done_group: set[Instruction] = set()
        done_ops: set[Instruction] = set()
        done_users: set[Instruction] = set()

        def clear_cache(hlo: Instruction, for_users: Instruction | None = None) -> None:
            for operand in hlo.operands:
                done_users.discard(operand)
            for user in (for_users or hlo).users:
                done_ops.discard(user)
                if user.opcode in _CONTROL_FLOW:  # the bodies' parameters read the operands
                    for callee in user.called_computations():
                        for param in callee.parameters:
                            if param is not None:
                                done_ops.discard(param)
            group = self.group_of.get(hlo)
            if group is not None:
                for m in self.groups[group]:
                    if m is not hlo:
                        done_group.discard(m)

        def after_change(instr: Instruction) -> None:
            changed_related: set[Instruction] = set()
            self._propagate_related(instr, changed_related)
            clear_cache(instr)
            for other in changed_related:
                clear_cache(other)

        orders = self.orders
        # The group step visits only the groups' members (most steps have no group at all).
        members = {comp: [i for i in order if i in self.group_of] for comp, order in orders.items()}
        conversions = self._conversions
        # (the sweeps ask these of every instruction: looked up once)
        provided, evaluate = self.provided, self._evaluate
        from_operands, settled_ops = self._from_operands, self._settled_ops
        from_users, settled_users = self._from_users, self._settled_users
        for sweep in range(1, 10001):
            changed = False
            for comp in self.comps:
                order = orders[comp]
                if shard_groups:
                    for instr in members[comp]:
                        if instr in done_group:
                            continue
                        group = self.groups[self.group_of[instr]]
                        if instr in provided:
                            if self.may_combine and instr in self.unspecified and self._unspecified_from_group(
                                    instr, group):
                                clear_cache(instr)
                                done_group.add(instr)
                                changed = True
                            continue
                        done_group.add(instr)
                        if self._from_group(instr, group):
                            after_change(instr)
                            changed = True
                for instr in order:
                    if instr in done_ops:
                        continue
                    if instr in provided:
                        if self.may_combine and instr in self.unspecified:
                            conv = self._unspecified_from_operand(instr)
                            if conv is not False:
                                clear_cache(instr, conv)
                                done_ops.add(instr)
                                changed = True
                        continue
                    done_ops.add(instr)
                    if evaluate(instr, from_operands, settled_ops, _OPERANDS):
                        after_change(instr)
                        changed = True
                for instr in reversed(order):
                    if instr in conversions and instr not in done_users:
                        done_users.discard(instr.operands[0])
                    if instr in done_users:
                        continue
                    if instr in provided:
                        if self.may_combine and instr in self.unspecified:
                            conv = self._unspecified_from_users(instr)
                            if conv is not False:
                                clear_cache(instr, conv)
                                done_users.add(instr)
                                if conv is not None:
                                    done_users.add(conv)
                                changed = True
                        continue
                    done_users.add(instr)
                    if evaluate(instr, from_users, settled_users, _USERS):
                        after_change(instr)
                        changed = True
            if not changed:
                return sweep
        raise PropagationError("sharding propagation did not reach a fixed point")

    def _evaluate(self, instr: Instruction, rule: Callable[[Instruction], bool],
                  settled: dict[Instruction, _Settled | _Reads],
                  neighbours: Callable[[Instruction], Collection[Instruction]]) -> bool:
        """`rule(instr)` (_from_operands or _from_users, whose neighbours are the operands or the
        users), unless it is known to change nothing.

        A rule's answer is a function of the shardings it reads, of the level (through
        `aggressiveness`, `may_combine` and the crossing thresholds) and of the graph, which is
        fixed; it writes only through `set_sharding`.  So an evaluation that wrote nothing is
        kept with the clock's tick (see _State), what it read and the levels at which its level
        tests come out the same; asked again at such a level, none of what it read having
        changed since, the rule would take the same path to the same "no", and is not run.  This
        spares most of each round's first sweep, which asks every instruction afresh while most
        of the graph is as the previous round left it."""
        found = settled.get(instr)
        near = neighbours(instr)
        if found is not None:
            entry = found[0] if isinstance(found, _Reads) else found
            if entry >> self.level & 1:
                tick = entry >> _LEVELS
                tick_of = self.state.changed.get
                if isinstance(found, _Reads):
                    if max(map(tick_of, found[1:], _NEVER), default=0) <= tick:
                        return False
                elif tick_of(instr, 0) <= tick and max(map(tick_of, near, _NEVER), default=0) <= tick:
                    return False
        self._reads, self._levels_alike, self._wrote = set(), (0, _ANY_LEVEL), False
        try:
            changed = rule(instr)
        finally:
            reads, self._reads = self._reads, None
        if changed or self._wrote:
            if instr in settled:
                settled[instr] = _UNSETTLED
            return changed
        # The settled entry (see _Settled): an int when the rule read exactly `instr` and `near`.
        lo, hi = self._levels_alike
        entry = (self.state.clock << _LEVELS) | ((1 << (min(hi, _LEVELS - 1) + 1)) - (1 << lo))
        if (instr in reads and reads.issuperset(near)
                and len(reads) - 1 == (len(near) if len(near) < 2 else len(set(near)))):
            settled[instr] = entry
        else:
            settled[instr] = _Reads((entry, *reads))
        return False

    def _propagate_related(self, instr: Instruction, changed: set[Instruction]) -> None:
        def to_related(search: Instruction) -> None:
            related = self._related(search)
            if instr not in related:
                return
            s = self.state.get(instr)
            for other in related:
                if s is not None and self.state.get(other) != s and other not in self.provided:
                    self.state[other] = s
                    changed.add(other)
                    self._propagate_related(other, changed)

        if instr.opcode in _CONTROL_FLOW:
            to_related(instr)
        if instr.opcode is Opcode.PARAMETER or instr.is_root:
            caller = self.caller.get(instr.parent)
            if caller is not None:
                to_related(caller)
                if instr.opcode is Opcode.PARAMETER and caller.opcode in (Opcode.CONDITIONAL, Opcode.CALL):
                    to_related(instr)  # back to the operand passed in

    def _supports(self, instr: Instruction, *, from_users: bool) -> bool:
        """May `instr` take a sharding from its operands (the entry root only if the output may
        change) or from its users (entry parameters only if they may change)?"""
        facts = self._graph_facts(instr)
        static = facts.from_users if from_users else facts.from_operands
        return static or self._tiles_through_manual_collective(instr)

    def _tiles_through_manual_collective(self, instr: Instruction) -> bool:
        """An all-reduce or collective-permute a partially manual region writes (shard_map's psum,
        ppermute) keeps its operand's automatic tiling when every device it connects holds the
        same tile: it then sums or moves tiles as it did whole values.  XLA's propagation stops
        at cross-partition collectives; Shardy's passes this through, and the partitioner
        (handlers/manual_collectives.py) runs it on tiles."""
        if instr.opcode not in (Opcode.ALL_REDUCE, Opcode.COLLECTIVE_PERMUTE) or len(instr.operands) != 1:
            return False
        s = self.sharding(instr.operands[0])
        if s is None or not isinstance(instr.shape, ArrayShape) or not su.is_manual_subgroup(s):
            return False
        tm = TileMap.from_sharding(s, len(s.devices), instr.shape.rank)
        return tm is not None and pair_on_other_tiles(instr, tm) is None

    def _from_operands(self, instr: Instruction) -> bool:
        """XLA's InferShardingFromOperands."""
        if not self._passes(instr):
            return False
        cur = self.sharding(instr)
        if cur is not None and su.is_manual(cur):
            return False
        if ((cur is None or su.is_tile_maximal(cur))
                and (not instr.shape.is_tuple or instr.opcode in (Opcode.REDUCE, Opcode.SORT, Opcode.REDUCE_WINDOW)
                     or instr.opcode is Opcode.CUSTOM_CALL)):
            for op in instr.operands:
                s = self.sharding(op)
                if s is None or not su.is_manual(s):
                    continue
                if is_custom_call(instr, SHARD_TO_FULL):
                    return False
                if instr.opcode in (Opcode.CONCATENATE, Opcode.DYNAMIC_SLICE) and not self._at_least(1):
                    return False
                self.set_sharding(instr, su.manual(_first_metadata(s)))
                return True
        if not self._supports(instr, from_users=False):
            if (instr.shape.is_tuple or not instr.operands or instr.is_root
                    or has_side_effect(instr)):
                return False
            for op in instr.operands:
                s = self.sharding(op)
                if s is not None and s.kind is ShardingKind.REPLICATED:
                    return self.improve(s, instr)
            return False
        return forward_rule(instr)(self, instr)

    def _from_users(self, instr: Instruction) -> bool:
        """XLA's InferShardingFromUsers."""
        if instr.opcode is Opcode.BROADCAST and not self._at_least(2):
            return False
        cur = self.sharding(instr)
        if cur is not None and su.is_manual(cur):
            return False
        # What each user asked in the manual check, reused below until a sharding changes (rules
        # are pure: asked again on the same shardings, a user answers the same).
        asked: dict[Instruction, Sharding | None] = {}
        if cur is None or su.is_tile_maximal(cur):
            for user in self._users(instr):
                us = self.sharding(user)
                if us is None or is_custom_call(user, FULL_TO_SHARD):
                    continue
                if not instr.shape.is_tuple and su.is_manual(us):
                    self.set_sharding(instr, su.manual(_first_metadata(us)))
                    return True
                found = asked[user] = self.sharding_from_user(instr, user)
                if found is not None and su.is_manual(found):
                    self.set_sharding(instr, found)
                    return True
        if not self._supports(instr, from_users=True):
            return False
        improved = False
        for user in self._users(instr):
            if user.opcode is Opcode.RNG_BIT_GENERATOR:  # its state is one value: XLA replicates it
                if cur is not None and su.is_replicated(cur):
                    return improved
                self.set_sharding(instr, su.replicated())
                return True
            found = asked[user] if not improved and user in asked else self.sharding_from_user(instr, user)
            if found is not None and is_custom_call(instr, BARRIER_TO):
                found = su.replicated()
            if found is not None:
                improved |= self.improve(found, instr)
        return improved

    # ------------------------------------------------------------ groups --
    def _from_group(self, instr: Instruction, group: list[Instruction]) -> bool:
        if not self._passes(instr):
            return False
        cur = self.state.get(instr)
        if cur is not None and su.is_manual(cur):
            return False
        if is_custom_call(instr, BARRIER_TO):
            return False
        if cur is None or su.is_tile_maximal(cur):
            for m in group:
                ms = self.state.get(m)
                if m is not instr and ms is not None and su.is_manual(ms):
                    self.set_sharding(instr, ms)
                    return True
        changed = False
        for m in group:
            if m is instr or is_custom_call(m, BARRIER_FROM) or m not in self.state:
                continue
            changed |= self.improve(self.state[m], instr)
        return changed

    def _align_shard_as(self) -> None:
        for (kind, _), members in self.groups.items():
            if kind != "shard_as":
                continue
            default = su.replicated()
            found = []
            for m in members:
                s = self.state.get(m)
                if s is not None:
                    found.append(s)
                    if not is_custom_call(m, BARRIER_FROM) and su.is_replicated(default):
                        default = s
            if not found:
                continue
            common = su.find_common(found, default)
            for m in members:
                if not is_custom_call(m, BARRIER_TO):
                    self.set_sharding(m, common)

    def _relay_barrier_from(self) -> None:
        """A ShardBarrierFrom in a shard_as group hands the group's sharding to its operand."""
        for instr, group in self.group_of.items():
            if group[0] != "shard_as" or not is_custom_call(instr, BARRIER_FROM) or instr not in self.state:
                continue
            s = self.state[instr]
            operand = instr.operands[0]
            os = self.state.get(operand)
            if os is not None and not su.is_manual(os) and not su.is_manual(s):
                merged = su.merge_if_compatible(os, su.num_tiles(s), s)
                if merged is not None:
                    s = merged
            self.state[operand] = s

    # ---------------------------------------------------- unspecified dims --
    def _conversion_after(self, annotation: Instruction, dims: list[int]) -> Instruction | Literal[False] | None:
        """The manual-conversion custom-call an annotation feeds (None when none; False when its
        unspecified dims differ, which stops the refinement)."""
        if len(annotation.users) != 1:
            return None
        user = next(iter(annotation.users))
        if not is_custom_call(user, FULL_TO_SHARD, SHARD_TO_FULL):
            return None
        if (unspecified_dims(user) or []) != dims:
            return False
        return user

    def _refine(self, annotation: Instruction, conv: Instruction | None, source: Sharding, dims: list[int],
                source_is_manual_side: bool) -> bool:
        """Merge `source`'s tiling of `dims` into the annotation (and its manual conversion)."""
        if conv is None:
            partial = su.replicate_all_except(source, dims)
            cur = self.state[annotation]
            if su.is_manual(cur) or su.is_manual(partial):
                return False
            merged = su.merge_if_compatible(partial, su.num_tiles(cur) + 1, cur)
            if merged is None:
                return False
            self.state[annotation] = merged
            return True
        if is_custom_call(conv, FULL_TO_SHARD):
            auto_of, manual_of = annotation, conv
        else:
            auto_of, manual_of = conv, annotation
        refine = _refine_from_manual if source_is_manual_side else _refine_from_auto
        found = refine(source, dims, self.state.get(auto_of), self.state.get(manual_of))
        if found is None and not source_is_manual_side:
            found = _refine_from_auto_blocks(source, dims, self.state.get(auto_of), self.state.get(manual_of),
                                             auto_of.shape, manual_of.shape)
        if found is None:
            return False
        self.state[auto_of], self.state[manual_of] = found
        return True

    def _unspecified_from_operand(self, annotation: Instruction) -> Instruction | Literal[False] | None:
        """Returns False (nothing changed), else the conversion op after it (or None)."""
        dims = self.unspecified[annotation]
        operand = annotation.operands[0]
        s = self.state.get(operand)
        if s is None or not su.is_spatially_partitioned(s) or s.kind is not ShardingKind.TILED:
            return False
        conv = self._conversion_after(annotation, dims)
        if conv is False:
            return False
        manual_side = conv is not None and is_custom_call(conv, SHARD_TO_FULL)
        return conv if self._refine(annotation, conv, s, dims, manual_side) else False

    def _unspecified_from_users(self, annotation: Instruction) -> Instruction | Literal[False] | None:
        dims = self.unspecified[annotation]
        conv = self._conversion_after(annotation, dims)
        if conv is False:
            return False
        changed = False
        for user in self._users(conv or annotation):
            us = self.state.get(user)
            if us is None or us.kind not in (ShardingKind.TILED, ShardingKind.TUPLE):
                continue
            found = self.sharding_from_user(conv or annotation, user)
            if found is None or su.is_tile_maximal(found):
                continue
            manual_side = conv is not None and is_custom_call(conv, FULL_TO_SHARD)
            changed |= self._refine(annotation, conv, found, dims, manual_side)
        return conv if changed else False

    def _unspecified_from_group(self, annotation: Instruction, group: list[Instruction]) -> bool:
        if is_custom_call(annotation, BARRIER_TO):
            return False
        dims = self.unspecified[annotation]
        changed = False
        for m in group:
            s = self.state.get(m)
            if m is annotation or is_custom_call(m, BARRIER_FROM) or s is None or s.kind is not ShardingKind.TILED:
                continue
            changed |= self._refine(annotation, None, s, dims, False)
        return changed

    # ----------------------------------------------------------- the entry --
    def _restore_entry(self) -> None:
        """Entry parameters / root leaves propagation may not change get their input sharding back
        (or none); those it may change are replicated when their sharding does not divide them."""
        entry = self.entry
        root = root_of(entry)
        if self.saved_root and len(self.saved_root) == len(self.output_allowed) and root in self.state:
            leaves = su.leaves_of(self.state[root], root.shape)
            for i, saved in enumerate(self.saved_root):
                if not self.output_allowed[i] and saved.kind is not ShardingKind.UNKNOWN:
                    leaves[i] = saved
            self.state[root] = su.tuple_sharding(leaves)
        params = entry.parameters
        if self.allow_params and len(self.params_allowed) == len(params):
            for i, p in enumerate(params):
                if p is None or self.params_allowed[i]:
                    continue
                saved_param = self.saved_params.get(i)
                if saved_param is not None and saved_param.kind is not ShardingKind.UNKNOWN:
                    self.state[p] = saved_param
                else:
                    self.state.pop(p, None)
        if self.allow_output and root in self.state:
            s = self.state[root]
            evened: Sharding | None = None
            if isinstance(root.shape, TupleShape) and len(self.output_allowed) == len(root.shape.elements):
                elems: list[Sharding] = []
                for i, shape in enumerate(root.shape.elements):
                    sub = su.sub_sharding(root.shape, s, i)
                    if self.output_allowed[i] and not su.evenly_partitions(shape, sub):
                        sub = self._evened(shape, sub)
                    elems.extend(su.leaves_of(sub, shape))
                evened = su.tuple_sharding(elems)
            elif not root.shape.is_tuple and not su.evenly_partitions(root.shape, s):
                evened = self._evened(root.shape, s)
            if evened is not None and evened != s:
                if self.shardy_form and (not root.shape.is_tuple or root.opcode is Opcode.TUPLE):
                    self.output_boundary = evened
                else:
                    self.state[root] = evened
        if self.allow_params and len(self.params_allowed) == len(params):
            for i, p in enumerate(params):
                if p is not None and p in self.state and self.params_allowed[i] and not su.evenly_partitions(
                        p.shape, self.state[p]):
                    self.state[p] = su.single(p.shape, su.replicated())

    def _evened(self, shape: Shape, s: Sharding) -> Sharding:
        """A propagated output sharding that does not divide its shape evenly, made even: XLA's
        GSPMD rule replicates it whole; for JAX's Shardy form, as XLA's Shardy pipeline, only
        the dims it does not divide lose their tiling (a `where` of [250, 120] on a 4x2 mesh
        keeps its columns' 2 tiles: it was gathered whole, 2.2x the bytes of XLA's plan)."""
        if (self.shardy_form and isinstance(shape, ArrayShape) and s.kind is ShardingKind.TILED
                and not su.is_manual(s)):
            uneven = [d for d in range(shape.rank) if shape.dims[d] % s.tile_dims[d]]
            kept = su.replicate_dims(s, uneven)
            if su.evenly_partitions(shape, kept):
                return kept
        return su.single(shape, su.replicated())


class _GraphFacts(NamedTuple):
    """What the graph alone decides about an instruction, kept by the walk (the graph is fixed):
    the level from which propagation crosses it (propagation_level), and whether it may take a
    sharding from its operands (the entry root only if the output may change) / from its users
    (entry parameters only if they may change), less the collective case, which reads a
    sharding.  One table of these, each one of the few distinct values (_graph_facts), where
    three tables took a twelfth of the walk's memory on the 96-layer step."""

    level: int
    from_operands: bool
    from_users: bool


@functools.cache
def _graph_facts(level: int, from_operands: bool, from_users: bool) -> _GraphFacts:
    return _GraphFacts(level, from_operands, from_users)


# ------------------------------------------------------------------ helpers --
def _same_objects(a: dict[Instruction, Sharding], b: dict[Instruction, Sharding]) -> bool:
    """The same instructions hold the very same sharding objects in both."""
    return len(a) == len(b) and all(b.get(k) is v for k, v in a.items())


def _strictly_better(lhs: Sharding, rhs: Sharding) -> bool:
    """Manual over tile-maximal (XLA's IsShardingStrictlyBetter)."""
    if lhs.kind is ShardingKind.TUPLE or rhs.kind is ShardingKind.TUPLE:
        if lhs.kind is not rhs.kind or len(lhs.elements) != len(rhs.elements):
            return False
        mask = 0
        for a, b in zip(lhs.elements, rhs.elements):
            if a.kind is ShardingKind.MANUAL and su.is_tile_maximal(b):
                mask |= 1
            if b.kind is ShardingKind.MANUAL and su.is_tile_maximal(a):
                mask |= 2
        return mask == 1
    return lhs.kind is ShardingKind.MANUAL and su.is_tile_maximal(rhs)


def _strip(s: Sharding) -> Sharding:
    if s.kind is ShardingKind.TUPLE:
        return s if not any(e.metadata for e in s.elements) else su.tuple_sharding(_strip(e) for e in s.elements)
    return replace(s, metadata="") if s.metadata else s


def _metadata_of(s: Sharding) -> tuple[str, ...]:
    return tuple(e.metadata for e in s.elements) if s.kind is ShardingKind.TUPLE else (s.metadata,)


def _first_metadata(s: Sharding) -> str:
    if s.kind is ShardingKind.TUPLE:
        return s.elements[0].metadata if s.elements else ""
    return s.metadata


def _with_default_metadata(s: Sharding, text: str) -> Sharding:
    if not text:
        return s
    if s.kind is ShardingKind.TUPLE:
        return su.tuple_sharding(_with_default_metadata(e, text) for e in s.elements)
    return s if s.metadata else replace(s, metadata=text)


def _shard_group(s: Sharding) -> tuple[str, int] | None:
    if s.kind is ShardingKind.TUPLE:
        return next((e.shard_group for e in s.elements if e.shard_group is not None), None)
    return s.shard_group


def _without_group(s: Sharding) -> Sharding:
    if s.kind is ShardingKind.TUPLE:
        return su.tuple_sharding(replace(e, shard_group=None) for e in s.elements)
    return replace(s, shard_group=None)


def _has_unknown(s: Sharding) -> bool:
    if s.kind is ShardingKind.TUPLE:
        return any(e.kind is ShardingKind.UNKNOWN for e in s.elements)
    return s.kind is ShardingKind.UNKNOWN


def _unknown_to_replicated(s: Sharding) -> Sharding:
    if s.kind is ShardingKind.TUPLE:
        return su.tuple_sharding(_unknown_to_replicated(e) for e in s.elements)
    return su.replicated(s.metadata) if s.kind is ShardingKind.UNKNOWN else s


def _check_devices(instr: Instruction, s: Sharding) -> None:
    leaves = s.elements if s.kind is ShardingKind.TUPLE else (s,)
    for leaf in leaves:
        if leaf.kind is ShardingKind.TILED and _names_a_device_twice(su.arr(leaf)):
            raise PropagationError(f"{instr.name}: sharding {leaf.to_hlo()} names a device twice")


def _names_a_device_twice(devices: np.ndarray) -> bool:
    ordered = np.sort(devices, axis=None)
    return bool(np.any(ordered[1:] == ordered[:-1]))


def _refine_from_auto(to_merge: Sharding, dims: list[int], auto: Sharding | None,
                      man: Sharding | None) -> tuple[Sharding, Sharding] | None:
    """XLA's RefineManualAutoShardingFromAuto: an auto-side sharding refines the (auto, manual)
    pair around a manual conversion on the unspecified dims."""
    if auto is None or man is None or to_merge.kind is not ShardingKind.TILED:
        return None
    if (not su.is_manual_subgroup(man) or su.is_manual_subgroup(auto) or not su.has_partial_replication(man)
            or len(man.subgroups) != 2):
        return None
    partial = su.replicate_all_except(to_merge, dims)
    if su.is_tile_maximal(partial) or su.is_manual_subgroup(partial):
        return None
    new_auto = su.merge_if_compatible(partial, su.num_tiles(auto) + 1, auto)
    if new_auto is None:
        return None
    r = partial.data_rank
    pa = su.arr(partial)
    shape = list(pa.shape)
    shape.insert(r, 1)
    if not su.replicate_on_last_tile_dim(partial):
        return None
    for_manual = su.partial_tile(pa.reshape(shape))
    ma = su.arr(man)
    if man.subgroups[-1] is not su.REP:
        perm = list(range(ma.ndim))
        perm[-1], perm[man.data_rank] = perm[man.data_rank], perm[-1]
        ma = ma.transpose(perm)
    tmp = su.partial_tile(ma)
    merged = su.merge_if_compatible(for_manual, su.num_tiles(tmp) + 1, tmp)
    if merged is None:
        return None
    kinds = [su.MAN] + ([su.REP] if su.has_partial_replication(merged) else [])
    return new_auto, su.subgroup(su.arr(merged), kinds)


def _refine_from_auto_blocks(to_merge: Sharding, dims: list[int], auto: Sharding | None, man: Sharding | None,
                             global_shape: Shape, region_shape: Shape) -> tuple[Sharding, Sharding] | None:
    """An auto-side sharding that also tiles dims over the manual axes refines the pair where
    XLA's rule (which needs `to_merge` replicated over the manual devices) gives up: the merged
    auto sharding cuts each manual group's block (global dims / region dims) further, and that
    finer part becomes the region's automatic tiling.

        auto {devices=[4,1,2] last_tile_dim_replicate}, to_merge {devices=[4,2]}, f32[16,8] -> f32[4,8]
        -> auto {devices=[4,2]}, region {devices=[1,2,4]<=[4,2]T(1,0) last_tile_dims={manual}}

    None where the blocks are not the major part of the merged tiling, a manual group's devices
    hold pieces of two blocks, or a block is not cut evenly."""
    if auto is None or man is None or to_merge.kind is not ShardingKind.TILED or not su.is_manual_subgroup(man):
        return None
    if (su.is_manual_subgroup(auto) or su.is_manual_subgroup(to_merge) or not isinstance(global_shape, ArrayShape)
            or not isinstance(region_shape, ArrayShape)):
        return None
    partial = su.replicate_all_except(to_merge, dims)
    if su.is_tile_maximal(partial):
        return None
    new_auto = su.merge_if_compatible(partial, su.num_tiles(auto) + 1, auto)
    if new_auto is None or new_auto.kind is not ShardingKind.TILED:
        return None
    n, rank = len(man.devices), global_shape.rank
    outer, inner = TileMap.from_sharding(new_auto, n, rank), TileMap.from_sharding(man, n, rank)
    if outer is None or inner is None or region_shape.rank != rank:
        return None
    extra_dims: list[int] = []
    extra = np.zeros((n, rank), np.int64)
    for k in range(rank):
        size, part = global_shape.dims[k], region_shape.dims[k]
        if part == 0 or size % part or outer.dims[k] % (size // part):
            return None
        e = outer.dims[k] // (size // part)
        if e > 1 and part % e:
            return None
        block = outer.coords[:, k] // e
        for group in range(inner.manual_size):
            if len(set(block[inner.manual == group].tolist())) > 1:
                return None
        extra[:, k] = outer.coords[:, k] % e
        extra_dims.append(e)
    merged = TileMap(tuple(extra_dims), extra, inner.manual, inner.manual_size).merge(inner)
    new_man = merged.to_sharding() if merged is not None else None
    if new_man is None or new_man == man:
        return None
    return new_auto, new_man


def _refine_from_manual(to_merge: Sharding, dims: list[int], auto: Sharding | None,
                        man: Sharding | None) -> tuple[Sharding, Sharding] | None:
    """XLA's RefineManualAutoShardingFromManual: a manual-side sharding refines the pair."""
    if auto is None or man is None:
        return None
    if (not su.is_manual_subgroup(to_merge) or not su.is_manual_subgroup(man) or not su.has_partial_replication(man)
            or su.is_manual_subgroup(auto) or len(man.subgroups) != 2):
        return None
    partial = su.replicate_all_except(to_merge, dims)
    if su.is_tile_maximal(partial) or partial.kind is not ShardingKind.TILED:
        return None
    new_man = su.merge_if_compatible(partial, su.num_tiles(man) + 1, man)
    if new_man is None:
        return None
    for_auto = su.subgroup(su.arr(partial), [su.REP] * len(partial.subgroups))
    new_auto = su.merge_if_compatible(for_auto, su.num_tiles(auto) + 1, auto)
    if new_auto is None:
        return None
    return new_auto, new_man


def _sharding_calls_to_copies(module: Module) -> bool:
    """custom-call "Sharding" -> copy with the same sharding, except at manual-region boundaries."""
    changed = False
    for comp in propagated_computations(module):
        for instr in comp.post_order():
            if instr.custom_call_target != SHARDING:
                continue
            if any(u.custom_call_target in (FULL_TO_SHARD, SHARD_TO_FULL) for u in instr.users):
                continue
            copy = Instruction(Opcode.COPY, instr.shape, [instr.operands[0]], name=instr.name)
            copy.sharding = instr.sharding
            if "metadata" in instr.attributes:
                copy.attributes["metadata"] = instr.attributes["metadata"]
            comp.replace(instr, copy)
            changed = True
    return changed


def refuse_unusable_shardings(module: Module) -> None:
    """Raise an input error at the first sharding no rule can use: one that does not fit its
    value's shape (a tile rank other than the array's, a tuple sharding with another number of
    entries than leaves: XLA's verifier refuses both), or one with an UNREDUCED subgroup
    (devices holding partial sums: JAX's `unreduced=`), which would be read as whole values
    and compute something else (no propagation or partitioning rule has partial sums)."""
    for instr in module.all_instructions():
        s = instr.sharding if "sharding" in instr.attributes else None
        if s is None:
            continue
        problem = s.problem_with(instr.shape)
        if problem is not None:
            raise PropagationError(f"{instr.name}: sharding {s.to_hlo()} does not fit {instr.shape.to_hlo()}: "
                                   f"{problem}")
        for leaf in s.leaves():
            if SubgroupKind.UNREDUCED in leaf.subgroups:
                raise PropagationError(f"{instr.name}: sharding {leaf.to_hlo()} holds partial sums (unreduced); "
                                       "sharding-propagation and spmd-partition do not partition unreduced values")


def _output_boundary(module: Module, evened: Sharding, owner: ModulePass) -> bool:
    """Shardy form: the entry's output takes `evened` (its propagated sharding with the dims it
    does not divide evenly untiled) at a boundary, a copy after the root, as XLA's Shardy
    pipeline reshards a function result; the root keeps the sharding propagation gave it.
    Evening the root itself made the op computing it run whole on every device (a cumulative
    product of 30 columns on 8 devices: 1,756 FLOPs against XLA's 249).  A tuple root gets a
    copy on each element that changes."""
    entry = module.entry
    assert entry is not None and entry.root is not None, "an entry with a root (the walk found one)"
    root = entry.root
    current = root.sharding if "sharding" in root.attributes else None
    if root.opcode is not Opcode.TUPLE:
        copy = Builder(entry).op(Opcode.COPY, root.shape, [root], name=f"{root.name}.output")
        copy.sharding = evened
        entry.root = copy
        owner.remark(copy, f"the output's sharding {evened.to_hlo()} (its uneven dims untiled) is applied after "
                           "the value is computed, as XLA's Shardy pipeline does", "applied")
        return True
    shape = cast(TupleShape, root.shape)
    leaves: list[Sharding] = []
    for i, element in enumerate(shape.elements):
        want = su.sub_sharding(shape, evened, i)
        have = su.sub_sharding(shape, current, i) if current is not None else None
        if have is not None and have != want and not element.is_tuple:
            operand = root.operands[i]
            copy = Builder(entry, before=root).op(Opcode.COPY, element, [operand], name=f"{operand.name}.output")
            copy.sharding = want
            root.set_operand(i, copy)
        leaves.extend(su.leaves_of(want, element))
    root.sharding = su.tuple_sharding(leaves)
    return True


def _device_annotations(module: Module) -> list[tuple[Instruction, Sharding]]:
    """Every tiled or one-device leaf sharding the module's propagated computations carry."""
    found: list[tuple[Instruction, Sharding]] = []
    for comp in propagated_computations(module):
        for instr in comp.instructions:
            s = instr.sharding if "sharding" in instr.attributes else None
            for leaf in (s.elements if s is not None and s.kind is ShardingKind.TUPLE else (s,)):
                if leaf is not None and leaf.kind in (ShardingKind.TILED, ShardingKind.MAXIMAL):
                    found.append((instr, leaf))
    return found


def annotated_device_count(module: Module) -> int:
    """The devices the module's annotations name (the largest tiling's count, or one past the
    highest single device; 1 when none): the program's device count where nothing else says
    it (JAX's lowered text records no num_partitions)."""
    return _devices_named(_device_annotations(module))


def _devices_named(found: list[tuple[Instruction, Sharding]]) -> int:
    return max([s.num_devices for _, s in found if s.kind is ShardingKind.TILED]
               + [s.device + 1 for _, s in found if s.kind is ShardingKind.MAXIMAL and s.device is not None]
               + [1])


def _check_device_count(module: Module, n: int) -> None:
    """Every annotation tiles over exactly the program's devices, as XLA's verifier requires (so
    no sharding we propagate names a device the program does not have)."""
    found = _device_annotations(module)
    if n <= 1:
        n = _devices_named(found)
    for instr, s in found:
        if s.kind is ShardingKind.TILED and (s.num_devices != n or int(su.arr(s).max()) >= n):
            raise PropagationError(f"{instr.name}: sharding {s.to_hlo()} tiles over {s.num_devices} devices, "
                                   f"but the program has {n} (num_partitions)")
        if s.kind is ShardingKind.MAXIMAL and s.device is not None and s.device >= n:
            raise PropagationError(f"{instr.name}: sharding {s.to_hlo()} names device {s.device}, but the "
                                   f"program has {n} (num_partitions)")


def _is_no_op(instr: Instruction) -> bool:
    """An identity transpose or a reverse of size-1 dims (the import drops them)."""
    if instr.opcode is Opcode.TRANSPOSE:
        return list(instr.dimensions) == sorted(instr.dimensions)
    return instr.opcode is Opcode.REVERSE and all(instr.array_shape.dims[d] == 1 for d in instr.dimensions)


def _moves_only_unit_dims(transpose: Instruction) -> bool:
    operand = transpose.operands[0].array_shape
    kept = [d for d in transpose.dimensions if operand.dims[d] != 1]
    return kept == sorted(kept)


def _constant_offsets(ds: Instruction) -> list[int] | None:
    """A dynamic-slice's start offsets when all are scalar constants, clamped as XLA clamps them."""
    starts: list[int] = []
    for offset, size, dim in zip(ds.operands[1:], ds.array_shape.dims, ds.operands[0].array_shape.dims):
        if offset.opcode is not Opcode.CONSTANT or offset.array_shape.rank != 0:
            return None
        try:
            value = int(str(offset.literal))
        except ValueError:
            return None
        starts.append(min(max(value, 0), dim - size))
    return starts if len(ds.operands) == len(ds.array_shape.dims) + 1 else None


def _reshaped_by_import(instr: Instruction) -> bool:
    """Does XLA's pipeline (or the import its compile of HLO text goes through) change the graph
    around `instr` before propagating (see _Flat)?"""
    if instr.opcode is Opcode.TRANSPOSE and _moves_only_unit_dims(instr):
        return True
    if _is_no_op(instr):
        return True
    if instr.opcode is Opcode.BROADCAST and instr.operands[0].opcode is Opcode.BROADCAST:
        return True
    if instr.opcode is Opcode.DYNAMIC_SLICE and _constant_offsets(instr) is not None:
        return True
    if instr.opcode is Opcode.CALL or (instr.opcode is Opcode.CONDITIONAL and (
            not instr.shape.is_tuple or any(not o.shape.is_tuple for o in instr.operands[1:]))):
        return True
    if instr.opcode is Opcode.GET_TUPLE_ELEMENT and instr.operands[0].opcode is Opcode.TUPLE:
        return True
    if instr.is_root and instr.shape.is_tuple and instr.opcode is not Opcode.TUPLE:
        return True
    if (instr.parent is not None and instr.parent.is_entry and instr.is_root and instr.opcode is Opcode.TUPLE
            and len(instr.operands) == 1 and "sharding" not in instr.attributes):
        return True
    return (not instr.users and not instr.is_root and instr.opcode is not Opcode.PARAMETER
            and not instr.has_side_effect)


def _detach_shard_alike(module: Module) -> bool:
    """A `Sharding` custom-call whose sharding is only `{unknown shard_as N}` (JAX's
    shard_alike) names a group and nothing else: its operand joins the group and the call goes
    (XLA's ProcessShardingInstruction).  On a parameter it stays, as a copy would in XLA."""
    changed = False
    for comp in propagated_computations(module):
        for instr in list(comp.post_order()):
            if not is_custom_call(instr, SHARDING) or "sharding" not in instr.attributes:
                continue
            s = instr.sharding
            assert s is not None  # (it has the attribute)
            group = _shard_group(s)
            if group is None or s.kind is not ShardingKind.UNKNOWN or instr.operands[0].opcode is Opcode.PARAMETER:
                continue
            operand = instr.operands[0]
            cur = operand.sharding or Sharding.unknown()
            operand.sharding = replace(cur, shard_group=group) if cur.kind is not ShardingKind.TUPLE else cur
            if comp.root is instr:
                comp.root = operand
            instr.replace_all_uses_with(operand)
            comp.remove(instr)
            changed = True
    return changed


def _remove_barriers(module: Module) -> bool:
    """ShardBarrierFrom / ShardBarrierTo only steer propagation: they go once it is done (an
    operand without a sharding takes the barrier's, as XLA's instruction replacement does)."""
    changed = False
    for comp in propagated_computations(module):
        for instr in list(comp.instructions):
            if is_custom_call(instr, BARRIER_FROM, BARRIER_TO):
                operand = instr.operands[0]
                if "sharding" in instr.attributes and "sharding" not in operand.attributes:
                    operand.sharding = instr.sharding  # XLA's ReplaceInstruction keeps the old sharding
                if comp.root is instr:
                    comp.root = operand
                instr.replace_all_uses_with(operand)
                comp.remove(instr)
                changed = True
    return changed
