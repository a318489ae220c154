"""Propagation in JAX's Shardy form (issue 11): where Shardy's rules give another plan than
XLA's GSPMD rules, a module in the Shardy form follows Shardy's, as XLA's own Shardy pipeline
(which compiles that form) does.

* Conflicting proposals: when two operands of one op want the same mesh axis along different
  dims of its result, Shardy keeps the one from the larger operand (the smaller is the cheaper
  to reshard); GSPMD takes the first in its fixed order.  The FSDP step whose embedding table
  is tiled along the feature dim and whose token ids along the batch, over the same axis, is
  the case that matters: the batch winning cost it 1.23x XLA's Shardy bytes.
* A sort along a tiled dim, top-k and grouped convolutions, which GSPMD's rules leave
  unsharded (and their results gathered).

Each test lowers a JAX program and checks the plan against XLA's own partition of the same
lowering, and the result numerically against XLA's run of the unpartitioned one."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
from hlo_passes.runtime.xla_backend import cost_analysis
from hlo_passes.stats import module_stats
from tests.spmd.partitioning import partition_verified

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _lower(fn, args, shardy: bool) -> tuple[str, str]:
    """(the lowered HLO text as JAX compiles it, XLA's after_spmd-partitioning module)."""
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        lowered = fn.lower(*args)
        text = lowered.as_text(dialect="hlo")
        with tempfile.TemporaryDirectory() as d:
            lowered.compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning"})
            xla = sorted(Path(d).glob("*after_spmd-partitioning*.txt"))[-1].read_text()
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)
    header, body = text.split("\n", 1)  # JAX lets XLA choose the unspecified result sharding
    return header + ", allow_spmd_sharding_propagation_to_output={true}\n" + body, xla


def _mesh_fn(fn, *specs):
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    return jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, PartitionSpec(*s)) for s in specs))


def _f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _embed_then_project(table, ids, w):
    h = table[ids]
    h = h - h.mean(-1, keepdims=True)
    return jnp.tanh(h @ w)


EMBED = (_mesh_fn(_embed_then_project, (None, "x"), ("x", None), ("x", None)),
         (_f32(128, 64), jax.ShapeDtypeStruct((8, 16), jnp.int32), _f32(64, 32)))


def _only(module, opcode: Opcode):
    (instr,) = [i for i in module.all_instructions() if i.opcode is opcode]
    return instr


def _propagated(text: str, opcode: Opcode) -> str:
    """The sharding our propagation gives the module's one `opcode` instruction."""
    module = parse_module(text)
    ShardingPropagation(num_partitions=8).run(module)
    return str(_only(module, opcode).sharding)


def _gather_dims(text: str) -> list[int]:
    return list(_only(parse_module(text), Opcode.GATHER).array_shape.dims)


def _bytes(text: str) -> int:
    return sum(module_stats(parse_module(text)).collective_bytes.values())


def test_a_lookup_whose_table_and_ids_want_one_axis_takes_the_tables_tiling_in_shardy_form():
    """Table [128,64] tiled by feature over x, ids [8,16] tiled by batch over x: in the Shardy
    form the larger table's feature tiling wins, as in XLA's Shardy partition (a [8,16,8]
    lookup per device, the mean's sums all-reduced, the projection's partial sums all-reduced)."""
    text, xla = _lower(*EMBED, shardy=True)
    assert _propagated(text, Opcode.GATHER) == "{devices=[1,1,8]<=[8]}"
    partitioned, out = partition_verified(text)
    assert _gather_dims(out) == _gather_dims(xla) == [8, 16, 8]
    assert _bytes(out) <= _bytes(xla)


def test_the_gspmd_form_of_the_same_lookup_keeps_xlas_gspmd_plan():
    """The GSPMD form keeps XLA's GSPMD order (the ids' batch tiling first); its partition is
    XLA's GSPMD partition of this lowering, which moves a third of the Shardy plan's bytes
    here: the rule is the form's, not a cost decision."""
    text, xla = _lower(*EMBED, shardy=False)
    assert _propagated(text, Opcode.GATHER) == "{devices=[8,1,1]<=[8]}"
    partitioned, out = partition_verified(text)
    assert _gather_dims(out) == _gather_dims(xla)
    assert _bytes(out) == _bytes(xla)


