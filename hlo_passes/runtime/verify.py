"""Numerical verification: run the original and the rewritten module on the same
random inputs through XLA and compare.

How a module runs is read from the module itself:

* plain module (one partition, one replica, no collectives): on one device, with
  any logical `sharding=` annotations and `Sharding` custom-calls removed (they
  do not change what is computed);
* per-device partitioned module (`num_partitions=N`, per-device shapes, the
  logical sharding on every ENTRY parameter and on the ROOT — our
  `spmd-partition` output): global inputs are sliced into per-device shards by
  the parameter shardings (uneven shards zero-padded the way XLA pads them), the
  program runs on N devices, and the global result is reassembled from the ROOT
  sharding (replicated results: every device must agree).  A partitioned module
  without shardings on its parameters (XLA's own SPMD output) takes them from
  the unpartitioned module it is compared with;
* per-device programs on both sides (replica-style `replica_count=N`, or
  `num_partitions=N` without logical shardings): every device gets its own
  inputs and outputs are compared device by device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.printer import print_module


class VerificationError(Exception):
    """The modules cannot be run or compared (not a mismatch)."""


# ----------------------------------------------------------------- report --
@dataclass
class OutputStats:
    index: str
    dtype: str
    shape: tuple
    max_abs: float = 0.0
    max_rel: float = 0.0
    ok: bool = True
    detail: str = ""


@dataclass
class VerificationReport:
    mode: str
    outputs: list[OutputStats] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The compared values (global outputs), for --save-outputs; per-device runs keep device 0's.
    expected: list[np.ndarray] = field(default_factory=list, repr=False)
    actual: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems and all(o.ok for o in self.outputs)

    def format(self) -> str:
        lines = [f"{'EQUIVALENT' if self.ok else 'MISMATCH'} ({self.mode})"]
        lines += [f"  {p}" for p in self.problems]
        for o in self.outputs:
            mark = "ok " if o.ok else "BAD"
            lines.append(f"  {mark} output {o.index}: {o.dtype}{list(o.shape)} max abs {o.max_abs:.3g} "
                         f"max rel {o.max_rel:.3g}" + (f" — {o.detail}" if o.detail else ""))
        return "\n".join(lines)


# ------------------------------------------------------------ tolerances --
def default_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) by element type: exact for integers and pred."""
    name = np.dtype(dtype).name
    if np.dtype(dtype).kind in "biu":
        return 0.0, 0.0
    if "float8" in name or "float4" in name:
        return 0.25, 0.25
    if name in ("bfloat16",):
        return 2e-2, 2e-2
    if name == "float16":
        return 5e-3, 5e-3
    if name in ("float64", "complex128"):
        return 1e-9, 1e-9
    return 1e-4, 1e-5


def compare_arrays(index: str, want: np.ndarray, got: np.ndarray, rtol=None, atol=None) -> OutputStats:
    stats = OutputStats(index, str(want.dtype), tuple(want.shape))
    if want.shape != got.shape or want.dtype != got.dtype:
        stats.ok = False
        stats.detail = f"got {got.dtype}{list(got.shape)}"
        return stats
    if want.size == 0:
        return stats
    d_rtol, d_atol = default_tolerance(want.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    kind = np.dtype(want.dtype).kind
    w = want.astype(np.complex128 if kind == "c" else np.float64)
    g = got.astype(np.complex128 if kind == "c" else np.float64)
    w_nan, g_nan = np.isnan(w), np.isnan(g)
    w_inf, g_inf = np.isinf(w), np.isinf(g)
    bad = (w_nan != g_nan) | (w_inf != g_inf) | (w_inf & g_inf & (w != g))
    finite = ~(w_nan | g_nan | w_inf | g_inf)
    diff = np.where(finite, np.abs(w - g), 0.0)
    stats.max_abs = float(diff.max())
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rel = np.where(finite, diff / np.maximum(np.abs(np.where(finite, w, 1.0)), 1e-30), 0.0)
    stats.max_rel = float(rel.max())
    bad |= finite & (diff > atol + rtol * np.abs(w))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        stats.ok = False
        stats.detail = f"first mismatch at {list(where)}: expected {w[where]}, got {g[where]}"
    return stats


# ---------------------------------------------------------------- inputs --
def random_array(rng: np.random.Generator, shape) -> np.ndarray:
    """Deterministic inputs that keep tolerances meaningful: floats in [-1, 1), small ints."""
    etype = shape.element_type
    dtype = etype.numpy_dtype()
    dims = shape.dims
    if etype.is_complex:
        return (rng.uniform(-1, 1, dims) + 1j * rng.uniform(-1, 1, dims)).astype(dtype)
    if etype.is_float:
        return rng.uniform(-1, 1, dims).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, dims).astype(bool)
    high = 2 if etype.bit_width <= 2 else 5
    return rng.integers(0, high, dims).astype(dtype)


