"""One cost model for every partitioning decision: estimated time per device.

Bytes alone make the wrong choice exactly where it matters: gathering a Megatron layer's
activation and weight moves fewer bytes than all-reducing the partial matmul at small batch,
and then every device multiplies the whole matrix — compute grows with d², bytes with d.
So every choice (reshard plans, dot/convolution tilings, halo vs gather, partition vs
replicate) is priced in seconds on a hardware profile:

    time = per-device compute  max(FLOPs / peak FLOP/s(type), bytes touched / memory bandwidth)
         + per collective      (1 - overlap) × wire bytes / link bandwidth
                               (+ latency: it breaks ties, and counts against a
                                choice that replicates work; see `cheapest`)

Compute counts whole and communication only in the share an asynchronous schedule cannot hide
(`overlap`, 0.5 on the accelerator profile): replicated work is never free, and this is what
keeps an FSDP layer's matmul partial-summed (XLA's choice) instead of gathering both operands
to multiply the whole matrix on every device.

with each collective's wire volume from the algorithm a runtime uses on a ring of g devices:

    all-gather, reduce-scatter   (g-1)/g × the full (gathered / unscattered) buffer
    all-reduce                   2 (g-1)/g × the buffer (reduce-scatter + all-gather)
    all-to-all                   (g-1)/g × the buffer
    collective-permute           the buffer

Profiles are data (`PROFILES`): `accelerator` (H100-class: ~990 TFLOP/s dense bf16, ~60
TFLOP/s f32 without tensor cores, 3.35 TB/s HBM, ~450 GB/s per-direction NVLink, 10 µs
collective latency) is the default; `cpu` models the virtual CPU devices this project tests
on.  A pass option selects one (`spmd-partition{cost-profile=cpu}`).

    model = CostModel.for_profile("accelerator")
    t = model.collective("all-reduce", 4 << 20, group=8)        # seconds
    est = model.dot(flops=2 * 4096**3, out_bytes=..., operand_bytes=..., element_type=F32)

`Estimate` values add up (`seconds`, `bytes` received per device, `flops`) so a handler can
show what it chose and why.  The memory limit: a candidate that holds more per device than the
unpartitioned instruction would (its operands and result whole) is refused unless the pass
allows it.

The API is small and typed on purpose: an automatic sharding pass (solving over
per-instruction strategies, Alpa-style) needs exactly `instruction` + `reshard` costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection, Iterable, TypeVar

from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_TERNARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType

if TYPE_CHECKING:
    from hlo_passes.ir.computation import Computation
    from hlo_passes.ir.instruction import Instruction
    from hlo_passes.ir.module import Module

GIB = 1 << 30


@dataclass(frozen=True)
class HardwareProfile:
    """Peak rates of one device and its interconnect (per direction)."""

    name: str
    # FLOP/s by element-type class: "f8", "bf16", "f16", "f32", "f64", "int"
    flops: dict[str, float]
    memory_bandwidth: float        # bytes/s of device memory
    link_bandwidth: float          # bytes/s a device sends (and receives) in a collective
    collective_latency: float      # seconds per collective (launch + synchronisation)
    memory_bytes: int = 80 * GIB   # per-device memory
    # The share of collective time an asynchronous schedule hides behind independent compute
    # (XLA GPU's latency-hiding scheduler overlaps collectives; XLA CPU runs them in line).
    # Compute is never hidden: a choice that replicates work pays all of it.
    overlap: float = 0.0

    def flop_rate(self, element_type: PrimitiveType) -> float:
        return self.flops.get(_type_class(element_type), self.flops["f32"])


PROFILES: dict[str, HardwareProfile] = {
    "accelerator": HardwareProfile(
        "accelerator",
        flops={"f8": 1979e12, "bf16": 989e12, "f16": 989e12, "f32": 60e12, "f64": 30e12, "int": 60e12},
        memory_bandwidth=3.35e12, link_bandwidth=450e9, collective_latency=10e-6, memory_bytes=80 * GIB,
        overlap=0.5),
    "cpu": HardwareProfile(
        "cpu",
        flops={"f8": 5e10, "bf16": 5e10, "f16": 5e10, "f32": 1e11, "f64": 5e10, "int": 1e11},
        memory_bandwidth=2e10, link_bandwidth=1e10, collective_latency=20e-6, memory_bytes=16 * GIB),
}


def _type_class(t: PrimitiveType) -> str:
    name = t.value
    if name.startswith("f8") or name.startswith("f4"):
        return "f8"
    if name in ("bf16", "f16", "f32", "f64"):
        return name
    if name in ("c64",):
        return "f32"
    if name in ("c128",):
        return "f64"
    return "int"


@dataclass(frozen=True)
class Estimate:
    """Estimated cost per device of some work.

    `seconds` is what decisions compare: compute time plus the part of communication time an
    asynchronous schedule cannot hide (the profile's `overlap`); `comm_seconds` the whole
    communication time; `collectives` how many it launches (each pays the profile's latency);
    `bytes` received and `flops` computed."""

    seconds: float = 0.0
    bytes: int = 0
    flops: int = 0
    collectives: int = 0
    comm_seconds: float = 0.0
    latency_seconds: float = 0.0   # the collectives' latency in the share the schedule cannot hide

    def __add__(self, other: "Estimate") -> "Estimate":
        return Estimate(self.seconds + other.seconds, self.bytes + other.bytes, self.flops + other.flops,
                        self.collectives + other.collectives, self.comm_seconds + other.comm_seconds,
                        self.latency_seconds + other.latency_seconds)

    def __lt__(self, other: "Estimate") -> bool:
        """Exposed time first; on a tie, fewer collectives, then fewer bytes and FLOPs.
        Latency only breaks ties: a choice made per instruction cannot know which collectives the
        schedule overlaps, and on small arrays latency would otherwise decide everything
        (replicating work to save one collective)."""
        if abs(self.seconds - other.seconds) > 1e-9 * max(self.seconds, other.seconds) + 1e-15:
            return self.seconds < other.seconds
        return (self.collectives, self.bytes, self.flops) < (other.collectives, other.bytes, other.flops)

    def shared_by(self, users: int) -> "Estimate":
        """Each one's share of work done once for `users` users (a reshard several users
        take); the collective count stays whole, as the tie-breaker counts launches."""
        if users <= 1:
            return self
        return Estimate(self.seconds / users, self.bytes // users, self.flops // users, self.collectives,
                        self.comm_seconds / users, self.latency_seconds / users)

    def step_seconds(self, profile: "HardwareProfile") -> float:
        """The time estimate with nothing overlapped: compute, every collective's transfer and
        its latency."""
        compute = self.seconds - (1 - profile.overlap) * self.comm_seconds
        return compute + self.comm_seconds + self.collectives * profile.collective_latency

    def describe(self) -> str:
        return (f"{self.seconds * 1e6:.1f} µs exposed ({self.comm_seconds * 1e6:.1f} µs communicating, "
                f"{self.collectives} collective(s)), {self.bytes:,} B moved, {self.flops:,} FLOPs")


ZERO = Estimate()


@dataclass(frozen=True)
class CostModel:
    profile: HardwareProfile
    allow_more_memory: bool = False

    @classmethod
    def for_profile(cls, name: str, **kwargs: bool) -> "CostModel":
        try:
            return cls(PROFILES[name], **kwargs)
        except KeyError:
            raise ValueError(f"unknown cost profile {name!r}; known: {', '.join(PROFILES)}") from None

    # -------------------------------------------------------------- compute --
    def compute(self, flops: int, bytes_touched: int, element_type: PrimitiveType) -> Estimate:
        """A kernel's time: bound by its FLOPs or by the memory it touches."""
        p = self.profile
        seconds = max(flops / p.flop_rate(element_type), bytes_touched / p.memory_bandwidth)
        return Estimate(seconds, 0, int(flops))

    def dot(self, flops: int, operand_bytes: int, out_bytes: int, element_type: PrimitiveType) -> Estimate:
        return self.compute(flops, operand_bytes + out_bytes, element_type)

    def local_copy(self, bytes_touched: int) -> Estimate:
        """A slice, pad, select or other data movement within a device."""
        return Estimate(bytes_touched / self.profile.memory_bandwidth, 0, 0)

    # ---------------------------------------------------------- collectives --
    def collective(self, kind: str, buffer_bytes: int, group: int) -> Estimate:
        """One collective over groups of `group` devices on a buffer of `buffer_bytes` (the full
        buffer: gathered for all-gather, before scattering for reduce-scatter)."""
        if group <= 1 or buffer_bytes <= 0:
            return ZERO
        share = (group - 1) / group
        wire = {"all-gather": share, "reduce-scatter": share, "all-reduce": 2 * share,
                "all-to-all": share, "collective-permute": 1.0}[kind] * buffer_bytes
        return self.transfer(int(wire))

    def transfer(self, wire_bytes: int, collectives: int = 1) -> Estimate:
        """`collectives` collectives that bring `wire_bytes` to each device."""
        p = self.profile
        t = wire_bytes / p.link_bandwidth
        return Estimate(t * (1 - p.overlap), wire_bytes, 0, collectives, t,
                        collectives * p.collective_latency * (1 - p.overlap))

    def fits(self, per_device_bytes: int, unpartitioned_bytes: int) -> bool:
        """May a candidate hold `per_device_bytes` for one instruction, given that the
        unpartitioned instruction holds `unpartitioned_bytes`?"""
        return self.allow_more_memory or per_device_bytes <= unpartitioned_bytes


DEFAULT = CostModel.for_profile("accelerator")


Candidate = TypeVar("Candidate")


def cheapest(priced: Iterable[tuple[Candidate, Estimate]],
             recompute_tolerance: float = 0.0) -> tuple[Candidate, Estimate] | None:
    """The candidate a decision takes: the least `Estimate` (exposed time; latency breaks ties),
    unless it replicates work, i.e. does more FLOPs per device than the candidate of fewest
    FLOPs, and loses to the best of those once each collective's exposed latency counts too.

    Latency cannot decide every choice: per instruction it would replicate small work to save
    one collective (and XLA keeps such work sharded).  But it must decide this one.  Gathering a
    Megatron layer's activation and weight to multiply the whole matrix on every device moves
    a few kilobytes less than all-reducing the partial product at small widths, two collectives
    for one: by transfer time alone the gathers win by nanoseconds, and the step then pays a
    whole collective's latency more and the replicated FLOPs (a GPT at d_model 64: +23% FLOPs,
    +16% estimated step against XLA's partial matmul).  So latency counts against replicating
    work, never for it.  `recompute_tolerance`: the share of FLOPs above the fewest that a
    caller's candidates recompute rather than replicate (a convolution's halo rows: a kernel
    gradient tiled 4 ways along its window recomputes 0.02% more, and latency must not then pick
    a plan with one collective fewer, 10x the wire bytes and 1.6x the FLOPs, as it did).  None
    when there are no candidates."""
    best: tuple[Candidate, Estimate] | None = None
    frugal: tuple[Candidate, Estimate] | None = None  # least among the candidates of fewest FLOPs
    for item in priced:
        est = item[1]
        if best is None or est < best[1]:
            best = item
        if frugal is None or est.flops < frugal[1].flops or (est.flops == frugal[1].flops and est < frugal[1]):
            frugal = item
    if best is None or frugal is None or best[1].flops <= frugal[1].flops * (1 + recompute_tolerance):
        return best
    with_latency = best[1].seconds + best[1].latency_seconds
    return frugal if frugal[1].seconds + frugal[1].latency_seconds < with_latency else best





# ------------------------------------------------------------ whole modules --
_COLLECTIVE_KIND = {
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce", "all-gather": "all-gather",
    "all-gather-start": "all-gather", "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all",
    "collective-permute": "collective-permute", "collective-permute-start": "collective-permute",
}


def instruction_estimate(instr: "Instruction", module: "Module", model: CostModel = DEFAULT) -> Estimate:
    """One instruction's share of `module_estimate`: a collective by its wire volume, any other
    array-shaped op bound by its FLOPs or the bytes it touches (result and operands), nothing for
    parameters, constants, tuples and bitcasts.  Called computations are not included.  Work is
    XLA's count (`stats.instruction_work`) with transcendentals charged as operations too: an
    exp or a tanh is compute XLA merely counts apart."""
    from hlo_passes.passes.collectives.common import uniform_group_size
    from hlo_passes.stats import instruction_work

    op = instr.opcode
    kind = _COLLECTIVE_KIND.get(op.value)
    if kind is not None:
        group = uniform_group_size(instr, module) or module.num_partitions * module.replica_count
        if kind == "collective-permute":
            group = 2
        # the larger side: the gathered result of an all-gather, the operand of a reduce-scatter;
        # a variadic collective's result is a tuple whose elements add up (an async start's
        # tuple also holds its operands: its operands count)
        operands = sum(o.shape.byte_size() for o in instr.operands)
        result = instr.shape.byte_size() if instr.shape.is_array or not op.value.endswith("-start") else 0
        buffer = max(result, operands)
        return model.collective(kind, buffer, group)
    if op in (Opcode.PARAMETER, Opcode.CONSTANT, Opcode.GET_TUPLE_ELEMENT, Opcode.TUPLE, Opcode.BITCAST) \
            or not isinstance(instr.shape, ArrayShape):
        return ZERO
    touched = instr.shape.byte_size() + sum(o.shape.byte_size() for o in instr.operands if o.shape.is_array)
    etype = instr.shape.element_type if instr.shape.element_type.is_array else None
    return model.compute(instruction_work(instr).operations, touched, etype) if etype is not None else ZERO


# XLA's loop fusion: element-wise ops and the data movement that fuses with them read a fused
# producer's value without a memory round trip; a reduce takes them too (input fusion).
FUSES_INTO_CONSUMER = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY | {
    Opcode.BROADCAST, Opcode.RESHAPE, Opcode.BITCAST, Opcode.TRANSPOSE, Opcode.SLICE, Opcode.DYNAMIC_SLICE,
    Opcode.IOTA, Opcode.CONCATENATE, Opcode.PAD, Opcode.REVERSE}
TAKES_FUSED_PRODUCERS = FUSES_INTO_CONSUMER | {Opcode.REDUCE}


class CallsInlined:
    """Operands and readers of values as XLA sees them when it fuses: its pipeline inlines every
    call first, so a called body's parameter is the call's operand, and its root (or a root
    tuple's element) is read by the call's users (or by the get-tuple-elements that take that
    element).  A partitioned program keeps JAX's calls (`jax.nn.gelu`, `_where`, ...), which
    are free once XLA compiles it; charged as kernels of their own, and as fusion boundaries,
    they made a scanned transformer's estimated step 34% above XLA's partition of the same
    program, which has the calls inlined.  A body called from several places keeps its
    boundaries: there is no one call to see through."""

    def __init__(self, module: "Module"):
        sites: dict["Computation", list["Instruction"]] = {}
        for instr in module.all_instructions():
            if instr.opcode is Opcode.CALL:
                for callee in instr.called_computations():
                    sites.setdefault(callee, []).append(instr)
        self._caller = {callee: calls[0] for callee, calls in sites.items() if len(calls) == 1}

    def inlined_body(self, call: "Instruction") -> "Computation | None":
        """The body `call` alone calls (seen through), else None."""
        callees = call.called_computations()
        return callees[0] if len(callees) == 1 and self._caller.get(callees[0]) is call else None

    def producer(self, value: "Instruction") -> "Instruction":
        """The instruction that computes `value` once calls are inlined."""
        while True:
            if value.opcode is Opcode.PARAMETER and value.parent is not None and value.parent in self._caller:
                value = self._caller[value.parent].operands[value.parameter_number or 0]
            elif value.opcode is Opcode.CALL and (body := self.inlined_body(value)) is not None \
                    and body.root is not None and body.root.opcode is not Opcode.TUPLE:
                value = body.root
            elif value.opcode is Opcode.GET_TUPLE_ELEMENT and value.operands[0].opcode is Opcode.CALL \
                    and (body := self.inlined_body(value.operands[0])) is not None \
                    and body.root is not None and body.root.opcode is Opcode.TUPLE:
                value = body.root.operands[value.tuple_index]
            else:
                return value

    def readers(self, value: "Instruction") -> tuple[list["Instruction"], bool]:
        """(the instructions that read `value` once calls are inlined, whether it also leaves
        as a result that stays: the root of the entry, of a loop body or branch, or an element
        of a tuple something other than get-tuple-element reads)."""
        found: list["Instruction"] = []
        stays = False
        pending = [value]
        while pending:
            v = pending.pop()
            if v.is_root and v.parent is not None:
                call = self._caller.get(v.parent)
                if call is None:
                    stays = True
                elif v.opcode is not Opcode.TUPLE:
                    pending.append(call)
            for user in v.users:
                body = self.inlined_body(user) if user.opcode is Opcode.CALL else None
                if body is not None:
                    params = body.parameters
                    pending.extend(params[k] for k, o in enumerate(user.operands) if o is v and k < len(params))
                elif user.opcode is Opcode.TUPLE and user.is_root and user.parent in self._caller:
                    call = self._caller[user.parent]
                    indices = {k for k, o in enumerate(user.operands) if o is v}
                    pending.extend(g for g in call.users
                                   if g.opcode is Opcode.GET_TUPLE_ELEMENT and g.tuple_index in indices)
                    if any(g.opcode is not Opcode.GET_TUPLE_ELEMENT for g in call.users) or call.is_root:
                        stays = True
                else:
                    found.append(user)
        return found, stays


def fused_estimate(instr: "Instruction", module: "Module", model: CostModel = DEFAULT,
                   calls: CallsInlined | None = None) -> Estimate:
    """`instruction_estimate` with the memory traffic XLA's loop and input fusion remove:
    elementwise ops and the data movement that fuses with them (broadcast, reshape, transpose,
    slice, pad, concatenate, iota) read a fused producer's value in registers, not memory, and
    write their result only when some user cannot fuse it (a dot, a collective, a loop, the
    root); a reduce takes fused producers as XLA's input fusion does.  So a chain
    of element-wise work on an activation (a norm, a softmax, an optimizer update) costs
    reading its inputs once and writing its outputs once, as the fused kernel does, where the
    op-by-op charge counted every intermediate twice.  FLOPs are unchanged.  `calls`: see
    through calls, as XLA's inlining does (`CallsInlined`); a call then costs nothing itself."""
    op = instr.opcode
    if op is Opcode.CALL and calls is not None and calls.inlined_body(instr) is not None:
        return ZERO
    if op not in TAKES_FUSED_PRODUCERS or not isinstance(instr.shape, ArrayShape) \
            or not instr.shape.element_type.is_array:
        return instruction_estimate(instr, module, model)
    from hlo_passes.stats import instruction_work

    touched = 0
    for operand in instr.operands:
        source = calls.producer(operand) if calls is not None else operand
        if source.opcode not in FUSES_INTO_CONSUMER and operand.shape.is_array:
            touched += operand.shape.byte_size()
    users: Collection["Instruction"]
    if calls is not None:
        users, stays = calls.readers(instr)
    else:
        users, stays = instr.users, instr.is_root
    if op not in FUSES_INTO_CONSUMER or not users or stays \
            or any(u.opcode not in TAKES_FUSED_PRODUCERS for u in users):
        touched += instr.shape.byte_size()
    return model.compute(instruction_work(instr).operations, touched, instr.shape.element_type)


def module_estimate(module: "Module", model: CostModel = DEFAULT, fused: bool = True) -> Estimate:
    """The estimated step time of a per-device module: every kernel bound by its FLOPs or the
    bytes it touches, every collective by its wire volume (plus latency in `step_seconds`).
    Call, fusion and while bodies count once per call site (trip counts are unknown).
    `fused`: element-wise work is charged as XLA fuses it, with calls seen through as XLA
    inlines them (`fused_estimate`, `CallsInlined`); without it, op by op
    (`instruction_estimate`)."""

    if fused:
        calls = CallsInlined(module)

        def charge(instr: "Instruction", module: "Module", model: CostModel) -> Estimate:
            return fused_estimate(instr, module, model, calls)
    else:
        charge = instruction_estimate

    def walk(comp: "Computation", stack: set["Computation"]) -> Estimate:
        total = ZERO
        stack.add(comp)
        for instr in comp.instructions:
            total = total + charge(instr, module, model)
            for callee in instr.called_computations():
                if callee not in stack and instr.opcode in (Opcode.FUSION, Opcode.CALL, Opcode.WHILE,
                                                            Opcode.CONDITIONAL, Opcode.ASYNC_START):
                    total = total + walk(callee, stack)
        stack.discard(comp)
        return total

    assert module.entry is not None, "a module to estimate has an entry computation"
    return walk(module.entry, set())

__all__ = ["CallsInlined", "CostModel", "DEFAULT", "Estimate", "HardwareProfile", "PROFILES", "ZERO", "cheapest",
           "fused_estimate", "instruction_estimate", "module_estimate"]
