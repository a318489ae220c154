"""sharding-propagation: give every instruction a sharding, starting from the user's.

JAX annotates parameters, `with_sharding_constraint`s (custom-call "Sharding"),
the result, and shard_map boundaries; the SPMD partitioner needs a sharding on
every instruction.  This pass fills the gaps, like XLA's ShardingPropagation:

    %a = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
    %b = f32[8,4] parameter(1), sharding={replicated}
    %d = f32[16,4] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    %t = f32[4,16] transpose(%d), dimensions={1,0}
  becomes
    %d = ... dot(...), ..., sharding={devices=[4,1]<=[4]}
    %t = ... transpose(%d), ..., sharding={devices=[1,4]<=[4]}

Shardy-form input (JAX's default) is first rewritten to the GSPMD form
(`shardy_import.import_shardy`).  Then shardings flow forward (operands -> result)
and backward (result -> operands) through per-opcode rules (propagation_rules.py)
and across while / call / conditional boundaries, until nothing changes.  A value
only ever takes a sharding with more tiles than it had (merging compatible
candidates), so the walk ends, and the most tiled proposal wins when several
compete.  Shardings present in the input are never changed.  What stays unknown
is replicated (or, inside a shard_map body, manual).

Entry parameters and the root only receive propagated shardings when allowed:
by the options, else by the module's `allow_spmd_sharding_propagation_to_parameters`
/ `_to_output` attributes, else yes: JAX annotates every parameter and result
whose sharding it knows, so a missing one means "unspecified".
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass
from hlo_passes.passes.spmd.propagation_rules import (Leaves, RuleContext, combine, num_leaves, rule_for,
                                                      specificity)
from hlo_passes.passes.spmd.shardy_import import SDY_PREFIX, import_shardy
from hlo_passes.passes.spmd.tile_map import TileMap

# Ops whose called computations run once per element (reducers, comparators): not propagated into.
_CONTROL_FLOW = (Opcode.WHILE, Opcode.CALL, Opcode.CONDITIONAL)


@register_pass
class ShardingPropagation(ModulePass):
    """See the module docstring."""

    name = "sharding-propagation"
    summary = "Give every instruction a sharding, propagated from the user's annotations"

    @dataclass(frozen=True)
    class Options:
        propagate_to_parameters: bool | None = option(
            None, "entry parameters without a sharding may receive one (default: module attribute, else yes)")
        propagate_to_output: bool | None = option(
            None, "the entry root without a sharding may receive one (default: module attribute, else yes)")
        keep_sharding_custom_calls: bool = option(
            True, "keep custom-call \"Sharding\" annotations (else they become copies)")

    def run(self, module: Module) -> bool:
        changed = import_shardy(module)
        if changed:
            self.remark(None, "rewrote Shardy attributes to HLO shardings", "applied")
        walk = _Propagation(module, self._allow(module, "parameters"), self._allow(module, "output"), self)
        changed |= walk.run()
        if not self.options.keep_sharding_custom_calls:
            changed |= _sharding_calls_to_copies(module)
        return changed

    def _allow(self, module: Module, what: str) -> list[bool]:
        """Per entry parameter / per root leaf: may propagation give it a sharding?"""
        flag = self.options.propagate_to_parameters if what == "parameters" else self.options.propagate_to_output
        count = (len(module.entry.parameters) if what == "parameters"
                 else num_leaves(module.entry.root.shape))
        if flag is not None:
            return [flag] * count
        values = module.header_attr(f"allow_spmd_sharding_propagation_to_{what}")
        if values is None:  # JAX leaves these unannotated exactly when it wants them propagated
            return [True] * count
        values = list(values) if isinstance(values, tuple) else [values]
        if len(values) == 1:
            return values * count
        return values + [False] * (count - len(values))


def is_fully_sharded(module: Module) -> bool:
    """Every instruction of every computation the partitioner walks has a sharding,
    and no Shardy-only annotation is left."""
    for comp in propagated_computations(module):
        for instr in comp.instructions:
            if instr.sharding is None or instr.sharding.kind is ShardingKind.UNKNOWN:
                return False
            if (instr.custom_call_target or "").startswith(SDY_PREFIX):
                return False
    return True


def propagated_computations(module: Module) -> list[Computation]:
    """The entry and, transitively, the bodies of while / call / conditional (callers first)."""
    order: list[Computation] = []
    seen: set[int] = set()

    def visit(comp: Computation) -> None:
        if id(comp) in seen:
            return
        seen.add(id(comp))
        order.append(comp)
        for instr in comp.instructions:
            if instr.opcode in _CONTROL_FLOW:
                for callee in instr.called_computations():
                    visit(callee)

    if module.entry is not None:
        visit(module.entry)
    return order


class _Propagation:
    def __init__(self, module: Module, params_allowed: list[bool], output_allowed: list[bool],
                 owner: ModulePass):
        self.module = module
        self.owner = owner
        self.comps = propagated_computations(module)
        self.num_devices = self._device_count()
        self.ctx = RuleContext(self.num_devices, self.leaves)
        self.state: dict[Instruction, Leaves] = {}
        self.fixed: dict[Instruction, list[bool]] = {}
        self.params_allowed = params_allowed
        self.output_allowed = output_allowed
        self.changed = False

    def _device_count(self) -> int:
        n = max(self.module.num_partitions, 1)
        for comp in self.comps:
            for instr in comp.instructions:
                s = instr.sharding
                for leaf in (s.elements if s is not None and s.is_tuple else (s,)):
                    if leaf is not None and leaf.kind is ShardingKind.TILED:
                        n = max(n, leaf.num_devices)
        return n

    # -------------------------------------------------------------- state --
    def leaves(self, instr: Instruction) -> Leaves:
        return self.state.get(instr) or [None] * num_leaves(instr.shape)

    def _initial(self) -> None:
        entry = self.module.entry
        for comp in self.comps:
            for instr in comp.instructions:
                n = num_leaves(instr.shape)
                s = instr.sharding
                if s is not None and s.kind is not ShardingKind.UNKNOWN:
                    leaves = list(s.elements) if s.is_tuple else [s] * n
                    if len(leaves) != n:
                        leaves = [s] * n if not s.is_tuple else [None] * n
                    self.state[instr] = leaves
                    self.fixed[instr] = [x is not None for x in leaves]
                else:
                    self.state[instr] = [None] * n
                    self.fixed[instr] = [False] * n
        for p, allowed in zip(entry.parameters, self.params_allowed):
            if p is not None and not allowed:
                self._pin_replicated(p)
        root = entry.root
        if not all(self.output_allowed):
            fixed = self.fixed[root]
            for i, allowed in enumerate(self.output_allowed[:len(fixed)]):
                if not allowed and not fixed[i]:
                    self.state[root][i] = Sharding.replicated()
                    fixed[i] = True

    def _pin_replicated(self, instr: Instruction) -> None:
        fixed = self.fixed[instr]
        for i, f in enumerate(fixed):
            if not f:
                self.state[instr][i] = Sharding.replicated()
                fixed[i] = True

    def propose(self, instr: Instruction, leaves: Leaves | None) -> None:
        """Offer shardings for `instr`'s leaves; keep a proposal only if it says more."""
        if not leaves or instr not in self.state:
            return
        cur, fixed = self.state[instr], self.fixed[instr]
        if len(leaves) != len(cur):
            return
        shapes = instr.shape.leaves()
        for i, new in enumerate(leaves):
            if new is None or fixed[i]:
                continue
            old = cur[i]
            if old is not None and not _same_manual(old, new, self.num_devices, shapes[i].rank):
                continue
            best = new if old is None else combine([old, new], shapes[i].rank, self.ctx)
            if best is None:
                continue
            if specificity(best) > specificity(old):
                cur[i] = best
                self.changed = True

    # --------------------------------------------------------------- walk --
    def run(self) -> bool:
        self._initial()
        for _ in range(64):
            self.changed = False
            for comp in self.comps:
                for instr in comp.post_order():
                    self._forward(instr)
            for comp in reversed(self.comps):
                for instr in reversed(comp.post_order()):
                    self._backward(instr)
            for comp in self.comps:
                for instr in comp.instructions:
                    if instr.opcode in _CONTROL_FLOW:
                        self._link_callees(instr)
            if not self.changed:
                break
        self._find_manual_regions()
        self._equalize_while_loops()
        return self._write()

    def _forward(self, instr: Instruction) -> None:
        if instr.opcode in _CONTROL_FLOW:
            return
        operands = [self.leaves(o) for o in instr.operands]
        try:
            proposal = rule_for(instr).forward(instr, operands, self.ctx)
        except (TypeError, IndexError, KeyError, ValueError, AttributeError) as e:
            self.owner.remark(instr, f"no forward propagation: {e}", "missed")
            return
        self.propose(instr, proposal)

    def _backward(self, instr: Instruction) -> None:
        result = self.leaves(instr)
        if all(s is None for s in result):
            return
        if instr.opcode in _CONTROL_FLOW:
            return
        rule = rule_for(instr)
        for i, operand in enumerate(instr.operands):
            try:
                proposal = rule.backward(instr, i, result, self.ctx)
            except (TypeError, IndexError, KeyError, ValueError, AttributeError) as e:
                self.owner.remark(instr, f"no backward propagation to operand {i}: {e}", "missed")
                continue
            self.propose(operand, proposal)

    def _link_callees(self, instr: Instruction) -> None:
        """while: operand, result, body parameter, body root and condition parameter agree;
        call: operand i <-> parameter i, result <-> root; conditional: operand i+1 <->
        branch i's parameter, result <-> every branch root."""
        if instr.opcode is Opcode.WHILE:
            body, cond = instr.called["body"], instr.called["condition"]
            group = [instr, body.parameters[0], body.root, cond.parameters[0]]
            for member in group:
                self.propose(member, self.leaves(instr.operands[0]))
                for other in group:
                    self.propose(member, self.leaves(other))
            self.propose(instr.operands[0], self.leaves(instr))
        elif instr.opcode is Opcode.CALL:
            callee = instr.called_computations()[0]
            for operand, param in zip(instr.operands, callee.parameters):
                self.propose(param, self.leaves(operand))
                self.propose(operand, self.leaves(param))
            self.propose(instr, self.leaves(callee.root))
            self.propose(callee.root, self.leaves(instr))
        else:  # conditional
            self.propose(instr.operands[0], [Sharding.replicated()])
            for branch, operand in zip(instr.called_computations(), instr.operands[1:]):
                if branch.parameters:
                    self.propose(branch.parameters[0], self.leaves(operand))
                    self.propose(operand, self.leaves(branch.parameters[0]))
                self.propose(instr, self.leaves(branch.root))
                self.propose(branch.root, self.leaves(instr))

    def _equalize_while_loops(self) -> None:
        """The partitioner needs a while's body parameter, body root and condition parameter
        to carry the while's own sharding."""
        for comp in self.comps:
            for instr in comp.instructions:
                if instr.opcode is not Opcode.WHILE:
                    continue
                body, cond = instr.called["body"], instr.called["condition"]
                group = [instr, body.parameters[0], body.root, cond.parameters[0]]
                pinned = next((m for m in group if all(self.fixed[m])), instr)
                rep = self._completed(pinned)
                for member in group:
                    if member is not pinned and self.state[member] != rep:
                        self.state[member] = list(rep)

    # -------------------------------------------------------------- write --
    def _find_manual_regions(self) -> None:
        """Computations called with manual operands (shard_map bodies) and their callees."""
        self.manual_default: dict[Computation, Sharding] = {}
        for comp in self.comps:
            for instr in comp.instructions:
                if instr.opcode is not Opcode.CALL or not instr.operands:
                    continue
                leaves = [s for o in instr.operands for s in self.leaves(o)]
                if leaves and all(s is not None and _is_manual(s) for s in leaves):
                    default = _manual_replicated(leaves[0], self.num_devices)
                    for callee in instr.called_computations():
                        self._mark_manual(callee, default)

    def _mark_manual(self, comp: Computation, default: Sharding) -> None:
        if comp in self.manual_default:
            return
        self.manual_default[comp] = default
        for instr in comp.instructions:
            if instr.opcode in _CONTROL_FLOW:
                for callee in instr.called_computations():
                    self._mark_manual(callee, default)

    def _default(self, comp: Computation) -> Sharding:
        """Replicated, or "replicated within the manual region" inside a shard_map body."""
        return self.manual_default.get(comp, Sharding.replicated())

    def _completed(self, instr: Instruction) -> Leaves:
        default = self._default(instr.parent)
        return [s if s is not None else default for s in self.state[instr]]

    def _write(self) -> bool:
        changed = False
        for comp in self.comps:
            default = self._default(comp)
            for instr in comp.instructions:
                leaves = [s if s is not None else default for s in self.state[instr]]
                new = Sharding.tuple_of(leaves) if instr.shape.is_tuple else leaves[0]
                old = instr.sharding
                if old is not None and old.kind is not ShardingKind.UNKNOWN and old == new:
                    continue
                instr.sharding = new
                changed = True
        return changed


