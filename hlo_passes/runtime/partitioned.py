"""Running multi-device modules: global arrays ⇄ per-device shards, and the three ways a
multi-device module runs on N devices.

* `run_per_device_program(module, args, n)` — a per-device (already partitioned)
  program: `args[leaf][device]` in, `outputs[device][leaf]` out.  The program is
  rewritten on the IR so that every ENTRY parameter and the ROOT carry
  `sharding={manual}` (all other `sharding=` annotations dropped) and compiled with
  `num_partitions=N` through XLA's SPMD partitioner, which leaves manual code alone;
  XLA itself then interprets channel ids, replica groups and partition-id.
  XLA's manual mode rejects variadic all-reduces, and XLA CPU can misplace the pieces of
  a variadic all-gather, so those are first split into one collective per operand (same
  groups, fresh channel ids; `per_device.split_variadic_collectives`) — the same
  computation.
  Replica-style programs (`replica_count=N`, one partition) compile as they are with
  `num_replicas=N`.  A program XLA still rejects in manual mode (a partitioner
  limitation, not an error in the program) runs as the equivalent `replica_count=N`
  program (`per_device.as_replica_program`), and the result says so; so does one on which
  XLA's partitioner dies (a failed check kills the process: the CLI runs it once more, told
  so, and that run takes the replica form directly; `_xla_deaths.py`).
* `run_global_partitioned(module, inputs, ...)` — mode (c): global inputs are sliced
  into per-device shards by the parameter shardings (`Sharding.tile_shape`/
  `tile_offset`: tile = ceil(dim / tiles), zero padding past the end, the way XLA pads
  uneven shards), run with `run_per_device_program`, and each output is reassembled
  from the ROOT sharding (tuple roots per element).  Every device holding the same
  tile (replicated results, `last_tile_dim_replicate`) must hold the same values.
* `run_xla_spmd(module, inputs, n)` — mode (b): a module with logical `sharding=`
  annotations and global shapes, partitioned by XLA's own SPMD partitioner; the
  parameter and output shardings XLA settled on are read back from the executable.
  A module in JAX's default Shardy form (`xla.sdy.*` frontend attributes) goes through
  XLA's Shardy partitioner, as JAX itself compiles it; where XLA refuses it (partially
  manual shard_map regions), our Shardy import rewrites it into the GSPMD form first
  and the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hlo_passes import _xla_deaths
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import Shape
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.parse.shardy_import import has_partially_manual_regions, import_shardy
from hlo_passes.printer import print_module
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.sharding_propagation import unspecified_dims
from hlo_passes.runtime import xla_backend
from hlo_passes.runtime.compare import compare_arrays
from hlo_passes.runtime.per_device import (SPLIT_ALWAYS, SPLIT_IN_MANUAL_MODE, as_replica_program, has_variadic,
                                           split_variadic_collectives)


class PartitionError(ValueError):
    """A sharding that cannot slice or reassemble a global array."""


# ------------------------------------------------------ shards of arrays --
def _whole(sharding: Sharding | None) -> bool:
    return sharding is None or sharding.kind in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL,
                                                 ShardingKind.UNKNOWN) or sharding.is_replicated


def shard_array(array: np.ndarray, sharding: Sharding | None, device: int) -> np.ndarray:
    """Device `device`'s tile of a global array (zero-padded past the end of uneven dims).  A
    maximal sharding puts the array on its one device; the others get `poison` in its place,
    so a program that reads it anywhere else (rather than broadcasting it from its device, as
    XLA's partition does) computes a wrong value instead of passing by luck."""
    if sharding is not None and sharding.kind is ShardingKind.MAXIMAL and sharding.device != device:
        return poison(array)
    if _whole(sharding):
        return array
    if sharding.kind is not ShardingKind.TILED or any(k.value != "replicated" for k in sharding.subgroups):
        raise PartitionError(f"cannot slice a global array by {sharding.to_hlo()}")
    dims = tuple(array.shape)
    sizes = sharding.tile_shape(dims)
    offsets = sharding.tile_offset(device, dims)
    tile = np.zeros(sizes, dtype=array.dtype)
    src = tuple(slice(min(o, d), min(o + s, d)) for o, s, d in zip(offsets, sizes, dims))
    dst = tuple(slice(0, max(0, min(o + s, d) - o)) for o, s, d in zip(offsets, sizes, dims))
    tile[dst] = array[src]
    return tile


def poison(array: np.ndarray) -> np.ndarray:
    """What a device that does not hold a maximal parameter is given in its place: NaN for
    floating-point and complex arrays, the opposite for pred, the largest value for integers."""
    kind = array.dtype.kind
    if kind == "b":
        return ~array
    if kind in "iu":
        return np.full_like(array, np.iinfo(array.dtype).max)
    return np.full_like(array, np.nan)


def assemble_array(per_device: list[np.ndarray], sharding: Sharding | None,
                   global_dims: tuple[int, ...]) -> tuple[np.ndarray, str | None]:
    """The global array from every device's tile, and a problem when devices holding the same
    tile (replicas) disagree.  A maximal result is its device's buffer (what the others hold
    is not part of it)."""
    if sharding is not None and sharding.kind is ShardingKind.MAXIMAL and sharding.device is not None:
        return per_device[min(sharding.device, len(per_device) - 1)], None
    if _whole(sharding):
        first = per_device[0]
        for d, arr in enumerate(per_device[1:], 1):
            if arr.shape != first.shape or not _same_replica(first, arr):
                return first, f"should be replicated but device {d} differs from device 0"
        return first, None
    if sharding.kind is not ShardingKind.TILED or any(k.value != "replicated" for k in sharding.subgroups):
        raise PartitionError(f"cannot reassemble a global array from {sharding.to_hlo()}")
    dims = tuple(global_dims)
    out = np.zeros(dims, dtype=per_device[0].dtype)
    holder: dict[tuple[int, ...], int] = {}
    problem = None
    for d in range(min(len(per_device), sharding.num_devices)):
        tile = per_device[d]
        expected = sharding.tile_shape(dims)
        if tuple(tile.shape) != expected:
            raise PartitionError(f"device {d} holds a {list(tile.shape)} tile; the sharding "
                                 f"{sharding.to_hlo()} of {list(dims)} gives {list(expected)}")
        index = sharding.tile_index(d)
        offsets = sharding.tile_offset(d, dims)
        dst = tuple(slice(min(o, n), min(o + s, n)) for o, s, n in zip(offsets, tile.shape, dims))
        src = tuple(slice(0, max(0, min(o + s, n) - o)) for o, s, n in zip(offsets, tile.shape, dims))
        if index in holder:
            if problem is None and not _same_replica(out[dst], tile[src]):
                problem = f"devices {holder[index]} and {d} hold tile {list(index)} with different values"
            continue
        holder[index] = d
        out[dst] = tile[src]
    return out, problem


def _same_replica(a: np.ndarray, b: np.ndarray) -> bool:
    """Do two devices hold the same replica?  Exactly for integers and pred; floats within the
    element type's tolerance: XLA:CPU's reductions add in an order that depends on the buffer's
    alignment, so replicas computed by one program on identical data can differ in the last bit."""
    if a.shape != b.shape:
        return False
    return compare_arrays("", a, b).ok


def leaf_shardings(sharding: Sharding | None, shape: Shape) -> list[Sharding | None]:
    """One sharding per leaf of `shape` (a non-tuple sharding applies to every leaf)."""
    leaves = shape.leaves()
    if sharding is not None and sharding.is_tuple:
        if len(sharding.elements) != len(leaves):
            raise PartitionError(f"tuple sharding with {len(sharding.elements)} elements for "
                                 f"{len(leaves)} leaves")
        return list(sharding.elements)
    return [sharding] * len(leaves)


# ------------------------------------------------------- manual programs --
def manual_program(module: Module, num_partitions: int) -> str:
    """Text of a per-device program with its ENTRY parameters and ROOT marked manual.

    Mesh-form replica groups (`mesh['x'=4,'y'=2] {'x':(2)2}`) are spelled out as explicit
    groups: XLA's verifier misreads sub-axis groups when it parses them back."""
    copy = module.clone()
    for instr in copy.all_instructions():
        instr.remove_attr("sharding")
        if instr.custom_call_target == "Sharding":  # XLA requires one on these; all code is manual here
            instr.sharding = _manual_like(instr.shape)
        elif instr.opcode in (Opcode.SCATTER, Opcode.TOPK) and instr.shape.is_tuple:
            # XLA's sharding propagation CHECK-fails inferring a manual variadic scatter's
            # sharding from its users (hlo_sharding_util.cc, merging into a tuple sharding), and
            # a topk's (hlo_sharding.cc, "!IsManualLeaf()"): give them one
            instr.sharding = _manual_like(instr.shape)
        if "replica_groups" in instr.attributes:
            groups = instr.attr("replica_groups")
            if groups is not None and groups.mesh_spelling:
                instr.set_attr("replica_groups", ReplicaGroups.explicit(groups.groups))
    entry = copy.entry
    for p in entry.parameters:
        p.sharding = _manual_like(p.shape)
    entry.root.sharding = _manual_like(entry.root.shape)
    split_variadic_collectives(copy, SPLIT_IN_MANUAL_MODE)
    copy.num_partitions = num_partitions
    for key in ("allow_spmd_sharding_propagation_to_parameters", "allow_spmd_sharding_propagation_to_output"):
        copy.attributes.pop(key, None)
    return print_module(copy)


def _manual_like(shape: Shape) -> Sharding:
    if shape.is_tuple:
        return Sharding.tuple_of([_manual_like(e) for e in shape.elements])
    return Sharding.manual()


@dataclass
class DeviceRun:
    """Outputs of a per-device run: `outputs[device][leaf]`, and how it ran."""

    outputs: list[list[np.ndarray]]
    how: str
    notes: list[str] = field(default_factory=list)


def run_per_device_program(module: Module, args: list[list[np.ndarray]], num_devices: int,
                           platform: str | None = None) -> DeviceRun:
    """Run a per-device program on `num_devices` devices (see the module docstring)."""
    replicas, partitions = module.replica_count, module.num_partitions
    if has_variadic(module, SPLIT_ALWAYS):
        module = module.clone()
        split_variadic_collectives(module, SPLIT_ALWAYS)
    if partitions == 1:  # replica-style: XLA runs it as it is
        text = print_module(module)
        exe = xla_backend.compile_hlo(text, num_replicas=num_devices, platform=platform)
        return DeviceRun(exe.run(args), f"{num_devices} replicas")
    if replicas * partitions != num_devices and replicas > 1:
        raise PartitionError(f"{replicas} replicas × {partitions} partitions do not make {num_devices} devices")
    parts = num_devices // max(replicas, 1)
    died = _xla_deaths.manual_died_reason()
    if died is not None:  # a first try died compiling it in manual mode (_xla_deaths.py)
        exe = _replica_executable(module, num_devices, platform)
        return _replica_run(exe, args, num_devices, f"XLA died compiling the manual program ({died})")
    try:
        with _xla_deaths.phase(_xla_deaths.COMPILING_MANUAL):
            exe = xla_backend.compile_hlo(manual_program(module, parts), num_replicas=max(replicas, 1),
                                          num_partitions=parts, spmd=True, platform=platform)
        return DeviceRun(exe.run(args), f"{parts} partitions (manual)")
    except Exception as manual_error:  # XLA's partitioner rejects some manual code; see the docstring
        try:
            exe = _replica_executable(module, num_devices, platform)
        except Exception:
            raise manual_error from None
        first = xla_backend.xla_error_lines(manual_error, 1)[0]
        return _replica_run(exe, args, num_devices, f"XLA rejected the manual program ({first})")


def _replica_executable(module: Module, num_devices: int, platform: str | None) -> xla_backend.Executable:
    """The per-device `module` compiled as the equivalent `replica_count=N` program: no XLA
    partitioner involved (per_device.as_replica_program)."""
    return xla_backend.compile_hlo(as_replica_program(print_module(module), num_devices), num_replicas=num_devices,
                                   platform=platform)


def _replica_run(exe: xla_backend.Executable, args: list[list[np.ndarray]], num_devices: int, why: str) -> DeviceRun:
    return DeviceRun(exe.run(args), f"{num_devices} devices as a replica program", [f"{why}; ran it as a replica program"])


def run_global_partitioned(module: Module, leaf_inputs: list[np.ndarray], *,
                           param_shardings: list[Sharding | None], root_sharding: Sharding | None,
                           global_root_shape: Shape, num_devices: int | None = None,
                           platform: str | None = None) -> tuple[list[np.ndarray], list[str], DeviceRun]:
    """Mode (c): global leaf inputs → shards → per-device program → global outputs.

    `param_shardings` has one entry per ENTRY parameter (tuple shardings for tuple
    parameters); `leaf_inputs` one global array per parameter leaf.  Returns the global
    outputs, problems (disagreeing replicas) and the run (how it ran, notes).
    """
    n = num_devices or module.num_partitions * module.replica_count
    per_leaf_sharding: list[Sharding | None] = []
    for p, s in zip(module.entry.parameters, param_shardings):
        per_leaf_sharding += leaf_shardings(s, p.shape)
    if len(per_leaf_sharding) != len(leaf_inputs):
        raise PartitionError(f"{len(leaf_inputs)} inputs for {len(per_leaf_sharding)} parameter leaves")
    args = [[shard_array(x, s, d) for d in range(n)] for x, s in zip(leaf_inputs, per_leaf_sharding)]
    leaf_shapes = [leaf for p in module.entry.parameters for leaf in p.shape.leaves()]
    for i, (per_device, shape, s) in enumerate(zip(args, leaf_shapes, per_leaf_sharding)):
        if tuple(per_device[0].shape) != tuple(shape.dims):
            raise PartitionError(
                f"parameter leaf {i}: its sharding {s.to_hlo() if s else '{replicated}'} cuts the global "
                f"{list(leaf_inputs[i].shape)} into {list(per_device[0].shape)} tiles, but the per-device "
                f"program expects {shape.to_hlo(with_layout=False)}")
    run = run_per_device_program(module, args, n, platform)
    leaves = global_root_shape.leaves()
    shardings = leaf_shardings(root_sharding, global_root_shape)
    outputs, problems = [], []
    for i, (leaf, s) in enumerate(zip(leaves, shardings)):
        array, problem = assemble_array([dev[i] for dev in run.outputs], s, tuple(leaf.dims))
        if problem:
            problems.append(f"output {i} {problem}")
        outputs.append(array)
    return outputs, problems, run


def in_shardy_form(module: Module) -> bool:
    """Does the module carry JAX's Shardy lowering: `xla.sdy.*` module frontend attributes,
    Shardy's custom-calls (`xla.sdy.GlobalToLocalShape` …), or shardings in the named mesh form?
    The last two are what XLA's `before_optimizations` dump of a Shardy-lowered program holds;
    XLA's GSPMD pipeline rejects the custom-calls and never finishes on some named shardings,
    so such modules go through the Shardy partitioner, as JAX compiled them."""
    attributes = module.header_attr("frontend_attributes")
    if attributes is not None and any(k.startswith("xla.sdy.") for k, _ in attributes.entries):
        return True
    for i in module.all_instructions():
        if (i.custom_call_target or "").startswith("xla.sdy."):
            return True
        s = i.sharding if "sharding" in i.attributes else None
        if s is not None and any(leaf.named_mesh for leaf in (s.elements if s.is_tuple else (s,))):
            return True
    return False


def _propagation_flags(module: Module, key: str) -> tuple[bool, ...]:
    return tuple(module.header_attr(key) or ()) if key in module.attributes else ()


def compile_xla_spmd(module: Module, num_devices: int, platform: str | None, notes: list[str],
                     propagate_to_output: tuple[bool, ...] | None = None):
    """XLA's executable for a global module partitioned by XLA on `num_devices`, compiled with
    the module header's `allow_spmd_sharding_propagation_to_parameters/output` (what JAX asked
    for when it compiled the module), see mode (b) in the module docstring for how Shardy-form
    modules are compiled."""
    copy = module.clone()
    copy.num_partitions = num_devices
    _steer_around_manual_subgroup_hints(copy, notes)
    flags = dict(platform=platform,
                 propagate_to_output=(propagate_to_output if propagate_to_output is not None else
                                      _propagation_flags(copy, "allow_spmd_sharding_propagation_to_output")),
                 propagate_to_parameters=_propagation_flags(copy, "allow_spmd_sharding_propagation_to_parameters"))
    if not in_shardy_form(copy):
        return xla_backend.compile_hlo(print_module(copy), num_partitions=num_devices, spmd=True, **flags)
    if not has_partially_manual_regions(copy):
        try:
            return xla_backend.compile_hlo(print_module(copy), num_partitions=num_devices, spmd=True,
                                           shardy=True, **flags)
        except xla_backend.BackendUnavailable:
            raise
        except RuntimeError as e:  # XLA's own error (JaxRuntimeError)
            reason = f"XLA's Shardy partitioner refused it ({xla_backend.xla_error_lines(e, 1)[0]})"
    else:
        reason = "XLA's Shardy pipeline aborts on partially manual shard_map regions"
    import_shardy(copy)
    notes.append(f"{reason}; it ran in GSPMD form after our Shardy import")
    return xla_backend.compile_hlo(print_module(copy), num_partitions=num_devices, spmd=True, **flags)


def _steer_around_manual_subgroup_hints(module: Module, notes: list[str]) -> None:
    """Drop `unspecified_dims` from `Sharding` annotations inside partially manual regions.

    XLA's GSPMD propagation CHECK-fails on them and aborts the process
    (`hlo_sharding_util.cc` `IsManualSubgroup()`; JAX's GSPMD lowering of a partially manual
    shard_map writes them, and jit of such a program dies the same way).  The hint only leaves
    XLA's propagation free to shard the named dims further, which changes the plan, never a
    value, so a verification may run without it."""
    dropped = 0
    for instr in module.all_instructions():
        if (instr.custom_call_target == "Sharding" and instr.sharding is not None
                and su.is_manual_subgroup(instr.sharding) and unspecified_dims(instr) is not None):
            instr.remove_attr("backend_config")
            dropped += 1
    if dropped:
        notes.append(f"dropped unspecified_dims from {dropped} partially manual Sharding annotation(s): XLA's GSPMD "
                     "propagation aborts on them (IsManualSubgroup CHECK); they change XLA's plan, not the values")


def run_xla_spmd(module: Module, leaf_inputs: list[np.ndarray], num_devices: int,
                 platform: str | None = None, notes: list[str] | None = None
                 ) -> tuple[list[np.ndarray], list[str], list[Sharding]]:
    """Mode (b): XLA's SPMD partitioner on a module with logical shardings and global shapes.

    Returns the global outputs, problems, and the output shardings XLA chose (per leaf);
    how the module was compiled, where it matters, is appended to `notes`."""
    exe = compile_xla_spmd(module, num_devices, platform, notes if notes is not None else [])
    read = reader_for("sharding")
    in_shardings = [read("{" + s + "}" if not s.startswith("{") else s) for s in exe.parameter_shardings() or []]
    out_shardings = [read("{" + s + "}" if not s.startswith("{") else s) for s in exe.output_shardings() or []]
    if len(in_shardings) != len(leaf_inputs):
        raise PartitionError(f"XLA reports {len(in_shardings)} parameter shardings for {len(leaf_inputs)} inputs")
    args = [[shard_array(x, s, d) for d in range(num_devices)] for x, s in zip(leaf_inputs, in_shardings)]
    per_device = exe.run(args)
    leaves = module.entry.root.shape.leaves()
    outputs, problems = [], []
    for i, (leaf, s) in enumerate(zip(leaves, out_shardings)):
        array, problem = assemble_array([dev[i] for dev in per_device], s, tuple(leaf.dims))
        if problem:
            problems.append(f"output {i} {problem}")
        outputs.append(array)
    return outputs, problems, out_shardings


__all__ = ["DeviceRun", "PartitionError", "assemble_array", "leaf_shardings", "manual_program", "poison",
           "run_global_partitioned", "run_per_device_program", "run_xla_spmd", "shard_array"]
