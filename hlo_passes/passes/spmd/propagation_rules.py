"""Per-opcode sharding propagation rules for `sharding-propagation`, as GSPMD defines them.

Two tables, one per direction, each keyed by opcode with a default (XLA's
ShardingPropagation::InferShardingFromOperands and ::GetShardingFromUser):

    FORWARD[opcode](ctx, instr) -> bool
        improve `instr`'s sharding from its operands' (through `ctx.improve`, which only
        accepts a sharding that says more: see `PropagationContext.improve`); True if it changed.
    FROM_USER[opcode](ctx, instr, user) -> Sharding | None
        the sharding `user` (of this opcode) asks of its operand `instr`.

Three more tables say where and when propagation may act at all:

    supports_spatial_partitioning(ctx, instr)   may `instr` be given a tiled sharding
    passes_at_level(instr, aggressiveness)       does propagation cross `instr` at this level
    representative_operand(ctx, instr)           the operand whose sharding an op copies

The aggressiveness levels are why XLA gives a Flax FSDP transformer's activations the batch
sharding of its tokens rather than its weights' embed sharding: at level 0 only pass-through
ops (elementwise, transpose, reshape, tuple, while, ...) propagate, so the tokens' batch
split reaches the residual stream and the attention through elementwise ops and reshapes
first; dots, reduces and broadcasts join at level 1 and 2 (forward through a broadcast only
at 3), when every activation already holds the batch split and a weight's embed split can no
longer replace it (`improve` refuses a sharding that is not a refinement of the current one).

Dots and convolutions live in propagation_dot.py, gathers and scatters in
propagation_gather.py; both register into the tables below.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence

from hlo_passes.ir.cumulative import CumulativeWindow
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_TERNARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape, leaf_range
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.ir.while_loop import trip_count
from hlo_passes.passes.spmd.cost_model import Estimate
from hlo_passes.passes.spmd.reshard import cost as reshard_cost
from hlo_passes.passes.spmd.batch_dims import infer_from_operands, is_batch_partitionable_custom_call

Leaves = list[Optional[Sharding]]

SHARDING = "Sharding"
FULL_TO_SHARD = "SPMDFullToShardShape"
SHARD_TO_FULL = "SPMDShardToFullShape"
BARRIER_FROM = "ShardBarrierFrom"
BARRIER_TO = "ShardBarrierTo"
# Custom-calls that carry their operand's sharding through unchanged (XLA's IsPassthroughCustomOps).
PASSTHROUGH_TARGETS = frozenset({SHARDING, "X64Combine"})
SAME_RANK_PASSTHROUGH_TARGETS = frozenset({
    "ResizeNearest", "ResizeBilinear", "ResizeNearestGrad", "ResizeBilinearGrad", "Cholesky",
    "MoveToDevice", "MoveToHost"})


class PropagationContext(Protocol):
    """What rules read and write; implemented by the pass (sharding_propagation._Walk)."""

    @property
    def aggressiveness(self) -> int: ...  # the round's level (0-3)
    @property
    def may_combine(self) -> bool: ...  # merge compatible partial shardings (level > 0)
    @property
    def shardy_form(self) -> bool: ...  # the module came in JAX's Shardy form (Shardy's conflict rules)

    def sharding(self, instr: Instruction) -> Sharding | None: ...
    def set_sharding(self, instr: Instruction, s: Sharding) -> None: ...
    def improve(self, s: Sharding, instr: Instruction, *, aggressive: bool = False) -> bool: ...
    def improved(self, s: Sharding, instr: Instruction, *, aggressive: bool = False) -> Sharding | None: ...
    def improve_sub(self, s: Sharding, instr: Instruction, index: int, *, aggressive: bool = False) -> bool: ...
    def non_root_users(self, instr: Instruction) -> int: ...
    def caller_of(self, instr: Instruction) -> Instruction | None: ...
    def operand_indices(self, user: Instruction, operand: Instruction) -> list[int]: ...  # where user reads it
    def lookahead_user_sharding(self, instr: Instruction) -> Sharding | None: ...
    def remark(self, instr: Instruction, message: str) -> None: ...  # a deliberate difference from XLA


# ------------------------------------------------------------------ traits --
def is_elementwise(instr: Instruction) -> bool:
    """XLA's IsElementwise: the elementwise opcodes, map and rng; a bitcast-convert only when
    the element width does not change."""
    op = instr.opcode
    if op is Opcode.BITCAST_CONVERT:
        src, dst = instr.operands[0].shape, instr.shape
        return (isinstance(src, ArrayShape) and isinstance(dst, ArrayShape)
                and src.element_type.bit_width == dst.element_type.bit_width)
    return op in _ELEMENTWISE


_ELEMENTWISE = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY | {Opcode.MAP, Opcode.RNG}


_LAYOUT_BOUND_COLLECTIVES = frozenset({
    Opcode.ALL_GATHER, Opcode.ALL_REDUCE, Opcode.ALL_TO_ALL, Opcode.REDUCE_SCATTER, Opcode.RAGGED_ALL_TO_ALL,
    Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_BROADCAST})


def has_side_effect(instr: Instruction) -> bool:
    """XLA's HasSideEffect, which decides whether an op propagation cannot shard still turns
    replicated with a replicated operand: a collective only when it constrains its layout
    (the IR's own `has_side_effect`, which keeps DCE and CSE off every collective, is wider)."""
    if instr.opcode in _LAYOUT_BOUND_COLLECTIVES:
        return bool(instr.attr("constrain_layout", False))
    return instr.has_side_effect


def is_custom_call(instr: Instruction, *targets: str) -> bool:
    return instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in targets


def is_passthrough_custom_call(instr: Instruction) -> bool:
    if is_custom_call(instr, *PASSTHROUGH_TARGETS):
        return True
    if (len(instr.operands) != 1 or not isinstance(instr.shape, ArrayShape)
            or not isinstance(instr.operands[0].shape, ArrayShape)
            or instr.operands[0].shape.rank != instr.shape.rank):
        return False
    return is_custom_call(instr, *SAME_RANK_PASSTHROUGH_TARGETS)


def same_dims(a: Shape, b: Shape) -> bool:
    """XLA's ShapeUtil::CompatibleIgnoringElementType."""
    if a.is_tuple != b.is_tuple:
        return False
    if isinstance(a, TupleShape) and isinstance(b, TupleShape):
        return len(a.elements) == len(b.elements) and all(same_dims(x, y) for x, y in zip(a.elements, b.elements))
    return isinstance(a, ArrayShape) and isinstance(b, ArrayShape) and tuple(a.dims) == tuple(b.dims)


def is_spatial(ctx: PropagationContext, instr: Instruction) -> bool:
    return su.is_spatially_partitioned(ctx.sharding(instr))


def known_sharding(ctx: PropagationContext, instr: Instruction) -> Sharding:
    """`ctx.sharding(instr)` where the caller knows there is one: an operand `is_spatial`
    accepted, the user a from-user rule is asked about (`_Walk.sharding_from_user` asks only
    users with a spatial sharding)."""
    s = ctx.sharding(instr)
    assert s is not None, f"{instr.name} has no sharding"
    return s


def agreeing_proposals(ctx: PropagationContext, shape: ArrayShape,
                       offers: Sequence[tuple[Instruction, Sharding | None]]) -> list[Sharding | None]:
    """The shardings several operands offer for one result ((operand, proposal) pairs), as the
    propagation form says to weigh them.  XLA's GSPMD takes them in order (the first
    settles what later ones may refine): all are kept.  Shardy (JAX's default form) lets a
    mesh axis tile only one dim of a tensor: where two proposals tile different dims with the
    same devices, the one from the larger operand keeps its dim (the smaller operand is the
    cheaper one to reshard; equal sizes: the earlier operand) and the other loses that dim's
    tiling (a proposal left tiling nothing is dropped).  An embedding lookup whose table is
    tiled along the feature dim and whose token ids along the batch over one axis is such a
    conflict: GSPMD shards the lookup by batch, Shardy by feature, and the FSDP step built on
    it moved 1.23x XLA's Shardy bytes when the batch won."""
    proposals = [p for _, p in offers]
    if not ctx.shardy_form:
        return proposals
    tiled = [i for i, p in enumerate(proposals) if p is not None and su.is_tiled(p) and not su.is_manual(p)]
    rank = {i: (-_elements(offers[i][0]), i) for i in tiled}
    # each proposal's tiling of each dim alone, the unit a conflict is judged by
    alone = {i: {d: su.replicate_all_except(p, [d]) for d in _tiled_dims(p)}
             for i, p in enumerate(proposals) if i in rank and p is not None}
    lost: dict[int, set[int]] = {i: set() for i in tiled}
    for x in tiled:
        for y in tiled:
            if rank[x] >= rank[y]:
                continue
            for dp, a in alone[x].items():
                for dq, b in alone[y].items():
                    if dp != dq and dq not in lost[y] and not _compatible(shape, a, b):
                        lost[y].add(dq)
    out = proposals
    for i, dims in lost.items():
        if dims:
            kept = su.replicate_dims(out[i], dims)  # type: ignore[arg-type]
            out[i] = kept if su.is_tiled(kept) else None
    return out


def _elements(instr: Instruction) -> int:
    shape = instr.shape
    return shape.element_count if isinstance(shape, ArrayShape) else shape.byte_size()


def _tiled_dims(s: Sharding) -> list[int]:
    return [d for d in range(s.data_rank) if s.tile_dims[d] > 1]


def _compatible(shape: ArrayShape, a: Sharding, b: Sharding) -> bool:
    """One sharding refines the other (no `_conflicts`), or a partially replicated pair merges
    into one."""
    if not _conflicts(shape, a, b):
        return True
    if a.num_devices != b.num_devices:
        return False
    return ((su.has_partial_replication(b) and su.merge_if_compatible(a, 0, b) is not None)
            or (su.has_partial_replication(a) and su.merge_if_compatible(b, 0, a) is not None))


# Ops propagation crosses at aggressiveness 0 (besides elementwise ones and Sharding calls).
_LEVEL0 = frozenset({
    Opcode.TRANSPOSE, Opcode.RESHAPE, Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT, Opcode.WHILE,
    Opcode.DYNAMIC_SLICE, Opcode.DYNAMIC_UPDATE_SLICE, Opcode.OPTIMIZATION_BARRIER, Opcode.CONCATENATE,
    Opcode.CALL, Opcode.COPY})


def passes_at_level(instr: Instruction, aggressiveness: int) -> bool:
    """XLA's CanPropagateThroughAtAggressiveLevel."""
    return aggressiveness >= propagation_level(instr)


def propagation_level(instr: Instruction) -> int:
    """The lowest aggressiveness at which propagation crosses `instr` (XLA's
    CanPropagateThroughAtAggressiveLevel as a threshold, which the pass keeps per instruction):
    0 for pass-through ops, 2 for broadcasts, 1 for the rest."""
    if instr.opcode is Opcode.BROADCAST:
        return 2
    if is_elementwise(instr) or is_custom_call(instr, SHARDING) or instr.opcode in _LEVEL0:
        return 0
    return 1


_SPATIAL = frozenset({
    Opcode.BROADCAST, Opcode.CONCATENATE, Opcode.CONDITIONAL, Opcode.CONSTANT, Opcode.CONVOLUTION,
    Opcode.OPTIMIZATION_BARRIER, Opcode.DOT, Opcode.DYNAMIC_SLICE, Opcode.DYNAMIC_UPDATE_SLICE,
    Opcode.GATHER, Opcode.GET_TUPLE_ELEMENT, Opcode.INFEED, Opcode.IOTA, Opcode.PAD,
    Opcode.REDUCE_WINDOW, Opcode.RESHAPE, Opcode.SCATTER, Opcode.SELECT_AND_SCATTER, Opcode.SLICE,
    Opcode.SORT, Opcode.TRANSPOSE, Opcode.TUPLE, Opcode.WHILE, Opcode.REDUCE, Opcode.RNG_BIT_GENERATOR,
    Opcode.REVERSE})


def supports_spatial_partitioning(instr: Instruction, *, in_called: bool, allow_output: bool,
                                  allow_parameters: bool, shardy_form: bool = False) -> bool:
    """XLA's SupportSpatialPartitioning: may `instr` receive a propagated sharding at all.
    `in_called`: its computation is a while body / branch / call body linked to a caller;
    `shardy_form`: the module is in JAX's Shardy form, whose propagation also shards top-k."""
    comp = instr.parent
    assert comp is not None, f"{instr.name} is in no computation"
    if comp.root is instr and not in_called and not (comp.is_entry and allow_output):
        return False  # the root of a computation no caller links (a reducer, a condition)
    if is_elementwise(instr):
        return True
    op = instr.opcode
    if op in _SPATIAL:
        return True
    if op in (Opcode.ALL_REDUCE, Opcode.REDUCE_SCATTER):
        return True  # with a channel too (XLA's current rule)
    if op is Opcode.TOPK:
        return shardy_form
    if op is Opcode.FFT:
        return True
    if op is Opcode.PARAMETER:
        return allow_parameters or in_called
    if op is Opcode.CUSTOM_CALL:
        return (is_custom_call(instr, BARRIER_FROM, BARRIER_TO) or is_passthrough_custom_call(instr)
                or is_batch_partitionable_custom_call(instr))
    return False


_FIRST_OPERAND = frozenset({
    Opcode.MAP, Opcode.PAD, Opcode.POWER, Opcode.OPTIMIZATION_BARRIER, Opcode.REVERSE, Opcode.SLICE,
    Opcode.SHIFT_LEFT, Opcode.SHIFT_RIGHT_ARITHMETIC, Opcode.SHIFT_RIGHT_LOGICAL})
_ANY_OPERAND = (ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY | frozenset({
    Opcode.CONCATENATE, Opcode.COPY, Opcode.ALL_GATHER, Opcode.ALL_REDUCE, Opcode.REDUCE_SCATTER,
    Opcode.ALL_TO_ALL, Opcode.COLLECTIVE_BROADCAST, Opcode.COLLECTIVE_PERMUTE, Opcode.TOPK, Opcode.SORT,
    Opcode.WHILE})) - _FIRST_OPERAND


def representative_operand(ctx: PropagationContext, instr: Instruction) -> Instruction | None:
    """XLA's PickRepresentativeOperand: the operand an op copies its sharding from — the first
    (slice, pad, reverse, map, ...), the most specific one (elementwise, concatenate, sort), or
    none (ops that move dims)."""
    op = instr.opcode
    if op in _FIRST_OPERAND:
        return instr.operands[0] if ctx.sharding(instr.operands[0]) is not None else None
    if op in _ANY_OPERAND:
        best: Instruction | None = None
        best_s: Sharding | None = None
        for operand in instr.operands:
            s = ctx.sharding(operand)
            if s is not None and (best_s is None or _comparable(s, best_s) and su.is_more_specific(s, best_s)):
                best, best_s = operand, s
        return best
    if op is Opcode.CUSTOM_CALL and is_passthrough_custom_call(instr):
        return instr.operands[0]
    return None


def _comparable(a: Sharding, b: Sharding) -> bool:
    return (a.kind is ShardingKind.TUPLE) == (b.kind is ShardingKind.TUPLE)


# ------------------------------------------------------------ forward rules --
ForwardRule = Callable[[PropagationContext, Instruction], bool]
FORWARD: dict[Opcode, ForwardRule] = {}


def forward(*opcodes: Opcode) -> Callable[[ForwardRule], ForwardRule]:
    def register(fn: ForwardRule) -> ForwardRule:
        for op in opcodes:
            FORWARD[op] = fn
        return fn
    return register


def _single_user(ctx: PropagationContext, instr: Instruction) -> bool:
    """XLA lets an op with one (non-root) user take an incompatible operand sharding."""
    return ctx.non_root_users(instr) == 1


@forward(Opcode.GET_TUPLE_ELEMENT)
def _gte_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = instr.operands[0]
    if not is_spatial(ctx, operand):
        return False
    s = su.sub_sharding(operand.shape, known_sharding(ctx, operand), instr.attr("index"))
    if su.is_manual(s):
        ctx.set_sharding(instr, s)
        return True
    return ctx.improve(s, instr, aggressive=_single_user(ctx, instr))


@forward(Opcode.TUPLE)
def _tuple_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """Each element takes its operand's sharding when that is more specific than what the
    tuple has (a tuple without a sharding counts as replicated)."""
    if not any(is_spatial(ctx, o) for o in instr.operands):
        return False
    current = ctx.sharding(instr)
    had = current is not None
    leaves = (su.leaves_of(current, instr.shape) if current is not None
              else [su.replicated()] * len(instr.shape.leaves()))
    carried: dict[int, Instruction] | None = None  # found only when a leaf conflicts (rare)
    index = 0
    for operand in instr.operands:
        s = ctx.sharding(operand)
        n = len(operand.shape.leaves()) if operand.shape.is_tuple else 1
        if s is not None:
            for j, leaf in enumerate(su.leaves_of(s, operand.shape)):
                if not had or su.is_more_specific(leaf, leaves[index + j]):
                    leaves[index + j] = leaf
                elif isinstance(operand.shape, ArrayShape) and _conflicts(operand.shape, leaf, leaves[index]):
                    if carried is None:
                        carried = _loop_carried_constraints(ctx, instr)
                    constraint = carried.get(index)
                    if constraint is not None and ctx.sharding(constraint) == leaf:
                        ctx.remark(instr, f"loop state element {index} takes the body's constraint "
                                          f"{constraint.name} over the loop's initial value's sharding: "
                                          "keeping the initial one reshards it every iteration, this "
                                          "reshards it once before the loop (XLA keeps whichever came first)")
                        leaves[index] = leaf
        index += n
    new = su.tuple_sharding(leaves)
    if not had or new != current:
        ctx.set_sharding(instr, new)
        return True
    return False


def _loop_carried_constraints(ctx: PropagationContext, root: Instruction) -> dict[int, Instruction]:
    """By loop-state leaf: the sharding constraint (a `Sharding` custom-call) a while body puts
    on that carried value, when the loop may run more than once — one the root passes on as the
    next iteration's value, else one on the value as the body reads it from its parameter.

    Such a constraint says how the carried value must lie at every iteration's end (or start).
    A loop state that keeps its initial value's sharding instead reshards the value at every
    iteration (usually twice: to the constraint and back); taking the constraint's reshards the
    initial value once, before the loop.  XLA's GSPMD propagation keeps whichever reached the
    loop first, so a constraint inside a scan or fori body over a differently sharded carry
    costs a reshard per iteration; Shardy's (JAX's default) carries the constraint to the loop,
    as this does."""
    if not root.is_root:
        return {}
    loop = ctx.caller_of(root)
    if loop is None or loop.opcode is not Opcode.WHILE or loop.called_computation("body") is not root.parent:
        return {}
    trips = trip_count(loop)
    if trips is not None and trips <= 1:
        return {}
    found: dict[int, Instruction] = {}
    shape = root.shape
    for i, o in enumerate(root.operands):
        if is_custom_call(o, SHARDING) and isinstance(o.shape, ArrayShape):
            found[leaf_range(shape, i)[0]] = o
    param = root.parent.parameters[0]
    for read in param.users:
        if read.opcode is not Opcode.GET_TUPLE_ELEMENT or not isinstance(read.shape, ArrayShape):
            continue
        leaf = leaf_range(shape, read.attr("index"))[0]
        for user in read.users:
            if is_custom_call(user, SHARDING):
                found.setdefault(leaf, user)
    return found


def _conflicts(shape: ArrayShape, a: Sharding, b: Sharding) -> bool:
    """Neither sharding refines the other (both tiled, or tiled and partially replicated)."""
    if su.is_tile_maximal(a) or su.is_tile_maximal(b) or su.is_manual(a) or su.is_manual(b):
        return False
    return not su.is_subtiling(shape, a, b) and not su.is_subtiling(shape, b, a)


def _maybe_tuple(instr: Instruction, s: Sharding) -> Sharding:
    return su.single(instr.shape, s) if instr.shape.is_tuple else s


@forward(Opcode.REDUCE)
def _reduce_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """Reduced dims drop out; their devices become replicas (variadic reduces share one sharding)."""
    n = len(instr.operands) // 2
    dims = instr.dimensions
    changed = False
    aggressive = _single_user(ctx, instr)
    for operand in instr.operands[:n]:
        if not is_spatial(ctx, operand):
            continue
        s = known_sharding(ctx, operand)
        if su.is_replicated(s):
            changed |= ctx.improve(_maybe_tuple(instr, su.replicate_all_data_dims(s)), instr, aggressive=aggressive)
            continue
        partial = su.replicate_dims(s, dims)
        if su.is_replicated(partial):
            changed |= ctx.improve(_maybe_tuple(instr, partial), instr, aggressive=aggressive)
            continue
        changed |= ctx.improve(_maybe_tuple(instr, su.remove_dims(partial, dims)), instr, aggressive=aggressive)
    return changed


@forward(Opcode.BROADCAST)
def _broadcast_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """Only at the highest level: a broadcast's result usually wants its users' sharding, and
    taking its operand's early would force a reshard after it."""
    if ctx.aggressiveness < 3:
        return False
    operand = instr.operands[0]
    s = ctx.sharding(operand)
    if s is None or not is_spatial(ctx, operand) or su.is_replicated(s) or s.kind is not ShardingKind.TILED:
        return False
    dims = instr.dimensions
    tiles = [s.tile_dims[dims.index(i)] if i in dims else 1 for i in range(instr.array_shape.rank)]
    tiles += list(s.tile_dims[s.data_rank:])
    new = su.retile(s, tiles)
    return ctx.improve(new, instr, aggressive=_single_user(ctx, instr))


def _concat_operand_passes_early(ctx: PropagationContext, operand: Instruction) -> bool:
    """XLA lets a concatenate take a sharding at level 0 only for stacked parameters
    (reshape of a parameter or tuple element, already tiled)."""
    s = ctx.sharding(operand)
    return (s is not None and su.is_spatially_partitioned(s) and su.num_tiles(s) > 1
            and operand.opcode is Opcode.RESHAPE
            and operand.operands[0].opcode in (Opcode.PARAMETER, Opcode.GET_TUPLE_ELEMENT))


@forward(Opcode.CONCATENATE)
def _concatenate_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = representative_operand(ctx, instr)
    if operand is None or not is_spatial(ctx, operand):
        return False
    if ctx.aggressiveness == 0:
        for o in instr.operands:
            if not _concat_operand_passes_early(ctx, o):
                return False
            s = known_sharding(ctx, o)  # (each passes early: spatially partitioned)
            if any(s.tile_dims[d] > 1 for d in instr.dimensions):
                return False
    return ctx.improve(known_sharding(ctx, operand), instr, aggressive=_single_user(ctx, instr))


@forward(Opcode.TRANSPOSE)
def _transpose_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = instr.operands[0]
    if not is_spatial(ctx, operand):
        return False
    return ctx.improve(su.transpose(known_sharding(ctx, operand), instr.dimensions), instr,
                       aggressive=_single_user(ctx, instr))


def wide_window_dims(instr: Instruction, operand: Instruction) -> list[int]:
    """Dims whose window spans more than half of the dim (JAX's cumsum on the CPU is a
    reduce-window as wide as the dim).

    Deliberate difference from XLA, which carries such a dim's tiling into the op: our
    partitioner (handlers/reduce_window.py, halo.py) would then gather the dim, compute, and
    slice the result for nothing; a halo exchange only beats a gather when the window spans
    at most half the dim, so the tiling of these dims stays behind (a remark says so).  Not a
    cumulative reduction's dim (`ir/cumulative.py`): the partitioner runs that as a scan of each
    device's own rows plus one small gather of the tiles' totals, which beats a gather."""
    window = instr.window
    if window is None:
        return []
    dims = operand.array_shape.dims
    scan = CumulativeWindow.of(instr)
    return [d for d, w in enumerate(window.dimensions)
            if w.size > 1 and 2 * ((w.size - 1) * w.rhs_dilation + 1) > dims[d]
            and (scan is None or scan.dim != d)]


def _windowed(ctx: PropagationContext, instr: Instruction, operand: Instruction, s: Sharding) -> Sharding:
    wide = [d for d in wide_window_dims(instr, operand) if s.kind is ShardingKind.TILED and s.tile_dims[d] > 1]
    if not wide:
        return s
    ctx.remark(instr, f"dims {wide} keep no tiling: their window spans more than half the dim, where "
                      "the partitioner's halo exchange cannot beat a gather (XLA would carry it)")
    return su.replicate_dims(s, wide)


@forward(Opcode.REDUCE_WINDOW)
def _reduce_window_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """Inputs' shardings carry over whole (the partitioner exchanges halos); not with dilation."""
    window = instr.window
    if window is not None and any(w.lhs_dilation > 1 or w.rhs_dilation > 1 for w in window.dimensions):
        return False
    changed = False
    for operand in instr.operands[:len(instr.operands) // 2]:
        if is_spatial(ctx, operand):
            s = _windowed(ctx, instr, operand, known_sharding(ctx, operand))
            changed |= ctx.improve(_maybe_tuple(instr, s), instr, aggressive=_single_user(ctx, instr))
    return changed


@forward(Opcode.SELECT_AND_SCATTER)
def _select_and_scatter_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = instr.operands[0]
    if not is_spatial(ctx, operand):
        return False
    window = instr.window
    if window is not None and any(w.lhs_dilation > 1 for w in window.dimensions):
        return False
    s = _windowed(ctx, instr, operand, known_sharding(ctx, operand))
    return ctx.improve(s, instr, aggressive=_single_user(ctx, instr))


@forward(Opcode.RESHAPE)
def _reshape_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = instr.operands[0]
    if not is_spatial(ctx, operand):
        return False
    s = su.propagate_through_reshape(operand.array_shape, instr.array_shape, known_sharding(ctx, operand))
    return ctx.improve(s, instr, aggressive=_single_user(ctx, instr))


@forward(Opcode.REVERSE)
def _reverse_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = instr.operands[0]
    if not is_spatial(ctx, operand):
        return False
    return ctx.improve(su.reverse(known_sharding(ctx, operand), instr.dimensions), instr,
                       aggressive=_single_user(ctx, instr))


@forward(Opcode.PARAMETER)
def _parameter_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """A branch or call body's parameter takes the sharding of the operand passed to it (a while
    body's parameter is linked to the loop instead, see the pass)."""
    caller = ctx.caller_of(instr)
    if caller is None:
        return False
    if caller.opcode is Opcode.CONDITIONAL:
        for i, branch in enumerate(caller.called_computations()):
            if branch is instr.parent:
                s = ctx.sharding(caller.operands[i + 1])
                return s is not None and ctx.improve(s, instr)
        return False
    if caller.opcode is Opcode.CALL:
        assert instr.parameter_number is not None
        s = ctx.sharding(caller.operands[instr.parameter_number])
        return s is not None and ctx.improve(s, instr)
    return False


def sort_dimension(instr: Instruction) -> int:
    return (instr.dimensions or (0,))[0]


def sort_sharding_movable(s: Sharding, shape: ArrayShape, sort_dim: int) -> bool:
    """A sharding split on the sort dim can still be used when another dim divides evenly by
    its own tiles times the sort dim's: the partitioner can move the split there (XLA's
    GetFirstMergeableDimForSortOperand)."""
    if shape.rank < 2 or shape.dims[sort_dim] == 1 or s.kind is not ShardingKind.TILED or s.tile_dims[sort_dim] == 1:
        return False
    return any(d != sort_dim and shape.dims[d] % (s.tile_dims[sort_dim] * s.tile_dims[d]) == 0
               for d in range(shape.rank))


@forward(Opcode.SORT)
def _sort_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    operand = representative_operand(ctx, instr)
    if operand is None or not is_spatial(ctx, operand):
        return False
    s = known_sharding(ctx, operand)
    dim = sort_dimension(instr)
    if (s.kind is ShardingKind.TILED and s.tile_dims[dim] != 1 and not ctx.shardy_form
            and not sort_sharding_movable(s, operand.array_shape, dim)):
        return False
    return ctx.improve(_maybe_tuple(instr, s), instr, aggressive=_single_user(ctx, instr))


@forward(Opcode.TOPK)
def _topk_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """Shardy form only: the values and indices take the operand's sharding with the last dim
    (the one top-k selects along, k wide in the result) replicated.  XLA's GSPMD propagation
    has no rule for the top-k opcode and leaves it unsharded; Shardy's keeps the batch dims'
    tiling (a [4,4,64] top-8 tiled 2x1x4 otherwise gathered its whole result)."""
    operand = instr.operands[0]
    if not ctx.shardy_form or not is_spatial(ctx, operand):
        return False
    s = known_sharding(ctx, operand)
    kept = su.replicate_dims(s, [operand.array_shape.rank - 1])
    return not su.is_tile_maximal(kept) and ctx.improve(su.single(instr.shape, kept), instr)


def _cut_dims(instr: Instruction, operand: Instruction) -> list[int]:
    """The dims a dynamic-slice (or a dynamic-update-slice's update) does not span whole."""
    return [i for i in range(instr.array_shape.rank) if instr.array_shape.dims[i] != operand.array_shape.dims[i]]


@forward(Opcode.DYNAMIC_SLICE, Opcode.DYNAMIC_UPDATE_SLICE)
def _dynamic_slice_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """A dynamic-slice takes its operand's sharding (a dynamic-update-slice its update's), with
    the dims it cuts replicated, from level 0 on; a dynamic-update-slice also takes its base
    operand's sharding whole."""
    is_ds = instr.opcode is Opcode.DYNAMIC_SLICE
    operand = instr.operands[0] if is_ds else instr.operands[1]
    s = ctx.sharding(operand)
    cut = _cut_dims(instr, operand)
    changed = False
    if not is_ds and s is not None and su.is_spatially_partitioned(s) and is_spatial(ctx, instr.operands[0]):
        base = known_sharding(ctx, instr.operands[0])
        if _base_is_cheaper(instr, base, su.replicate_dims(s, cut), s, cut):
            ctx.remark(instr, "takes its base operand's sharding before its update's, which conflicts "
                              "with it: moving the update costs less than moving the base (XLA tries "
                              "the update's first)")
            changed |= ctx.improve(base, instr)
    if s is not None and su.is_spatially_partitioned(s):
        changed |= ctx.improve(su.replicate_dims(s, cut), instr, aggressive=_single_user(ctx, instr))
    if not is_ds and is_spatial(ctx, instr.operands[0]):
        changed |= ctx.improve(known_sharding(ctx, instr.operands[0]), instr)
    return changed


def _base_is_cheaper(instr: Instruction, base: Sharding, from_update: Sharding, update: Sharding,
                     cut: list[int]) -> bool:
    """Do a dynamic-update-slice's base operand and its update offer shardings that conflict
    (neither refines the other), and would the instruction, taking the base's, cost less
    resharding than taking the update's?  XLA's order (the update's first) leaves a scan that
    writes its stacked outputs into a sharded buffer moving that whole buffer every iteration
    to fit a small update; the cheaper of the two is what Shardy's propagation also picks (the
    larger tensor's).  Each choice is priced by the reshards it asks of both operands."""
    if not _conflicts(instr.array_shape, base, from_update):
        return False  # one refines the other: XLA's order gives the same answer
    base_shape, update_shape = instr.operands[0].shape, instr.operands[1].shape
    n = base.num_devices

    def price(choice: Sharding) -> Estimate:
        return (reshard_cost(base, choice, base_shape, n)
                + reshard_cost(update, su.replicate_dims(choice, cut), update_shape, n))

    return price(base) < price(from_update)


@forward(Opcode.WHILE)
def _while_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    s = ctx.sharding(instr.operands[0])
    if s is None:
        return False
    current = ctx.sharding(instr)
    if current is not None and current.kind is s.kind:
        _, s = su.merge(current, s, ctx.may_combine)
    if current is not None and s.kind is ShardingKind.TUPLE and current.kind is ShardingKind.TUPLE:
        s = _keeping_carried_constraints(ctx, instr, s, current)
    return ctx.improve(s, instr)


def _keeping_carried_constraints(ctx: PropagationContext, loop: Instruction, offered: Sharding,
                                 current: Sharding) -> Sharding:
    """`offered` (the initial value's tuple sharding) with the leaves the loop state took from a
    body constraint (`_tuple_forward`, `_loop_carried_constraints`) kept as they are: a tuple
    with more tiles elsewhere would otherwise win them back (a tuple's improvement is judged
    leaf by leaf, without the sub-tiling test of an array's) and undo the choice."""
    if offered == current:  # the usual case: nothing to keep, no need to read the body
        return offered
    root = loop.called_computation("body").root
    if root is None or root.opcode is not Opcode.TUPLE:
        return offered
    constraints = _loop_carried_constraints(ctx, root)
    if not constraints:
        return offered
    offered_leaves = su.leaves_of(offered, loop.shape)
    current_leaves = su.leaves_of(current, loop.shape)
    kept = False
    for leaf, constraint in constraints.items():
        if current_leaves[leaf] == ctx.sharding(constraint) and offered_leaves[leaf] != current_leaves[leaf]:
            offered_leaves[leaf] = current_leaves[leaf]
            kept = True
            ctx.remark(loop, f"loop state element {leaf} keeps the body's constraint {constraint.name} "
                             "over the initial value's sharding: that reshards it once before the loop, "
                             "the initial one every iteration (XLA takes the initial one when it has more tiles)")
    return su.tuple_sharding(offered_leaves) if kept else offered


@forward(Opcode.FFT)
def _fft_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """An FFT's leading dims (all but the transformed ones) take the operand's tiling, the
    transformed dims none, as Shardy's rule passes them.  XLA's GSPMD propagation has none for
    the opcode (its partitioner runs a batch-tiled FFT locally all the same): without it an
    rfft of activations tiled over batch and features was gathered whole after its local
    transform and everything after it ran replicated (Shardy form: 5x XLA's bytes; GSPMD form:
    XLA's plan, which gathers too)."""
    s = infer_from_operands(instr, [ctx.sharding(instr.operands[0])])
    return s is not None and not su.is_tile_maximal(s) and ctx.improve(s, instr, aggressive=_single_user(ctx, instr))


@forward(Opcode.CUSTOM_CALL)
def _custom_call_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    if is_custom_call(instr, BARRIER_FROM):
        return False  # nothing crosses a barrier-from forward
    if is_custom_call(instr, BARRIER_TO):
        s = ctx.sharding(instr.operands[0])
        return s is not None and ctx.improve(s, instr, aggressive=_single_user(ctx, instr))
    if is_batch_partitionable_custom_call(instr):  # the LAPACK calls JAX registers (batch_dims.py)
        s = infer_from_operands(instr, [ctx.sharding(op) for op in instr.operands])
        return s is not None and ctx.improve(s, instr, aggressive=_single_user(ctx, instr))
    operand = representative_operand(ctx, instr)
    if operand is None or not is_spatial(ctx, operand):
        return False
    return ctx.improve(known_sharding(ctx, operand), instr, aggressive=_single_user(ctx, instr))


def default_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """Elementwise ops merge every operand's sharding (from level 1); other ops copy their
    representative operand's (slice and pad keep it whole: the partitioner handles the cut)."""
    if is_elementwise(instr) and ctx.may_combine:
        changed = False
        for operand in instr.operands:
            if not is_spatial(ctx, operand):
                continue
            s = known_sharding(ctx, operand)
            if instr.opcode is Opcode.RNG:
                changed |= ctx.improve(su.replicate_all_data_dims(s, instr.array_shape.rank), instr,
                                       aggressive=_single_user(ctx, instr))
                continue
            changed |= ctx.improve(s, instr, aggressive=len(instr.operands) == 1 and _single_user(ctx, instr))
        return changed
    rep = representative_operand(ctx, instr)
    if rep is None or not is_spatial(ctx, rep):
        return False
    return ctx.improve(known_sharding(ctx, rep), instr, aggressive=_single_user(ctx, instr))


# ---------------------------------------------------------- from-user rules --
UserRule = Callable[[PropagationContext, Instruction, Instruction], Optional[Sharding]]
FROM_USER: dict[Opcode, UserRule] = {}


def from_user(*opcodes: Opcode) -> Callable[[UserRule], UserRule]:
    def register(fn: UserRule) -> UserRule:
        for op in opcodes:
            FROM_USER[op] = fn
        return fn
    return register


@from_user(Opcode.BROADCAST)
def _broadcast_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """The operand keeps the tiling of the dims it maps to; new dims' devices become replicas."""
    s = known_sharding(ctx, user)
    if su.is_replicated(s) or su.is_manual(s):
        return s
    if s.kind is not ShardingKind.TILED:
        return None
    new = [i for i in range(user.array_shape.rank) if i not in user.dimensions]
    return su.remove_dims(su.replicate_dims(s, new), new)


@from_user(Opcode.CONCATENATE)
def _concatenate_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    if ctx.aggressiveness == 0:
        return None
    return ctx.sharding(user)


@from_user(Opcode.DYNAMIC_SLICE, Opcode.DYNAMIC_UPDATE_SLICE)
def _dynamic_slice_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """A dynamic-update-slice's base takes its sharding whole; the sliced operand (or the
    update) with the dims the slice cuts replicated; the index operands only a replicated
    sharding."""
    if ctx.aggressiveness == 0:
        return None
    s = known_sharding(ctx, user)
    if su.is_replicated(s):
        return s
    if user.opcode is Opcode.DYNAMIC_UPDATE_SLICE and instr is user.operands[0]:
        return s
    operand = user.operands[0] if user.opcode is Opcode.DYNAMIC_SLICE else user.operands[1]
    if instr is not operand:
        return None
    return su.replicate_dims(s, _cut_dims(user, operand))


@from_user(Opcode.REDUCE_WINDOW)
def _reduce_window_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    n = len(user.operands) // 2
    inputs = user.operands[:n]
    if instr not in inputs:
        return None
    s = known_sharding(ctx, user)
    if user.shape.is_tuple:
        return su.sub_sharding(user.shape, s, inputs.index(instr))
    return s


@from_user(Opcode.RESHAPE)
def _reshape_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    return su.propagate_through_reshape(user.array_shape, instr.array_shape, known_sharding(ctx, user))


@from_user(Opcode.PAD)
def _pad_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    return ctx.sharding(user) if instr is user.operands[0] else None


@from_user(Opcode.SLICE)
def _slice_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    return ctx.sharding(user)


@from_user(Opcode.TRANSPOSE)
def _transpose_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    perm = user.dimensions
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return su.transpose(known_sharding(ctx, user), inverse)


@from_user(Opcode.TUPLE)
def _tuple_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """The element's sharding; an operand used twice takes the more specific of its elements."""
    s = known_sharding(ctx, user)
    indices = ctx.operand_indices(user, instr)
    best = su.sub_sharding(user.shape, s, indices[0])
    for i in indices[1:]:
        alt = su.sub_sharding(user.shape, s, i)
        if _comparable(alt, best) and su.is_more_specific(alt, best):
            best = alt
    return best


@from_user(Opcode.GET_TUPLE_ELEMENT)
def _gte_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """The tuple's sharding with the element's leaves replaced (others kept, or replicated)."""
    index = user.attr("index")
    us = known_sharding(ctx, user)
    start, count = leaf_range(instr.shape, index)
    current = ctx.sharding(instr)
    if user.shape.is_tuple:
        if us.kind is not ShardingKind.TUPLE or not us.elements:
            return None
        fill = su.replicate_all_data_dims(us.elements[0])
        new_leaves = list(us.elements)
    else:
        fill = su.replicate_all_data_dims(us)
        new_leaves = [us]
    leaves = su.leaves_of(current, instr.shape) if current is not None else [fill] * len(instr.shape.leaves())
    leaves[start:start + count] = new_leaves[:count]
    return su.tuple_sharding(leaves)


@from_user(Opcode.REDUCE)
def _reduce_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """The reduced dims come back untiled; merged with the other inputs' shardings when they fit."""
    if not isinstance(instr.shape, ArrayShape) or instr.shape.rank == 0:
        return None
    s = known_sharding(ctx, user)
    if user.shape.is_tuple:
        s = su.sub_sharding(user.shape, s, user.operands.index(instr))
    if s.kind is ShardingKind.TILED:
        dims = set(user.dimensions)
        extra = len(s.tile_dims) - s.data_rank
        target: list[int] = []
        nxt = 0
        for i in range(instr.shape.rank + extra):
            if i in dims:
                target.append(1)
            else:
                target.append(s.tile_dims[nxt])
                nxt += 1
        s = su.retile(s, target)
    n = len(user.operands) // 2
    for operand in user.operands[:n]:
        other = ctx.sharding(operand)
        if operand is not instr and other is not None and not su.is_manual(other) and not su.is_manual(s):
            merged = su.merge_if_compatible(other, su.num_tiles(s) + 1, s)
            if merged is not None:
                s = merged
    return s


@from_user(Opcode.SORT)
def _sort_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    s = known_sharding(ctx, user)
    if s.kind is ShardingKind.TUPLE:
        return su.sub_sharding(user.shape, s, user.operands.index(instr))
    return s


@from_user(Opcode.TOPK)
def _topk_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """Shardy form only: the operand takes the values' sharding, the last dim replicated."""
    if not ctx.shardy_form:
        return None
    s = su.sub_sharding(user.shape, known_sharding(ctx, user), 0)
    kept = su.replicate_dims(s, [instr.array_shape.rank - 1])
    return None if su.is_tile_maximal(kept) else kept


@from_user(Opcode.REVERSE)
def _reverse_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    return su.reverse(known_sharding(ctx, user), user.dimensions)


@from_user(Opcode.FFT)
def _fft_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """The operand takes the result's tiling of the leading (batch) dims."""
    s = infer_from_operands(user, [known_sharding(ctx, user)]) if user.operands[0] is instr else None
    return None if s is None or su.is_tile_maximal(s) else s


@from_user(Opcode.CUSTOM_CALL)
def _custom_call_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    return ctx.sharding(user) if same_dims(instr.shape, user.shape) else None


def default_from_user(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    """A user of the same dims (elementwise ops, copies, a while, a select's predicate) wants
    its own sharding."""
    return ctx.sharding(user) if same_dims(instr.shape, user.shape) else None


# The dot, convolution, gather and scatter rules register themselves here.
from hlo_passes.passes.spmd import propagation_dot as _dot  # noqa: E402,F401  (registers rules)
from hlo_passes.passes.spmd import propagation_gather as _gather  # noqa: E402,F401  (registers rules)


def forward_rule(instr: Instruction) -> ForwardRule:
    return FORWARD.get(instr.opcode, default_forward)


def user_rule(user: Instruction) -> UserRule:
    return FROM_USER.get(user.opcode, default_from_user)
