"""Inputs spmd-partition refuses rather than partition into a program that computes something
else: partition-id outside a manual region (its global meaning is ambiguous; XLA's partitioner
refuses it too) and a module that is a per-device program already.  And the neighbours that
must still be partitioned: partition-id inside a shard_map region, replica-id anywhere, and a
cross-replica all-reduce, which runs on tiles."""

from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import parse_module
from hlo_passes.cli.main import main as cli
from hlo_passes.ir import Opcode
from hlo_passes.passes.spmd.sharding_propagation import PropagationError, ShardingPropagation
from hlo_passes.runtime import execute_module, verify_equivalent
from tests.spmd.partitioning import partition

# Each device would add its own id to its shard where the global program (ids all 0, or
# "which device?") has no such value.
GLOBAL_PARTITION_ID = """HloModule pid, num_partitions=4

ENTRY main {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  id = u32[] partition-id()
  c = f32[] convert(id)
  b = f32[8] broadcast(c), dimensions={}
  ROOT a = f32[8] add(p, b), sharding={devices=[4]<=[4]}
}
"""

# The same arithmetic inside a fully manual region: each device adds its own index to its shard,
# which is what the global program means (shard_map's axis_index).
MANUAL_PARTITION_ID = """HloModule pid_manual, num_partitions=4

ENTRY main {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  s = f32[8] custom-call(p), custom_call_target="Sharding", sharding={devices=[4]<=[4]}
  l = f32[2] custom-call(s), custom_call_target="SPMDFullToShardShape", sharding={manual}
  id = u32[] partition-id(), sharding={manual}
  c = f32[] convert(id), sharding={manual}
  b = f32[2] broadcast(c), dimensions={}, sharding={manual}
  a = f32[2] add(l, b), sharding={manual}
  ROOT g = f32[8] custom-call(a), custom_call_target="SPMDShardToFullShape", sharding={devices=[4]<=[4]}
}
"""

GLOBAL_REPLICA_ID = GLOBAL_PARTITION_ID.replace("partition-id()", "replica-id()")


def test_partition_id_outside_manual_regions_is_refused():
    with pytest.raises(PropagationError, match=r"id: partition-id outside a manual \(shard_map\) region"):
        partition(GLOBAL_PARTITION_ID, 4)


def test_partition_id_inside_a_manual_region_is_the_device_index():
    module, out, _ = partition(MANUAL_PARTITION_ID, 4)
    assert any(i.opcode is Opcode.PARTITION_ID for i in module.all_instructions())
    report = verify_equivalent(MANUAL_PARTITION_ID, out, num_devices=4)
    assert report.ok, report.format()
    x = np.arange(8, dtype=np.float32)
    (got,) = execute_module(out, [x], num_devices=4)
    np.testing.assert_array_equal(got, x + np.repeat(np.arange(4, dtype=np.float32), 2))  # by hand


def test_replica_id_outside_manual_regions_is_kept_replicated():
    """Partitioning leaves replicas alone: with one replica every device's replica-id is 0 before
    and after, so the op is copied and the add stays local."""
    module, out, _ = partition(GLOBAL_REPLICA_ID, 4)
    assert [i.opcode for i in module.all_instructions() if i.opcode.is_collective] == []
    assert "f32[2] add(" in out and "replica-id()" in out


def test_a_per_device_program_is_not_partitioned_again():
    _, once, _ = partition(GLOBAL_REPLICA_ID, 4)
    with pytest.raises(PropagationError, match=r"ENTRY main_spmd is a partitioned \(per-device\) program"):
        partition(once, 4)
    parse_module(once)  # the refusal is about meaning, not syntax


