"""runtime/lowered.py: a lowered jit's text carries the propagation flags JAX compiles it with."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from hlo_passes import parse_module  # noqa: E402
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner  # noqa: E402
from hlo_passes.runtime.lowered import lowered_as_compiled, with_propagation_flags  # noqa: E402


def test_flags_are_copied_once_and_stated_ones_kept():
    compiled = ("HloModule m, allow_spmd_sharding_propagation_to_parameters={false,true}, "
                "allow_spmd_sharding_propagation_to_output={true}, entry_computation_layout={()->f32[]}")
    text = "HloModule m, allow_spmd_sharding_propagation_to_output={false}\nENTRY e {}\n"
    got = with_propagation_flags(text, compiled)
    assert got.splitlines()[0] == ("HloModule m, allow_spmd_sharding_propagation_to_output={false}, "
                                   "allow_spmd_sharding_propagation_to_parameters={false,true}")
    assert got.endswith("ENTRY e {}\n")


def test_unspecified_out_shardings_leave_the_result_sharded():
    """Without the flag the result is replicated (an all-gather); JAX compiles with it and
    keeps the row split, and so does the partition of the flagged text."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    arg = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    lowered = jax.jit(lambda a: a * 2.0 + 1.0).lower(arg)
    plain, flagged = lowered.as_text(dialect="hlo"), lowered_as_compiled(lowered)
    assert "allow_spmd_sharding_propagation_to_output={true}" in flagged.splitlines()[0]

    def result_shape(text):
        module = parse_module(text)
        SpmdPartitioner(num_partitions=8).run(module)
        return module.entry.root.shape.dims, "all-gather" in str([i.opcode.value for i in module.entry.instructions])

    assert result_shape(plain) == ((16, 4), True)
    assert result_shape(flagged) == ((2, 4), False)