def random_inputs(module: Module, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = []
    for p in module.entry.parameters:
        if p.shape.is_tuple:
            raise VerificationError(f"parameter {p.name}: tuple-shaped parameters are not supported")
        inputs.append(random_array(rng, p.shape))
    return inputs


# ----------------------------------------------------------------- modes --
def _module(m: Module | str) -> Module:
    return parse_module(m) if isinstance(m, str) else parse_module(print_module(m))


def _has_collectives(module: Module) -> bool:
    return any(i.opcode.is_collective or i.opcode in (Opcode.PARTITION_ID, Opcode.REPLICA_ID)
               for i in module.all_instructions())


def is_per_device(module: Module) -> bool:
    return module.num_partitions > 1 or module.replica_count > 1


def strip_shardings(module: Module) -> Module:
    """Remove logical sharding annotations (in place) so the module runs on one device."""
    for comp in module.computations:
        for instr in comp.post_order():
            if instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in (
                    "Sharding", "xla.sdy.FuncResultSharding"):
                instr.replace_all_uses_with(instr.operands[0])
                if not instr.users and instr is not comp.root:
                    comp.remove(instr)
            instr.remove_attr("sharding")
    for key in ("num_partitions", "allow_spmd_sharding_propagation_to_parameters",
                "allow_spmd_sharding_propagation_to_output"):
        module.attributes.pop(key, None)
    return module


def run_single_device(module: Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    from hlo_passes.runtime import xla_backend

    if _has_collectives(module) or any(
            i.sharding is not None and i.sharding.is_manual for i in module.all_instructions()
            if "sharding" in i.attributes):
        raise VerificationError("an unpartitioned module with collectives or manual regions cannot run "
                                "on one device; compare per-device programs instead")
    return xla_backend.run_single(print_module(strip_shardings(_module(module))), inputs)


def _shard(array: np.ndarray, sharding: Sharding | None, device: int) -> np.ndarray:
    if sharding is None or sharding.kind in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL):
        return array
    if sharding.kind is not ShardingKind.TILED:
        raise VerificationError(f"cannot slice a global input by a {sharding.kind.value} sharding")
    dims = array.shape
    sizes = sharding.tile_shape(dims)
    offsets = sharding.tile_offset(device, dims)
    tile = np.zeros(sizes, dtype=array.dtype)
    src = tuple(slice(o, min(o + s, d)) for o, s, d in zip(offsets, sizes, dims))
    dst = tuple(slice(0, max(0, min(o + s, d) - o)) for o, s, d in zip(offsets, sizes, dims))
    tile[dst] = array[src]
    return tile


def _assemble(index: str, per_device: list[np.ndarray], sharding: Sharding | None, global_shape,
              report: VerificationReport) -> np.ndarray:
    if sharding is None or sharding.kind in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL):
        first = per_device[0]
        for d, arr in enumerate(per_device[1:], 1):
            if arr.shape != first.shape or not np.array_equal(arr, first, equal_nan=True):
                report.problems.append(f"output {index} should be replicated but device {d} differs "
                                       "from device 0")
                break
        return first
    if sharding.kind is not ShardingKind.TILED:
        raise VerificationError(f"cannot reassemble output {index} from a {sharding.kind.value} sharding")
    dims = tuple(global_shape.dims)
    out = np.zeros(dims, dtype=per_device[0].dtype)
    for d, tile in enumerate(per_device):
        if d >= sharding.num_devices:
            break
        offsets = sharding.tile_offset(d, dims)
        dst = tuple(slice(o, min(o + s, n)) for o, s, n in zip(offsets, tile.shape, dims))
        src = tuple(slice(0, max(0, min(o + s, n) - o)) for o, s, n in zip(offsets, tile.shape, dims))
        out[dst] = tile[src]
    return out


def run_partitioned(module: Module, global_inputs: list[np.ndarray], *, param_shardings=None,
                    root_sharding=None, global_root_shape=None, report=None) -> list[np.ndarray]:
    """Run a per-device partitioned module on global inputs; return global outputs."""
    from hlo_passes.runtime.per_device import execute

    n = module.num_partitions
    params = module.entry.parameters
    shardings = param_shardings or [p.sharding for p in params]
    per_param = [[_shard(x, s, d) for d in range(n)] for x, s in zip(global_inputs, shardings)]
    per_device_outputs = execute(print_module(module), per_param, n)
    root = module.entry.root
    rs = root_sharding if root_sharding is not None else root.sharding
    gshape = global_root_shape
    if gshape is None:
        raise VerificationError("the global result shape is unknown")
    leaves = gshape.leaves() if gshape.is_tuple else [gshape]
    outs = []
    report = report if report is not None else VerificationReport("partitioned")
    for i, leaf in enumerate(leaves):
        s = rs.element(i) if rs is not None and rs.is_tuple else rs
        outs.append(_assemble(str(i), [dev[i] for dev in per_device_outputs], s, leaf, report))
    return outs


