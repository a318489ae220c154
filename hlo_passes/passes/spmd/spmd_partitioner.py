"""spmd-partition: rewrite a sharded (global-view) module into the per-device program.

GSPMD (Xu et al. 2021): every instruction carries the sharding of its result;
walking each computation in post order, a handler per opcode family
(handlers/) emits the per-device computation from the operands' per-device
values, resharding operands (reshard.py) where the op needs another layout.

    ENTRY %main {
      %x = f32[16,32] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
      %w = f32[32,64] parameter(1), sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
      ROOT %d = f32[16,64] dot(%x, %w), ..., sharding={devices=[4,2]<=[8]}
    }
  becomes (num_partitions=8)
    ENTRY %main_spmd {
      %x = f32[4,32] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
      %w = f32[32,32] parameter(1), sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
      ROOT %d = f32[4,32] dot(%x, %w), ..., sharding={devices=[4,2]<=[8]}
    }

ENTRY parameters and the ROOT keep their logical sharding (what the runtime
uses to slice inputs and reassemble the result); nothing else does.  The entry is renamed
`NAME_spmd`, as XLA names its partitioned entry.  Missing
shardings are completed by sharding-propagation first; an op without a native
rule is computed replicated (operands all-gathered, the result sliced) and a
"missed" remark says so.  Like XLA's partitioner, it ends with a cleanup (option `cleanup`):
call inlining (all but manual regions' bodies, as XLA), dce, tuple-simplifier, a layout-insensitive cse, which also merges twin collectives such as
two psums of one value, and dce again for what the merges left dead.

Two inputs are refused (an input error, exit 2 on the command line), never partitioned into a
program that computes something else:

* a per-device program (its ENTRY named `*_spmd`: XLA's `after_spmd-partitioning` dump, or
  this pass's own output): its shapes are per-device already, so partitioning it again would
  split every shard once more;
* `partition-id` outside a manual (shard_map) region.  In a global program its value is
  ambiguous (is the op replicated, or the data?), so XLA's partitioner refuses it too; kept as
  each device's own id it would give every device a different value where the global program
  has one.  Inside manual regions it is the program's own device index and is kept.
  (`replica-id` is not affected: partitioning leaves replicas as they are.)

And shardings no rule can use are refused (`refuse_unusable_shardings`): unreduced ones
(partial sums, JAX's `unreduced=`), and ones that do not fit their values' shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from hlo_passes._gc import collector_paused
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.program_kind import manual_instructions
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass
from hlo_passes.passes.spmd.cost_model import ZERO, CostModel, Estimate
from hlo_passes.passes.spmd.handlers import Handler
from hlo_passes.passes.spmd.handlers.fallback import whole_per_manual_group
from hlo_passes.passes.spmd.implicit_batching import make_iota_batching_explicit
from hlo_passes.passes.spmd.partition_context import (Emitter, ManualGroupsMismatch, PartitionContext, PValue,
                                                       is_manual, is_partially_manual, local_shape, root_of)
from hlo_passes.passes.spmd.plan_trials import alternatives, annotated_gathers, try_alternatives, lookups_worth_a_trial
from hlo_passes.passes.spmd.recompute import recomputed_whole
from hlo_passes.passes.spmd.reshard import cost as reshard_cost
from hlo_passes.passes.spmd.reshard import reshard


@register_pass
class SpmdPartitioner(ModulePass):
    """See the module docstring."""

    name = "spmd-partition"
    summary = "Partition a sharded module into the per-device SPMD program"

    @dataclass(frozen=True)
    class Options:
        num_partitions: int = option(0, "number of devices (0: the module's num_partitions, else the devices its "
                                            "annotations name)")
        cleanup: bool = option(True, "end with call inlining, dce, tuple-simplifier, cse{layout-sensitive=false}, dce, "
                                            "as XLA's partitioner ends with its spmd-cleanup")
        cost_profile: Literal["accelerator", "cpu"] = option("accelerator", "hardware profile the cost model prices every choice with "
                                                  "(cost_model.PROFILES: accelerator, cpu)")

    def run(self, module: Module) -> bool:
        n = self.options.num_partitions or module.num_partitions
        if n <= 1 and not self.options.num_partitions:
            from hlo_passes.passes.spmd.sharding_propagation import annotated_device_count

            n = annotated_device_count(module)  # JAX's lowered text records no num_partitions
            if n > 1:
                self.remark(None, f"the module records no num_partitions: partitioned for the {n} devices its "
                                  "annotations name", "applied")
        if n <= 1:
            self.remark(None, "num_partitions is 1: nothing to partition", "missed")
            return False
        _refuse_what_it_cannot_partition(module)
        model = CostModel.for_profile(self.options.cost_profile)
        with collector_paused():  # see hlo_passes/_gc.py: on a 24-layer step it ran 1.4 of 5 s
            # see plan_trials: a lookup's conflict is tried both ways, from the module as it is now
            from hlo_passes.passes.spmd.sharding_propagation import is_fully_sharded

            mark = len(self.remarks)
            before = module.snapshot() if not is_fully_sharded(module) and lookups_worth_a_trial(module) else None
            annotated = annotated_gathers(module) if before is not None else set()
            _complete_shardings(module, self)
            found = alternatives(module, annotated) if before is not None else []
            if not found:
                before = None
            self._plan(module, n, model, propagate=False)
            if before is not None:
                try_alternatives(module, before, found, model, lambda m: self._plan(m, n, model, propagate=True), self,
                                 mark)
        _name_partitioned_entry(module)
        return True

    def _plan(self, module: Module, n: int, model: CostModel, *, propagate: bool) -> None:
        """Propagate (when asked), partition and clean up `module` in place."""
        if propagate:
            _complete_shardings(module, self)
        if make_iota_batching_explicit(module):
            self.remark(None, "gather/scatter index components that are an iota made explicit batching dims")
        partitioner = Partitioner(PartitionContext(module, n, self, model))
        partitioner.run()
        if self.options.cleanup:
            _cleanup(module, self, partitioner.manual_bodies)


def _remade(op: Instruction, src: Sharding, dst: Sharding) -> bool:
    """Is `op` made again in `dst` rather than moved from `src` (`Partitioner._made_again`, and
    `move_cost`, which prices it so): a broadcast or an iota, outside manual regions."""
    return (op.opcode in (Opcode.BROADCAST, Opcode.IOTA) and op.shape.is_array
            and not is_manual(src) and not is_manual(dst))


def _refuse_what_it_cannot_partition(module: Module) -> None:
    """Raise an input error for a module this pass cannot partition without changing what it
    computes (see the module docstring): shardings no rule can use, a per-device program, or
    partition-id outside a manual region."""
    from hlo_passes.passes.spmd.sharding_propagation import PropagationError, refuse_unusable_shardings

    refuse_unusable_shardings(module)
    entry = module.entry
    if entry is not None and entry.name.endswith("_spmd"):
        raise PropagationError(f"ENTRY {entry.name} is a partitioned (per-device) program, as its name says: its "
                               "shapes are per-device already; spmd-partition takes the global program "
                               "(JAX's lowering, or a dump from before spmd-partitioning)")
    ids = [i for i in module.all_instructions() if i.opcode is Opcode.PARTITION_ID]
    if not ids:
        return
    manual = manual_instructions(module)
    outside = [i for i in ids if i not in manual]
    if outside:
        raise PropagationError(f"{outside[0].name}: partition-id outside a manual (shard_map) region; in a global "
                               "program its value is ambiguous (XLA's partitioner refuses it too): compute the "
                               "device index inside a shard_map region, or give the op sharding={manual}")


def _name_partitioned_entry(module: Module) -> None:
    """`main` → `main_spmd`, as XLA's partitioner names the entry of the program it writes: the
    mark by which a reader (ir/program_kind.py) tells a per-device program from a global one
    when nothing else does (a partition that needed no collective)."""
    entry = module.entry
    if entry is None or entry.name.endswith("_spmd"):
        return
    module.computation_names.release(entry.name)
    entry.name = module.computation_names.unique(f"{entry.name}_spmd")


def _cleanup(module: Module, owner: ModulePass, manual_bodies: set[Computation]) -> None:
    """Inline the calls, then merge twins in the per-device program: JAX emits one reducer computation per psum,
    so two psums of one value stay two all-reduces until cse sees that their reducers are
    the same computation; JAX's duplicate constants; and the few index computations
    (iota, partition-id offsets, dynamic-slices) that two reshards of one value emit
    alike.  XLA's partitioner ends the same way (its spmd-cleanup pipeline runs DCE, the
    tuple simplifier and a layout-insensitive CSE), and its partitioned programs in the corpus
    have these merged.  The dce before cse drops what the handlers emitted and nobody used
    (values the input itself left dead, reshards a later one superseded); the dce after it
    drops the reducers and index computations the merges orphaned.

    XLA inlines every call before it partitions, all but the bodies of manual regions
    (shard_map), which it keeps as calls; so do we, after partitioning (each call site has its
    own partitioned body by then).  Only then can cse see that a value computed inside a call
    (say the mean inside `jnp.var`) is one computed beside it too."""
    from hlo_passes.passes.cleanup.call_inliner import inline_calls
    from hlo_passes.passes.cleanup.cse import CommonSubexpressionElimination
    from hlo_passes.passes.cleanup.dce import DeadCodeElimination
    from hlo_passes.passes.cleanup.tuple_simplifier import TupleSimplifier

    def inlined_callee(call: Instruction) -> Computation | None:
        callee = call.called.get("to_apply") if call.opcode is Opcode.CALL else None
        if (isinstance(callee, Computation) and callee not in manual_bodies
                and not call.control_predecessors and not call.control_successors):
            return callee
        return None

    # Sizes once inlined, callees first (linear): bodies shared by many sites (see
    # `Partitioner.partition`) would be copied once per call path, so calls that fan out stay
    inlined: dict[Computation, int] = {}
    for comp in module.computation_post_order():
        inlined[comp] = sum(inlined[callee] if (callee := inlined_callee(i)) else 1 for i in comp.instructions)
    before, after = sum(len(c.instructions) for c in module.computations), sum(inlined.values())
    if after <= 3 * before:  # (`after` counts an inlined body also where it stays: at most 2x)
        inline_calls(module, lambda call: inlined_callee(call) is not None)
    else:
        owner.remark(None, f"calls kept: inlining them would copy bodies along every call path "
                           f"({after:,} instructions from {before:,})")
    for cleanup in (DeadCodeElimination(remove_cross_partition_collectives=True), TupleSimplifier(),
                    CommonSubexpressionElimination(layout_sensitive=False),
                    DeadCodeElimination(remove_cross_partition_collectives=True)):
        cleanup.run(module)
        owner.remarks.extend(cleanup.remarks)


def _complete_shardings(module: Module, owner: ModulePass) -> None:
    try:
        from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation, is_fully_sharded
    except ImportError:  # pragma: no cover - propagation ships with the package
        owner.remark(None, "sharding-propagation unavailable: unannotated values are replicated", "missed")
        return
    if not is_fully_sharded(module):
        prop = ShardingPropagation()
        prop.run(module)
        owner.remarks.extend(prop.remarks)


def target_sharding(instr: Instruction) -> Sharding:
    """The sharding `instr`'s result should have; unannotated (or maximal) means replicated."""
    return _complete(instr.sharding if "sharding" in instr.attributes else None, instr.shape)


