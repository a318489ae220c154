"""Which gradient all-reduces the weight update can be sharded behind, and how.

The analysis of one computation, in three steps:

1. *Candidates*: all-reduces of one array with a sum reduction over uniform device
   groups of size N > 1.  Right after each, a chain of single-user layout ops
   (reshape, transpose, a reduce over size-1 dimensions) is its *stem*: those ops
   commute with the sum, so the rewrite applies them before reducing.  The stem's
   end has the *canonical shape* D of the weight.
2. *Region*: the forward closure from the stem ends.  Every value in it is a
   *shard value* (shape D, computed elementwise), a *reduction* (a reduce of a shard
   value over all its dimensions: sums of squares for global or per-weight norms,
   maxima, ...), or leaves through the computation's ROOT (an *exit*: a new weight or
   new optimizer state).  A reduce of a shard value over some of D's dimensions S
   (Adafactor's row and column means of g², per-row norms) starts a *factor*: it, the
   elementwise ops of it and their reductions over all their dimensions are shard values
   too (`Component.reduced` says S), and a broadcast of a factor back over S is a shard
   value of shape D again.  Any other user declines the candidate.  Scalars computed
   from reductions are identical on every device, so they are used freely.
3. *Inputs*: operands of shard values from outside the region: scalars, broadcasts
   of scalars, elementwise expressions used only by the region (*pulled* in and
   recomputed on the shard), and other values of shape D or of a factor's shape
   (*sliced*).  Every scalar, broadcast source and sliced value must be provably
   identical on every device of the group (`Replication`), else the candidate is
   declined.  Reductions over all dimensions of elementwise expressions of sliced
   values (the weight's norm: *side reductions*) join the region, their expressions pulled.

Candidates whose shard values meet (an elementwise op of two gradients) form one
*component*; a component is rewritten or declined as a whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.weight_update_sharding.fused import elementwise_fusion
from hlo_passes.passes.collectives.common import callers_of
from hlo_passes.passes.collectives.replication import Replication, device_groups

# Reductions a region may compute from shards, with the identity their init must hold.
REDUCTION_IDENTITY = {Opcode.ADD: 0.0, Opcode.MULTIPLY: 1.0, Opcode.MAXIMUM: -math.inf,
                      Opcode.MINIMUM: math.inf}
REDUCTION_NAME = {Opcode.ADD: "add", Opcode.MULTIPLY: "multiply", Opcode.MAXIMUM: "maximum",
                  Opcode.MINIMUM: "minimum"}

# ------------------------------------------------------------------ plan --
@dataclass
class Stem:
    """A gradient all-reduce and the layout ops that follow it alone."""

    all_reduce: Instruction
    ops: list[Instruction] = field(default_factory=list)

    @property
    def end(self) -> Instruction:
        return self.ops[-1] if self.ops else self.all_reduce


@dataclass
class Component:
    """Gradient all-reduces whose update regions meet, rewritten or declined together."""

    stems: list[Stem]
    groups: tuple[tuple[int, ...], ...]
    dims: tuple[int, ...]  # canonical shape: the first gradient's, after its stem
    shard_values: list[Instruction] = field(default_factory=list)  # post-order, stem ends excluded
    reshapes: set[Instruction] = field(default_factory=set)  # shard values that only regroup dims
    # Factor values: shard values of a reduce over some of the gradient's dims S (Adafactor's row
    # and column means) and elementwise ops of them, by S.  On a shard tiled on dimension k a factor
    # keeps its own tile when k is not in S, and is all-reduced and held whole when it is.
    reduced: dict[Instruction, tuple[int, ...]] = field(default_factory=dict)
    reductions: list[Instruction] = field(default_factory=list)
    exits: list[Instruction] = field(default_factory=list)
    tails: list[Instruction] = field(default_factory=list)  # layout ops between an exit and the ROOT
    pulled: list[Instruction] = field(default_factory=list)  # outside ops recomputed on the shard
    sliced: list[Instruction] = field(default_factory=list)  # outside values cut into shards
    assumed: set[Instruction] = field(default_factory=set)  # ENTRY parameters assumed replicated
    side_reductions: list[Instruction] = field(default_factory=list)  # of the weight, not the gradient
    declined: tuple[Instruction, str] | None = None

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def group_size(self) -> int:
        return len(self.groups[0])

    def decline(self, instr: Instruction, reason: str) -> None:
        if self.declined is None:
            self.declined = (instr, reason)


@dataclass
class ComputationPlan:
    computation: Computation
    components: list[Component]
    skipped: list[tuple[Instruction, str]]  # all-reduces that are no candidates, with why


# -------------------------------------------------------------- analysis --
_LAYOUT_OPCODES = frozenset({Opcode.RESHAPE, Opcode.TRANSPOSE, Opcode.BITCAST, Opcode.COPY})


def _is_layout_op(instr: Instruction) -> bool:
    """Ops that only reorder or regroup elements (they commute with a sum)."""
    if instr.opcode in (Opcode.RESHAPE, Opcode.TRANSPOSE):
        return True
    return is_row_major_bitcast(instr) or _is_degenerate_reduce(instr)


def _is_regroup(instr: Instruction) -> bool:
    """A reshape that keeps row-major order: a reshape, a row-major bitcast, a sum over size-1 dims."""
    return (instr.shape.is_array and instr.shape.rank > 0 and
            (instr.opcode is Opcode.RESHAPE or is_row_major_bitcast(instr) or _is_degenerate_reduce(instr)))


def is_elementwise(instr: Instruction) -> bool:
    """An elementwise op, or a kLoop fusion that computes like one (`fused.elementwise_fusion`)."""
    return instr.opcode.is_elementwise or elementwise_fusion(instr)


def is_row_major_bitcast(instr: Instruction) -> bool:
    """A bitcast between row-major layouts: a reshape (XLA's layout passes leave these behind)."""
    if instr.opcode is not Opcode.BITCAST or not instr.shape.is_array or len(instr.operands) != 1:
        return False
    return all(_row_major(s) for s in (instr.shape, instr.operands[0].shape))


def _row_major(shape) -> bool:
    return shape.layout is None or shape.layout.minor_to_major == tuple(range(shape.rank - 1, -1, -1))


def _is_degenerate_reduce(instr: Instruction) -> bool:
    """A sum over size-1 dimensions with a zero init: a reshape."""
    if instr.opcode is not Opcode.REDUCE or len(instr.operands) != 2 or not instr.shape.is_array:
        return False
    data, init = instr.operands
    kind = Reduction.of_instruction(instr)
    return (kind is not None and kind.opcode is Opcode.ADD
            and all(data.shape.dims[d] == 1 for d in instr.dimensions)
            and _constant_equals(init, 0.0))


def _constant_equals(instr: Instruction, value: float) -> bool:
    if instr.opcode is not Opcode.CONSTANT or not instr.shape.is_array or instr.shape.rank != 0:
        return False
    try:
        return float(instr.literal_value()) == value
    except (ValueError, TypeError):
        return False


def _fusion_problem(fusion: Instruction) -> str:
    fused = fusion.called.get("calls")
    ops = {i.opcode for i in fused.instructions} if isinstance(fused, Computation) else set()
    if Opcode.REDUCE in ops:
        return (f"a {fusion.attr('kind')} fusion that reduces it inside (a fused norm or sum; "
                "reductions are modelled only outside fusions)")
    return f"a {fusion.attr('kind')} fusion that is not elementwise on the weight's shape"


_CONTROL_FLOW = {Opcode.CONDITIONAL: "a conditional (lax.cond, lax.switch)", Opcode.WHILE: "a while loop"}


def _control_flow(instr: Instruction) -> Instruction | None:
    """The conditional or while loop that takes `instr` (itself, or a tuple it is packed in)."""
    if instr.opcode in _CONTROL_FLOW:
        return instr
    if instr.opcode is Opcode.TUPLE:
        return next((u for u in instr.users if u.opcode in _CONTROL_FLOW), None)
    return None


def _blocker(instr: Instruction, reduced: dict[Instruction, tuple[int, ...]]) -> str:
    """What `instr`, a user of the region that the analysis does not model, is."""
    flow = _control_flow(instr)
    if flow is not None:
        via = "" if flow is instr else f" in a tuple for %{flow.name}"
        return (f"it is passed{via} to {_CONTROL_FLOW[flow.opcode]}: an update under control flow is "
                "not sharded")
    of_factor = any(o in reduced for o in instr.operands)
    if instr.opcode is Opcode.REDUCE:
        return ("a reduce over some dimensions of a value already reduced over others" if of_factor else
                "a reduce over some dimensions")
    if instr.opcode is Opcode.BROADCAST and of_factor:
        return "a broadcast of a row or column reduction over other dimensions than it reduced"
    if instr.opcode is Opcode.FUSION:
        return _fusion_problem(instr)
    return f"{instr.opcode.value} (not elementwise on the weight's shape)"


def _candidate_problem(instr: Instruction, module: Module) -> str | None:
    if len(instr.operands) != 1 or not instr.shape.is_array:
        return "a variadic all-reduce (one gradient per all-reduce is modeled)"
    if instr.shape.rank == 0:
        return "a scalar all-reduce (a loss or a metric, not a weight's gradient)"
    kind = Reduction.of_instruction(instr)
    if kind is None or kind.opcode is not Opcode.ADD:
        name = kind.opcode.value if kind is not None else "an unrecognised computation"
        return f"a non-sum reduction ({name}); only summed gradients are sharded"
    groups = device_groups(instr, module)
    if not groups or len({len(g) for g in groups}) != 1:
        return "non-uniform replica groups"
    if len(groups[0]) < 2:
        return "groups of one device (nothing to shard)"
    if instr.control_predecessors or instr.control_successors:
        return "ordered by control edges (the rewrite replaces it, and would drop the order they keep)"
    return None


def _stem(all_reduce: Instruction) -> Stem:
    stem = Stem(all_reduce)
    cur = all_reduce
    while len(cur.users) == 1 and not cur.is_root:
        (user,) = cur.users
        if not _is_layout_op(user) or user.operands[0] is not cur or user.shape.rank == 0:
            break
        stem.ops.append(user)
        cur = user
    return stem


def analyze_computation(comp: Computation, module: Module, *, assume_replicated_parameters: bool = False
                        ) -> ComputationPlan:
    candidates, skipped = [], []
    for instr in comp.instructions:
        if instr.opcode is not Opcode.ALL_REDUCE:
            continue
        problem = _candidate_problem(instr, module)
        if problem is None:
            candidates.append(instr)
        elif instr.shape.is_tuple or instr.shape.rank > 0:
            skipped.append((instr, problem))
    if not candidates:
        return ComputationPlan(comp, [], skipped)

    # Union-find over candidates, joined where their shard values meet.
    parent: dict[Instruction, Instruction] = {c: c for c in candidates}

    def find(x: Instruction) -> Instruction:
        while parent[x] is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    stems = {c: _stem(c) for c in candidates}
    stem_ops = {op for s in stems.values() for op in s.ops}
    origin: dict[Instruction, Instruction] = {}  # shard value -> a candidate it derives from
    problems: dict[Instruction, tuple[Instruction, str]] = {}
    blocked_by: dict[Instruction, tuple[Instruction, str]] = {}  # problems that are another user
    reductions: dict[Instruction, Instruction] = {}
    regroups: set[Instruction] = set()
    reduced: dict[Instruction, tuple[int, ...]] = {}  # factor value -> the gradient dims reduced away
    under_control_flow: set[Instruction] = set()
    exits: dict[Instruction, Instruction] = {}
    tails: dict[Instruction, Instruction] = {}
    for c, s in stems.items():
        origin[s.end] = c
        if s.end.shape.rank == 0:
            problems[c] = (c, "its gradient is reshaped to a scalar")

    for instr in comp.post_order():
        if instr in origin or instr in stem_ops or instr.opcode is Opcode.ALL_REDUCE and instr in parent:
            continue
        shard_ops = [o for o in instr.operands if o in origin]
        if not shard_ops:
            continue
        if instr.is_root and instr.opcode is Opcode.TUPLE:  # exits do not join components
            for o in shard_ops:
                exits[o] = origin[o]
            continue
        roots = {find(origin[o]) for o in shard_ops}
        first = roots.pop()
        for r in roots:
            parent[r] = first
        if ((instr.opcode in (Opcode.RESHAPE, Opcode.TRANSPOSE) or is_row_major_bitcast(instr)) and instr.users
                and all(u.is_root and u.opcode is Opcode.TUPLE for u in instr.users)):
            tails[instr] = first  # a new weight reshaped on its way out: done on the full value
            exits[instr.operands[0]] = first
            continue
        if (_is_regroup(instr) and instr.operands[0] in origin and instr.operands[0] not in reduced
                and instr.shape.element_count == instr.operands[0].shape.element_count):
            # a reshape inside the update (BatchNorm's [16] -> [1,1,1,16] -> [16]): the same
            # elements in the same row-major order, so the same shard
            origin[instr] = first
            regroups.add(instr)
            if instr.is_root:
                exits[instr] = first
            continue
        dims = shard_ops[0].shape.dims
        base = stems[first].end.shape.dims  # the component's shape D
        if is_elementwise(instr) and instr.shape.is_array and instr.shape.dims == dims:
            bad = [o for o in instr.operands if o.shape.is_tuple or
                   (o.shape.rank != 0 and o.shape.dims != dims)]
            if bad:
                problems.setdefault(first, (instr, f"%{instr.name} mixes the gradient with "
                                                   f"%{bad[0].name} of another shape"))
            kinds = {reduced.get(o, ()) for o in shard_ops}
            if len(kinds) > 1:
                problems.setdefault(first, (instr, f"%{instr.name} mixes values reduced over different "
                                                   "dimensions of the gradient"))
            if kinds - {()}:
                reduced[instr] = kinds.pop()
            origin[instr] = first
            if instr.is_root:
                exits[instr] = first
            continue
        if (instr.opcode is Opcode.REDUCE and len(instr.operands) == 2 and instr.shape.is_array
                and instr.operands[0] in origin and (instr.shape.rank == 0 or (
                    instr.operands[0] not in reduced and instr.operands[0].shape.dims == base))):
            # over every dimension (a norm: a scalar), or over some of the gradient's (Adafactor's
            # row and column means: a *factor*, see `Component.reduced`)
            kind = Reduction.of_instruction(instr)
            if kind is None or kind.opcode not in REDUCTION_IDENTITY:
                problems.setdefault(first, (instr, f"%{instr.name} reduces the gradient with a computation "
                                                   "that is not add/multiply/maximum/minimum"))
            elif not _constant_equals(instr.operands[1], REDUCTION_IDENTITY[kind.opcode]):
                problems.setdefault(first, (instr, f"%{instr.name} starts its reduction from a value that "
                                                   "is not the identity (partial results would repeat it)"))
            if instr.shape.rank == 0:
                reductions[instr] = first
                continue
            reduced[instr] = tuple(sorted(instr.dimensions))
            origin[instr] = first
            if instr.is_root:
                exits[instr] = first
            continue
        if (instr.opcode is Opcode.BROADCAST and instr.operands[0] in reduced and instr.shape.dims == base
                and instr.dimensions == tuple(
                    d for d in range(len(base)) if d not in reduced[instr.operands[0]])):
            origin[instr] = first  # a factor broadcast back over the dimensions it was reduced over
            continue
        what = _blocker(instr, reduced)
        if _control_flow(instr) is not None:
            under_control_flow.add(first)
        known = problems.get(first)
        if known is None or (known[0].opcode in _LAYOUT_OPCODES and instr.opcode not in _LAYOUT_OPCODES):
            # a layout op beside the real blocker (a transpose hoisted out of a fusion) says less
            problems[first] = (instr, f"the reduced gradient has another user %{instr.name}: {what}")
            blocked_by[first] = (instr, what)

    # Components.
    by_root: dict[Instruction, Component] = {}
    for c in candidates:
        r = find(c)
        comp_ = by_root.get(r)
        if comp_ is None:
            comp_ = by_root[r] = Component([], device_groups(c, module), stems[c].end.shape.dims)
        comp_.stems.append(stems[c])
    # A weight's gradient feeds an update the step returns; an all-reduced value from which no
    # output is computed elementwise is something else (an activation summed over the model
    # axis, a statistic), and the remark says so rather than calling it a gradient (unless
    # control flow takes it: the update may well be inside).
    updating = {find(c) for c in exits.values()}
    for c, (instr, reason) in problems.items():  # the instruction that blocks says most
        if blocked_by.get(c, (None,))[0] is instr and find(c) not in updating and c not in under_control_flow:
            reason = (f"not a weight's gradient: no output of the step is computed elementwise from it "
                      f"(%{instr.name} reads it: {blocked_by[c][1]})")
        by_root[find(c)].decline(instr, reason)
    for c in candidates:
        comp_ = by_root[find(c)]
        if device_groups(c, module) != comp_.groups:
            comp_.decline(c, "its gradients are reduced over different device groups")
        if stems[c].end.shape.element_count != comp_.size:
            comp_.decline(c, "its gradients have different sizes")
    ends = {s.end for s in stems.values()}
    post_order = comp.post_order()  # the analysis only reads the graph: one order serves all
    for instr in post_order:
        if instr in origin and instr not in ends:
            member = by_root[find(origin[instr])]
            member.shard_values.append(instr)
            if instr in regroups:
                member.reshapes.add(instr)
            if instr in reduced:
                member.reduced[instr] = reduced[instr]
    for instr, c in reductions.items():
        by_root[find(c)].reductions.append(instr)
    for instr, c in exits.items():
        by_root[find(c)].exits.append(instr)
    for instr, c in tails.items():
        by_root[find(c)].tails.append(instr)

    components = list(by_root.values())
    for component in components:
        if component.reduced and component.reshapes:
            component.decline(next(iter(component.reshapes)),
                              "the update both regroups the gradient's dimensions (a flat shard) and reduces "
                              "over some of them (a tiled shard)")
    reduction_set = set(reductions)
    position = {instr: i for i, instr in enumerate(post_order)}
    callers = callers_of(module)
    whole_reductions = [i for i in post_order if i.opcode is Opcode.REDUCE and len(i.operands) == 2
                        and i.shape.is_array and i.shape.rank == 0 and i not in reduction_set]
    for component in components:
        if component.declined is None:
            _plan_inputs(component, module, reduction_set, assume_replicated_parameters, origin,
                         position, callers, whole_reductions)
    return ComputationPlan(comp, components, skipped)


def _plan_inputs(component: Component, module: Module, reductions: set[Instruction],
                 assume_parameters: bool, origin: dict[Instruction, Instruction],
                 position: dict[Instruction, int], callers: dict[Computation, list[Instruction]],
                 whole_reductions: list[Instruction]) -> None:
    """Sort the outside operands of the shard values into pulled and sliced ones and check
    that everything the shards read is identical across the group."""
    members = set(component.shard_values) | {s.end for s in component.stems}
    size = component.size

    def pullable(x: Instruction) -> bool:
        return (x not in members and x not in origin and is_elementwise(x) and x.shape.is_array
                and x.shape.rank > 0 and x.shape.element_count == size and not x.has_side_effect
                and all(o.shape.is_array and (o.shape.rank == 0 or o.shape.dims == x.shape.dims)
                        for o in x.operands))

    # Largest set of elementwise outside expressions used only by the region (a fixpoint).
    pulled: set[Instruction] = set()
    work = [o for m in component.shard_values for o in m.operands]
    while work:
        x = work.pop()
        if x in pulled or not pullable(x):
            continue
        pulled.add(x)
        work.extend(x.operands)
    changed = True
    while changed:
        changed = False
        for x in list(pulled):
            if x.is_root or any(u not in members and u not in pulled for u in x.users):
                pulled.discard(x)
                changed = True

    sliced: dict[Instruction, None] = {}
    need_replicated: dict[Instruction, None] = {}
    for user in [*component.shard_values, *pulled]:
        for o in user.operands:
            if o in members or o in pulled:
                continue
            if o.shape.rank == 0:
                need_replicated[o] = None
            elif o.opcode is Opcode.BROADCAST and o.operands[0].shape.rank == 0:
                need_replicated[o.operands[0]] = None
            else:
                need_replicated[o] = None
                sliced[o] = None

    side, side_ops = _side_reductions(component, members | pulled, set(sliced), reductions, pullable, position,
                                      whole_reductions)
    for x in side_ops:
        for o in x.operands:
            if o.shape.rank == 0:
                need_replicated[o] = None
            elif o.opcode is Opcode.BROADCAST and o.operands[0].shape.rank == 0:
                need_replicated[o.operands[0]] = None
    replicated = Replication(module, component.groups, assume_parameters=assume_parameters,
                             parameter_replication_covers_partitions=True,
                             extra=reductions | set(side), callers=callers)
    for instr in need_replicated:
        if not replicated(instr):
            component.decline(instr, f"%{instr.name} is not provably identical on every device of the "
                                     "group (declare parameter_replication={true}, or use "
                                     "assume-replicated-parameters)")
            return
    component.pulled = sorted(pulled | side_ops, key=position.__getitem__)
    component.reductions = sorted([*component.reductions, *side], key=position.__getitem__)
    component.side_reductions = list(side)
    reductions.update(side)  # no other component takes them
    component.sliced = list(sliced)
    component.assumed = set(replicated.assumed)


def _side_reductions(component: Component, region: set[Instruction], sliced: set[Instruction],
                     taken: set[Instruction], pullable, position: dict[Instruction, int],
                     whole_reductions: list[Instruction]) -> tuple[list[Instruction], set[Instruction]]:
    """Whole-tensor reductions of values the update slices anyway (LAMB's and Adafactor's ‖w‖):
    a reduce over every dimension, from the identity, of an elementwise expression of the
    component's shape whose only arrays are sliced values (the weight) and broadcast scalars.
    On the shard they become a partial reduction (padding masked) + a scalar all-reduce, as the
    gradient's norms do, and every device reads 1/N of the weight instead of all of it.  Their
    expressions are pulled in; one whose ops something else reads stays whole (the expression
    would be computed whole anyway).  Returns the reductions and the ops of their expressions."""
    dims = component.dims
    found: dict[Instruction, set[Instruction]] = {}
    for r in whole_reductions:
        if r in taken or r.operands[0].shape.dims != dims:
            continue
        kind = Reduction.of_instruction(r)
        if (kind is None or kind.opcode not in REDUCTION_IDENTITY
                or not _constant_equals(r.operands[1], REDUCTION_IDENTITY[kind.opcode])):
            continue
        ops: set[Instruction] = set()
        work, ok = [r.operands[0]], True
        while work and ok:
            x = work.pop()
            if x in sliced or x in ops or x.shape.rank == 0 or (
                    x.opcode is Opcode.BROADCAST and x.operands[0].shape.rank == 0):
                continue
            if x in region or not pullable(x) or x.shape.dims != dims:
                ok = False
            else:
                ops.add(x)
                work.extend(x.operands)
        if ok and (ops or r.operands[0] in sliced):
            found[r] = ops
    # Their ops must be read only by the region, these reductions and each other.
    changed = True
    while changed:
        changed = False
        inside = region | set(found) | {x for ops in found.values() for x in ops}
        for r, ops in list(found.items()):
            if any(x.is_root or any(u not in inside for u in x.users) for x in ops):
                del found[r]
                changed = True
    side = sorted(found, key=position.__getitem__)
    return side, {x for r in side for x in found[r]}
