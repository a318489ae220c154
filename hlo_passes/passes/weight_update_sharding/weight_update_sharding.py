"""weight-update-sharding: shard the optimizer update of data-parallel training across
the devices that all-reduce its gradients (Xu et al. 2020, "Automatic Cross-Replica
Sharding of Weight Update in Data-Parallel Training").

In data-parallel training every device all-reduces the gradient and then runs the same
weight update on the whole weight and the whole optimizer state.  When the reduced
gradient feeds only that update, each device can instead update 1/N of it:

    before                                   after (N devices, S elements, P = S padded to N·c)
    g  = all-reduce(dg)                      f  = pad(reshape(dg, [S]), [P])
    m' = b1*m + (1-b1)*g                     gs = reduce-scatter(f)                       [c]
    w' = w - lr * m' / (sqrt(v')+eps)        ms = dynamic-slice(pad(reshape(m)), i·c, c)  [c]
    ROOT (w', m', ...)                       m's = b1*ms + (1-b1)*gs ; w's = ...          [c]
                                             w' = reshape(slice(all-gather(w's), S))      full
                                             m' = reshape(slice(all-gather(m's), S))      full

(i is the device's position in its group.)  The groups are whatever the gradient is reduced
over: all devices in pure data parallelism, the `data` axis of a data x model mesh, where the
weights and their state are already tiled over `model` and each device of a data group updates
1/N of its model tile.  Reductions over the whole gradient or weight (global-norm clipping,
LAMB's ‖w‖ and ‖u‖) reduce the chunk, padding masked out, and all-reduce the scalar (the pass
packs its scalars into one all-reduce per dependency level).  Reductions over some dimensions
(Adafactor's factored moments) tile the shard: a factor that keeps the tile dimension stays on
the device, one reduced over it is all-reduced as a vector and held whole.  With
`keep-state-sharded` (offline files, where the signature may change) the optimizer state stays
sharded between steps: state parameters take and state outputs return each device's tile, their
shardings refined by the data groups (`state.py`), so no state is gathered.

Steps:
1. As a trial on the module (`Module.trial`: taken back afterwards from a compact snapshot, a
   quarter of a copy's memory, of the computations it may change, `trial_computations`): `canonicalize` (variadic all-reduces split, reduce-scatter +
   all-gather pairs joined, calls on gradients inlined, XLA's fused form normalized), then
   all-reduces of values every device of the group already holds become `x * N`
   (`simplify_replicated_all_reduces`), then `analysis` finds the components and
   `rewrite` rewrites each, priced with the partitioner's cost model (`pricing`).
2. On the module: the same, for the components that pay (all the analysis allows with
   `only-when-it-pays=false`); then small tensors' reduce-scatters and all-gathers are packed
   into one each (`packing`).  A module where nothing pays comes back untouched.

Anything the analysis does not model leaves the all-reduce as it is, with a "missed" remark
saying why; a rewrite that does not pay gets a "missed" remark with both estimates.
Scheduled modules (`is_scheduled=true`) are declined: XLA CPU compiles no standalone
elementwise ops after its scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.pass_base import ModulePass, Remark, option, source_location
from hlo_passes.passes.registry import register_pass
from hlo_passes.passes.spmd.cost_model import CostModel
from hlo_passes.passes.weight_update_sharding.analysis import Component, analyze_computation
from hlo_passes.passes.weight_update_sharding.canonicalize import canonicalize, simplify_replicated_all_reduces
from hlo_passes.passes.weight_update_sharding.formatting import Formatting
from hlo_passes.passes.weight_update_sharding.fused import normalize
from hlo_passes.passes.weight_update_sharding.packing import count_levels, pack_collectives
from hlo_passes.passes.weight_update_sharding.pricing import Price, kernel_estimate
from hlo_passes.passes.weight_update_sharding.rewrite import ComponentRewriter, DeviceIndex


@register_pass
class WeightUpdateSharding(ModulePass):
    """Reduce-scatter gradients, update 1/N of each weight and optimizer state per device,
    all-gather the new weights (see the module docstring for a before/after)."""

    name = "weight-update-sharding"
    summary = "Shard the data-parallel weight update across the gradient all-reduce's devices"

    @dataclass(frozen=True)
    class Options:
        keep_state_sharded: bool = option(
            False, "optimizer state stays sharded: state parameters and outputs become per-device tiles")
        assume_replicated_parameters: bool = option(
            False, "take ENTRY parameters as identical on every device (data-parallel weights); "
                   "they are marked parameter_replication={true}")
        only_when_it_pays: bool = option(
            True, "rewrite an update only when the cost model says it is cheaper (false: every one allowed)")
        cost_profile: Literal["accelerator", "cpu"] = option(
            "accelerator", "hardware profile of the cost model that prices the rewrite")
        pack_threshold_bytes: int = option(
            4 << 20, "pack the pass's reduce-scatters (and all-gathers) of up to this many bytes together "
                     "into one each (0: one per tensor)")

    def run(self, module: Module) -> bool:
        if module.header_attr("is_scheduled", False):
            # XLA CPU's thunk emitter takes no standalone elementwise ops after scheduling (its
            # FusionWrapper has run), and the rewrite creates some: decline the whole module.
            if any(i.opcode is Opcode.ALL_REDUCE for i in module.all_instructions()):
                self.remark(None, "not sharded: the module is already scheduled (is_scheduled=true); "
                                  "run before scheduling (jax_hook stage='pre-scheduler')", kind="missed")
            return False
        # 1. Everything as a trial (the module taken back afterwards, see Module.trial): what
        # the analysis allows, and what pays.  (`priced` holds names and prices only.)
        changing = trial_computations(module)
        with module.trial(changing) as trial:
            priced = self._shard(trial, chosen=None, in_trial=True)
        chosen = set(priced)
        if chosen and self.options.only_when_it_pays:
            # 2. Packing merges the pass's small collectives, so a component's price leaves out
            # their latency; one whose reduce-scatter stands alone after packing (too large, or
            # dependent on the others) pays a collective's latency more than the all-reduce it
            # replaces, and must still pay with it (unless it keeps state sharded, see below).
            said = len(self.remarks)
            with module.trial(changing) as candidate:
                alone = self._shard(candidate, chosen=chosen, in_trial=True)
            del self.remarks[said:]
            for name in alone:
                cost, stems, kept = priced[name]
                if not kept and not cost.pays_its_latency:
                    chosen.discard(name)
                    message = ("not sharded: its reduce-scatter and all-gather cannot be packed with others, "
                               "and one more collective's latency costs more than the rewrite saves: "
                               + cost.describe(latency=True))
                    self.remarks.extend(replace(r, message=message) for r in stems)
        if not chosen:
            # Nothing to shard: only all-reduces of already-replicated values are simplified,
            # where they stand (without splitting or inlining anything).
            changed = False
            for comp in update_computations(module):
                for new, name in simplify_replicated_all_reduces(module, comp):
                    self.remark(new, f"%{name}: an all-reduce of a value every device of its groups already "
                                     "holds is that value times the group size", "applied")
                    changed = True
            return changed
        # 3. The same on the module, for the components that pay.
        self._shard(module, chosen=chosen)
        return True

    # ---------------------------------------------------------------- steps --
    def _shard(self, module: Module, chosen: set[str] | None, in_trial: bool = False) -> dict:
        """Rewrite `module`.  Trial (`chosen` None): every component the analysis allows, priced;
        returns, by the name of the first all-reduce of each that pays, its price and its stems'
        remarks.  Otherwise: only `chosen`, then packed; returns the names of the components
        whose reduce-scatter packing left alone.  `in_trial`: `module` is inside a
        `Module.trial`, its changes undone afterwards, so its computations are not sorted at the
        end (nobody reads the order, and sorting the entry of a big step was the pass's peak:
        the check's set and the new order beside the old)."""
        trial = chosen is None
        note = self.remark if trial else (lambda *a, **k: None)
        model = CostModel.for_profile(self.options.cost_profile)
        price = (lambda region, users, roots: kernel_estimate(region, module, model, users=users, roots=roots)
                 ) if trial else None
        computations = update_computations(module)
        if _in_fused_form(module, computations):
            normalize(module, computations)
        canonicalize(module, computations)
        pays: dict[str, tuple[Price, list[Remark], bool]] = {}
        alone: set[str] = set()
        for comp in update_computations(module):
            for new, name in simplify_replicated_all_reduces(module, comp):
                if not trial:
                    self.remark(new, f"%{name}: an all-reduce of a value every device of its groups already "
                                     "holds is that value times the group size (not sharded)", "applied")
            plan = analyze_computation(comp, module,
                                       assume_replicated_parameters=self.options.assume_replicated_parameters)
            for instr, reason in plan.skipped:
                note(instr, f"not sharded: {reason}", kind="missed")
            index = DeviceIndex(module, comp)
            made: list[Instruction] = []
            sizes: dict[Instruction, int] = {}
            scattered: dict[str, list[Instruction]] = {}
            for component in plan.components:
                first = component.stems[0].all_reduce
                if component.declined is not None:
                    _, reason = component.declined
                    for stem in component.stems:
                        note(stem.all_reduce, f"not sharded: {reason}", kind="missed")
                    continue
                if not trial and first.name not in chosen:
                    continue
                rewriter = self._rewriter(module, comp, component, index, price, quiet=trial)
                stems = [Remark(self.name, "", s.all_reduce.name, comp.name, source_location(s.all_reduce), "missed")
                         for s in component.stems]
                summary = self._summary(component, rewriter)
                with comp.recording_additions() as made_here:
                    rewriter.apply()
                if trial:
                    # The paper's rewrite moves the bytes of the all-reduce it replaces and saves
                    # (N-1)/N of the update: it is priced only where it moves more, when the
                    # signature returns optimizer state whole (all-gathered) or the formatting pads.
                    gathered, padded = len(rewriter.gathered_state), rewriter.fmt.padded > rewriter.fmt.size
                    added = [i for i in made_here if i in comp]
                    with_rewrite = kernel_estimate(added, module, model, roots=frozenset({comp.root}))
                    if self.options.pack_threshold_bytes > 0 and rewriter.reduced:
                        # Its scalar all-reduces are packed, one per dependency level (`packing`):
                        # as many launches as levels, not as norms.
                        levels = count_levels(rewriter.reduced, set(added))
                        with_rewrite = replace(with_rewrite, collectives=with_rewrite.collectives
                                               - len(rewriter.reduced) + levels)
                    cost = Price(rewriter.removed_cost, with_rewrite, model.profile)
                    # State kept sharded holds (N-1)/N less per device, which the time estimate
                    # does not weigh: with keep-state-sharded the padding's copies are the price
                    # the option asks to pay for it (only gathered state is priced then).
                    kept = bool(rewriter.kept_outputs)
                    if (not (gathered or padded) or (kept and not gathered) or cost.pays
                            or not self.options.only_when_it_pays):
                        pays[first.name] = (cost, stems, kept)
                    else:
                        why = ([f"{gathered} optimizer-state output(s) all-gathered (the signature returns them "
                                "whole; keep-state-sharded=true keeps them sharded)"] if gathered else []) + \
                              ([f"the gradient padded from {rewriter.fmt.size} to {rewriter.fmt.padded} elements"]
                               if padded else [])
                        message = (f"not sharded: the rewrite costs more than it saves ({'; '.join(why)}): "
                                   + cost.describe())
                        self.remarks.extend(replace(r, message=message) for r in stems)
                    continue
                kept, gathered = len(rewriter.kept_outputs), len(rewriter.gathered)
                self.remarks.append(replace(stems[0], kind="applied", message=f"{summary}; {gathered} output(s) "
                                            "all-gathered" + (f", {kept} kept sharded" if kept else "")))
                made += rewriter.scattered + rewriter.gathered + rewriter.reduced
                scattered[first.name] = rewriter.scattered
                for x in rewriter.scattered + rewriter.gathered + rewriter.reduced:
                    sizes[x] = component.group_size
            if made and self.options.pack_threshold_bytes > 0:
                pack_collectives(module, comp, made, sizes, self.options.pack_threshold_bytes)
            alone |= {name for name, rs in scattered.items() if any(x.parent is comp for x in rs)}
            if not in_trial:
                comp.sort_topologically()
        return pays if trial else alone

    def _rewriter(self, module: Module, comp: Computation, component: Component, index: DeviceIndex,
                  price, quiet: bool) -> ComponentRewriter:
        keep = self.options.keep_state_sharded
        # State kept sharded needs chunks that are tiles (a reshape inside the update leaves
        # only the flat layout, whose chunks are tiles when nothing is padded); so do reductions
        # over some of the gradient's dimensions (a tile holds whole rows of the others).
        tiled = (keep or component.reduced) and not component.reshapes
        fmt = (Formatting.best_tiled if tiled else Formatting.flat)(component.group_size, component.dims)
        remark = (lambda *a: None) if quiet else (lambda instr, msg, kind: self.remark(instr, msg, kind=kind))
        return ComponentRewriter(module, comp, component, fmt, keep_state=keep,
                                 assume_parameters=self.options.assume_replicated_parameters, index=index,
                                 remark=remark, price=price)

    @staticmethod
    def _summary(component: Component, rewriter: ComponentRewriter) -> str:
        names = ", ".join(f"%{s.all_reduce.name}" for s in component.stems)
        fmt = rewriter.fmt
        return (f"sharded the update of {list(component.dims)} over {component.group_size} devices "
                f"({names}; {fmt.chunk} elements per device, {fmt.describe()})")


def _in_fused_form(module: Module, computations: list[Computation]) -> bool:
    """Has XLA combined the gradient all-reduces or fused their users (see `fused.normalize`)?"""
    for comp in computations:
        for instr in comp.instructions:
            if instr.opcode is Opcode.ALL_REDUCE and instr.shape.is_tuple:
                return True
            if instr.opcode is Opcode.FUSION and any(o.opcode is Opcode.ALL_REDUCE for o in instr.operands):
                return True
    return False


def trial_computations(module: Module) -> list[Computation]:
    """The computations `_shard` may change in a trial, the only ones the trials keep
    (`Module.trial`; the module's reducers and per-device copies of called computations are
    most of it): the entry (a region's rewrite changes the call to it and the ROOT), the update
    computations holding an all-reduce or a reduce-scatter (every split, join, inlining,
    simplification and rewrite starts from one in its computation; in a trial it sorts none),
    and the computations their fusions call (XLA's fused form: `fused.normalize` hoists a
    gradient's transposes out of the fused computation, in place)."""
    changing: list[Computation] = []
    for comp in update_computations(module):
        if comp is module.entry or any(i.opcode is Opcode.ALL_REDUCE or i.opcode is Opcode.REDUCE_SCATTER
                                       for i in comp._instructions):
            changing.append(comp)
            changing += [callee for i in comp._instructions if i.opcode is Opcode.FUSION
                         for callee in i.called_computations()]
    return list(dict.fromkeys(changing))


def update_computations(module: Module) -> list[Computation]:
    """The entry and the computations it calls (manual-region bodies), callers first."""
    order, seen = [], set()
    stack = [module.entry]
    while stack:
        comp = stack.pop()
        if comp in seen:
            continue
        seen.add(comp)
        order.append(comp)
        for instr in comp.instructions:
            if instr.opcode is Opcode.CALL:
                stack.extend(instr.called_computations())
    return order
