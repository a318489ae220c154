"""Run one HLO module on 8 virtual CPU devices and compare two modules device by device.

The shared runtime (`hlo_passes.runtime`) checks whole programs against their
logical meaning; collective rewrites need something stricter and simpler: every
device gets its own random inputs, both modules run with the same inputs, and
every device's outputs must agree.  Modules run as `replica_count=N` or
`num_partitions=N` programs, whichever their header declares.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.opcode import Opcode
from hlo_passes.parse.module_parser import parse_module

_GROUPED = {Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL,
            Opcode.ALL_REDUCE_START, Opcode.ALL_GATHER_START}
_PAIRED = {Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START}


def _client():
    from jax._src import xla_bridge

    return xla_bridge.get_backend("cpu")


def _compile(text: str, replicas: int, partitions: int):
    from jax._src.lib import xla_client as xc

    hlo = xc.hlo.hlo_module_from_text(text)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_replicas = replicas
    build.num_partitions = partitions
    build.use_spmd_partitioning = False
    n = replicas * partitions
    build.device_assignment = xc.DeviceAssignment.create(np.arange(n).reshape(replicas, partitions))
    devices = _client().devices()[:n]
    return _client().compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), options), devices


def as_replica_program(text: str) -> str:
    """A `num_partitions=N` per-device program as the equivalent `replica_count=N` program.

    XLA's CPU client runs partitioned programs only through its SPMD partitioner, which in
    manual mode rejects variadic all-reduces ("supports only single-operand allreduce").  With
    one replica, device d is partition d, so: partition-id becomes replica-id, and every
    collective gets its device groups spelled out as replica groups without channel (the
    cross-replica reading of the same groups).  Both sides of a comparison go through this.
    """
    from hlo_passes.ir.replica_groups import ReplicaGroups
    from hlo_passes.passes.collectives.common import participant_groups
    from hlo_passes.printer import print_module

    module = parse_module(text)
    if module.replica_count != 1:
        raise ValueError("programs with both replicas and partitions are not supported here")
    n = module.num_partitions
    for instr in module.all_instructions():
        if instr.opcode is Opcode.PARTITION_ID:
            instr.opcode = Opcode.REPLICA_ID
        elif instr.opcode in _GROUPED:
            groups = participant_groups(instr, module)
            instr.set_attr("replica_groups", ReplicaGroups.explicit(groups))
            instr.remove_attr("channel_id")
            instr.remove_attr("use_global_device_ids")
        elif instr.opcode in _PAIRED:
            instr.remove_attr("channel_id")
    module.set_header_attr("replica_count", n)
    module.attributes.pop("num_partitions", None)
    return print_module(module)


def device_count(text: str) -> tuple[int, int]:
    module = parse_module(text)
    return module.replica_count, module.num_partitions


def random_inputs(text: str, seed: int = 0) -> list[list[np.ndarray]]:
    """Per parameter, one array per device (integers small, floats in [-1, 1))."""
    module = parse_module(text)
    replicas, partitions = module.replica_count, module.num_partitions
    rng = np.random.default_rng(seed)
    inputs = []
    for shape in module.entry.parameter_shapes():
        dtype = shape.element_type.numpy_dtype()
        per_device = []
        for _ in range(replicas * partitions):
            if np.issubdtype(dtype, np.floating):
                per_device.append(rng.uniform(-1, 1, shape.dims).astype(dtype))
            elif dtype == np.bool_:
                per_device.append(rng.integers(0, 2, shape.dims).astype(bool))
            else:
                per_device.append(rng.integers(-4, 5, shape.dims).astype(dtype))
        inputs.append(per_device)
    return inputs


def execute(text: str, inputs: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Outputs per device: result[device] = flat list of output arrays."""
    replicas, partitions = device_count(text)
    if partitions > 1:
        text, replicas, partitions = as_replica_program(text), replicas * partitions, 1
    exe, devices = _compile(text, replicas, partitions)
    import jax

    # One "replicated" global array per parameter whose per-device buffers differ: the executable
    # only looks at each device's own buffer.
    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
    everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = [jax.make_array_from_single_device_arrays(
                per_device[0].shape, everywhere,
                [jax.device_put(arr, devices[d]) for d, arr in enumerate(per_device)])
            for per_device in inputs]
    results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    return [[np.asarray(out[d]) for out in results] for d in range(len(devices))]


def assert_same_on_every_device(original: str, rewritten: str, *, seed: int = 0, rtol: float = 1e-5) -> None:
    inputs = random_inputs(original, seed)
    expected = execute(original, inputs)
    actual = execute(rewritten, inputs)
    assert len(expected) == len(actual)
    for device, (want, got) in enumerate(zip(expected, actual)):
        assert len(want) == len(got), f"device {device}: {len(want)} outputs vs {len(got)}"
        for i, (w, g) in enumerate(zip(want, got)):
            assert w.shape == g.shape, f"device {device} output {i}: shape {w.shape} vs {g.shape}"
            np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-5,
                                       err_msg=f"device {device} output {i} differs")
