"""Ops independent along their batch dims (handlers/batch_parallel.py, batch_dims.py): cholesky,
triangular-solve, fft and the LAPACK custom-calls JAX emits on CPU run on each device's batch
tiles; a tiled core dim moves onto a free batch dim (all-to-all) or is gathered, whichever the
cost model prices lower.  Each case states the collectives and local shapes it expects and is
verified on 8 devices against the unpartitioned module."""

import pytest

from hlo_passes import parse_module
from hlo_passes.ir import Opcode
from hlo_passes.passes.spmd.batch_dims import BATCH_PARTITIONABLE_TARGETS
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from tests.spmd.partitioning import collectives as _collectives
from tests.spmd.partitioning import partition_verified as _partition


def _local(module, opcode: Opcode, target: str | None = None) -> str:
    (op,) = [i for i in module.entry.instructions if i.opcode is opcode
             and (target is None or i.custom_call_target == target)]
    return op.shape.to_hlo(False)


def test_targets_are_the_ones_jaxlib_registers_as_batch_partitionable():
    from jaxlib import lapack

    assert BATCH_PARTITIONABLE_TARGETS == frozenset(lapack.batch_partitionable_targets())


# A positive definite batch, computed elementwise (no communication of its own): inputs are in
# [-1, 1), the factor reads the lower triangle, and 32 on the diagonal dominates 15 entries.
SPD = """  p = f32[{b},{m},{m}] parameter(0), sharding={s}
  i0 = s32[{b},{m},{m}] iota(), iota_dimension=1, sharding={s}
  i1 = s32[{b},{m},{m}] iota(), iota_dimension=2, sharding={s}
  eq = pred[{b},{m},{m}] compare(i0, i1), direction=EQ, sharding={s}
  big = f32[{b},{m},{m}] broadcast(f32[] constant(32)), dimensions={{}}, sharding={s}
  zero = f32[{b},{m},{m}] broadcast(f32[] constant(0)), dimensions={{}}, sharding={s}
  d = f32[{b},{m},{m}] select(eq, big, zero), sharding={s}
  x = f32[{b},{m},{m}] add(p, d), sharding={s}
"""


@pytest.mark.parametrize("b,s,out,expect,local", [
    # batch tiled: each device factors its 2 matrices, nothing moves
    (16, "{devices=[8,1,1]<=[8]}", "{devices=[8,1,1]<=[8]}", {}, "f32[2,16,16]"),
    # rows tiled: the tiling moves to the batch dim and back (XLA: the same two all-to-alls)
    (16, "{devices=[1,8,1]<=[8]}", "{devices=[1,8,1]<=[8]}", {"all-to-all": 2}, "f32[2,16,16]"),
    # batch over 4 and rows over 2: the rows' tiles fold into the batch dim's as their minor
    # part (8 tiles of 2 matrices; XLA: the same two all-to-alls), not gathered in pairs with
    # each device factoring 4 matrices
    (16, "{devices=[4,2,1]<=[8]}", "{devices=[4,2,1]<=[8]}", {"all-to-all": 2}, "f32[2,16,16]"),
    # uneven batch (6 over 8): padded, the padding's matrices solved and dropped
    (6, "{devices=[8,1,1]<=[8]}", "{devices=[8,1,1]<=[8]}", {}, "f32[1,16,16]"),
    # the result unannotated (replicated): factor locally, then gather the factors
    (16, "{devices=[8,1,1]<=[8]}", None, {"all-gather": 1}, "f32[2,16,16]"),
])
def test_cholesky_runs_on_batch_tiles(b, s, out, expect, local):
    attr = f", sharding={out}" if out else ""
    text = (f"HloModule chol, num_partitions=8\nENTRY e {{\n{SPD.format(b=b, m=16, s=s)}"
            f"  ROOT c = f32[{b},16,16] cholesky(x), lower=true{attr}\n}}\n")
    module, _ = _partition(text)
    assert _collectives(module) == expect
    assert _local(module, Opcode.CHOLESKY) == local