def _complete(s: Sharding | None, shape: Shape) -> Sharding:
    if isinstance(shape, TupleShape):
        elems = [s.subsharding(shape, i) if s is not None and s.is_tuple else s for i in range(len(shape.elements))]
        return Sharding.tuple_of(_complete(e, sh) for e, sh in zip(elems, shape.elements))
    if s is None or s.kind in (ShardingKind.UNKNOWN, ShardingKind.MAXIMAL) or s.is_tuple:
        return Sharding.replicated()
    return s.without_metadata() if s.metadata else s


# Partitioned copies of one called body with the same shardings before further call sites share
# one (see `Partitioner.partition`).
SHARED_AFTER_COPIES = 8


class Partitioner:
    """Walks computations, dispatches instructions to handlers, keeps per-device values."""

    def __init__(self, ctx: PartitionContext):
        self.ctx = ctx
        self.values: dict[Instruction, PValue] = {}
        self._reshards: dict[tuple[Instruction, Sharding], PValue] = {}
        # per-device value -> the wider value it was sliced from without communication (see
        # `reshard`); users wanting the wider form take it instead of gathering the slice
        self._wider: dict[Instruction, PValue] = {}
        # A result moved by collectives to its sharding -> the value it was moved from (see
        # `reshard`): a user wanting that sharding back takes it instead of moving it again.
        self._moved_from: dict[Instruction, PValue] = {}
        self._target_override: dict[Instruction, Sharding] = {}  # a value made again in another sharding
        self._targets: dict[Instruction, tuple[object, Sharding]] = {}  # see `target`
        self._em: Emitter | None = None  # while `partition` runs: see `em`
        self._kept: set[Computation] = set()
        self.manual_bodies: set[Computation] = set()  # partitioned manual regions: the cleanup keeps their calls
        self._origin: dict[Computation, str] = {}  # a partitioned copy -> the name of what it copies
        # shared calls' (body, parameter shardings, root sharding, manual, name) -> how many partitioned
        # copies were made, and the last (the copy, its root sharding)
        self._partitioned: dict[tuple[object, ...], tuple[int, tuple[Computation, Sharding] | None]] = {}
        # entry parameters only one device is given (`{maximal device=N}`) -> N
        self._held_by_one_device: dict[Instruction, int] = {}

    # -------------------------------------------------------------- driver --
    def run(self) -> None:
        module = self.ctx.module
        old = list(module.computations)
        entry = module.entry
        assert entry is not None, "spmd-partition: the module has no entry computation"
        params = [target_sharding(p) for p in entry.parameters]
        self._held_by_one_device = {p: s.device for p in entry.parameters
                                    if (s := p.sharding) is not None and s.kind is ShardingKind.MAXIMAL
                                    and s.device is not None and not p.shape.is_tuple}
        new_entry, root_sharding = self.partition(entry, params, target_sharding(root_of(entry)),
                                                  name=entry.name)
        for p, s in zip(new_entry.parameters, params):
            p.sharding = s
        for p, device in self._held_by_one_device.items():  # the caller's contract, kept
            assert p.parameter_number is not None
            new_entry.parameters[p.parameter_number].sharding = Sharding.maximal(device)
        root_of(new_entry).sharding = root_sharding
        new_entry.is_entry = True
        module.entry = new_entry
        entry.is_entry = False
        keep = _reachable(new_entry)
        module.computations = [c for c in module.computation_post_order() if c in keep]  # callees first
        for c in old:
            if c not in keep:
                module.computation_names.release(c.name)
                c.discard()  # freed now, not left to the cyclic collector (paused: see SpmdPartitioner.run)
        for c in module.computations:  # partitioned copies take their original names back
            base = self._origin.get(c)
            if base is not None and base not in module.computation_names:
                module.computation_names.release(c.name)
                module.computation_names.reserve(base)
                c.name = base
        module.num_partitions = self.ctx.n
        module.attributes.pop("entry_computation_layout", None)
        for key in ("allow_spmd_sharding_propagation_to_parameters", "allow_spmd_sharding_propagation_to_output"):
            module.attributes.pop(key, None)

    def partition(self, comp: Computation, param_shardings: list[Sharding], root_sharding: Sharding | None,
                  *, name: str | None = None, manual: bool = False, shared: bool = False
                  ) -> tuple[Computation, Sharding]:
        """A per-device copy of `comp` whose parameters have `param_shardings`; its root is
        resharded to `root_sharding` (when given).  Returns the copy and its root's sharding.
        `manual`: the body of a manual region, copied instruction by instruction.

        `shared` (calls): each call site gets a copy of its own, as XLA's (which inlines every
        call) and the cost model's view of a body with one caller want, up to
        `SHARED_AFTER_COPIES` copies of one body with the same shardings; further sites share
        the last, so calls of one body from many sites (a body calling its callee twice, thirty
        deep, is 2^30 sites) make a bounded number of partitioned bodies.  (Loop bodies and
        branches always keep a copy each, one caller per body.)"""
        if shared:
            key = (comp, tuple(param_shardings), root_sharding, manual, name)
            copies, last = self._partitioned.get(key, (0, None))
            if last is not None and copies >= SHARED_AFTER_COPIES:
                return last
        done = self._partition_copy(comp, param_shardings, root_sharding, name=name, manual=manual)
        if shared:
            self._partitioned[key] = (copies + 1, done)
        if manual or any(is_manual(s) for s in param_shardings):
            self.manual_bodies.add(done[0])
        return done

    def _partition_copy(self, comp: Computation, param_shardings: list[Sharding], root_sharding: Sharding | None,
                        *, name: str | None, manual: bool) -> tuple[Computation, Sharding]:
        module = self.ctx.module
        new = Computation(f"{name or comp.name}.spmd")
        new.attributes = dict(comp.attributes)
        new.print_signature = comp.print_signature
        module.add_computation(new, before=comp)
        self._origin[new] = comp.name
        for instr in comp.instructions:
            module.names.release(instr.name)
        saved = (self._em, self._reshards, self._wider, self._moved_from)
        self._em, self._reshards, self._wider, self._moved_from = Emitter(self.ctx, new), {}, {}, {}
        from hlo_passes.passes.spmd.handlers import handler_for
        from hlo_passes.passes.spmd.handlers.structural import manual as copy_manual

        try:
            for instr in comp.post_order():
                self.em.metadata = instr.attributes.get("metadata")
                if instr.opcode is Opcode.PARAMETER:
                    assert instr.parameter_number is not None
                    s = param_shardings[instr.parameter_number]
                    value = PValue(self.clone(instr, [], local_shape(instr.shape, s)), s, instr.shape)
                    if instr in self._held_by_one_device:
                        value = self._broadcast_from(value, self._held_by_one_device[instr])
                elif manual:
                    value = copy_manual(self, instr)
                else:
                    value = self._partition_instruction(instr, handler_for(instr))
                self.values[instr] = value
                self._targets.pop(instr, None)  # see `target`
            root = self.values[root_of(comp)]
            self.em.metadata = root_of(comp).attributes.get("metadata")
            if root_sharding is not None:
                root = reshard(self.em, root, root_sharding)
            new.root = root.instr
            return new, root.sharding
        finally:
            self._em, self._reshards, self._wider, self._moved_from = saved

    def _broadcast_from(self, value: PValue, device: int) -> PValue:
        """An entry parameter sharded `{maximal device=N}`: only device N is given it (XLA's
        calling convention; the other devices' buffers are undefined), so the program reads it
        as the replicated value an all-reduce makes of device N's buffer and every other
        device's zeros, as XLA's partition does.  (Carrying floats as integer bits would keep a
        zero's sign, at two bitcasts an element of FLOPs.)"""
        em = self.em
        b = em.b()
        x = value.instr
        shape = x.array_shape
        mask = b.broadcast(em.is_device(device), ArrayShape(PrimitiveType.PRED, shape.dims))
        zero = False if shape.element_type is PrimitiveType.PRED else 0
        kept = b.select(mask, x, em.broadcast_scalar(zero, shape.element_type, tuple(shape.dims)))
        return PValue(em.sum_of_parts(kept, [tuple(range(self.ctx.n))]), value.sharding, value.global_shape)

    def _partition_instruction(self, instr: Instruction, handler: Handler) -> PValue:
        """Run `handler`.  Inside a partially manual region it may ask for a resharding that
        would leave the region's manual groups (ManualGroupsMismatch); then whatever it emitted
        is taken back and the op is computed whole per manual group, as before this region was
        partitioned over its automatic axes (fallback.whole_per_manual_group)."""
        if not is_partially_manual_instr(instr, self):
            return handler(self, instr)
        em = self.em
        checkpoint, reshards = em.checkpoint(), len(self._reshards)
        try:
            return handler(self, instr)
        except ManualGroupsMismatch as e:
            em.rollback(checkpoint)
            for key in list(self._reshards)[reshards:]:
                del self._reshards[key]
            em.metadata = instr.attributes.get("metadata")
            return whole_per_manual_group(self, instr, str(e))

    # ------------------------------------------------------ handler API --
    @property
    def em(self) -> Emitter:
        """The emitter of the computation being partitioned (there is one while `partition` runs)."""
        if self._em is None:
            raise RuntimeError("the partitioner emits only while it partitions a computation")
        return self._em

    def value(self, instr: Instruction) -> PValue:
        return self.values[instr]

    def operand(self, instr: Instruction, i: int) -> PValue:
        return self.values[instr.operands[i]]

    def operand_as(self, instr: Instruction, i: int, sharding: Sharding) -> Instruction:
        """Operand `i`'s per-device value in `sharding` (collectives shared among users)."""
        op = instr.operands[i]
        return self.resharded(op, sharding).instr

    def resharded(self, op: Instruction, sharding: Sharding) -> PValue:
        value = self.values[op]
        if value.stand_in:
            raise RuntimeError(f"{op.name}: read, but partitioned as unread (a stand-in): "
                               "this would compute a wrong value")
        if value.sharding == sharding:
            return value
        key = (op, sharding)
        if key not in self._reshards:
            self._reshards[key] = (self._tuple_rebuilt(op, sharding) or self._made_again(op, value, sharding)
                                   or recomputed_whole(self, op, value, sharding)
                                   or reshard(self.em, self._cheapest_source(op, value, sharding), sharding))
        return self._reshards[key]

    def move_cost(self, op: Instruction, sharding: Sharding) -> Estimate:
        """What `resharded(op, sharding)` would cost: nothing where `op` lies so already or a
        user has had it made, nothing for an iota or a broadcast of a scalar, which are made
        again in `sharding` (`_made_again`), else the reshard's price.  Handlers price operands
        with it: priced as moved, a zero buffer updated in place made the plan move it (a
        dynamic-update-slice into a broadcast tiled 2x2 took an all-to-all of the whole buffer
        there and back, 8.5x XLA's bytes, rather than making the zeros again untiled)."""
        value = self.values[op]
        if value.sharding == sharding or (op, sharding) in self._reshards:
            return ZERO
        if _remade(op, value.sharding, sharding) and (op.opcode is Opcode.IOTA
                                                      or op.operands[0].array_shape.rank == 0):
            return ZERO  # (a broadcast of an array reshards its operand: priced as a move)
        n, model = self.ctx.n, self.ctx.cost_model
        return min(reshard_cost(s, sharding, op.shape, n, model) for s in self._source_shardings(op, value))

    def _source_shardings(self, op: Instruction, value: PValue) -> list[Sharding]:
        """The shardings `_cheapest_source` chooses among (without building the element of a
        wider tuple it would build): a slice of a sort's first rows prices reading the sort's
        replicated result, not gathering its tiles back."""
        found = [value.sharding]
        wider = self._wider.get(value.instr)
        if wider is not None:
            found.append(wider.sharding)
        elif op.opcode is Opcode.GET_TUPLE_ELEMENT:
            whole = self._wider.get(self.values[op.operands[0]].instr)
            if whole is not None and whole.sharding.is_tuple:
                found.append(whole.sharding.subsharding(op.operands[0].shape, op.attr("index")))
        earlier = self._moved_from.get(value.instr)
        if earlier is not None:
            found.append(earlier.sharding)
        return found

    def known_reshard(self, op: Instruction, sharding: Sharding) -> PValue | None:
        """`op` in `sharding` if some user has already had it made (nothing more to pay)."""
        return self._reshards.get((op, sharding))

    def remember_reshard(self, op: Instruction, sharding: Sharding, value: PValue) -> None:
        """`value` is `op` in `sharding`, for every later user that asks (see `recompute`)."""
        self._reshards[(op, sharding)] = value

    def wider_of(self, value: PValue) -> PValue | None:
        """The wider value `value` was sliced from without communication, if remembered."""
        return self._wider.get(value.instr)

    def _cheapest_source(self, op: Instruction, value: PValue, sharding: Sharding) -> PValue:
        """`op`'s value, the wider one it was sliced from, or the one collectives moved it from
        (`reshard`), whichever moves to `sharding` for less: a sort along its sharded dim runs replicated and is sliced to its
        own tiling; a slice of its first rows wants it replicated again, and takes the
        replicated result rather than gathering the tiles back (XLA's partition does the same,
        its propagation having left the sort replicated).  A get-tuple-element's wider value
        is the element of its tuple's."""
        wider = self._wider.get(value.instr)
        if wider is None and op.opcode is Opcode.GET_TUPLE_ELEMENT:
            whole = self._wider.get(self.values[op.operands[0]].instr)
            if whole is not None and whole.sharding.is_tuple:
                index: int = op.attr("index")
                wider = PValue(self.em.b().get_tuple_element(whole.instr, index),
                               whole.sharding.subsharding(op.operands[0].shape, index),
                               op.shape)
                self._wider[value.instr] = wider
        earlier = self._moved_from.get(value.instr)
        if wider is None and earlier is None:
            return value
        n, model = self.ctx.n, self.ctx.cost_model
        best, best_cost = value, reshard_cost(value.sharding, sharding, op.shape, n, model)
        for other in (wider, earlier):
            if other is not None:
                c = reshard_cost(other.sharding, sharding, op.shape, n, model)
                if c < best_cost:
                    best, best_cost = other, c
        return best

    def _tuple_rebuilt(self, op: Instruction, sharding: Sharding) -> PValue | None:
        """A tuple wanted in another sharding is built again from its elements, each resharded
        as its own value: shared with the element's other users, and a broadcast made again
        rather than moved (a while loop's init tuple of zero gradient accumulators, each sharded
        its own way in the loop, would otherwise all-to-all a zero stack of layers)."""
        if op.opcode is not Opcode.TUPLE or not sharding.is_tuple:
            return None
        parts = [self.resharded(e, sharding.subsharding(op.shape, k)) for k, e in enumerate(op.operands)]
        return PValue(self.em.b().tuple([v.instr for v in parts]), sharding, op.shape)

    def _made_again(self, op: Instruction, value: PValue, sharding: Sharding) -> PValue | None:
        """A broadcast or an iota wanted in another sharding is made again in it rather than
        moved: the iota from the device's offsets, the broadcast from its operand (never larger
        than its result) in the matching sharding.  One value used in several shardings is
        common (one zero broadcast initialises every gradient accumulator of a scanned model,
        each sharded its own way; moving it all-to-alls the whole stack of layers).  Only where
        the move would communicate: a local slice is as cheap as making it again."""
        if (not _remade(op, value.sharding, sharding)
                or reshard_cost(value.sharding, sharding, op.shape, self.ctx.n).collectives == 0):
            return None
        from hlo_passes.passes.spmd.handlers import handler_for  # cycle: the handlers import this module

        self._target_override[op] = sharding
        try:
            return handler_for(op)(self, op)
        finally:
            del self._target_override[op]

    def reshard(self, value: PValue, sharding: Sharding) -> PValue:
        """`value` in `sharding`; where that only slices (no collective), the wider value is
        remembered for the result's users (`_cheapest_source`)."""
        done = reshard(self.em, value, sharding)
        if done.instr is not value.instr:
            if self._only_slices(value.sharding, sharding, value.global_shape):
                self._wider[done.instr] = value
            else:
                # (an op computed where its operands lie and gathered to its own sharding, whose
                # user wants it tiled as it was computed: the user reads the computed tiles, not
                # slices of the gathered value; the gather is dead if no other user reads it)
                self._moved_from[done.instr] = value
        return done

    def _only_slices(self, src: Sharding, dst: Sharding, shape: Shape) -> bool:
        """Does resharding `shape` from `src` to `dst` only cut local pieces (every element of a
        tuple alike)?  Manual shardings are left out: their wider forms are per group."""
        if isinstance(shape, TupleShape):
            return (src.is_tuple and dst.is_tuple
                    and all(self._only_slices(src.subsharding(shape, k), dst.subsharding(shape, k), e)
                            for k, e in enumerate(shape.elements)))
        if is_manual(src) or is_manual(dst):
            return False
        found = reshard_cost(src, dst, shape, self.ctx.n, self.ctx.cost_model)
        return found.collectives == 0 and found.bytes == 0

    def target(self, instr: Instruction) -> Sharding:
        override = self._target_override.get(instr)
        if override is not None:
            return override
        # Kept per instruction (handlers and the partially-manual check each ask, and a tuple's
        # is rebuilt every time), for as long as its sharding attribute is the same object, and
        # dropped once the instruction is partitioned (`partition`): few ask after that, and a
        # table over the whole source module was 4% of the partitioner's peak on gpt24.
        slot = instr.attributes.get("sharding")
        found = self._targets.get(instr)
        if found is None or found[0] is not slot:
            found = self._targets[instr] = (slot, target_sharding(instr))
        return found[1]

    def clone(self, instr: Instruction, operands: Sequence[Instruction], shape: Shape,
              **called: Computation | tuple[Computation, ...]) -> Instruction:
        """`instr` with new operands and per-device shape; attributes kept except the sharding."""
        new = Instruction(instr.opcode, shape, operands, name=instr.name,
                          attributes=instr.shared_attributes_without("sharding"),
                          called=dict(instr.called, **called) if instr.called or called else None,
                          literal=instr.literal,
                          parameter_number=instr.parameter_number)
        return self.em.comp.add(new, name_hint=instr.name)

    def partition_manual(self, comp: Computation) -> Computation:
        new, _ = self.partition(comp, [Sharding.manual()] * len(comp.parameters), None, manual=True)
        return new

    def remark(self, instr: Instruction, message: str, kind: str = "note") -> None:
        self.ctx.remark(instr, message, kind)

    @property
    def n(self) -> int:
        return self.ctx.n


def is_partially_manual_instr(instr: Instruction, p: "Partitioner") -> bool:
    """Is `instr` inside a partially manual region (its result or an operand's value is)?"""
    return _partially_manual(p.target(instr)) or any(_partially_manual(p.value(op).sharding) for op in instr.operands)


def _partially_manual(s: Sharding) -> bool:
    """A module-level function, not a closure in the function above: a closure that calls itself
    is a reference cycle, one per instruction partitioned, left to the cyclic collector."""
    return any(_partially_manual(e) for e in s.elements) if s.is_tuple else is_partially_manual(s)


def _reachable(entry: Computation) -> set[Computation]:
    seen: set[Computation] = set()
    stack = [entry]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for instr in c.instructions:
            stack.extend(instr.called_computations())
    return seen


__all__ = ["Partitioner", "SpmdPartitioner", "target_sharding", "is_manual"]
