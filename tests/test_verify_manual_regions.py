"""The second oracle for global modules with fully manual regions (runtime/manual_regions.py):
the regions run as written on each device, everything else whole on every device, no SPMD
partitioner involved.  Judged here against numpy, and as verify uses it: a second opinion when
XLA's partition of the original disagrees with the rewrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify as verify_module
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.manual_regions import direct_program, run_direct
from hlo_passes.runtime.verify import random_inputs

# rows tiled over devices {0,1} / {2,3} (replicated in pairs), 10 rows (even) or 9 (uneven:
# the second tile is padded); inside: tanh, then a sum over the devices that hold different rows
FULLY_MANUAL = """HloModule full_manual, num_partitions=4

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}

ENTRY main {{
  p = f32[{rows},4] parameter(0)
  q = f32[{rows},4] parameter(1)
  s = f32[{rows},4] add(p, q)
  enter = f32[{rows},4] custom-call(s), custom_call_target="Sharding", sharding={{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}}
  region = f32[5,4] custom-call(enter), custom_call_target="SPMDFullToShardShape", sharding={{manual}}
  t = f32[5,4] tanh(region), sharding={{manual}}
  r = f32[5,4] all-reduce(t), channel_id=1, replica_groups={{{{0,2}},{{1,3}}}}, use_global_device_ids=true, to_apply=add, sharding={{manual}}
  leave = f32[5,4] custom-call(r), custom_call_target="Sharding", sharding={{manual}}
  full = f32[{rows},4] custom-call(leave), custom_call_target="SPMDShardToFullShape", sharding={{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}}
  ROOT out = (f32[{rows},4], f32[{rows},4]) tuple(full, s)
}}
"""


def _truth(inputs: list[np.ndarray], rows: int) -> np.ndarray:
    s = inputs[0] + inputs[1]
    tiles = np.zeros((10, 4), np.float32)
    tiles[:rows] = np.tanh(s)  # the padding rows of an uneven tile are zeros, tanh(0) = 0
    summed = tiles[:5] + tiles[5:]
    return np.concatenate([summed, summed])[:rows]


@pytest.mark.parametrize("rows", [10, 9])
def test_fully_manual_regions_run_directly_compute_the_truth(rows):
    text = FULLY_MANUAL.format(rows=rows)
    inputs = random_inputs(parse_module(text), seed=0)
    out = run_direct(parse_module(text), inputs, 4)
    assert out is not None
    assert np.allclose(out[0], _truth(inputs, rows), rtol=1e-6, atol=1e-6)
    assert np.array_equal(out[1], inputs[0] + inputs[1])


def test_the_direct_program_has_no_region_left():
    program = direct_program(parse_module(FULLY_MANUAL.format(rows=10)), 4)
    text = print_module(program)
    for word in ("SPMDFullToShardShape", "SPMDShardToFullShape", "Sharding", "sharding="):
        assert word not in text


def test_a_partially_manual_region_runs_whole_along_its_other_axes():
    """Columns cut by the manual axis, rows still partitioned inside (SPMD fuzz seed 10085,
    reduced): each device runs the region on its manual group's columns, all rows."""
    text = (Path(__file__).parent / "dumps" / "data" / "dus_beside_manual_region_10085.hlo").read_text()
    inputs = random_inputs(parse_module(text), seed=0)
    out = run_direct(parse_module(text), inputs, 4)
    assert out is not None
    assert np.array_equal(out[0], -inputs[1])
    dus = inputs[0].copy()
    dus[2, 0] = inputs[2][0, 0]
    assert np.array_equal(out[1], dus)


def test_edge_shardings_whose_manual_part_cannot_be_read_are_declined():
    """The region's inside sharding tiles the rows as the outside one does, so no axis is left
    to be manual, yet the region's shape is cut: declined, not guessed."""
    text = FULLY_MANUAL.format(rows=10).replace(
        'custom_call_target="SPMDFullToShardShape", sharding={manual}',
        'custom_call_target="SPMDFullToShardShape", sharding={devices=[2,1,2]0,1,2,3 last_tile_dims={manual}}')
    assert direct_program(parse_module(text), 4) is None


def _partitioned(text: str) -> str:
    module = parse_module(text)
    SpmdPartitioner(num_partitions=4).run(module)
    return print_module(module)