def _is_manual(s: Sharding) -> bool:
    return s.kind is ShardingKind.MANUAL or (s.kind is ShardingKind.TILED and SubgroupKind.MANUAL in s.subgroups)


def _manual_replicated(s: Sharding, num_devices: int) -> Sharding:
    """The manual sharding of a value that is whole on every device of its manual group."""
    if s.kind is ShardingKind.MANUAL:
        return s
    tm = TileMap.from_sharding(s, num_devices)
    out = None if tm is None else tm.keep_dims(()).to_sharding()
    return out if out is not None else s


def _same_manual(a: Sharding, b: Sharding, num_devices: int, rank: int) -> bool:
    """Shardings inside and outside a manual region never replace each other."""
    def manual_key(s: Sharding):
        if s.kind is ShardingKind.MANUAL:
            return ("manual",)
        if s.kind is ShardingKind.TILED and SubgroupKind.MANUAL in s.subgroups:
            tm = TileMap.from_sharding(s, num_devices)
            return ("partial", tm.manual_size, tuple(tm.manual)) if tm is not None else ("partial",)
        return ()
    return manual_key(a) == manual_key(b)


def _sharding_calls_to_copies(module: Module) -> bool:
    """custom-call "Sharding" -> copy with the same sharding, except at manual-region boundaries."""
    changed = False
    for comp in propagated_computations(module):
        for instr in comp.post_order():
            if instr.custom_call_target != "Sharding":
                continue
            if any(u.custom_call_target in ("SPMDFullToShardShape", "SPMDShardToFullShape") for u in instr.users):
                continue
            copy = Instruction(Opcode.COPY, instr.shape, [instr.operands[0]], name=instr.name)
            copy.sharding = instr.sharding
            if "metadata" in instr.attributes:
                copy.attributes["metadata"] = instr.attributes["metadata"]
            comp.replace(instr, copy)
            changed = True
    return changed