def _mlp(x, w1, w2):
    x = jax.lax.with_sharding_constraint(x, _named("x", "y", None))
    y = jnp.tanh(x @ w1) @ w2
    return jax.lax.with_sharding_constraint(y, _named("x", "y", None))


def _named(*spec):
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y")), PartitionSpec(*spec))


def _first_dot_dims(text: str) -> list[int]:
    module = parse_module(text)
    dots = [i for i in module.entry.instructions if i.opcode is Opcode.DOT]
    return list(dots[0].array_shape.dims)


@pytest.mark.parametrize("hidden", [64, 16])
def test_a_dot_whose_operands_want_one_axis_follows_the_larger_operand_in_shardy_form(hidden):
    """A sequence-parallel MLP: x [4,8,32] tiled (x, y, -), w1 [32,hidden] tiled (-, y).  The
    first dot's result wants y along the sequence (from x) and along the hidden dim (from w1).
    Shardy keeps the larger operand's: w1's when hidden is 64 (2,048 elements against 1,024;
    XLA then multiplies by w2 locally and all-reduces 1,536 bytes, where taking x's tiling
    cost 5,632), x's when hidden is 16."""
    fn = jax.jit(_mlp, in_shardings=(_named("x", "y", None), _named(None, "y"), _named("y", None)))
    text, xla = _lower(fn, (_f32(4, 8, 32), _f32(32, hidden), _f32(hidden, 32)), shardy=True)
    module = parse_module(text)
    ShardingPropagation(num_partitions=8).run(module)
    first = next(i for i in module.entry.instructions if i.opcode is Opcode.DOT)
    expected = "{devices=[4,1,2]<=[8]}" if hidden == 64 else "{devices=[4,2,1]<=[8]}"
    assert str(first.sharding) == expected
    partitioned, out = partition_verified(text)
    if hidden == 64:
        assert _first_dot_dims(out) == _first_dot_dims(xla) == [1, 8, 32]
    assert _bytes(out) <= _bytes(xla)


def test_a_lookup_whose_ids_outweigh_the_table_takes_the_batch_tiling_in_shardy_form():
    """The same lookup with a table of 16 x 8 and ids of 64 x 32: the ids are the larger
    operand, so Shardy keeps their batch tiling (as XLA's Shardy partition does)."""
    fn = _mesh_fn(_embed_then_project, (None, "x"), ("x", None), ("x", None))
    text, xla = _lower(fn, (_f32(16, 8), jax.ShapeDtypeStruct((64, 32), jnp.int32), _f32(8, 32)), shardy=True)
    assert _propagated(text, Opcode.GATHER) == "{devices=[8,1,1]<=[8]}"
    partitioned, out = partition_verified(text)
    assert _gather_dims(out) == _gather_dims(xla) == [8, 32, 8]
    assert _bytes(out) <= _bytes(xla)


def _sort_operand_dims(text: str) -> list[int]:
    return list(_only(parse_module(text), Opcode.SORT).operands[0].array_shape.dims)


def test_a_sort_along_a_tiled_dim_keeps_the_other_dims_tiling_in_shardy_form():
    """argsort along dim 0 of x [32,4] tiled (x, y) on a 4x2 mesh: 4 columns cannot take the
    sort dim's 4 tiles beside their own 2, so XLA's GSPMD propagation leaves the sort
    unsharded (and the whole array is sorted on every device).  Shardy gives the result the
    operand's sharding; the sort then gathers only the sort dim and keeps the columns' tiles,
    as XLA's Shardy partition does."""
    fn = jax.jit(lambda x: jnp.argsort(x, axis=0, stable=True), in_shardings=(_named("x", "y"),))
    text, xla = _lower(fn, (_f32(32, 4),), shardy=True)
    partitioned, out = partition_verified(text)
    assert _sort_operand_dims(out) == _sort_operand_dims(xla) == [32, 2]
    assert _bytes(out) <= _bytes(xla)


def test_a_top_k_keeps_its_batch_tiling_in_shardy_form():
    """lax.top_k of x [8,64] tiled by rows: XLA's GSPMD propagation has no rule for the top-k
    opcode (its result stayed unsharded and was gathered); Shardy keeps the rows' tiling, and
    each device selects from its own row with nothing moved (XLA's Shardy partition moves 256
    bytes for it)."""
    fn = jax.jit(lambda x: jax.lax.top_k(x, 4)[1], in_shardings=(_named(("x", "y"), None),))
    text, xla = _lower(fn, (_f32(8, 64),), shardy=True)
    assert _propagated(text, Opcode.TOPK) == "{{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}"
    partitioned, out = partition_verified(text)
    assert _bytes(out) == 0 < _bytes(xla)