def test_a_wrong_oracle_is_overruled_by_the_direct_run(monkeypatch):
    """XLA's partition of the original made to compute the region's output wrong: the second
    opinion judges that output, our (right) partition verifies, and the report says why."""
    text = FULLY_MANUAL.format(rows=10)
    real = verify_module.run_xla_spmd

    def wrong(module, inputs, n, platform, notes):
        outputs, problems, run = real(module, inputs, n, platform, notes)
        return [outputs[0] + 1.0, *outputs[1:]], problems, run

    monkeypatch.setattr(verify_module, "run_xla_spmd", wrong)
    report = verify_equivalent(text, _partitioned(text))
    assert report.ok, report.format()
    assert any("judged by the direct run" in n for n in report.notes), report.notes


def test_a_wrong_rewrite_stays_wrong_under_both_oracles(monkeypatch):
    text = FULLY_MANUAL.format(rows=10)
    wrong_rewrite = _partitioned(text).replace("tanh(", "sine(", 1)
    assert "sine(" in wrong_rewrite
    report = verify_equivalent(text, wrong_rewrite)
    assert not report.ok
    assert not any("judged by the direct run" in n for n in report.notes)  # both oracles agree


def test_a_module_xla_cannot_partition_is_judged_by_its_regions_run_directly():
    """SPMD fuzz seed 9842: XLA cannot partition the original (its partition all-reduces with an
    `or` reducer XLA:CPU does not implement), so there was no oracle and the seed was skipped.
    Its manual regions run directly need no such all-reduce: they are the oracle now, and say so."""
    text = (Path(__file__).parent / "dumps" / "data" / "xla_cannot_partition_9842.hlo").read_text()
    report = verify_equivalent(text, _partitioned_for(text, 8))
    assert report.ok, report.format()
    assert any("XLA cannot partition this global module" in n for n in report.notes), report.notes
    wrong = verify_equivalent(text, _partitioned_for(text, 8).replace(" tanh(", " exponential(", 1))  # in the region
    assert not wrong.ok


def _partitioned_for(text: str, n: int) -> str:
    module = parse_module(text)
    SpmdPartitioner(num_partitions=n).run(module)
    return print_module(module)


def _shard_map_programs():
    """Two jitted functions with shard_map regions over a 4x2 mesh: fully manual with a whole
    (`P()`) operand and result, and manual over 'x' only (partially manual) with a whole result."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))

    def fully_manual(a, b):
        summed = jax.shard_map(lambda u, v: jax.lax.psum(jnp.tanh(u) * 2, "x") + v, mesh=mesh,
                               in_specs=(P("x", None), P()), out_specs=P(), check_vma=False)
        gathered = jax.shard_map(lambda u: jax.lax.all_gather(u, "y", axis=1, tiled=True), mesh=mesh,
                                 in_specs=P(None, "y"), out_specs=P(), check_vma=False)
        return summed(a, b) + 1, gathered(a * 3)

    def partially_manual(a, b):
        summed = jax.shard_map(lambda u: jax.lax.psum(jnp.sin(u), "x"), mesh=mesh, in_specs=P("x"),
                               out_specs=P(), axis_names={"x"}, check_vma=False)
        return summed(a) * b

    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal((2, 6)).astype(np.float32)
    tiled, whole = NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P())
    return {name: (jax.jit(fn, in_shardings=(tiled, whole)), (a, b))
            for name, fn in (("fully_manual", fully_manual), ("partially_manual", partially_manual))}


@pytest.mark.parametrize("lowering", ["shardy", "gspmd"])
def test_shard_map_regions_as_jax_lowers_them_run_directly(lowering):
    """JAX's own lowerings of shard_map, both of them: Shardy's region edges
    (`xla.sdy.GlobalToLocalShape`, a body call) are read through import_shardy, and whole
    (`{replicated}`) operands and results of a region, fully or partially manual, enter as the
    whole value and leave as it.  The direct run computes what JAX's compiled function does."""
    import jax

    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", lowering == "shardy")
    try:
        for name, (jitted, args) in _shard_map_programs().items():
            text = jitted.lower(*args).as_text(dialect="hlo")
            assert ("xla.sdy.GlobalToLocalShape" in text) == (lowering == "shardy"), name
            truth = jitted(*args)
            truth = truth if isinstance(truth, tuple) else (truth,)
            direct = run_direct(parse_module(text), list(args), 8)
            assert direct is not None, name
            assert len(direct) == len(truth), name
            for got, want in zip(direct, truth):
                np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5, err_msg=name)
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)
