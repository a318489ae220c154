"""Module statistics for `--stats` and the benchmarks: instructions by opcode,
collectives by kind (count and bytes each device sends into them), FLOPs and transcendentals.

FLOPs and transcendentals follow XLA's HloCostAnalysis (xla/service/hlo_cost_analysis.cc), the
figure `hlo_passes.runtime.xla_backend.cost_analysis` reports and every benchmark compares
against, one rule per opcode (`_OWN_WORK`):  2·M·N·K for a dot, 2 × the multiply-adds at valid
window positions for a convolution, one per output element for element-wise ops, but a
transcendental one (exp, log, tanh, ...) counts as a transcendental and not as a FLOP; a reduce
or a reduce-window applies its reducer once per combined pair of elements; data movement (copy,
transpose, gather, ...) is free.  Called computations count as XLA counts them (`_CALLED_WORK`):
fusion and call bodies once per call site, a while's body and condition once (trip counts are
unknown to XLA too), a conditional its costliest branch.  One difference is deliberate: XLA charges
a custom-call -1 FLOPs, its mark for "unknown"; here it counts nothing.  Collectives are counted once each, or
(`executed`) as many times as one run of the entry executes them (a scanned model's loop body
times its layers)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_TERNARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.ir.shape import ArrayShape, Shape
from hlo_passes.ir.while_loop import trip_count

_DONE = {Opcode.ALL_REDUCE_DONE, Opcode.ALL_GATHER_DONE, Opcode.COLLECTIVE_PERMUTE_DONE}


@dataclass
class ModuleStats:
    opcodes: Counter = field(default_factory=Counter)
    collective_count: Counter = field(default_factory=Counter)
    collective_bytes: Counter = field(default_factory=Counter)
    flops: int = 0
    transcendentals: int = 0

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    def format(self, title: str = "") -> str:
        lines = [title] if title else []
        lines.append(f"  instructions: {self.instructions}   flops: {self.flops:,}"
                     f"   transcendentals: {self.transcendentals:,}")
        top = ", ".join(f"{op} {n}" for op, n in self.opcodes.most_common(12))
        lines.append(f"  by opcode: {top}")
        if self.collective_count:
            for kind in sorted(self.collective_count):
                n = self.collective_count[kind]
                lines.append(f"  {kind}: {n} op{'s' if n != 1 else ''}, {self.collective_bytes[kind]:,} bytes")
        else:
            lines.append("  collectives: none")
        return "\n".join(lines)


def collective_kind(instr: Instruction) -> str | None:
    """`all-reduce`, `all-gather`, ... for a collective (an async `-start` counts as its
    kind, its `-done` not at all); None for anything else."""
    if instr.opcode.is_collective and instr.opcode not in _DONE:
        return instr.opcode.value.removesuffix("-start")
    return None


def collective_bytes(instr: Instruction) -> int:
    """Bytes each device sends into a collective: the size of its operands."""
    return sum(o.shape.byte_size() for o in instr.operands)


# ------------------------------------------------------------------- work --
@dataclass(frozen=True, slots=True)
class Work:
    """What XLA's HloCostAnalysis counts of an instruction or a computation: `flops`, and
    apart from them `transcendentals` (one exp or tanh costs several FLOPs on any unit, so XLA
    keeps the two apart; `cost_analysis(text)["transcendentals"]`)."""

    flops: int = 0
    transcendentals: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.transcendentals + other.transcendentals)

    def times(self, count: int) -> Work:
        """This work done `count` times (a reducer applied once per combined pair)."""
        return Work(self.flops * count, self.transcendentals * count)

    def costliest(self, other: Work) -> Work:
        """Each count the larger of the two: XLA's charge for a conditional's branches."""
        return Work(max(self.flops, other.flops), max(self.transcendentals, other.transcendentals))

    @property
    def operations(self) -> int:
        """FLOPs and transcendentals together: what a compute unit spends, for the cost model
        (a transcendental is real work; it counted as one operation per element there before
        `stats` split it off to agree with XLA)."""
        return self.flops + self.transcendentals


NO_WORK = Work()

# XLA's HandleElementwiseOp counts these as transcendentals, not FLOPs (checked against the
# oracle: jaxlib's XLA also lists the inverse and hyperbolic trigonometric functions).
TRANSCENDENTAL = frozenset({
    Opcode.ACOS, Opcode.ACOSH, Opcode.ASIN, Opcode.ASINH, Opcode.ATAN2, Opcode.ATANH, Opcode.CBRT,
    Opcode.COS, Opcode.COSH, Opcode.ERF, Opcode.EXP, Opcode.EXPM1, Opcode.LOG, Opcode.LOG1P,
    Opcode.LOGISTIC, Opcode.POWER, Opcode.RSQRT, Opcode.SIN, Opcode.SINH, Opcode.SQRT, Opcode.TAN,
    Opcode.TANH,
})
# One FLOP per output element: every element-wise op but the transcendentals and copy (XLA's
# HandleCopy charges nothing); compare, select, clamp, convert and reduce-precision included.
_ONE_FLOP_PER_ELEMENT = (ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY) - TRANSCENDENTAL - {Opcode.COPY}

_FMA_FLOPS = 2  # XLA's kFmaFlops: a multiply-add is two FLOPs


def _elements(shape: Shape) -> int:
    """Elements of an array shape, or of a tuple's first element (XLA's variadic reduce,
    reduce-window and sort read their sizes there)."""
    if isinstance(shape, ArrayShape):
        return shape.element_count
    leaves = shape.leaves()
    return leaves[0].element_count if leaves else 0


class _WorkCounter:
    """Work of instructions and of the computations they call, each computation counted once
    however many paths of calls reach it (a body calling its callee twice thirty deep is 2^30
    paths but thirty computations); a computation that calls itself (invalid HLO) adds nothing
    the second time."""

    def __init__(self) -> None:
        self._done: dict[Computation, Work] = {}
        self._open: set[Computation] = set()

    def computation(self, comp: Computation) -> Work:
        """One run of `comp`, as XLA's ProcessSubcomputation counts it."""
        if comp in self._done:
            return self._done[comp]
        if comp in self._open:
            return NO_WORK
        self._open.add(comp)
        total = NO_WORK
        for instr in comp.instructions:
            total = total + self.instruction(instr)
        self._open.discard(comp)
        self._done[comp] = total
        return total

    def instruction(self, instr: Instruction) -> Work:
        """`instr`'s own work and that of the bodies it runs (fusion, call, while, ...)."""
        own = self.own(instr)
        bodies = _CALLED_WORK.get(instr.opcode)
        return own if bodies is None else own + bodies(instr, self)

    def own(self, instr: Instruction) -> Work:
        """`instr`'s work with the computations it applies per element (reducers, comparators,
        mapped functions) but not the bodies it runs (`_CALLED_WORK`)."""
        rule = _OWN_WORK.get(instr.opcode)
        return NO_WORK if rule is None else rule(instr, self)