def _depthwise(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=x.shape[-1])


def test_a_depthwise_convolution_of_channel_tiled_activations_stays_tiled_in_shardy_form():
    """A 3x3 depthwise convolution (16 groups) whose activations and kernel are tiled 8 ways
    along the channels: each device convolves its own two channels with nothing moved, as
    XLA's Shardy partition does.  GSPMD's rule propagates no tiled input feature dim: the
    result came out replicated and gathered (1,024 bytes)."""
    fn = jax.jit(_depthwise, in_shardings=(_named(None, None, None, ("x", "y")), _named(None, None, None, ("x", "y"))))
    text, xla = _lower(fn, (_f32(2, 8, 8, 16), _f32(3, 3, 1, 16)), shardy=True)
    assert _propagated(text, Opcode.CONVOLUTION) == "{devices=[1,1,1,8]<=[8]}"
    partitioned, out = partition_verified(text)
    assert _bytes(out) == _bytes(xla) == 0


def test_the_kernel_gradient_of_a_depthwise_convolution_keeps_the_channel_tiling_in_shardy_form():
    """The kernel gradient of the same convolution (the loss's gradient reaching a grouped
    convolution from its output): 3,216 bytes when the channel tiling stopped at the
    convolution, XLA Shardy's 144 now."""
    def loss(x, w):
        return jnp.sum(jnp.tanh(_depthwise(x, w)))

    fn = jax.jit(jax.grad(loss, argnums=1),
                 in_shardings=(_named(None, None, None, ("x", "y")), _named(None, None, None, ("x", "y"))))
    text, xla = _lower(fn, (_f32(2, 8, 8, 16), _f32(3, 3, 1, 16)), shardy=True)
    partitioned, out = partition_verified(text)
    assert _bytes(out) <= _bytes(xla)


def test_an_uneven_output_is_evened_after_the_value_is_computed_in_shardy_form():
    """A cumulative product of 30 columns tiled 8 ways, returned with its sharding left to the
    compiler: 30 columns do not divide by 8, so the output is untiled there, but as XLA's
    Shardy pipeline does it, at a boundary after the root: the product still runs as a scan
    over the tiles and only its result is gathered.  Untiling the root itself ran the whole
    30-wide window on every device (1,756 FLOPs; XLA 249)."""
    def f(x):
        y = jax.lax.with_sharding_constraint(x[:, :30], _named(None, ("x", "y")))
        return jnp.cumprod(y * 0.1 + 1.0, axis=1)

    fn = jax.jit(f, in_shardings=(_named(None, ("x", "y")),))
    text, xla = _lower(fn, (_f32(2, 32),), shardy=True)
    partitioned, out = partition_verified(text)
    assert cost_analysis(out)["flops"] <= cost_analysis(xla)["flops"]
    assert _bytes(out) <= _bytes(xla)
    assert partitioned.entry.root.array_shape.dims == (2, 30)


def test_a_conflicting_users_tiling_gives_the_result_its_free_axis():
    """JAX's Shardy dump of an MoE expert einsum after a constraint to P(None, 'expert') on a
    (data=2, expert=4) mesh, its relu sliced and constrained back to P(('data', 'expert'))
    (probe program `moe_a2a_wsc`).  The einsum's result is tiled over the experts by its
    operands and wanted tiled over ('data', 'expert') on the groups by its user.  GSPMD's merge
    is all or nothing, so the result stayed replicated over 'data' and every device computed
    all 8 groups of its expert (2x XLA Shardy's FLOPs); Shardy keeps the prefix of the user's
    axes that does not conflict ('data'), and each device computes 4."""
    from pathlib import Path
    from hlo_passes import parse_module
    from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
    from hlo_passes.runtime import verify_equivalent
    text = (Path(__file__).resolve().parents[1] / "dumps" / "data"
            / "moe_einsum_after_constraint_shardy.before_optimizations.txt").read_text()
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    dot, = [i for i in module.all_instructions() if i.opcode.value == "dot"]
    assert tuple(dot.array_shape.dims) == (1, 64, 4, 16), out
    assert verify_equivalent(text, out).ok
