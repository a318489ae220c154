"""xla_backend.pass_times reads XLA's own per-pass times from its log (the figures
benchmarks/pass_speed.py puts beside ours)."""

from __future__ import annotations

import pytest

from hlo_passes.runtime.xla_backend import _sum_pass_times, pass_times

# A Megatron-style matmul: x rows over 'data' (2), w columns over 'model' (4); JAX's GSPMD lowering.
TINY = """\
HloModule tiny, entry_computation_layout={(f32[16,16]{1,0}, f32[8,16]{1,0})->f32[8,16]{1,0}}, \
allow_spmd_sharding_propagation_to_output={true}

ENTRY main {
  x = f32[8,16]{1,0} parameter(1), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  w = f32[16,16]{1,0} parameter(0), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  dot = f32[8,16]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT tanh = f32[8,16]{1,0} tanh(dot)
}
"""


def test_log_lines_are_summed_per_pass_in_seconds():
    log = "\n".join([
        "I1125 17:47:58.884 1 hlo_pass_pipeline.cc:211]   HLO pass dce",
        "I1125 17:47:58.884 1 hlo_pass_pipeline.cc:206] HLO pass: dce time: 35 us (35 us) (cumulative: 1 us)",
        "I1125 17:47:58.885 1 hlo_pass_pipeline.cc:206] HLO pass: dce time: 1.5 ms (1.5 ms) (cumulative: 2 us)",
        "I1125 17:47:58.886 1 hlo_pass_pipeline.cc:206] HLO pass: spmd-partitioning time: 2.25 s (2.25 s)",
    ])
    assert _sum_pass_times(log) == pytest.approx({"dce": 35e-6 + 1.5e-3, "spmd-partitioning": 2.25})


def test_xla_reports_its_propagation_and_partitioning_times():
    times = pass_times(TINY, num_partitions=8, propagate_to_output=(True,), timeout=120)
    assert times["spmd-partitioning"] > 0
    assert times["sharding-propagation"] > 0
    assert all(seconds < 60 for seconds in times.values())