@pytest.mark.parametrize("sa,sb,so,expect", [
    # both batch-tiled alike: local solves
    ("{devices=[8,1,1]<=[8]}", "{devices=[8,1,1]<=[8]}", "{devices=[8,1,1]<=[8]}", {}),
    # b's rows tiled in pairs: its small right-hand sides move (all-to-all there and back), never a
    ("{devices=[8,1,1]<=[8]}", "{devices=[4,2,1]<=[8]}", "{devices=[4,2,1]<=[8]}", {"all-to-all": 2}),
    # a's columns tiled: moved onto the batch dim
    ("{devices=[1,1,8]<=[8]}", "{devices=[8,1,1]<=[8]}", "{devices=[8,1,1]<=[8]}", {"all-to-all": 1}),
])
def test_triangular_solve_runs_on_batch_tiles(sa, sb, so, expect):
    text = f"""HloModule ts, num_partitions=8
ENTRY e {{
  a0 = f32[16,32,32] parameter(0), sharding={sa}
  i0 = s32[16,32,32] iota(), iota_dimension=1, sharding={sa}
  i1 = s32[16,32,32] iota(), iota_dimension=2, sharding={sa}
  eq = pred[16,32,32] compare(i0, i1), direction=EQ, sharding={sa}
  big = f32[16,32,32] broadcast(f32[] constant(8)), dimensions={{}}, sharding={sa}
  a = f32[16,32,32] select(eq, big, a0), sharding={sa}
  b = f32[16,32,4] parameter(1), sharding={sb}
  ROOT c = f32[16,32,4] triangular-solve(a, b), left_side=true, lower=true, transpose_a=NO_TRANSPOSE, sharding={so}
}}
"""
    module, _ = _partition(text)
    assert _collectives(module) == expect
    assert _local(module, Opcode.TRIANGULAR_SOLVE) == "f32[2,32,4]"


@pytest.mark.parametrize("x,op,s,expect,local", [
    ("c64[16,64]", "c64[16,64] fft(x), fft_type=FFT, fft_length={64}", "{devices=[8,1]<=[8]}", {}, "c64[2,64]"),
    # a 2-D inverse transform over [8,8] tiles of its batch: local
    ("c64[8,4,16,16]", "c64[8,4,16,16] fft(x), fft_type=IFFT, fft_length={16,16}",
     "{devices=[4,2,1,1]<=[8]}", {}, "c64[2,2,16,16]"),
    # RFFT along a tiled axis (the output's 33 columns uneven over 4): the axis's tiles moved to
    # the free batch dim or folded into the tiled one (the same all-to-alls; either way each
    # device transforms 16 of the 128 rows)
    ("f32[16,8,64]", "c64[16,8,33] fft(x), fft_type=RFFT, fft_length={64}", "{devices=[2,1,4]<=[8]}",
     {"all-to-all": 2}, ("c64[8,2,33]", "c64[2,8,33]")),
])
def test_fft_runs_on_batch_tiles(x, op, s, expect, local):
    text = f"HloModule fft, num_partitions=8\nENTRY e {{\n  x = {x} parameter(0), sharding={s}\n  ROOT f = {op}, sharding={s}\n}}\n"
    module, _ = _partition(text)
    assert _collectives(module) == expect
    assert _local(module, Opcode.FFT) in ((local,) if isinstance(local, str) else local)


def test_lapack_custom_calls_run_on_batch_tiles_with_local_layout_constraints():
    """potrf then trsm (what jnp.linalg.cholesky and solve_triangular lower to on CPU), batch
    tiled: both calls run on [2,...] tiles, their layout constraints follow the local shapes, the
    per-matrix status result is tiled with them; no communication."""
    text = f"""HloModule lapack, num_partitions=8
ENTRY e {{
{SPD.format(b=16, m=8, s="{devices=[8,1,1]<=[8]}")}  b = f32[16,8,3]{{1,2,0}} parameter(1), sharding={{devices=[8,1,1]<=[8]}}
  c = (f32[16,8,8]{{1,2,0}}, s32[16]{{0}}) custom-call(x), custom_call_target="lapack_spotrf_ffi", operand_layout_constraints={{f32[16,8,8]{{1,2,0}}}}, output_to_operand_aliasing={{{{0}}: (0, {{}})}}, api_version=API_VERSION_TYPED_FFI, frontend_attributes={{num_batch_dims="1"}}, backend_config={{uplo = 76 : ui8}}
  l = f32[16,8,8]{{1,2,0}} get-tuple-element(c), index=0
  info = s32[16]{{0}} get-tuple-element(c), index=1
  s = f32[16,8,3]{{1,2,0}} custom-call(l, b), custom_call_target="lapack_strsm_ffi", operand_layout_constraints={{f32[16,8,8]{{1,2,0}}, f32[16,8,3]{{1,2,0}}}}, output_to_operand_aliasing={{{{}}: (1, {{}})}}, api_version=API_VERSION_TYPED_FFI, frontend_attributes={{num_batch_dims="1"}}, backend_config={{diag = 78 : ui8, side = 76 : ui8, trans_x = 78 : ui8, uplo = 76 : ui8}}
  ROOT t = (f32[16,8,3]{{1,2,0}}, s32[16]{{0}}) tuple(s, info), sharding={{{{devices=[8,1,1]<=[8]}}, {{devices=[8]<=[8]}}}}
}}
"""
    module, out = _partition(text)
    assert _collectives(module) == {}
    assert "(f32[2,8,8]{1,2,0}, s32[2]{0}) custom-call(" in out
    assert "operand_layout_constraints={f32[2,8,8]{1,2,0}}" in out
    assert "operand_layout_constraints={f32[2,8,8]{1,2,0}, f32[2,8,3]{1,2,0}}" in out


