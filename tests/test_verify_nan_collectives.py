"""verify names the runtime's fault when a NaN is lost in a cross-device max/min reduction.

XLA:CPU's all-reduce (and reduce-scatter) over `maximum`/`minimum` skip NaN operands, where HLO's
maximum and minimum propagate NaN.  A random JAX program found it (fuzz_jax_dumps, GSPMD `--big`
seed 3015: `jnp.take` fills out-of-range rows with NaN, a max over them): ours, XLA's own
partition and JAX's run all returned -inf where the whole program returned NaN.  The mismatch
stays a mismatch (verify does not hide it), but the report says whose it is, and the fuzzer
files it as XLA's, not as a wrong partition.  Oracles: numpy for the values, XLA's own
partition for "any partitioner gets this".
"""

from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.verify import NAN_LOST_BY_COLLECTIVES

MAX_OF_SHARDS = """HloModule max_of_shards, num_partitions=8

{reducer} {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] {op}(a, b)
}}

ENTRY e {{
  p = f32[16,4] parameter(0), sharding={{devices=[8,1]<=[8]}}
  q = f32[4] parameter(1), sharding={{replicated}}
  r = f32[4] reduce(p, f32[] constant({init})), dimensions={{0}}, to_apply={reducer}, sharding={{replicated}}
  ROOT t = (f32[4], f32[4]) tuple(r, q)
}}
"""


def _partitioned(text: str) -> str:
    module = parse_module(text)
    SpmdPartitioner(num_partitions=8).run(module)
    return print_module(module)


@pytest.mark.parametrize("op,init", [("maximum", "-inf"), ("minimum", "inf")])
def test_a_nan_reduced_across_devices_is_named_as_the_runtimes_fault(op, init):
    text = MAX_OF_SHARDS.format(reducer=op, op=op, init=init)
    ours = _partitioned(text)
    assert "all-reduce(" in ours  # the rows are reduced across the devices
    p = np.arange(64, dtype=np.float32).reshape(16, 4)
    p[7, 1] = np.nan  # column 1's NaN is on device 3
    q = np.ones(4, np.float32)
    whole = p.min(0) if op == "minimum" else p.max(0)
    assert np.isnan(whole[1])  # numpy (and HLO) propagate the NaN
    report = verify_equivalent(text, ours, inputs=[p, q])
    assert not report.ok
    assert np.isnan(report.expected[0][1]) and not np.isnan(report.actual[0][1])
    # every other element is right, and output 1 too
    np.testing.assert_array_equal(np.delete(report.actual[0], 1), np.delete(whole, 1))
    assert report.outputs[1].ok
    assert any(NAN_LOST_BY_COLLECTIVES in n and n.startswith("output 0:") for n in report.notes), report.format()


def test_no_note_when_another_element_is_wrong_too():
    """The note explains a mismatch only when NaNs turned numbers are all of it: an output also
    wrong elsewhere gets no note (a real bug must not hide behind the runtime's)."""
    text = MAX_OF_SHARDS.format(reducer="maximum", op="maximum", init="-inf")
    ours = _partitioned(text).replace("f32[] constant(-inf)", "f32[] constant(1000)", 1)
    assert "constant(1000)" in ours  # the local reduces' init: every column now comes out 1000
    # (two rows a device: XLA folds a reduce over one row into a reshape, init and all)
    p = np.arange(64, dtype=np.float32).reshape(16, 4)
    p[7, 1] = np.nan
    report = verify_equivalent(text, ours, inputs=[p, np.ones(4, np.float32)])
    assert not report.ok
    assert not any(NAN_LOST_BY_COLLECTIVES in n for n in report.notes), report.format()


def test_no_note_without_nans():
    text = MAX_OF_SHARDS.format(reducer="maximum", op="maximum", init="-inf")
    ours = _partitioned(text).replace("f32[] constant(-inf)", "f32[] constant(1000)", 1)
    p = np.arange(64, dtype=np.float32).reshape(16, 4)
    report = verify_equivalent(text, ours, inputs=[p, np.ones(4, np.float32)])
    assert not report.ok
    assert not any(NAN_LOST_BY_COLLECTIVES in n for n in report.notes)
