"""Entry parameters sharded `{maximal device=N}`: XLA's calling convention gives the array to
device N alone (the other devices' buffers are undefined), and the partitioned program keeps
that convention.  It once declared such a parameter `{replicated}` and read it on every device:
a program that computed right only for a caller that fed every device, and that `verify`
could not catch, since it fed the rewritten module by its own (changed) declaration.  Now
`verify` gives the other devices poison (NaN, the largest integer, the negated pred) and the
partitioner broadcasts the array from its device."""

from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import parse_module
from hlo_passes.ir.sharding import ShardingKind
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.partitioned import assemble_array, poison, shard_array
from hlo_passes.ir.sharding import Sharding
from tests.spmd.partitioning import collectives, partition, partition_verified

MAXIMAL_PLUS_TILED = """
HloModule maximal_plus_tiled, num_partitions=8
ENTRY e {
  x = f32[32,16] parameter(0), sharding={maximal device=5}
  y = f32[32,16] parameter(1), sharding={devices=[8,1]<=[8]}
  ROOT a = f32[32,16] add(x, y), sharding={devices=[8,1]<=[8]}
}
"""


def test_a_maximal_parameter_keeps_its_sharding_and_is_broadcast_from_its_device():
    module, out = partition_verified(MAXIMAL_PLUS_TILED)
    x = module.entry.parameters[0]
    assert x.sharding is not None and x.sharding.kind is ShardingKind.MAXIMAL and x.sharding.device == 5, out
    assert collectives(module) == {"all-reduce": 1}, out


def test_verify_catches_a_program_that_reads_a_maximal_parameter_on_other_devices():
    """The program the partitioner wrote before: x read whole on every device, but declared as
    the caller gives it, on device 5 alone."""
    _, out, _ = partition(MAXIMAL_PLUS_TILED)
    allreduce, = [line for line in out.splitlines() if "all-reduce(" in line]
    name = allreduce.split("=")[0].strip()
    reads_everywhere = out.replace(allreduce, f"  {name} = {allreduce.split('=')[1].split('all-reduce')[0].strip()} "
                                              "copy(select)")
    report = verify_equivalent(MAXIMAL_PLUS_TILED, reads_everywhere)
    assert not report.ok, reads_everywhere


@pytest.mark.parametrize("etype", ["f32", "bf16", "s32", "u8", "pred", "c64"])
def test_the_broadcast_keeps_every_value_exactly(etype):
    """NaN and infinities, integer extremes and pred come out of the broadcast as device 3
    holds them (a zero may lose its sign, as in XLA's partition: XLA:CPU's sum of -0.0 and
    zeros is 0.0)."""
    text = f"""
HloModule maximal_values, num_partitions=4
ENTRY e {{
  x = {etype}[2,3] parameter(0), sharding={{maximal device=3}}
  ROOT c = {etype}[2,3] copy(x), sharding={{devices=[2,1,2]<=[4] last_tile_dim_replicate}}
}}
"""
    module, out = partition_verified(text, 4)
    values = {
        "f32": np.array([[-0.0, 0.0, np.nan], [np.inf, -np.inf, 1.5]], np.float32),
        "s32": np.array([[-2**31, 2**31 - 1, 0], [-1, 1, 7]], np.int32),
        "u8": np.array([[0, 255, 1], [2, 3, 128]], np.uint8),
        "pred": np.array([[True, False, True], [False, False, True]]),
        "c64": np.array([[complex(-0.0, -0.0), complex(1, -0.0), complex(np.nan, 2)],
                         [complex(0, 0), complex(-1, 1), complex(3, np.inf)]], np.complex64),
    }
    if etype == "bf16":
        import ml_dtypes
        x = np.array([[-0.0, 0.0, np.nan], [np.inf, -np.inf, 1.5]], ml_dtypes.bfloat16)
    else:
        x = values[etype]
    report = verify_equivalent(text, out, num_devices=4, inputs=[x])
    assert report.ok, report.format()
    got = np.asarray(report.actual[0])
    wide = np.complex128 if etype == "c64" else np.float64
    np.testing.assert_array_equal(got.astype(wide), x.astype(wide))  # NaN where NaN; -0.0 may come back 0.0, as in XLA's
    if etype in ("s32", "u8", "pred"):
        assert got.tobytes() == x.tobytes(), (got, x)


def test_shard_array_gives_a_maximal_array_to_its_device_and_poison_to_the_rest():
    s = Sharding.maximal(2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(shard_array(x, s, 2), x)
    assert np.isnan(shard_array(x, s, 0)).all()
    assert (poison(np.array([1, 2], np.int8)) == 127).all()
    assert (poison(np.array([True, False])) == np.array([False, True])).all()
    whole, problem = assemble_array([np.zeros(3), np.ones(3), np.full(3, 2.0)], s, (3,))
    assert problem is None and (whole == 2.0).all()


def test_parse_of_the_partitioned_module_keeps_the_maximal_parameter():
    _, out = partition_verified(MAXIMAL_PLUS_TILED)
    reparsed = parse_module(out)
    assert "maximal device=5" in reparsed.entry.parameters[0].sharding.to_hlo()