def test_custom_call_without_num_batch_dims_is_replicated_with_a_remark():
    text = """HloModule lapack, num_partitions=8
ENTRY e {
  x = f32[16,8,8]{1,2,0} parameter(0), sharding={devices=[8,1,1]<=[8]}
  ROOT c = (f32[16,8,8]{1,2,0}, s32[16]{0}) custom-call(x), custom_call_target="lapack_spotrf_ffi", operand_layout_constraints={f32[16,8,8]{1,2,0}}, api_version=API_VERSION_TYPED_FFI, backend_config={uplo = 76 : ui8}
}
"""
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=8)
    p.run(module)
    assert [r.message for r in p.remarks if r.kind == "missed"] == [
        "replicated: custom-call without a usable num_batch_dims frontend attribute"]
    assert _collectives(module) == {"all-gather": 1}


def test_jax_linear_algebra_on_a_batch_sharded_array_never_gathers_it():
    """jnp.linalg.cholesky and solve_triangular lowered by JAX (Shardy form, the LAPACK calls in
    called computations), the batch sharded over 8 devices: propagation carries the batch tiling
    through the custom-calls (XLA's rule for them) and every device factors and solves its own
    two matrices."""
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    batch = NamedSharding(mesh, P("x"))

    def f(a, b):
        spd = a @ jnp.swapaxes(a, 1, 2) + 8 * jnp.eye(a.shape[-1])
        return jsl.solve_triangular(jnp.linalg.cholesky(spd), b, lower=True)

    args = (jax.ShapeDtypeStruct((16, 8, 8), jnp.float32), jax.ShapeDtypeStruct((16, 8, 3), jnp.float32))
    text = jax.jit(f, in_shardings=(batch, batch), out_shardings=batch).lower(*args).as_text(dialect="hlo")
    module, out = _partition(text)
    assert "all-gather" not in _collectives(module)
    targets = {i.custom_call_target: i.shape.to_hlo(False) for i in module.all_instructions()
               if i.opcode is Opcode.CUSTOM_CALL}
    assert targets["lapack_spotrf_ffi"] == "(f32[2,8,8], s32[2])"
    assert targets["lapack_strsm_ffi"] == "f32[2,8,3]"


def test_lapack_custom_call_inside_a_manual_region_is_copied():
    """In a fully manual region the call is already per-device code: copied, not re-tiled."""
    text = """HloModule ml, num_partitions=8
ENTRY e {
  x = f32[16,8,8]{1,2,0} parameter(0), sharding={devices=[8,1,1]<=[8]}
  m = f32[2,8,8]{1,2,0} custom-call(x), custom_call_target="SPMDFullToShardShape", sharding={manual}
  c = (f32[2,8,8]{1,2,0}, s32[2]{0}) custom-call(m), custom_call_target="lapack_spotrf_ffi", operand_layout_constraints={f32[2,8,8]{1,2,0}}, api_version=API_VERSION_TYPED_FFI, frontend_attributes={num_batch_dims="1"}, backend_config={uplo = 76 : ui8}, sharding={{manual}, {manual}}
  l = f32[2,8,8]{1,2,0} get-tuple-element(c), index=0, sharding={manual}
  ROOT r = f32[16,8,8]{1,2,0} custom-call(l), custom_call_target="SPMDShardToFullShape", sharding={devices=[8,1,1]<=[8]}
}
"""
    module = parse_module(text)
    SpmdPartitioner(num_partitions=8).run(module)
    assert _collectives(module) == {}
    assert _local(module, Opcode.CUSTOM_CALL, "lapack_spotrf_ffi") == "(f32[2,8,8], s32[2])"
