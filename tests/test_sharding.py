"""Sharding value type: meaning-based equality and the device → tile mapping,
checked against JAX's own NamedSharding.devices_indices_map (the oracle)."""

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from hlo_passes.ir import Sharding, SubgroupKind
from hlo_passes.parse.attribute_reader import reader_for

read_sharding = reader_for("sharding")

MESHES = [(8,), (4, 2), (2, 4), (2, 2, 2), (1, 8), (2, 1, 4)]


@st.composite
def mesh_and_spec(draw):
    mesh_shape = draw(st.sampled_from(MESHES))
    axes = [f"a{i}" for i in range(len(mesh_shape))]
    rank = draw(st.integers(1, 3))
    unused = list(axes)
    spec = []
    for _ in range(rank):
        k = draw(st.integers(0, min(2, len(unused))))
        chosen = draw(st.permutations(unused).map(lambda p: p[:k]))
        for a in chosen:
            unused.remove(a)
        spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
    dims = [draw(st.integers(1, 3)) * 8 for _ in range(rank)]
    return mesh_shape, axes, spec, dims


@settings(max_examples=60, deadline=None)
@given(mesh_and_spec())
def test_tile_offsets_match_jax(case):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh_shape, axes, spec, dims = case
    mesh = jax.make_mesh(mesh_shape, tuple(axes), devices=jax.devices()[:8])
    named = NamedSharding(mesh, PartitionSpec(*spec))
    ours = read_sharding(str(named._to_xla_hlo_sharding(len(dims))))
    expected = named.devices_indices_map(tuple(dims))
    for device, index in expected.items():
        starts = tuple(s.start or 0 for s in index)
        sizes = tuple((s.stop if s.stop is not None else d) - (s.start or 0) for s, d in zip(index, dims))
        if ours.is_replicated:
            assert starts == (0,) * len(dims) and sizes == tuple(dims)
            continue
        assert ours.tile_offset(device.id, tuple(dims)) == starts
        assert ours.tile_shape(tuple(dims)) == sizes


@settings(max_examples=40, deadline=None)
@given(mesh_and_spec())
def test_from_mesh_equals_jax_spelling(case):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh_shape, axes, spec, dims = case
    mesh = jax.make_mesh(mesh_shape, tuple(axes), devices=jax.devices()[:8])
    named = NamedSharding(mesh, PartitionSpec(*spec))
    jax_spelling = read_sharding(str(named._to_xla_hlo_sharding(len(dims))))
    dim_to_axes = []
    for entry in spec:
        names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        dim_to_axes.append(tuple(axes.index(n) for n in names))
    assert Sharding.from_mesh(mesh_shape, dim_to_axes) == jax_spelling


def test_spellings_of_the_same_layout_are_equal():
    explicit = read_sharding("{devices=[2,2]0,2,1,3}")
    iota = read_sharding("{devices=[2,2]<=[2,2]T(1,0)}")
    assert explicit == iota and hash(explicit) == hash(iota)
    flag = read_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    dims = read_sharding("{devices=[2,1,4]<=[8] last_tile_dims={replicated}}")
    assert flag == dims
    assert read_sharding("{devices=[1,1,8]<=[8] last_tile_dim_replicate}") == Sharding.replicated()
    assert read_sharding("{devices=[2,1]<=[2] metadata={op_name=\"a\"}}") == read_sharding("{devices=[2,1]<=[2]}")
    assert read_sharding("{devices=[2,2]0,1,2,3}") != read_sharding("{devices=[2,2]0,2,1,3}")
    assert read_sharding("{maximal device=1}") != read_sharding("{maximal device=2}")


def test_printing_keeps_spelling_and_reads_back():
    for text in ["{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", "{devices=[2,2]0,2,1,3}",
                 "{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}", "{maximal device=3}",
                 "{{replicated}, {manual}}", "{replicated}", "{unknown shard_as 1}"]:
        s = read_sharding(text)
        assert s.to_hlo() == text
        assert read_sharding(s.to_hlo()) == s


def test_tile_shape_pads_uneven_dims_like_xla():
    s = read_sharding("{devices=[4,1]<=[4]}")
    assert s.tile_shape((10, 6)) == (3, 6)
    assert [s.tile_offset(d, (10, 6)) for d in range(4)] == [(0, 0), (3, 0), (6, 0), (9, 0)]


def test_subgroup_dims_are_not_data_dims():
    s = read_sharding("{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}")
    assert s.data_rank == 2 and s.subgroups == (SubgroupKind.MANUAL, SubgroupKind.REPLICATED)
    assert s.replication_factor == 4
    assert s.tile_index(5) == (1, 0)


