"""Numerical verification: run the original and the rewritten module on the same
deterministic inputs through XLA and compare every output.

    report = verify_equivalent(original, rewritten)      # Module objects or HLO text
    assert report.ok, report.format()

How a module runs is read from the module itself (`num_partitions`,
`replica_count`, the `sharding=` of its ENTRY parameters and ROOT):

(a) global module (one partition, one replica): on one device; logical `sharding=`
    annotations and `Sharding` custom-calls are dropped (they do not change what
    is computed).
(b) global module that cannot run on one device (manual regions, collectives) or
    that `execute_module` is asked to run on N > 1 devices: XLA's own SPMD
    partitioner on N devices, global arrays in, global arrays out.  When verifying,
    the outputs computed from no manual region, collective or device id are then
    computed again on one device, from the module cut down to them (XLA's
    partitioner has computed such outputs wrong beside a manual region); an output
    that then mismatches is asked again of the module's fully manual regions run
    directly on each device (manual_regions.py), which judges it where the two
    oracles disagree, and which is the oracle when XLA cannot partition the module.
(c) per-device partitioned module (`num_partitions=N`, per-device shapes, the
    logical sharding on every ENTRY parameter and the ROOT, as `spmd-partition`
    writes it) compared with a global module: global inputs are sliced into
    shards by the parameter shardings, the program runs on N devices with its
    parameters and ROOT marked `sharding={manual}`, and the global result is
    reassembled from the ROOT sharding (see partitioned.py).  A partitioned module
    without shardings (XLA's own SPMD output) takes them from `param_shardings`/
    `root_sharding`, else from the original's ENTRY parameters and ROOT; a result
    sharding nobody wrote down is the one XLA's partitioner chooses for the
    original (our sharding propagation's choice if XLA cannot compile it).
(d) two per-device programs (replica-style `replica_count=N`, or partitioned):
    every device gets its own inputs (identical for parameters declared
    replicated) and outputs are compared device by device.

Comparison rules and default tolerances are in compare.py; input values in
inputs.py.  Limits: partially manual shardings (manual subgroups) cannot slice
global inputs; per-device comparison needs both modules to have the same
parameters; token parameters cannot be given inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Callable, TypeVar

import numpy as np

from hlo_passes import _xla_deaths
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.program_kind import ProgramKind, ProgramReading, read_program
from hlo_passes.ir.shape import Shape, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.printer import print_module
from hlo_passes.runtime import inputs as _inputs
from hlo_passes.runtime import xla_backend
from hlo_passes.runtime.compare import OutputStats, compare_arrays, default_tolerance
from hlo_passes.runtime.partitioned import (PartitionError, compile_xla_spmd, leaf_shardings, run_global_partitioned,
                                            run_per_device_program, run_xla_spmd)
from hlo_passes.runtime.recompile import NotRecompilable, make_fresh_program, needs_fresh_program
from hlo_passes.runtime.xla_backend import xla_error_lines

# Kept importable from here: other modules use these names.
random_array = _inputs.random_array
__all__ = ["OutputStats", "VerificationError", "VerificationReport", "compare_arrays", "default_tolerance",
           "execute_module", "verify_equivalent"]


class VerificationError(Exception):
    """The modules cannot be run or compared (not a mismatch)."""


class OriginalFailed(VerificationError):
    """XLA cannot compile or run the ORIGINAL module (XLA's fault or the input's, not a rewrite's)."""


# Exceptions that only a bug of ours raises: XLA's errors come as RuntimeError or ValueError.
PYTHON_BUGS = (IndexError, KeyError, AttributeError, TypeError, NameError, AssertionError)


def _run_original(module: Module, inputs, num_devices, platform, report) -> list[np.ndarray]:
    try:
        return _run_global(module, inputs, num_devices, platform, report, oracle=True)
    except (VerificationError, _inputs.InputError, PartitionError, xla_backend.BackendUnavailable, *PYTHON_BUGS):
        raise  # PYTHON_BUGS: ours, never to be blamed on XLA or the input (it hid an IndexError once)
    except Exception as e:  # XLA's compile and run errors
        raise OriginalFailed("XLA could not compile or run the original module:\n  "
                             + "\n  ".join(xla_error_lines(e))) from e


T = TypeVar("T")


# ----------------------------------------------------------------- report --
@dataclass
class VerificationReport:
    """The outcome of `verify_equivalent`: per-output statistics and problems.

    `expected`/`actual` hold the compared arrays (global outputs; device 0's
    outputs for per-device comparisons), e.g. for `verify --save-outputs`.
    """

    mode: str
    outputs: list[OutputStats] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # How each module was read ("ORIGINAL: global program on 8 devices (...)").
    readings: list[str] = field(default_factory=list)
    expected: list[np.ndarray] = field(default_factory=list, repr=False)
    actual: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems and all(o.ok for o in self.outputs)

    @property
    def first_mismatch(self) -> OutputStats | None:
        return next((o for o in self.outputs if not o.ok), None)

    def format(self) -> str:
        lines = [f"{'EQUIVALENT' if self.ok else 'MISMATCH'} ({self.mode})"]
        lines += [f"  {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  {o.format()}" for o in self.outputs]
        lines += [f"  {r}" for r in self.readings]
        return "\n".join(lines)


# ------------------------------------------------------------ module kinds --
def _module(m: Module | str) -> Module:
    """A private copy: verification never mutates the caller's module.  A module XLA already
    fused, laid out or scheduled comes back as the fresh program it stands for (recompile.py)."""
    copy = parse_module(m) if isinstance(m, str) else m.clone()
    if needs_fresh_program(copy):
        try:
            make_fresh_program(copy)
        except NotRecompilable as e:
            raise VerificationError(f"cannot recompile {copy.name}: {e}") from None
    return copy


def is_per_device(module: Module) -> bool:
    """Does every device run this text on its own inputs (a partitioned or replica program)?
    Read from the module's content (ir/program_kind.py), not from `num_partitions`."""
    return read_program(module).kind.is_per_device


def _has_sharding(instr) -> bool:
    return "sharding" in instr.attributes and instr.sharding is not None


def needs_devices(module: Module) -> bool:
    """A global module that cannot run on one device: collectives or manual regions."""
    return any(_needs_a_device(i) for i in module.all_instructions())


def _needs_a_device(i: Instruction) -> bool:
    """Does `i` make its module need devices: a collective, a device id, a manual region's
    edge or inside?"""
    if i.opcode.is_collective or i.opcode in (Opcode.PARTITION_ID, Opcode.REPLICA_ID):
        return True
    if i.opcode is Opcode.CUSTOM_CALL and i.custom_call_target in (
            "SPMDFullToShardShape", "SPMDShardToFullShape", "xla.sdy.GlobalToLocalShape",
            "xla.sdy.LocalToGlobalShape"):
        return True
    return _has_sharding(i) and i.sharding.is_manual


def strip_shardings(module: Module) -> Module:
    """Remove logical sharding annotations (in place) so the module runs on one device."""
    for comp in module.computations:
        for instr in comp.post_order():
            if instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in (
                    "Sharding", "xla.sdy.FuncResultSharding"):
                instr.replace_all_uses_with(instr.operands[0])
                if comp.root is instr:
                    comp.root = instr.operands[0]
                if not instr.users:
                    comp.remove(instr)
                continue
            instr.remove_attr("sharding")
    for key in ("num_partitions", "allow_spmd_sharding_propagation_to_parameters",
                "allow_spmd_sharding_propagation_to_output"):
        module.attributes.pop(key, None)
    return module


# ------------------------------------------------------------------ runs --
def run_single_device(module: Module, inputs: list[np.ndarray], platform: str | None = None) -> list[np.ndarray]:
    """Mode (a): a global module without collectives on one device."""
    if needs_devices(module):
        raise VerificationError("a global module with collectives or manual regions cannot run on one "
                                "device; run it on several (num_devices) or compare per-device programs")
    return xla_backend.run_single(print_module(strip_shardings(_module(module))), inputs, platform)


def _run_global(module: Module, inputs, num_devices, platform, report, oracle: bool = False) -> list[np.ndarray]:
    """Mode (a), or (b) when the module needs several devices.  `oracle`: `module` is what the
    other side is judged by, so where XLA cannot partition it (an error, or a first try that
    died inside XLA: _xla_deaths.py) its manual regions run directly instead."""
    if not needs_devices(module):
        return run_single_device(module, inputs, platform)
    n = num_devices or read_program(module).num_devices
    died = _xla_deaths.oracle_died_reason() if oracle else None
    if died:
        return _run_regions_directly(module, inputs, n, platform, report, f"XLA died partitioning this global module in a first "
                                     f"try ({died})", OriginalFailed(f"XLA died partitioning the original module: {died}"))
    notes: list[str] = []
    try:
        with _xla_deaths.phase(_xla_deaths.PARTITIONING_ORACLE if oracle else "xla-partitions"):
            outputs, problems, _ = run_xla_spmd(module, inputs, n, platform, notes)
    except (VerificationError, _inputs.InputError, PartitionError, xla_backend.BackendUnavailable, *PYTHON_BUGS):
        raise
    except Exception as e:  # XLA cannot partition it: its manual regions may still run directly
        return _run_regions_directly(module, inputs, n, platform, report,
                                     f"XLA cannot partition this global module ({xla_error_lines(e, 1)[0]})", e)
    report.problems += problems
    report.notes.append(f"original partitioned by XLA's SPMD partitioner on {n} devices")
    report.notes += notes
    return _outputs_of_one_device(module, outputs, inputs, platform, report)


def _run_regions_directly(module: Module, inputs, n: int, platform, report, why: str,
                          otherwise: Exception) -> list[np.ndarray]:
    """The global `module`'s outputs without XLA's partitioner (`why` says what it did): its
    manual regions run directly on each device (manual_regions.py), the outputs that need no
    device on one device; `otherwise` is raised where the direct run declines the module."""
    from hlo_passes.runtime.manual_regions import run_direct

    direct = run_direct(module, inputs, n, platform)
    if direct is None:
        raise otherwise
    report.notes.append(f"{why}; its manual regions run directly on each of {n} devices instead (manual_regions.py)")
    return _outputs_of_one_device(module, direct, inputs, platform, report)


def _outputs_of_one_device(module: Module, outputs: list[np.ndarray], inputs, platform,
                           report: VerificationReport) -> list[np.ndarray]:
    """`outputs` of XLA's partition of `module`, those computed from no manual region,
    collective or device id recomputed on one device, the module unpartitioned: that is what
    they mean, and XLA's partitioner has computed such outputs wrong beside a manual region (a
    dynamic-update-slice into unevenly tiled rows left a row unwritten: JAX fuzz seed 2035,
    SPMD fuzz seed 10085).  XLA's partition stays the oracle for the outputs that need the
    devices.  Outputs of a root that is not a flat tuple, or whose slice cannot be cut out and
    run alone, keep XLA's values."""
    from hlo_passes.passes.cleanup.dce import DeadCodeElimination  # (the runtime sits above the passes)

    root = module.entry.root
    if root.opcode is not Opcode.TUPLE or len(root.operands) != len(outputs) \
            or any(op.shape.is_tuple for op in root.operands):
        return outputs
    alone = [not needed for needed in _per_output(module, _needs_a_device, lambda x, y: x or y)]
    if not any(alone):
        return outputs
    part = module.clone()
    entry = part.entry
    kept = [op for op, free in zip(entry.root.operands, alone) if free]
    entry.root = entry.add(Instruction(Opcode.TUPLE, TupleShape(tuple(op.shape for op in kept)), kept,
                                       name="one_device_outputs"))
    _keep_only_what_the_root_reads(entry)
    DeadCodeElimination(remove_cross_partition_collectives=True).run(part)  # (computations nobody calls)
    if needs_devices(part):  # a called computation of what is kept needs devices after all
        return outputs
    values = iter(run_single_device(part, inputs, platform))
    which = [str(i) for i, free in enumerate(alone) if free]
    report.notes.append(f"outputs {', '.join(which)} need no device of their own" if len(which) > 1 else
                        f"output {which[0]} needs no device of its own")
    report.notes[-1] += ": computed on one device, the module unpartitioned (not by XLA's partition)"
    return [next(values) if free else out for out, free in zip(outputs, alone)]


def run_partitioned(module: Module, global_inputs: list[np.ndarray], *, param_shardings=None,
                    root_sharding=None, global_root_shape=None, report=None, platform=None,
                    num_devices: int | None = None) -> list[np.ndarray]:
    """Mode (c): a per-device partitioned module on global inputs; global outputs."""
    if global_root_shape is None:
        raise VerificationError("the global result shape is unknown")
    shardings = param_shardings or [p.sharding if _has_sharding(p) else None for p in module.entry.parameters]
    rs = root_sharding if root_sharding is not None else (
        module.entry.root.sharding if _has_sharding(module.entry.root) else None)
    outputs, problems, run = run_global_partitioned(
        module, global_inputs, param_shardings=shardings, root_sharding=rs,
        global_root_shape=global_root_shape, platform=platform,
        num_devices=num_devices or read_program(module).num_devices)
    if report is not None:
        report.problems += problems
        report.notes += run.notes
    return outputs


@dataclass(frozen=True)
class XlaShardings:
    """The shardings XLA's partitioner settled on for a global module: one per ENTRY
    parameter (tuple shardings for tuple parameters) and the result's."""

    parameters: list[Sharding]
    result: Sharding


def xla_shardings(original: Module, n: int, platform, partitioned: Module | None = None,
                  errors: list[str] | None = None) -> XlaShardings | None:
    """What XLA's SPMD partitioner chooses for the global `original` on n devices, compiled with
    the module's own `allow_spmd_sharding_propagation_to_parameters/output` (what JAX asked for
    when it compiled it); None when XLA cannot compile it.

    A module from `jax.jit(...).lower(...).as_text()` does not record those flags; JAX compiles
    it letting XLA choose the outputs' shardings.  When the header is silent and `partitioned`
    (a per-device program of `original`) is given, that reading is tried too, and the one whose
    tiles have `partitioned`'s per-device shapes wins."""
    errors = errors if errors is not None else []
    candidates: list[tuple[bool, ...] | None] = [None]
    if "allow_spmd_sharding_propagation_to_output" not in original.attributes:
        candidates.append((True,))
    read = reader_for("sharding")
    found = None
    for flags in candidates:
        try:
            exe = compile_xla_spmd(original, n, platform, [], propagate_to_output=flags)
            params, results = exe.parameter_shardings(), exe.output_shardings()
        except Exception as e:  # XLA's error: the caller falls back, and says why if it cannot
            errors.append(xla_error_lines(e, 1)[0])
            continue
        if params is None or not results:
            continue
        leaves = [read(t if t.startswith("{") else "{" + t + "}") for t in params]
        per_param: list[Sharding] = []
        for p in original.entry.parameters:
            count = len(p.shape.leaves())
            mine, leaves = leaves[:count], leaves[count:]
            per_param.append(Sharding.tuple_of(mine) if p.shape.is_tuple else mine[0])
        outs = [read(t if t.startswith("{") else "{" + t + "}") for t in results]
        result = Sharding.tuple_of(outs) if original.entry.root.shape.is_tuple else outs[0]
        found = XlaShardings(per_param, result)
        if partitioned is None or _tiles_match(original.entry.root.shape, result, partitioned.entry.root.shape):
            return found
    return found


def _tiles_match(global_shape, sharding: Sharding | None, local_shape) -> bool:
    """Does `sharding` cut `global_shape` into tiles of `local_shape` (leaf by leaf)?"""
    g, loc = global_shape.leaves(), local_shape.leaves()
    if len(g) != len(loc):
        return False
    for leaf_g, leaf_l, s in zip(g, loc, leaf_shardings(sharding, global_shape)):
        tile = tuple(leaf_g.dims) if s is None or not s.is_tiled else s.tile_shape(tuple(leaf_g.dims))
        if tile != tuple(leaf_l.dims):
            return False
    return True


def _reading_beside(module: Module, reading: ProgramReading, other: Module) -> ProgramReading:
    """A module read as global whose ENTRY parameters are exactly the tiles of `other`'s
    global parameters under its own shardings (and differ from them) is a per-device program
    of `other` that needs no communication: the shapes say so."""
    if reading.kind.is_per_device or reading.overridden:
        return reading
    mine, theirs = module.entry.parameters, other.entry.parameters
    if len(mine) != len(theirs) or all(_same_dims(a.shape, b.shape) for a, b in zip(mine, theirs)):
        return reading
    if all(_has_sharding(a) and _tiles_match(b.shape, a.sharding, a.shape) for a, b in zip(mine, theirs)):
        return ProgramReading(ProgramKind.PER_DEVICE, reading.num_devices,
                              "its parameters are the other module's, tiled by their shardings")
    return reading


def _elided_constants(m: Module) -> list[Instruction]:
    return [i for i in m.all_instructions() if i.opcode is Opcode.CONSTANT and "..." in (i.literal or "")]


def _check_elided_constants(a: Module, b: Module) -> None:
    """XLA prints a large constant's values as `{...}` in the dumps after its first stage (unless
    --xla_dump_large_constants), and its parser takes that text with values of its own making.
    Two modules that hold the same such constants compare fairly (a pass that kept them); one
    that holds one the other computes or holds in full (XLA's after_optimizations beside
    before_optimizations: an iota folded into a constant) cannot be compared."""
    ea, eb = _elided_constants(a), _elided_constants(b)
    if sorted(str(i.shape) for i in ea) == sorted(str(i.shape) for i in eb):
        return
    one, m = (ea[0], a) if ea else (eb[0], b)
    raise VerificationError(
        f"{m.name}: constant {one.name} has its values elided ({one.literal}), as XLA dumps large constants, "
        "and the other module does not hold it: they cannot be compared (dump with "
        "XLA_FLAGS=--xla_dump_large_constants)")


def _same_dims(x: Shape, y: Shape) -> bool:
    """The same shape but for layouts (a recompiled module's parameters have none)."""
    return x.to_hlo(with_layout=False) == y.to_hlo(with_layout=False)


# ------------------------------------------------------------- public API --
def _reading(module: Module, as_kind: ProgramKind | str | None) -> ProgramReading:
    return read_program(module, ProgramKind(as_kind) if isinstance(as_kind, str) else as_kind)


def verify_equivalent(original, rewritten, *, num_devices: int | None = None, seed: int = 0,
                      rtol: float | None = None, atol: float | None = None,
                      inputs: list[np.ndarray] | None = None, platform: str | None = None,
                      param_shardings: list[Sharding | None] | None = None,
                      root_sharding: Sharding | None = None,
                      original_as: ProgramKind | str | None = None,
                      rewritten_as: ProgramKind | str | None = None) -> VerificationReport:
    """Run both modules on the same inputs and compare every output (see the module docstring).

    `inputs`: one global array per flattened ENTRY parameter leaf (per-device comparisons:
    arrays with a leading device axis).  `param_shardings`/`root_sharding`: the logical
    shardings of a partitioned module that does not print them (default: its own, else the
    ones XLA's partitioner chooses for the global module).  `original_as`/`rewritten_as`
    override the program kind read from each module (ir/program_kind.py).  Raises
    VerificationError when the modules cannot be run or compared; XLA's compile errors
    propagate.
    """
    a, b = _module(original), _module(rewritten)
    _check_elided_constants(a, b)
    ra, rb = _reading(a, original_as), _reading(b, rewritten_as)
    ra, rb = _reading_beside(a, ra, b), _reading_beside(b, rb, a)
    report = _verify(a, b, ra, rb, num_devices=num_devices, seed=seed, rtol=rtol, atol=atol, inputs=inputs,
                     platform=platform, param_shardings=param_shardings, root_sharding=root_sharding)
    report.readings = [f"ORIGINAL: {ra.describe()}", f"REWRITTEN: {rb.describe()}"]
    return report


def _verify(a: Module, b: Module, ra: ProgramReading, rb: ProgramReading, *, num_devices, seed, rtol, atol,
            inputs, platform, param_shardings, root_sharding) -> VerificationReport:
    _check_signatures(a, b, same_shapes=ra.kind.is_per_device == rb.kind.is_per_device)
    per_device = [r.num_devices for r in (ra, rb) if r.kind.is_per_device]
    xla_backend.ensure_devices(max([num_devices or 1, *per_device]), platform)
    try:
        if ra.kind.is_per_device and rb.kind.is_per_device:
            return _verify_per_device(a, b, num_devices or max(per_device), seed, rtol, atol, inputs, platform)
        if ra.kind.is_per_device:  # the global module is the oracle, whichever side it is on
            report = _verify(b, a, rb, ra, num_devices=num_devices, seed=seed, rtol=rtol, atol=atol,
                             inputs=inputs, platform=platform, param_shardings=param_shardings,
                             root_sharding=root_sharding)
            report.notes.append("the global module (REWRITTEN) served as the oracle")
            return report
        if inputs is None:
            inputs = _inputs.random_inputs(a, seed)
        else:
            inputs = _inputs.check_inputs(a, list(inputs))
        if not rb.kind.is_per_device:
            report = VerificationReport("single device" if not (needs_devices(a) or needs_devices(b))
                                        else "XLA-partitioned")
            want = _run_original(a, inputs, num_devices, platform, report)
            got = _run_global(b, inputs, num_devices, platform, report)
        else:
            # A per-device module from a proto dump has no num_partitions: the global module says.
            n = num_devices or max(rb.num_devices, ra.num_devices)
            report = VerificationReport(f"partitioned on {n} devices")
            want = _run_original(a, inputs, n, platform, report)
            got = _run_rewritten_partitioned(a, b, inputs, n, param_shardings, root_sharding, report, platform)
    except (PartitionError, _inputs.InputError) as e:
        raise VerificationError(str(e)) from None
    report = _compare(report, want, got, rtol, atol, computed_in(a, b), drawn_at_random(a, b))
    if not report.ok and not report.problems and needs_devices(a):
        n = num_devices or max(rb.num_devices if rb.kind.is_per_device else 0, ra.num_devices)
        report = _second_opinion_of_the_regions(a, b, inputs, n, platform, report, rtol, atol)
    if not report.ok:
        _explain_nans_dropped_by_collectives(report, b)
    return report


# Collectives whose reduction XLA:CPU's runtime carries out itself.
NAN_LOST_BY_COLLECTIVES = "NaN lost by XLA:CPU's collectives"
_RUNTIME_REDUCING = (Opcode.ALL_REDUCE, Opcode.ALL_REDUCE_START, Opcode.REDUCE_SCATTER)


def _explain_nans_dropped_by_collectives(report: VerificationReport, rewritten: Module) -> None:
    """XLA:CPU's all-reduce and reduce-scatter over `maximum` or `minimum` skip NaN operands,
    where HLO's maximum and minimum propagate NaN (jaxlib 0.12.0.1: one NaN among eight
    devices' values all-reduces to the largest number; a NaN element reduced on one device
    stays NaN).  So a max or min reduction split across devices returns a number where the
    whole program returns NaN, in XLA's own partition as in ours, and JAX's own run of the
    program agrees with the partitioned one.  Such a mismatch is the runtime's, not the
    rewrite's: say so beside it, so that nobody hunts a partitioner bug (the random JAX
    programs found it: `jnp.take` fills out-of-range rows with NaN, then a max over them)."""
    from hlo_passes.ir.reduction import Reduction

    bad = [i for i, o in enumerate(report.outputs) if not o.ok]
    lost = [i for i in bad if i < len(report.expected) and i < len(report.actual)
            and _only_nans_became_numbers(report.outputs[i], report.expected[i], report.actual[i])]
    if not lost or len(lost) < len(bad):
        return
    if not any(instr.opcode in _RUNTIME_REDUCING
               and (r := Reduction.of_instruction(instr)) is not None
               and r.opcode in (Opcode.MAXIMUM, Opcode.MINIMUM)
               for comp in rewritten.computations for instr in comp.instructions):
        return
    which = ", ".join(str(i) for i in lost)
    report.notes.append(
        f"output{'s' if len(lost) > 1 else ''} {which}: {NAN_LOST_BY_COLLECTIVES}: NaN expected where a number came back, and REWRITTEN "
        "reduces by maximum/minimum across devices: XLA:CPU's all-reduce and reduce-scatter skip NaN "
        "operands (HLO's maximum and minimum propagate them), so such a reduction split across devices "
        "loses the NaN in any partition of the program, XLA's own included")


def _only_nans_became_numbers(stats: OutputStats, want, got) -> bool:
    """Does `got` match `want` (at the default tolerances) once the elements
    where `want` is NaN and `got` a number are set aside, with at least one such element?"""
    want, got = np.asarray(want), np.asarray(got)
    if want.shape != got.shape or want.dtype != got.dtype or want.dtype.kind not in "fc":
        return False
    lost = np.isnan(want) & ~np.isnan(got)
    if not lost.any():
        return False
    return compare_arrays(stats.index, np.where(lost, got, want), got).ok  # default tolerances: the stricter


def _second_opinion_of_the_regions(a: Module, b: Module, inputs, n: int, platform, report: VerificationReport,
                                   rtol, atol) -> VerificationReport:
    """A mismatch judged by XLA's partition of the global `a`, asked again of `a`'s manual
    regions run directly on each device (manual_regions.py, which shares nothing with any
    partitioner).  Where the two oracles disagree on an output, the direct run judges it, and
    the report says so; where they agree, or `a` is not something the direct run expresses
    (partially manual regions), the report stands."""
    from hlo_passes.runtime.manual_regions import run_direct

    try:
        direct = run_direct(a, inputs, n, platform)
    except Exception as e:  # noqa: BLE001 - XLA's error: no second opinion, the first stands
        report.notes.append(f"no second opinion from the manual regions run directly: {xla_error_lines(e, 1)[0]}")
        return report
    if direct is None or len(direct) != len(report.expected):
        return report
    disputed = [i for i, o in enumerate(report.outputs) if not o.ok
                and not np.array_equal(direct[i], report.expected[i], equal_nan=True)]
    if not disputed:
        return report
    again = VerificationReport(report.mode, notes=list(report.notes), readings=list(report.readings))
    which = ", ".join(str(i) for i in disputed)
    again.notes.append(f"output{'s' if len(disputed) > 1 else ''} {which}: XLA's partition of ORIGINAL computes "
                       "other values than ORIGINAL's manual regions run directly on each device; judged by "
                       "the direct run")
    want = [direct[i] if i in disputed else w for i, w in enumerate(report.expected)]
    return _compare(again, want, report.actual, rtol, atol, computed_in(a, b), drawn_at_random(a, b))


def _check_signatures(a: Module, b: Module, *, same_shapes: bool) -> None:
    """Both modules must take the same parameters: as many, of the same element types, and of
    the same shapes when both are global or both per-device (a per-device module's shapes are
    tiles of the global one's, checked when inputs are sliced)."""
    def leaves(m: Module):
        return [leaf for p in m.entry.parameters for leaf in p.shape.leaves()]

    la, lb = leaves(a), leaves(b)
    if len(la) != len(lb):
        raise VerificationError(f"ORIGINAL and REWRITTEN take different parameters: {len(la)} array(s) "
                                f"({_shapes(la)}) vs {len(lb)} ({_shapes(lb)})")
    for i, (x, y) in enumerate(zip(la, lb)):
        if x.element_type is not y.element_type or (same_shapes and tuple(x.dims) != tuple(y.dims)):
            raise VerificationError(f"ORIGINAL and REWRITTEN take different parameters: parameter leaf {i} is "
                                    f"{x.to_hlo(with_layout=False)} vs {y.to_hlo(with_layout=False)}")


def _shapes(leaves) -> str:
    text = ", ".join(leaf.to_hlo(with_layout=False) for leaf in leaves[:6])
    return text + (", ..." if len(leaves) > 6 else "")


def _run_rewritten_partitioned(a: Module, b: Module, inputs, n, param_shardings, root_sharding, report,
                               platform) -> list[np.ndarray]:
    """The per-device `b` on the global inputs of `a`.  Its logical shardings: given, else its
    own annotations, else the ones XLA's partitioner settles on for `a` (how XLA's own
    partition of `a` lays out its arguments and result), else `a`'s annotations."""
    own_params = [pb.sharding if _has_sharding(pb) else None for pb in b.entry.parameters]
    own_root = b.entry.root.sharding if _has_sharding(b.entry.root) else None
    xla, why = None, []
    if (param_shardings is None and None in own_params) or (root_sharding is None and own_root is None):
        xla = xla_shardings(a, n, platform, partitioned=b, errors=why)
    if param_shardings is None:
        fallback = xla.parameters if xla is not None else [
            pa.sharding if _has_sharding(pa) else None for pa in a.entry.parameters]
        param_shardings = [own if own is not None else other for own, other in zip(own_params, fallback)]
    from_xla = False
    if root_sharding is None:
        root_sharding = own_root
        if root_sharding is None and xla is not None:
            root_sharding, from_xla = xla.result, True
            report.notes.append(f"result sharding {_hlo(root_sharding)} from XLA's partitioner")
        elif root_sharding is None and _has_sharding(a.entry.root):
            root_sharding = a.entry.root.sharding
        elif root_sharding is None:
            raise VerificationError("REWRITTEN does not say how its result is sharded and XLA cannot "
                                    f"partition ORIGINAL to tell ({'; '.join(why) or 'no shardings'}); "
                                    "give it (verify --result-sharding)")
    try:
        outs = run_partitioned(b, inputs, param_shardings=param_shardings, root_sharding=root_sharding,
                               global_root_shape=a.entry.root.shape, report=report, platform=platform,
                               num_devices=n)
    except PartitionError as e:
        if not from_xla or "tile; the sharding" not in str(e):
            raise
        raise _guessed_result_sharding_misfits(root_sharding, str(e)) from None
    if from_xla and not _has_sharding(a.entry.root):
        # a guess (the original states no result sharding) of {replicated} reads one device's
        # tile as the whole, of the wrong shape: no verdict either way
        wanted = [tuple(leaf.dims) for leaf in a.entry.root.shape.leaves()]
        got = [tuple(np.shape(o)) for o in outs]
        if len(got) == len(wanted) and got != wanted:
            bad = next(i for i, (x, y) in enumerate(zip(got, wanted)) if x != y)
            raise _guessed_result_sharding_misfits(
                root_sharding, f"output {bad} is {list(got[bad])} per device, not the whole {list(wanted[bad])}")
    return outs


def _guessed_result_sharding_misfits(root_sharding: Sharding | None, detail: str) -> VerificationError:
    """Nothing to judge: the result sharding taken from XLA's compile here is not the one the
    compile that made REWRITTEN chose (another jaxlib, other options, or the partially manual
    regions' hints this runtime drops before XLA partitions: `partitioned.compile_xla_spmd`)."""
    return VerificationError(f"REWRITTEN does not say how its result is sharded, and the sharding XLA's "
                             f"partitioner chooses for ORIGINAL here, {_hlo(root_sharding)}, does not cut it "
                             f"into REWRITTEN's tiles ({detail}): XLA laid the result out otherwise when it "
                             "compiled REWRITTEN; give the result's sharding (verify --result-sharding)")


def _hlo(s: Sharding | None) -> str:
    return s.to_hlo() if s is not None else "{replicated}"


def _keep_only_what_the_root_reads(comp: Computation) -> None:
    """Remove from `comp` everything its root is not computed from (operands and control
    predecessors, transitively), parameters excepted, effects or not: a slice of the
    computation for the outputs its root now holds."""
    kept = set(comp.parameters)
    stack = [comp.root]
    while stack:
        instr = stack.pop()
        if instr in kept:
            continue
        kept.add(instr)
        stack.extend(instr.operands)
        stack.extend(instr.control_predecessors)
    for instr in reversed(comp.post_order()):
        if instr not in kept:
            instr.drop_control_edges()
            comp.remove(instr)


def _per_output(module: Module, own: Callable[[Instruction], T], merge: Callable[[T, T], T]) -> list[T]:
    """Per output (leaf of the ENTRY result), `own` of every instruction it is computed from,
    merged: its operands' and the called computations' (fusions, loops, ...) transitively."""
    done: dict[Instruction, T] = {}
    by_comp: dict[Computation, T] = {}

    def of_comp(comp: Computation) -> T:
        if comp not in by_comp:
            found = None
            for instr in comp.instructions:
                found = own(instr) if found is None else merge(found, own(instr))
                for callee in instr.called_computations():
                    if callee is not comp:
                        found = merge(found, of_comp(callee))
            by_comp[comp] = found
        return by_comp[comp]

    def of(instr: Instruction) -> T:
        stack = [instr]
        while stack:  # operands first, without recursion (deep models)
            top = stack[-1]
            if top in done:
                stack.pop()
                continue
            pending = [o for o in top.operands if o not in done]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            found = own(top)
            for o in top.operands:
                found = merge(found, done[o])
            for callee in top.called_computations():
                found = merge(found, of_comp(callee))
            done[top] = found
        return done[instr]

    root = module.entry.root
    leaves = root.shape.leaves()
    flat = root.opcode is Opcode.TUPLE and len(root.operands) == len(leaves)
    return [of(o) for o in root.operands] if flat else [of(root)] * len(leaves)


def _looser(x: np.dtype | None, y: np.dtype | None) -> np.dtype | None:
    if x is None or y is None:
        return x if y is None else y
    return x if default_tolerance(x)[0] >= default_tolerance(y)[0] else y


def _own_precision(instr: Instruction) -> np.dtype | None:
    found = None
    for leaf in instr.shape.leaves():
        t = leaf.element_type
        if t.is_float or t.is_complex:
            found = _looser(found, t.numpy_dtype())
    return found


def computed_in(*modules: Module) -> list[np.dtype | None]:
    """Per output (leaf of the ENTRY result), the least precise float type it is computed from in
    any of `modules` (inside fusions and other called computations too; its own type counts, so
    None only for outputs without floats).  An f32 loss of a bf16 model carries bf16 roundings,
    which XLA places differently per platform and per partitioning."""
    result: list[np.dtype | None] = []
    for module in modules:
        per_leaf = _per_output(module, _own_precision, _looser)
        if not result:
            result = per_leaf
        elif len(result) == len(per_leaf):
            result = [_looser(x, y) for x, y in zip(result, per_leaf)]
    return result


# XLA's `rng` draws new numbers on every run (XLA keeps a generator state per executable), and
# `rng-get-and-update-state` reads and advances that state: what depends on them differs from
# one run to the next, even for one program run twice.  `rng-bit-generator` is a pure function
# of its state operand.
_NONDETERMINISTIC = frozenset({Opcode.RNG, Opcode.RNG_GET_AND_UPDATE_STATE})


def drawn_at_random(*modules: Module) -> list[bool]:
    """Per output, whether it depends on a nondeterministic op in any of `modules`."""
    result: list[bool] = []
    for module in modules:
        per_leaf = _per_output(module, lambda i: i.opcode in _NONDETERMINISTIC, lambda x, y: x or y)
        result = per_leaf if not result else [x or y for x, y in zip(result, per_leaf)]
    return result


def _not_compared(index: str, w: np.ndarray, g: np.ndarray) -> OutputStats:
    """An output that depends on XLA's `rng`: its values differ on every run, so only what a run
    cannot change is compared (type and shape)."""
    w, g = np.asarray(w), np.asarray(g)
    same = w.dtype == g.dtype and w.shape == g.shape
    detail = ("not compared: drawn by XLA's nondeterministic rng (new numbers every run); type and shape match"
              if same else f"type or shape differ: expected {w.dtype}{list(w.shape)}, got {g.dtype}{list(g.shape)}")
    return OutputStats(index, str(w.dtype), tuple(w.shape), ok=same, detail=detail, compared=False)


def _compare(report: VerificationReport, want, got, rtol, atol,
             precisions: list[np.dtype | None] | None = None, random: list[bool] | None = None) -> VerificationReport:
    report.expected, report.actual = list(want), list(got)
    if len(want) != len(got):
        report.problems.append(f"{len(want)} outputs expected, {len(got)} produced")
        return report
    for i, (w, g) in enumerate(zip(want, got)):
        if random is not None and i < len(random) and random[i]:
            report.outputs.append(_not_compared(str(i), w, g))
            continue
        narrow = precisions[i] if precisions is not None and i < len(precisions) else None
        report.outputs.append(compare_arrays(str(i), w, g, rtol, atol, computed_in=narrow))
    return report


def _verify_per_device(a: Module, b: Module, n: int, seed, rtol, atol, inputs, platform) -> VerificationReport:
    report = VerificationReport(f"per-device on {n} devices")
    replicated = [_declared_replicated(pa) or _declared_replicated(pb)
                  for pa, pb in zip(a.entry.parameters, b.entry.parameters)]
    if inputs is None:
        args = _inputs.per_device_inputs(a, n, replicated=replicated, seed=seed)
    else:
        stacked = [np.asarray(x) for x in inputs]
        if any(x.ndim == 0 or x.shape[0] != n for x in stacked):
            raise VerificationError(f"per-device inputs need a leading axis of {n} devices")
        args = [[x[d] for d in range(n)] for x in stacked]
        args = [list(col) for col in zip(*[_inputs.check_inputs(a, [arg[d] for arg in args]) for d in range(n)])]
    run_a = run_per_device_program(a, args, n, platform)
    run_b = run_per_device_program(b, args, n, platform)
    report.notes += run_a.notes + run_b.notes
    want, got = run_a.outputs, run_b.outputs
    report.expected, report.actual = list(want[0]), list(got[0])
    worst: dict[int, OutputStats] = {}
    precisions = computed_in(a, b)
    random = drawn_at_random(a, b)
    for d, (w_outs, g_outs) in enumerate(zip(want, got)):
        if len(w_outs) != len(g_outs):
            report.problems.append(f"device {d}: {len(w_outs)} outputs expected, {len(g_outs)} produced")
            break
        for i, (w, g) in enumerate(zip(w_outs, g_outs)):
            if i < len(random) and random[i]:
                stats = _not_compared(f"{i} (device {d})", w, g)
            else:
                stats = compare_arrays(f"{i} (device {d})", w, g, rtol, atol,
                                       computed_in=precisions[i] if i < len(precisions) else None)
            best = worst.get(i)
            if best is None or (best.ok and not stats.ok) or (best.ok == stats.ok and stats.max_abs > best.max_abs):
                worst[i] = stats
    report.outputs = [worst[i] for i in sorted(worst)]
    return report


def _declared_replicated(param) -> bool:
    """`parameter_replication={true}` (every leaf) or a replicated `sharding=` on a parameter."""
    flags = param.attr("parameter_replication") if "parameter_replication" in param.attributes else None
    if flags:
        return all(flags)
    return _has_sharding(param) and param.sharding.is_replicated


def random_inputs(module: Module, seed: int = 0) -> list[np.ndarray]:
    """Global inputs: one array per flattened ENTRY parameter leaf (see inputs.py)."""
    return _inputs.random_inputs(module, seed)


def execute_module(module_or_text, inputs: list[np.ndarray] | None = None, num_devices: int | None = None,
                   seed: int = 0, platform: str | None = None,
                   as_kind: ProgramKind | str | None = None) -> list[np.ndarray]:
    """Global outputs of one module.

    A global module runs on one device (mode a), or through XLA's SPMD partitioner when
    `num_devices` > 1 or it needs several devices (mode b); a partitioned module with
    logical shardings on its ENTRY parameters and ROOT runs on its devices with global
    inputs (mode c).  Per-device programs without logical shardings have no global result:
    VerificationError (`execute_per_device` runs them).
    """
    m = _module(module_or_text)
    reading = _reading(m, as_kind)
    try:
        if reading.kind.is_per_device:
            entry = m.entry
            if not has_logical_shardings(m):
                raise VerificationError("a per-device program without logical shardings on its ENTRY "
                                        "parameters and ROOT has no global result; `verify` it against "
                                        "its unpartitioned module")
            n = num_devices or reading.num_devices
            xla_backend.ensure_devices(n, platform)
            shapes = [_global_shape(p.shape, p.sharding) for p in entry.parameters]
            leaves = [leaf for s in shapes for leaf in s.leaves()]
            if inputs is not None:
                inputs = _inputs.check_leaves([(f"#{i}", leaf) for i, leaf in enumerate(leaves)], list(inputs))
            else:
                rng = np.random.default_rng(seed)
                counting = _inputs.counting_parameters(m)
                inputs = [_inputs.random_array(rng, leaf, counting=p.name in counting)
                          for p, s in zip(entry.parameters, shapes) for leaf in s.leaves()]
            report = VerificationReport("partitioned")
            outs = run_partitioned(m, list(inputs), root_sharding=entry.root.sharding,
                                   global_root_shape=_global_shape(entry.root.shape, entry.root.sharding),
                                   report=report, platform=platform, num_devices=n)
            if report.problems:
                raise VerificationError("; ".join(report.problems))
            return outs
        inputs = _inputs.random_inputs(m, seed) if inputs is None else _inputs.check_inputs(m, list(inputs))
        if (num_devices or 1) > 1 or needs_devices(m):
            n = num_devices or reading.num_devices
            xla_backend.ensure_devices(n, platform)
            died = _xla_deaths.oracle_died_reason()
            if died:  # a first try died inside XLA's partitioner; the CLI runs once more (_xla_deaths.py)
                from hlo_passes.runtime.manual_regions import run_direct

                direct = run_direct(m, inputs, n, platform)
                if direct is None:
                    raise VerificationError(f"XLA died partitioning this module ({died}), and it has no manual "
                                            "regions that run directly without XLA's partitioner")
                return direct
            with _xla_deaths.phase(_xla_deaths.PARTITIONING_ORACLE):
                outs, problems, _ = run_xla_spmd(m, inputs, n, platform)
            if problems:
                raise VerificationError("; ".join(problems))
            return outs
        return run_single_device(m, inputs, platform)
    except (PartitionError, _inputs.InputError) as e:
        raise VerificationError(str(e)) from None


def has_logical_shardings(module: Module) -> bool:
    """Does a per-device module say how its ENTRY parameters and result tile the global arrays
    (as `spmd-partition` writes them), so that it has a global result?"""
    entry = module.entry
    return (module.replica_count == 1 and all(_has_sharding(p) for p in entry.parameters)
            and _has_sharding(entry.root))


def execute_per_device(module_or_text, *, num_devices: int | None = None, seed: int = 0,
                       platform: str | None = None) -> tuple[list[list[np.ndarray]], int]:
    """Run a per-device program on its devices, each with its own random inputs (the same on
    every device for parameters declared replicated); `(outputs[device][leaf], devices)`."""
    m = _module(module_or_text)
    n = num_devices or read_program(m).num_devices
    xla_backend.ensure_devices(n, platform)
    replicated = [_declared_replicated(p) for p in m.entry.parameters]
    try:
        run = run_per_device_program(m, _inputs.per_device_inputs(m, n, replicated=replicated, seed=seed), n, platform)
    except (PartitionError, _inputs.InputError) as e:
        raise VerificationError(str(e)) from None
    return run.outputs, n


def _global_shape(shape, sharding: Sharding):
    """The global shape of a per-device shape under `sharding` (tiles × tile dims; uneven
    dims cannot be recovered and are reported as their padded size)."""
    if shape.is_tuple:
        return TupleShape(tuple(_global_shape(e, sharding.subsharding(shape, i)) for i, e in enumerate(shape.elements)))
    if sharding is None or not sharding.is_tiled:
        return shape
    return shape.with_dims([d * t for d, t in zip(shape.dims, sharding.data_tile_dims)])
