"""Compare two per-device SPMD programs device by device.

The modules XLA compiles after SPMD partitioning (and the ones a compile-time
rewrite produces from them) are per-device programs: per-device shapes,
collectives with explicit device groups, no logical shardings.  Two such
modules are equivalent when every device computes the same outputs from the
same inputs.  `compare_per_device` runs both on `num_partitions` CPU devices
with the same random inputs per device (identical on every device for the
parameters marked replicated, different per device otherwise) and compares
every device's outputs.

XLA's CPU client runs `num_partitions=N` programs only through its SPMD
partitioner, whose manual mode rejects variadic all-reduces; with one replica,
device d is partition d, so both modules run as the equivalent `replica_count=N`
program (partition-id becomes replica-id, every collective's device groups are
spelled out as replica groups without a channel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hlo_passes.ir.opcode import Opcode
from hlo_passes.parse.module_parser import parse_module

_GROUPED = {Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL,
            Opcode.ALL_REDUCE_START, Opcode.ALL_GATHER_START}
_PAIRED = {Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START}


@dataclass
class PerDeviceReport:
    ok: bool
    num_devices: int
    mismatches: list[str] = field(default_factory=list)
    max_abs_error: float = 0.0

    def format(self) -> str:
        if self.ok:
            return f"equal on all {self.num_devices} devices (max abs error {self.max_abs_error:.3g})"
        return "\n".join([f"differs on {self.num_devices} devices:"] + self.mismatches[:10])


def compare_per_device(original: str, rewritten: str, *, num_devices: int,
                       replicated: list[bool] | None = None, seed: int = 0,
                       rtol: float = 1e-5, atol: float = 1e-5) -> PerDeviceReport:
    """Run both per-device programs on `num_devices` devices with the same inputs; compare outputs."""
    inputs = random_inputs(original, num_devices, replicated=replicated, seed=seed)
    want = execute(original, inputs, num_devices)
    got = execute(rewritten, inputs, num_devices)
    report = PerDeviceReport(True, num_devices)
    for device, (w_outs, g_outs) in enumerate(zip(want, got)):
        if len(w_outs) != len(g_outs):
            report.mismatches.append(f"device {device}: {len(w_outs)} outputs vs {len(g_outs)}")
            continue
        for i, (w, g) in enumerate(zip(w_outs, g_outs)):
            if w.shape != g.shape or w.dtype != g.dtype:
                report.mismatches.append(f"device {device} output {i}: {w.dtype}{list(w.shape)} vs "
                                         f"{g.dtype}{list(g.shape)}")
                continue
            if w.size == 0:
                continue
            wf, gf = w.astype(np.float64), g.astype(np.float64)
            err = float(np.nanmax(np.abs(wf - gf))) if np.issubdtype(wf.dtype, np.floating) else 0.0
            report.max_abs_error = max(report.max_abs_error, err)
            if not np.allclose(gf, wf, rtol=rtol, atol=atol, equal_nan=True):
                report.mismatches.append(f"device {device} output {i}: max abs error {err:.3g}")
    report.ok = not report.mismatches
    return report


def random_inputs(text: str, num_devices: int, *, replicated: list[bool] | None = None,
                  seed: int = 0) -> list[list[np.ndarray]]:
    """Per parameter, one array per device (floats in [-1, 1), small integers)."""
    module = parse_module(text)
    rng = np.random.default_rng(seed)
    inputs = []
    for number, shape in enumerate(module.entry.parameter_shapes()):
        if shape.is_tuple:
            raise ValueError(f"parameter {number}: tuple parameters are not supported")
        dtype = shape.element_type.numpy_dtype()
        same = replicated is not None and number < len(replicated) and replicated[number]
        arrays = [_random(rng, dtype, shape.dims) for _ in range(1 if same else num_devices)]
        inputs.append(arrays * num_devices if same else arrays)
    return inputs


def _random(rng, dtype, dims) -> np.ndarray:
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V":  # ml_dtypes floats read as kind "V"
        return rng.uniform(-1, 1, dims).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, dims).astype(bool)
    return rng.integers(0, 5, dims).astype(dtype)


def as_replica_program(text: str, num_devices: int) -> str:
    """A per-device `num_partitions=N` program as the equivalent `replica_count=N` program."""
    from hlo_passes.ir.replica_groups import ReplicaGroups
    from hlo_passes.passes.collectives.common import participant_groups
    from hlo_passes.printer import print_module

    module = parse_module(text)
    if module.replica_count > 1 and module.num_partitions == 1:
        return text  # already a replica program
    module.num_partitions = num_devices
    for instr in module.all_instructions():
        if instr.opcode is Opcode.PARTITION_ID:
            instr.opcode = Opcode.REPLICA_ID
        elif instr.opcode in _GROUPED:
            instr.set_attr("replica_groups", ReplicaGroups.explicit(participant_groups(instr, module)))
            instr.remove_attr("channel_id")
            instr.remove_attr("use_global_device_ids")
        elif instr.opcode in _PAIRED:
            instr.remove_attr("channel_id")
    module.set_header_attr("replica_count", num_devices)
    module.attributes.pop("num_partitions", None)
    return print_module(module)


def execute(text: str, inputs: list[list[np.ndarray]], num_devices: int) -> list[list[np.ndarray]]:
    """Outputs per device: result[device] = the flat list of that device's outputs."""
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import xla_client as xc

    client = xla_bridge.get_backend("cpu")
    hlo = xc.hlo.hlo_module_from_text(as_replica_program(text, num_devices))
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_replicas = num_devices
    build.num_partitions = 1
    build.use_spmd_partitioning = False
    build.device_assignment = xc.DeviceAssignment.create(np.arange(num_devices).reshape(num_devices, 1))
    devices = client.devices()[:num_devices]
    if len(devices) < num_devices:
        raise RuntimeError(f"{num_devices} devices needed, {len(devices)} available "
                           "(XLA_FLAGS=--xla_force_host_platform_device_count)")
    exe = client.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), options)
    # One "replicated" global array per parameter whose per-device buffers differ: the executable
    # only reads each device's own buffer.
    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
    everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    from hlo_passes.runtime.xla_backend import exact_dtypes

    with exact_dtypes():
        args = [jax.make_array_from_single_device_arrays(
                    per_device[0].shape, everywhere,
                    [jax.device_put(arr, devices[d]) for d, arr in enumerate(per_device)])
                for per_device in inputs]
    results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    return [[np.asarray(out[d]) for out in results] for d in range(num_devices)]