NAMED = [
    "{mesh['x'=4,'y'=2], [{'x'}, {}]}",
    "{mesh['x'=4,'y'=2], [{'y'}, {'x'}]}",
    "{mesh['x'=4,'y'=2], device_ids=(0,2,4,6,1,3,5,7), [{'x'}, {?}]}",
    "{mesh['x'=4,'y'=2], [{'x':(1)2, 'y'}, {}], replicated={'x':(2)2}}",
    "{mesh['x'=2,'y'=2,'z'=2], [{'z', 'x'}, {}]}",
    "{mesh['x'=2,'y'=4], [{}, {'y':(2)2}]}",
    "{mesh['i'=8], [{'i'}, {}]}",
]


@pytest.mark.parametrize("text", NAMED)
def test_named_form_means_what_xla_compiles_it_to(text):
    """The mesh form newer XLA prints, read as a tile assignment, equals the sharding XLA's
    own compile reports for a parameter annotated with it."""
    from hlo_passes.runtime import xla_backend

    module = f"""HloModule m, num_partitions=8
ENTRY e {{
  p = f32[8,4] parameter(0), sharding={text}
  ROOT c = f32[8,4] copy(p), sharding={text}
}}"""
    [xla_says] = xla_backend.compile_hlo(module, num_partitions=8, spmd=True).parameter_shardings()
    assert read_sharding(text) == read_sharding(xla_says), xla_says


def test_named_special_forms():
    assert read_sharding("{mesh[], replicated}") == Sharding.replicated()
    assert read_sharding("{mesh['i'=8], manual}") == Sharding.manual()
    assert read_sharding("{{mesh['i'=8], manual}, {mesh[], replicated}}") == Sharding.tuple_of(
        [Sharding.manual(), Sharding.replicated()])
    assert read_sharding("{mesh['x'=4,'y'=2], [{'x'}, {}], unreduced={'y'}}").subgroups == (SubgroupKind.UNREDUCED,)
    with pytest.raises(ValueError, match="unreduced axes on a replicated sharding"):
        read_sharding("{mesh['x'=4,'y'=2], replicated, unreduced={'y'}}")


SINGLE_DEVICE = """HloModule m, num_partitions=2
ENTRY e {
  x = f32[8,16] parameter(0)
  cc = f32[8,16] custom-call(x), custom_call_target="foo", sharding={single_device[device_id=1]}
  ROOT t = (f32[8,16], f32[8,16]) tuple(cc, x), sharding={{single_device[device_id=0]}, {replicated}}
}
"""


@pytest.mark.parametrize("engine", ["fast", "lark"])
def test_single_device_is_maximal_and_prints_as_it_was_written(engine):
    """Shardy-lowered modules put `{single_device[device_id=N]}` on callbacks (pure_callback,
    io_callback, debug.print), in every dump stage: the named-sharding spelling of a maximal
    sharding.  It reads as `maximal device=N`, prints back as written, and XLA's parser reads
    our text to the same module."""
    from hlo_passes import parse_module, print_module
    from tests.frontend.xla_oracle import xla_canonical

    m = parse_module(SINGLE_DEVICE, "m.hlo", engine=engine)
    cc = next(i for i in m.entry.instructions if i.name == "cc")
    assert cc.sharding == Sharding.maximal(1) == read_sharding("{maximal device=1}")
    assert m.entry.root.sharding.elements[0] == Sharding.maximal(0)
    out = print_module(m)
    assert "sharding={single_device[device_id=1]}" in out
    assert xla_canonical(out) == xla_canonical(SINGLE_DEVICE)


def test_unreduced_axes_read_in_both_spellings_in_xla_order():
    """Devices holding partial sums (JAX's `unreduced=`, which XLA writes from
    before_optimizations on): the named form's unreduced axes become an UNREDUCED subgroup,
    ordered as XLA orders subgroups (manual, unreduced, replicated: XLA printed the
    replicated-first spelling below as its transposed twin)."""
    named = read_sharding("{mesh['x'=2,'y'=4], [{'y'}, {}], unreduced={'x'}}")
    assert named == read_sharding("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dims={unreduced}}")
    assert named.subgroups == (SubgroupKind.UNREDUCED,)
    assert read_sharding("{devices=[2,1,2,2]<=[8] last_tile_dims={replicated, unreduced}}") == read_sharding(
        "{devices=[2,1,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={unreduced, replicated}}")


def test_partitioning_refuses_unreduced_values():
    from hlo_passes import parse_module
    from hlo_passes.passes.spmd.sharding_propagation import PropagationError
    from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner

    m = parse_module("""HloModule m, num_partitions=8
ENTRY e {
  x = f32[8,4] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dims={replicated}}
  ROOT d = f32[8,4] negate(x), sharding={mesh['x'=2,'y'=4], [{'y'}, {}], unreduced={'x'}}
}""")
    with pytest.raises(PropagationError, match="d: sharding .* holds partial sums"):
        SpmdPartitioner(num_partitions=8).run(m)