_Rule = Callable[[Instruction, _WorkCounter], Work]


# ------------------------------------------------------ rules, per opcode --
def _elementwise(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleElementwiseOp: one FLOP per output element."""
    return Work(flops=_elements(instr.shape))


def _transcendental(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleElementwiseOp: one transcendental (no FLOP) per output element."""
    return Work(transcendentals=_elements(instr.shape))


def _random(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleRng, HandleRngBitGenerator: one transcendental per generated element, in every
    element of a tuple result (the new state too)."""
    return Work(transcendentals=sum(leaf.element_count for leaf in instr.shape.leaves()))


def _dot(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleDot (GetDotFlops): a multiply-add per output element and contracted element."""
    lhs = instr.operands[0].array_shape
    contracted = math.prod(lhs.dims[d] for d in instr.dot_dimensions.lhs_contracting)
    return Work(flops=_FMA_FLOPS * _elements(instr.shape) * contracted)


def _ragged_dot(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleRaggedDot: GetDotFlops over the result with as many leading dimensions deleted as
    the rhs has group dimensions (XLA deletes dimension i of the shrinking shape, i = 0, 1, ...)."""
    dims = list(instr.array_shape.dims)
    for i in range(len(instr.attr("rhs_group_dims") or ())):
        del dims[i]
    lhs = instr.operands[0].array_shape
    contracted = math.prod(lhs.dims[d] for d in instr.dot_dimensions.lhs_contracting)
    return Work(flops=_FMA_FLOPS * math.prod(dims) * contracted)


def _valid_positions(stride: int, padding_low: int, lhs_dilation: int, rhs_dilation: int,
                     kernel: int, output: int, input_size: int) -> int:
    """(output position, kernel position) pairs of one spatial dimension that read a real input
    element, not padding nor a hole of lhs dilation (GetConvolutionFlops' valid positions)."""
    count = 0
    for k in range(kernel):
        offset = k * rhs_dilation - padding_low  # dilated input index read at output 0
        if stride == 1 and lhs_dilation == 1:  # output o reads input o + offset
            count += max(0, min(output, input_size - offset) - max(0, -offset))
            continue
        for o in range(output):
            index, hole = divmod(o * stride + offset, lhs_dilation)
            count += hole == 0 and 0 <= index < input_size
    return count


def _convolution(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleConvolution (GetConvolutionFlops): a multiply-add per (input feature of a group,
    output feature, batch of a batch group, valid window position): padding, holes of lhs
    dilation and positions past the input do no work."""
    lhs, rhs, out = instr.operands[0].array_shape, instr.operands[1].array_shape, instr.array_shape
    labels = instr.conv_labels
    assert labels is not None, f"{instr.name}: a convolution has dim_labels"
    window = instr.window
    positions = 1
    for i, dim in enumerate(window.dimensions if window is not None else ()):
        positions *= _valid_positions(dim.stride, dim.padding_low, dim.lhs_dilation, dim.rhs_dilation,
                                      rhs.dims[labels.kernel_spatial[i]], out.dims[labels.output_spatial[i]],
                                      lhs.dims[labels.input_spatial[i]])
    multiply_adds = (lhs.dims[labels.input_feature] // instr.feature_group_count) * out.dims[labels.output_feature] \
        * (lhs.dims[labels.input_batch] // instr.batch_group_count) * positions
    return Work(flops=_FMA_FLOPS * multiply_adds)


def _reduce(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleReduce: the reducer once per element folded away (operand elements less result
    elements); a variadic reducer does the work of all its operands in one application."""
    reducer = counter.computation(instr.called_computation("to_apply"))
    return reducer.times(_elements(instr.operands[0].shape) - _elements(instr.shape))


def _reduce_window(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleReduceWindow: the reducer (window elements - 1) times per output element, padding
    included; but a window that spans one whole dimension, centred (size 2n - 1, padding n - 1 on
    both sides: a reduce broadcast back along that dimension), XLA charges as that reduce plus
    the broadcast: output / n + n - 1 applications."""
    window = instr.window
    assert window is not None, f"{instr.name}: a reduce-window has a window"
    dims = window.dimensions
    outputs = _elements(instr.shape)
    applications = (math.prod(d.size for d in dims) - 1) * outputs
    reducing = [i for i, d in enumerate(dims) if d.size != 1]
    padded = [i for i, d in enumerate(dims) if d.padding_low or d.padding_high]
    if len(reducing) == 1 and len(padded) == 1 and isinstance(instr.shape, ArrayShape):
        i = reducing[0]
        d = dims[i]
        whole = instr.shape.dims[i]
        if d.padding_low and d.padding_low == d.padding_high == whole - 1 and d.size == 2 * d.padding_low + 1:
            applications = outputs // whole + whole - 1
    return counter.computation(instr.called_computation("to_apply")).times(applications)


def _select_and_scatter(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleSelectAndScatter: per source element, `select` (window elements - 1) times and
    `scatter` once."""
    window = instr.window
    assert window is not None, f"{instr.name}: a select-and-scatter has a window"
    sources = _elements(instr.operands[1].shape)
    selects = sources * (math.prod(d.size for d in window.dimensions) - 1)
    return counter.computation(instr.called_computation("select")).times(selects) \
        + counter.computation(instr.called_computation("scatter")).times(sources)


def _scatter(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleScatter: the combiner once per element of the (first) updates."""
    first_updates = instr.operands[(len(instr.operands) - 1) // 2 + 1]
    return counter.computation(instr.called_computation("to_apply")).times(_elements(first_updates.shape))


def _map(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleMap: the mapped function once per output element."""
    return counter.computation(instr.called_computation("to_apply")).times(_elements(instr.shape))


def _sort(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleSort: n·⌈log2 n⌉ FLOPs for the n elements of the first operand, whatever the
    comparator and however many operands ride along."""
    n = _elements(instr.operands[0].shape)
    return Work(flops=n * (n - 1).bit_length()) if n else NO_WORK


def _fft(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleFft: 2 × 4 multiply-adds (a complex multiply) × ∏⌊log2 length⌋ per input element."""
    log_factors = math.prod(length.bit_length() - 1 for length in instr.attr("fft_length") or ())
    return Work(flops=_FMA_FLOPS * 4 * log_factors * _elements(instr.operands[0].shape))


def _triangular_solve(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleTriangularSolve: a multiply-add per element of b and row of a."""
    a, b = instr.operands[0].array_shape, instr.operands[1].array_shape
    return Work(flops=_FMA_FLOPS * a.dims[-1] * b.element_count)


def _cholesky(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleCholesky: n³/3 per matrix (n × the elements of a, over 3)."""
    a = instr.operands[0].array_shape
    return Work(flops=a.dims[-1] * a.element_count // 3)


def _all_reduce(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleAllReduce: one FLOP per result element (XLA assumes two participants), the
    reduction computation not consulted."""
    return Work(flops=sum(leaf.element_count for leaf in instr.shape.leaves()))


_OWN_WORK: dict[Opcode, _Rule] = {
    **{op: _elementwise for op in _ONE_FLOP_PER_ELEMENT},
    **{op: _transcendental for op in TRANSCENDENTAL},
    Opcode.RNG: _random,
    Opcode.RNG_BIT_GENERATOR: _random,
    Opcode.DOT: _dot,
    Opcode.SCALED_DOT: _dot,
    Opcode.RAGGED_DOT: _ragged_dot,
    Opcode.CONVOLUTION: _convolution,
    Opcode.REDUCE: _reduce,
    Opcode.REDUCE_WINDOW: _reduce_window,
    Opcode.SELECT_AND_SCATTER: _select_and_scatter,
    Opcode.SCATTER: _scatter,
    Opcode.MAP: _map,
    Opcode.SORT: _sort,
    Opcode.FFT: _fft,
    Opcode.TRIANGULAR_SOLVE: _triangular_solve,
    Opcode.CHOLESKY: _cholesky,
    Opcode.ALL_REDUCE: _all_reduce,
    Opcode.ALL_REDUCE_START: _all_reduce,
}
"""An instruction's own work, per opcode; any opcode not here does none (data movement, gather,
iota, collectives other than all-reduce, parameters, tuples).  A custom-call XLA marks unknown with
-1 FLOPs; here it counts nothing, as an unknown amount cannot be added up."""


def _fusion_body(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleFusion: the fused computation's work; a custom fusion holding a gather or scatter
    is charged as that first gather or scatter alone."""
    body = instr.called_computation("calls")
    if instr.fusion_kind == "kCustom":
        for fused in body.instructions:
            if fused.opcode in (Opcode.GATHER, Opcode.SCATTER):
                return counter.own(fused)
    return counter.computation(body)


def _call_body(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleCall, HandleAsyncStart: the (first) called computation's work."""
    return counter.computation(instr.called_computations()[0])


def _while_body(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleWhile: the body and the condition once each (XLA does not read trip counts)."""
    return counter.computation(instr.called_computation("body")) \
        + counter.computation(instr.called_computation("condition"))


def _costliest_branch(instr: Instruction, counter: _WorkCounter) -> Work:
    """HandleConditional: FLOPs and transcendentals each of its costliest branch."""
    total = NO_WORK
    for branch in instr.branch_computations:
        total = total.costliest(counter.computation(branch))
    return total


_CALLED_WORK: dict[Opcode, _Rule] = {
    Opcode.FUSION: _fusion_body,
    Opcode.CALL: _call_body,
    Opcode.ASYNC_START: _call_body,
    Opcode.WHILE: _while_body,
    Opcode.CONDITIONAL: _costliest_branch,
}
"""The bodies an instruction runs, per opcode, counted beside its own work; the cost model walks
these bodies itself and asks `instruction_work` for each instruction's own share."""


def instruction_work(instr: Instruction) -> Work:
    """`instr`'s own work, as XLA counts it, with the computations it applies per element
    (reducers, comparators, mapped and scatter functions) but without the bodies it runs
    (fusion, call, while, conditional, async): those are instructions of their own to a walker."""
    return _WorkCounter().own(instr)


def computation_work(comp: Computation) -> Work:
    """One run of `comp` as XLA's HloCostAnalysis counts it, every called computation included
    (a while's body once, a conditional's costliest branch)."""
    return _WorkCounter().computation(comp)


def module_stats(module: Module, *, executed: bool = False) -> ModuleStats:
    """Static counts (each instruction once), or with `executed` the collectives as a step runs
    them: a while body's times its trip count where the module says it (see ir/while_loop.py;
    once where unknown), a computation called from several places once per call.  FLOPs and
    transcendentals are XLA's HloCostAnalysis of the entry either way."""
    stats = ModuleStats()
    runs = _executions(module) if executed else None
    for comp in module.computations:
        times = 1 if runs is None else runs.get(comp, 0)
        for instr in comp.instructions:
            stats.opcodes[instr.opcode.value] += 1
            kind = collective_kind(instr)
            if kind is not None and times:
                stats.collective_count[kind] += times
                stats.collective_bytes[kind] += times * collective_bytes(instr)
    if module.entry is not None:
        work = computation_work(module.entry)
        stats.flops, stats.transcendentals = work.flops, work.transcendentals
    return stats


def _executions(module: Module) -> dict[Computation, int]:
    """How many times each computation reachable from the entry through control flow runs in
    one execution of the entry (computations nothing executes are left out)."""
    runs: dict[Computation, int] = {}
    if module.entry is None:
        return runs
    runs[module.entry] = 1
    for comp in reversed(module.computation_post_order()):  # callers before callees
        times = runs.get(comp, 0)
        if not times:
            continue
        for instr in comp.instructions:
            if instr.opcode not in _CONTROL_FLOW:
                continue
            per_call = times
            if instr.opcode is Opcode.WHILE:
                per_call = times * (trip_count(instr) or 1)
            for callee in instr.called_computations():
                runs[callee] = runs.get(callee, 0) + per_call
    return runs


_CONTROL_FLOW = (Opcode.WHILE, Opcode.CALL, Opcode.CONDITIONAL, Opcode.ASYNC_START)