@pytest.mark.parametrize("text, expected", [
    (GLOBAL_PARTITION_ID, "partition-id outside a manual"),
    (GLOBAL_PARTITION_ID.replace("ENTRY main", "ENTRY main_spmd"), "is a partitioned (per-device) program"),
])
def test_the_command_line_reports_the_refusal_and_writes_nothing(tmp_path, capsys, text, expected):
    src, out = tmp_path / "in.hlo", tmp_path / "out.hlo"
    src.write_text(text)
    rc = cli(["run", str(src), "--passes", "spmd-partition", "--num-partitions", "4", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expected in err and "Traceback" not in err
    assert err.startswith(f"error: {src}:")
    assert not out.exists()


# A cross-replica all-reduce (no channel id) in a global program: each element meets its twins
# on other replicas only, so it runs tile by tile, as XLA partitions it.  Uneven rows (13 on 4)
# and a reduce after it check that the padding stays out of the result.
CROSS_REPLICA_ALL_REDUCE = """HloModule cross_replica, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[13,6] parameter(0), sharding={devices=[4,1]<=[4]}
  t = f32[13,6] tanh(x)
  ar = f32[13,6] all-reduce(t), replica_groups={}, to_apply=add
  z = f32[] constant(0)
  ROOT r = f32[6] reduce(ar, z), dimensions={0}, to_apply=add, sharding={replicated}
}
"""


def test_a_cross_replica_all_reduce_runs_on_tiles():
    module, out, remarks = partition(CROSS_REPLICA_ALL_REDUCE, 4)
    (ar,) = [i for i in module.all_instructions() if i.opcode is Opcode.ALL_REDUCE and i.channel_id is None]
    assert ar.shape.to_hlo(False) == "f32[4,6]"  # its tile, not the gathered array
    assert not [r for r in remarks if r.kind == "missed"]
    report = verify_equivalent(CROSS_REPLICA_ALL_REDUCE, out, num_devices=4)  # kinds read from the modules
    assert report.ok, report.format()


def test_a_cross_replica_collective_is_no_evidence_of_a_per_device_program():
    """With several partitions a channel-less collective acts across replicas only: it means
    the same in a global program and in each device's, so it does not make the original
    read as per-device (where `verify` would compare f32[13,6] inputs with f32[4,6] ones);
    a channel id, or partition-id, does."""
    from hlo_passes.ir.program_kind import ProgramKind, read_program

    assert read_program(parse_module(CROSS_REPLICA_ALL_REDUCE)).kind is ProgramKind.GLOBAL
    with_channel = CROSS_REPLICA_ALL_REDUCE.replace("replica_groups={}", "channel_id=1, replica_groups={}")
    assert read_program(parse_module(with_channel)).kind is ProgramKind.PER_DEVICE
    replicas = CROSS_REPLICA_ALL_REDUCE.replace("num_partitions=4", "replica_count=4")
    assert read_program(parse_module(replicas)).kind is ProgramKind.REPLICA


# A shard_map nested in another's body, in Shardy's frontend-attribute form: the outer region is
# manual over 'x', the inner one adds 'y'.  Its shardings name only the inner region's own axes.
NESTED_SHARD_MAP = r'''HloModule nested, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}, allow_spmd_sharding_propagation_to_output={true}

inner_body {
  p = f32[8,8]{1,0} parameter(0)
  c = f32[] constant(2)
  b = f32[8,8]{1,0} broadcast(c), dimensions={}
  ROOT m = f32[8,8]{1,0} multiply(p, b)
}

outer_body {
  a = f32[8,32]{1,0} parameter(0)
  g2l = f32[8,8]{1,0} custom-call(a), custom_call_target="xla.sdy.GlobalToLocalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{?}, {\"y\", ?}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"y\"}>"}
  cl = f32[8,8]{1,0} call(g2l), to_apply=inner_body, frontend_attributes={inlineable="xla_late"}
  ROOT l2g = f32[8,32]{1,0} custom-call(cl), custom_call_target="xla.sdy.LocalToGlobalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="#sdy<manual_axes{\"y\"}>",xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{?}, {\"y\", ?}]>]>"}
}

ENTRY main {
  x = f32[16,32]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"x\"}, {\"y\"}]>"}
  s21 = f32[8,32]{1,0} custom-call(x), custom_call_target="xla.sdy.GlobalToLocalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\", ?}, {?}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"x\"}>"}
  s22 = f32[8,32]{1,0} call(s21), to_apply=outer_body, frontend_attributes={inlineable="xla_late"}
  ROOT s23 = f32[16,32]{1,0} custom-call(s22), custom_call_target="xla.sdy.LocalToGlobalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="#sdy<manual_axes{\"x\"}>",xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\", ?}, {?}]>]>"}
}
'''


def test_a_shard_map_nested_in_another_is_manual_over_both_regions_axes():
    """The inner region's borders and body are manual over 'x' (the enclosing region's) and 'y'
    (its own); read as manual over 'y' alone, its border asked to move data between the
    outer region's manual groups and the partitioner stopped with an internal error."""
    _, out, _ = partition(NESTED_SHARD_MAP, 8)
    report = verify_equivalent(NESTED_SHARD_MAP, out, num_devices=8)
    assert report.ok, report.format()


@pytest.mark.parametrize("shardy", [True, False])
def test_axis_index_in_a_partially_manual_region_as_jax_lowers_it(shardy):
    """JAX lowers `axis_index` inside a partially manual shard_map to an operand-less manual
    call whose result leaves through LocalToGlobalShape.  Its body is manual (the region has
    no GlobalToLocalShape to find it by): read otherwise, XLA's partition of the original (the
    verifier's oracle) refused the partition-id in it."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from hlo_passes.runtime.lowered import lowered_as_compiled

    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(auto, auto), devices=jax.devices()[:8])

    def body(x):
        return x + jax.lax.axis_index("x").astype(x.dtype) * 100.0

    def f(x):
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})(x).sum(axis=1)

    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        x = jax.device_put(jnp.arange(512, dtype=jnp.float32).reshape(16, 32), NamedSharding(mesh, P("x", "y")))
        text = lowered_as_compiled(jax.jit(f).lower(x))
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    _, out, _ = partition(text, 8)
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format()


MISFIT = """HloModule misfit, num_partitions=8

ENTRY main {
  x = f32[8] parameter(0), sharding=SX
  t = (f32[8], f32[8]) tuple(x, x), sharding=ST
  ROOT y = f32[8] get-tuple-element(t), index=0
}
"""


@pytest.mark.parametrize("sx, st, message", [
    ("{devices=[2,4]<=[8]}", "{replicated}", r"x: sharding .* does not fit f32\[8\]: .* tiles 2 dimension"),
    ("{replicated}", "{{devices=[8]<=[8]}}", r"t: sharding .* tuple sharding has 1 entries, the shape .* has 2"),
    ("{replicated}", "{{replicated}, {replicated}, {replicated}}", r"t: .* has 3 entries"),
    ("{devices=[8]<=[8]}", "{{replicated}, {devices=[2,2,2]<=[8]}}", r"t: .* entry 1: .* tiles 3 dimension"),
], ids=["tile_rank", "too_few_entries", "too_many_entries", "entry_rank"])
def test_a_sharding_that_does_not_fit_its_shape_is_an_input_error(sx, st, message):
    """XLA's verifier refuses these (HloSharding::Validate); they crashed the partitioner."""
    text = MISFIT.replace("SX", sx).replace("ST", st)
    for run in (lambda: partition(text, 8), lambda: ShardingPropagation().run(parse_module(text))):
        with pytest.raises(PropagationError, match=message):
            run()


@pytest.mark.parametrize("sx, st", [("{devices=[8]<=[8]}", "{devices=[8]<=[8]}"),
                                    ("{devices=[2,4]<=[8] last_tile_dim_replicate}", "{{replicated}, {devices=[8]<=[8]}}"),
                                    ("{{devices=[8]<=[8]}}", "{replicated}")],
                         ids=["single_on_tuple", "replicated_subgroup", "one_entry_tuple_on_array"])
def test_shardings_that_fit_are_partitioned(sx, st):
    """A single sharding on a tuple is every leaf's (XLA's parser normalises it so); a one-entry
    tuple sharding on an array is its entry (XLA compiles it)."""
    text = MISFIT.replace("SX", sx).replace("ST", st)
    _, out, _ = partition(text, 8)
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format()