def verify_equivalent(original, rewritten, *, num_devices: int | None = None, seed: int = 0,
                      rtol: float | None = None, atol: float | None = None,
                      inputs: list[np.ndarray] | None = None) -> VerificationReport:
    """Run both modules on the same random inputs and compare every output."""
    a, b = _module(original), _module(rewritten)
    a_dev, b_dev = is_per_device(a), is_per_device(b)
    if a_dev and b_dev:
        return _verify_per_device(a, b, num_devices, seed, rtol, atol)
    if a_dev and not b_dev:
        report = verify_equivalent(b, a, num_devices=num_devices, seed=seed, rtol=rtol, atol=atol,
                                   inputs=inputs)
        return report
    inputs = inputs if inputs is not None else random_inputs(a, seed)
    want = run_single_device(a, inputs)
    if not b_dev:
        report = VerificationReport("single device")
        got = run_single_device(b, inputs)
    else:
        report = VerificationReport(f"partitioned on {b.num_partitions} devices")
        a_params = a.entry.parameters
        shardings = [p.sharding if "sharding" in p.attributes else
                     (ap.sharding if "sharding" in ap.attributes else None)
                     for p, ap in zip(b.entry.parameters, a_params)]
        root_sharding = b.entry.root.sharding if "sharding" in b.entry.root.attributes else (
            a.entry.root.sharding if "sharding" in a.entry.root.attributes else _propagated_root_sharding(a))
        got = run_partitioned(b, inputs, param_shardings=shardings, root_sharding=root_sharding,
                              global_root_shape=a.entry.root.shape, report=report)
    report.expected, report.actual = list(want), list(got)
    if len(want) != len(got):
        report.problems.append(f"{len(want)} outputs vs {len(got)}")
        return report
    for i, (w, g) in enumerate(zip(want, got)):
        report.outputs.append(compare_arrays(str(i), w, g, rtol, atol))
    return report


def _propagated_root_sharding(module: Module) -> Sharding | None:
    """The result sharding a partitioner picks when the program leaves it open (XLA does not
    print it): our sharding propagation's choice on a copy of the unpartitioned module."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation

    copy = _module(module)
    ShardingPropagation().run(copy)
    return copy.entry.root.sharding


def _verify_per_device(a: Module, b: Module, num_devices, seed, rtol, atol) -> VerificationReport:
    from hlo_passes.runtime.per_device import execute
    from hlo_passes.runtime.per_device import random_inputs as per_device_inputs

    n = num_devices or max(a.num_partitions, a.replica_count)
    report = VerificationReport(f"per-device on {n} devices")
    text_a, text_b = print_module(a), print_module(b)
    # Parameters either side declares identical on every device get the same input everywhere.
    replicated = [_declared_replicated(pa) or _declared_replicated(pb)
                  for pa, pb in zip(a.entry.parameters, b.entry.parameters)]
    inputs = per_device_inputs(text_a, n, replicated=replicated, seed=seed)
    want, got = execute(text_a, inputs, n), execute(text_b, inputs, n)
    report.expected, report.actual = list(want[0]), list(got[0])
    worst: dict[int, OutputStats] = {}
    for d, (w_outs, g_outs) in enumerate(zip(want, got)):
        if len(w_outs) != len(g_outs):
            report.problems.append(f"device {d}: {len(w_outs)} outputs vs {len(g_outs)}")
            continue
        for i, (w, g) in enumerate(zip(w_outs, g_outs)):
            stats = compare_arrays(str(i), w, g, rtol, atol)
            if not stats.ok:
                stats.detail = f"device {d}: {stats.detail}"
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
    return "sharding" in param.attributes and param.sharding is not None and param.sharding.is_replicated


def execute_module(module, inputs: list[np.ndarray] | None = None, *, seed: int = 0) -> list[np.ndarray]:
    """Global outputs of one module (plain, or partitioned with logical shardings)."""
    m = _module(module)
    inputs = inputs if inputs is not None else random_inputs(m, seed)
    if is_per_device(m):
        raise VerificationError("a per-device program has no single global result; use `verify` "
                                "against its unpartitioned module")
    return run_single_device(m, inputs)
